"""Incremental STOMP frame parser: bytes in, frames out, no I/O (in the manner of h11).

Speed comes from doing per-frame work with a few C-level calls: one `find` for the end of
the header section, one `decode` and one `split` for all its lines, one `find` (or an index)
for the end of the body. The common case, a feed of many small complete frames, parses
straight from the caller's bytes without copying them into a buffer first; only the
unfinished tail is kept, in a bytearray, and it always starts at the unfinished frame, so
all saved positions are relative to that frame.

Limits are enforced on what is buffered, not only on complete frames, so a peer that
streams without ever ending a line, a header section or a body is stopped as soon as the
frame passes a limit. Search positions are remembered between feeds so that a frame trickling
in small pieces is scanned once, not once per piece.

Frame size, for `max_frame_bytes`, counts the command line, the headers, the blank line and
the body, but neither the heart-beats before the frame nor its closing NUL. A line's length,
for `max_header_bytes`, excludes its line end and applies to the command line too.
"""

from __future__ import annotations

from typing import Final

from .errors import ProtocolError
from .frame import Frame
from .headers import parse_header_block
from .versions import SUPPORTED_VERSIONS, negotiate_version

_CONNECT_COMMANDS: Final = frozenset({"CONNECT", "STOMP"})


class FrameParser:
    """Feed it bytes as they arrive; it returns the frames they complete.

    After a ProtocolError the parser is dead: every later `feed` raises the same message.
    The error's `frames` holds the frames that same feed completed before the bad bytes.

    `heartbeats` counts the EOLs (LF or CRLF) skipped before commands so far; a server
    watching for heart-beats need only look at whether any bytes arrived at all.

    `version` governs header unescaping for frames whose headers are parsed from then on.
    The server sets it after CONNECT; the parser also adopts the version a CONNECT/STOMP
    frame negotiates by itself, so that frames pipelined behind the CONNECT in the same
    read are already read with the right rules.
    """

    __slots__ = (
        "_buf",
        "_crlf",
        "_error",
        "_last_nl",
        "_lines",
        "_lscan",
        "_max_frame",
        "_max_headers",
        "_max_line",
        "_pending",
        "_scan",
        "_version",
        "heartbeats",
    )

    def __init__(
        self,
        *,
        max_frame_bytes: int = 16 * 1024 * 1024,
        max_headers: int = 1000,
        max_header_bytes: int = 10240,
        version: str = "1.2",
    ) -> None:
        self._max_frame = max_frame_bytes
        self._max_headers = max_headers
        self._max_line = max_header_bytes
        self.version = version
        self.heartbeats = 0
        self._buf = bytearray()
        self._error: ProtocolError | None = None
        self._crlf = False  # did the last frame end its headers with CRLF? (search order hint)
        # An unfinished header section: where to resume looking for its end, and counts of
        # the lines seen so far (positions relative to the frame start).
        self._scan = 0
        self._lscan = 0
        self._lines = 0
        self._last_nl = -1
        # An unfinished body: (command, headers, body offset, content-length or -1,
        # offset to resume the NUL search from).
        self._pending: tuple[str, dict[str, str], int, int, int] | None = None

    @property
    def max_frame_bytes(self) -> int:
        """The frame size limit; a server raises it once a client has logged in (RabbitMQ's
        smaller limit before authentication). Applies to frames not parsed yet."""
        return self._max_frame

    @max_frame_bytes.setter
    def max_frame_bytes(self, value: int) -> None:
        self._max_frame = value

    @property
    def buffered(self) -> int:
        """Bytes of an unfinished frame held until the rest of it arrives."""
        return len(self._buf)

    @property
    def version(self) -> str:
        """The STOMP version whose escaping rules apply: "1.0", "1.1" or "1.2"."""
        return self._version

    @version.setter
    def version(self, value: str) -> None:
        if value not in SUPPORTED_VERSIONS:
            raise ValueError(f"unsupported STOMP version {value!r}")
        self._version = value

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Return every frame completed by `data` (maybe none); ProtocolError on bad input."""
        if self._error is not None:
            raise ProtocolError(str(self._error))
        if not data:
            return []
        buf = self._buf
        if buf:
            buf += data
            src: bytes | bytearray = buf
        else:
            src = data if type(data) is bytes else bytes(data)
        frames: list[Frame] = []
        try:
            pos = self._parse(src, frames)
        except ProtocolError as err:
            err.frames = frames
            self._error = err
            self._buf = bytearray()
            self._pending = None
            raise
        if src is buf:
            if pos:
                del buf[:pos]  # cheap: CPython moves the start of a bytearray, not its bytes
        elif pos < len(src):
            self._buf = bytearray(memoryview(src)[pos:])
        return frames

    def _parse(self, src: bytes | bytearray, frames: list[Frame]) -> int:
        """Append the frames complete in `src`; return where the unfinished rest starts."""
        end = len(src)
        max_frame = self._max_frame
        copy_body = type(src) is not bytes  # a bytearray's slice is copied to bytes
        version = self._version
        crlf = self._crlf
        scan = self._scan
        resumed = self._lscan != 0  # an unfinished header section left by the last feed
        pending = self._pending
        self._pending = None
        pos = 0
        while True:
            if pending is None:
                # Heart-beats: EOLs before a command. A lone CR at the end may be half a CRLF.
                while pos < end:
                    byte = src[pos]
                    if byte == 10:
                        pos += 1
                    elif byte == 13 and pos + 1 < end and src[pos + 1] == 10:
                        pos += 2
                    elif byte == 13 and pos + 1 == end:
                        self._crlf = crlf
                        return pos
                    else:
                        break
                    self.heartbeats += 1
                if pos >= end:
                    self._crlf = crlf
                    return pos
                start = pos
                # The header section ends at the first LF followed by LF or CRLF. Search
                # first for the kind the last frame used, then only before that hit for
                # the other, so neither search runs past this frame in the common case.
                limit = start + max_frame
                if limit > end:
                    limit = end
                resume = start + scan
                if crlf:
                    cut = src.find(b"\n\r\n", resume, limit)
                    if cut >= 0:
                        other = src.find(b"\n\n", resume, cut + 1)
                        if other >= 0:
                            cut, body = other, other + 2
                        else:
                            body = cut + 3
                    else:
                        cut = src.find(b"\n\n", resume, limit)
                        body = cut + 2
                else:
                    cut = src.find(b"\n\n", resume, limit)
                    if cut >= 0:
                        # A CRLF blank line before it has a CR, which LF lines seldom do:
                        # the one-byte search is 0.4x the three-byte one it spares.
                        other = -1 if src.find(b"\r", resume, cut) < 0 \
                            else src.find(b"\n\r\n", resume, cut + 2)
                        if other >= 0:
                            cut, body = other, other + 3
                        else:
                            body = cut + 2
                    else:
                        cut = src.find(b"\n\r\n", resume, limit)
                        body = cut + 3
                if cut < 0:
                    self._check_unfinished_headers(src, start, end)
                    self._scan = max(0, end - start - 2)
                    self._crlf = crlf
                    return start
                crlf = body - cut == 3
                if resumed:
                    resumed = False
                    scan = self._scan = self._lscan = self._lines = 0
                    self._last_nl = -1
                if cut - start > self._max_line:
                    self._check_line_lengths(src, start, cut)
                try:
                    text = src[start:cut].decode()
                except UnicodeDecodeError:
                    raise ProtocolError("headers are not valid UTF-8") from None
                command, headers = parse_header_block(text, version, self._max_headers)
                length = headers.get("content-length")
                if length is None:
                    size = -1
                    find_from = body
                elif length.isdigit() and length.isascii() and len(length) < 10:
                    size = int(length)
                    if body - start + size > max_frame:
                        raise ProtocolError(f"frame too large: more than {max_frame} bytes",
                                            receipt=headers.get("receipt"))
                else:
                    size = self._content_length(length, body - start, headers)
            else:
                # The frame left unfinished by the last feed; the buffer starts with it.
                command, headers, body, size, find_from = pending
                pending = None
                start = 0
            if size < 0:
                limit = start + max_frame + 1
                if limit > end:
                    limit = end
                stop = src.find(b"\0", find_from, limit)
                if stop < 0:
                    if end - start > max_frame:
                        raise ProtocolError(f"frame too large: more than {max_frame} bytes",
                                            receipt=headers.get("receipt"))
                    self._pending = (command, headers, body - start, -1, end - start)
                    self._crlf = crlf
                    return start
            else:
                stop = body + size
                if stop >= end:
                    self._pending = (command, headers, body - start, size, 0)
                    self._crlf = crlf
                    return start
                if src[stop]:
                    raise ProtocolError(f"missing NUL after body of content-length {size}",
                                        receipt=headers.get("receipt"))
            # bytes from bytes: `src` is bytes unless copy_body
            payload: bytes = bytes(src[body:stop]) if copy_body \
                else src[body:stop]  # type: ignore[assignment]
            frames.append(Frame(command, headers, payload))
            pos = stop + 1
            if command in _CONNECT_COMMANDS:
                agreed = negotiate_version(headers.get("accept-version"))
                if agreed is not None:
                    version = self._version = agreed

    def _content_length(self, value: str, header_bytes: int, headers: dict[str, str]) -> int:
        """Validate an unusual content-length value (not a short run of ASCII digits)."""
        if not (value.isascii() and value.isdigit()):
            shown = value if len(value) <= 40 else value[:40] + "..."
            raise ProtocolError(f'invalid content-length: "{shown}"',
                                receipt=headers.get("receipt"))
        if len(value) > 30:
            value = value.lstrip("0") or "0"
        size = int(value) if len(value) <= 30 else self._max_frame + 1
        if header_bytes + size > self._max_frame:
            raise ProtocolError(f"frame too large: more than {self._max_frame} bytes",
                                receipt=headers.get("receipt"))
        return size

    def _check_line_lengths(self, src: bytes | bytearray, start: int, cut: int) -> None:
        """Exact per-line check, needed only when the whole section exceeds one line's limit."""
        for line in src[start:cut].split(b"\n"):
            length = len(line) - (1 if line.endswith(b"\r") else 0)
            if length > self._max_line:
                raise ProtocolError(f"header line too long: more than {self._max_line} bytes")

    def _check_unfinished_headers(self, src: bytes | bytearray, start: int, end: int) -> None:
        """Apply every limit to a header section whose end has not arrived yet.

        Only bytes not seen by the previous feed are counted, and line lengths are measured
        only when the new stretch is long enough to hide a long line, so a section trickling
        in is scanned about once in total.
        """
        max_line = self._max_line
        if end - start >= self._max_frame:  # its end, if any, lies past the limit
            raise ProtocolError(f"frame too large: more than {self._max_frame} bytes")
        line_start = start + self._last_nl + 1  # the line that was unfinished last time
        scan_from = start + self._lscan
        newlines = src.count(b"\n", scan_from, end)
        if newlines:
            self._lines += newlines
            self._last_nl = src.rfind(b"\n", scan_from, end) - start
            if self._lines - 1 > self._max_headers:
                raise ProtocolError(f"too many headers: more than {self._max_headers}")
        self._lscan = end - start
        # The unfinished line may still lose a CR when its LF comes, hence the + 1.
        if end - line_start > max_line + 1:
            lines = src[line_start:end].split(b"\n")
            if len(lines[-1]) > max_line + 1:
                raise ProtocolError(f"header line too long: more than {max_line} bytes")
            del lines[-1]
            if lines and max(map(len, lines)) > max_line:
                for line in lines:
                    if len(line) - line.endswith(b"\r") > max_line:
                        raise ProtocolError(f"header line too long: more than {max_line} bytes")
