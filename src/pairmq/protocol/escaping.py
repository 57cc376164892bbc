"""Header value escaping per STOMP version, shared so parser and serializer use one table.

1.2 escapes backslash, LF, colon and CR; 1.1 the same without CR; 1.0 nothing. CONNECT,
CONNECTED (and STOMP, the other name of CONNECT) are never escaped: the version is not
known yet when they are written.
"""

from __future__ import annotations

import re
from typing import Final

from .errors import ProtocolError

UNESCAPED_COMMANDS: Final = frozenset({"CONNECT", "CONNECTED", "STOMP"})

_DECODE: Final = {
    "1.0": {},
    "1.1": {"n": "\n", "c": ":", "\\": "\\"},
    "1.2": {"r": "\r", "n": "\n", "c": ":", "\\": "\\"},
}
_ESCAPE_SEQUENCE: Final = re.compile(r"\\(.?)", re.DOTALL)


def _table(version: str) -> dict[str, str]:
    try:
        return _DECODE[version]
    except KeyError:
        raise ValueError(f"unsupported STOMP version {version!r}") from None


def escape_header(value: str, version: str) -> str:
    """Escape a header name or value for the wire; cheap when nothing needs escaping."""
    if version == "1.0":
        return value
    _table(version)
    if "\\" in value:  # first, so the backslashes added below are not doubled
        value = value.replace("\\", "\\\\")
    if "\n" in value:
        value = value.replace("\n", "\\n")
    if ":" in value:
        value = value.replace(":", "\\c")
    if "\r" in value and version != "1.1":  # 1.1 has no \r escape: CR goes out raw
        value = value.replace("\r", "\\r")
    return value


def unescape_header(value: str, version: str) -> str:
    """Undo escape_header; an escape the version does not define is a ProtocolError."""
    table = _table(version)
    if version == "1.0" or "\\" not in value:
        return value
    colons = value.replace("\\c", ":")
    if "\\" not in colons:  # only \c escapes (a message id's colons): every backslash
        return colons  # began one, so decoding left to right gives the same

    def decode(match: re.Match[str]) -> str:
        char = match.group(1)
        try:
            return table[char]
        except KeyError:
            if not char:
                raise ProtocolError("incomplete escape sequence at end of header") from None
            raise ProtocolError(f"undefined escape sequence \\{char} in header") from None

    return _ESCAPE_SEQUENCE.sub(decode, value)
