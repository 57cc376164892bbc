"""Turn one decoded header section (command line plus header lines) into command and headers.

The framing (where a section starts and ends, limits on bytes) is parser.py's job; this
module only knows the line grammar, so it can work on a whole section with C-speed string
methods instead of a per-line state machine.
"""

from __future__ import annotations

from .errors import ProtocolError
from .escaping import UNESCAPED_COMMANDS, unescape_header


def parse_header_block(text: str, version: str, max_headers: int) -> tuple[str, dict[str, str]]:
    """Split `text` (the section up to, not including, the blank line) into command and headers.

    Lines may end in LF or CRLF; only a CR right before the LF is dropped, so other CRs stay
    in values (1.0, 1.1). Each header splits at its first colon; the first of repeated names
    wins. Names and values are unescaped as `version` says, never on CONNECT/CONNECTED/STOMP.
    An empty header name is refused: the grammar asks for at least one octet. So is a NUL
    anywhere in the section: the grammar has no NUL in a header, and one passed on to a
    subscriber would end its MESSAGE there and start a forged frame after it.

    The lines are found by index in the one string, not split into a list of lines and a
    list per line: each header then costs its two strings and no list (0.82x a SEND's
    section, 0.75x an ACK's, in the compiled build; docs/benchmarks.md).
    """
    if "\0" in text:
        raise ProtocolError("NUL (octet 0) in the command or a header: not allowed by STOMP")
    if "\r" in text:
        text = text.replace("\r\n", "\n")
        if text[-1] == "\r":
            text = text[:-1]
    first = text.find("\n")
    command = text if first < 0 else text[:first]
    if not command:
        raise ProtocolError("empty command")
    headers: dict[str, str] = {}
    if first < 0:
        return command, headers
    count = text.count("\n")
    if count > max_headers:
        raise ProtocolError(f"too many headers: more than {max_headers}")
    # where the next backslash is, if escapes apply: lines before it need no unescaping
    escaped = -1 if version == "1.0" or command in UNESCAPED_COMMANDS else text.find("\\")
    end = len(text)
    pos = first + 1
    for _ in range(count):
        stop = text.find("\n", pos)
        if stop < 0:
            stop = end
        colon = text.find(":", pos, stop)
        if colon < 0:
            raise _no_colon(text[pos:stop])
        name = text[pos:colon]
        value = text[colon + 1:stop]
        if 0 <= escaped < stop:
            if escaped < colon:
                name = _unescaped(name, version)
            value = _unescaped(value, version)
            escaped = text.find("\\", stop)
        if name not in headers:
            headers[name] = value
        pos = stop + 1
    if "" in headers:
        raise ProtocolError("empty header name")
    return command, headers


def _unescaped(text: str, version: str) -> str:
    """A name or value that may hold escapes; `\\c` alone (a message id's colons) is the
    usual case and is undone here, the rest by escaping.py."""
    colons = text.replace("\\c", ":")
    if "\\" not in colons:  # every backslash began a \c: decoding left to right is the same
        return colons
    return unescape_header(text, version)


def _no_colon(line: str) -> ProtocolError:
    shown = line if len(line) <= 40 else line[:40] + "..."
    return ProtocolError(f"header line without colon: {shown!r}")
