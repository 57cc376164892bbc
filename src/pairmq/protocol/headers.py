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
    """
    if "\0" in text:
        raise ProtocolError("NUL (octet 0) in the command or a header: not allowed by STOMP")
    if "\r" in text:
        text = text.replace("\r\n", "\n")
        if text[-1] == "\r":
            text = text[:-1]
    lines = text.split("\n")
    command = lines[0]
    if not command:
        raise ProtocolError("empty command")
    count = len(lines) - 1
    if not count:
        return command, {}
    if count > max_headers:
        raise ProtocolError(f"too many headers: more than {max_headers}")
    del lines[0]
    if "\\" in text and version != "1.0" and command not in UNESCAPED_COMMANDS:
        headers = _unescaped(lines, version)
    else:
        pairs = [line.split(":", 1) for line in lines]
        try:
            headers = dict(pairs)
        except ValueError:
            raise _no_colon(lines) from None
        if len(headers) != count:  # a repeated name: dict() kept the last value
            headers = {}
            for name, value in pairs:
                if name not in headers:
                    headers[name] = value
    if "" in headers:
        raise ProtocolError("empty header name")
    return command, headers


def _unescaped(lines: list[str], version: str) -> dict[str, str]:
    """The slower path, taken only when a backslash appears in the section: only the lines
    that hold one are unescaped (a MESSAGE's `message-id:ID\\cserver-...` is the usual one)."""
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon:
            raise _no_colon([line])
        if "\\" in line:
            name = unescape_header(name, version)
            value = unescape_header(value, version)
        if name not in headers:
            headers[name] = value
    return headers


def _no_colon(lines: list[str]) -> ProtocolError:
    line = next(line for line in lines if ":" not in line)
    shown = line if len(line) <= 40 else line[:40] + "..."
    return ProtocolError(f"header line without colon: {shown!r}")
