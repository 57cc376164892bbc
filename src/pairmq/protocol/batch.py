"""Batched frames: K messages packed in one frame's body, so a peer parses one frame, not K.

Two kinds, one header-block format:

- a batched stream MESSAGE (`x-stream-batch`, docs/streams.md): K consecutive stream
  records, each with its offset, timestamp and message-id (`Record`);
- a batched SEND (`pairmq-batch`, docs/stomp.md): K messages for the frame's destination, each
  with its own headers (its dup-id among them) and body (`SendRecord`).

A stream record is a fixed little-endian header, then three variable parts:

    offset      u64   the record's stream offset
    timestamp   u64   its append time, ms since the epoch
    id length   u16   bytes of its message-id (UTF-8)
    hdr length  u32   bytes of its header block
    body length u32   bytes of its body
    message-id, header block, body

The header block is the record's own headers (those a one-record MESSAGE would carry
besides the per-delivery ones, `x-stream-offset` and `timestamp`; those a one-message SEND
would carry besides the frame's) as `name:value\\n` lines, escaped as STOMP 1.2 escapes
headers except that a colon is escaped (`\\c`) in names only: a line splits at its first
colon, and dup-ids, which often hold colons, are then written and read as they are. A
SEND record is the same without the stream fields:

    hdr length  u32   bytes of its header block
    body length u32   bytes of its body
    header block, body

Fixed-size fields first, so a decoder needs one `unpack_from` per record and never scans a
body. Pure: no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Final

from .errors import ProtocolError
from .escaping import escape_header, unescape_header

RECORD_HEAD: Final = struct.Struct("<QQHII")
SEND_HEAD: Final = struct.Struct("<II")
MAX_ID_BYTES: Final = 0xFFFF
SEND_BATCH_HEADER: Final = "pairmq-batch"  # on a SEND: its body packs this many messages
MAX_SEND_BATCH: Final = 10000  # messages in one batched SEND, at most

Record = tuple[int, int, str, dict[str, str], bytes]  # offset, ms, message-id, headers, body
SendRecord = tuple[dict[str, str], bytes]  # headers, body


def header_block(headers: Iterable[tuple[str, str]]) -> bytes:
    """The escaped `name:value\\n` lines of one record; cheap when nothing needs escaping."""
    pairs = list(headers)
    if not pairs:
        return b""
    text = "\n".join([f"{name}:{value}" for name, value in pairs])
    if ("\\" in text or "\r" in text or text.count("\n") != len(pairs) - 1
            or (text.count(":") != len(pairs) and any(":" in name for name, _ in pairs))):
        text = "\n".join([f"{escape_header(name, '1.2')}:{escape_value(value)}"
                          for name, value in pairs])
    return (text + "\n").encode()


def escape_value(value: str) -> str:
    """A header value for a record's header block: as STOMP 1.2 escapes it, but a colon
    stays as it is (the line splits at the first colon, which is the name's)."""
    if "\\" in value:
        value = value.replace("\\", "\\\\")
    if "\n" in value:
        value = value.replace("\n", "\\n")
    if "\r" in value:
        value = value.replace("\r", "\\r")
    return value


def append_record(parts: list[bytes | memoryview], offset: int, timestamp: int,
                  message_id: str, block: bytes, body: bytes | memoryview) -> None:
    """One record, as pieces for one `b"".join` (no copy of the body before it); `block`
    comes from `header_block`."""
    mid = message_id.encode()
    if len(mid) > MAX_ID_BYTES:
        raise ValueError(f"message-id of {len(mid)} bytes is too long for a batch record")
    parts.append(RECORD_HEAD.pack(offset, timestamp, len(mid), len(block), len(body)))
    parts.append(mid)
    parts.append(block)
    parts.append(body)


def encode_records(records: Iterable[Record]) -> bytes:
    """A whole batch body (tests, and any writer that has records at hand)."""
    parts: list[bytes | memoryview] = []
    for offset, stamp, message_id, headers, body in records:
        append_record(parts, offset, stamp, message_id, header_block(headers.items()), body)
    return b"".join(parts)


def parse_header_block(block: bytes) -> dict[str, str]:
    """A record's header block -> its headers (the first of a repeated name wins, as in a
    frame)."""
    if not block:
        return {}
    try:
        text = block.decode()
    except UnicodeDecodeError as e:
        raise ProtocolError(f"batch record header block is not UTF-8: {e}") from None
    lines = text.split("\n")
    if lines.pop():  # a block ends with a newline: anything after the last one is cut off
        raise ProtocolError(f"batch record header block does not end with a newline: "
                            f"{text[-60:]!r}")
    pairs = [line.split(":", 1) for line in lines]
    escaped = "\\" in text
    if not escaped:
        try:
            headers = dict(pairs)  # a line without a colon raises
        except ValueError:
            pass  # named below
        else:
            if len(headers) == len(pairs):  # no name repeated
                return headers
    headers = {}
    for pair in pairs:
        if len(pair) != 2:
            raise ProtocolError(f"batch record header line without a colon: {pair[0][:60]!r}")
        name, value = pair
        if escaped:
            name, value = unescape_header(name, "1.2"), unescape_header(value, "1.2")
        headers.setdefault(name, value)
    return headers


def decode_records(body: bytes) -> list[Record]:
    """Every record of a batch body, in order. Header blocks repeat (most records carry the
    same few headers): each distinct one is parsed once, and records that had the same
    block share one dict, which callers must not change."""
    size = len(body)
    unpack = RECORD_HEAD.unpack_from
    head = RECORD_HEAD.size
    parsed: dict[bytes, dict[str, str]] = {}
    records: list[Record] = []
    append = records.append
    at = 0
    while at < size:
        if at + head > size:
            raise ProtocolError(f"batch body cut inside a record header at byte {at}")
        offset, stamp, id_len, block_len, body_len = unpack(body, at)
        at += head
        block_at = at + id_len
        body_at = block_at + block_len
        end = body_at + body_len
        if end > size:
            raise ProtocolError(f"batch record at offset {offset} runs past the body "
                                f"({end} > {size} bytes)")
        block = body[block_at:body_at]
        headers = parsed.get(block)
        if headers is None:
            headers = parsed[block] = parse_header_block(block)
        append((offset, stamp, body[at:block_at].decode(), headers, body[body_at:end]))
        at = end
    return records


def parse_send_batch(value: str | None) -> int | None:
    """A SEND's `pairmq-batch` header -> how many messages its body packs (None: not batched)."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 5 \
            or not 1 <= int(value) <= MAX_SEND_BATCH:
        raise ProtocolError(f"{SEND_BATCH_HEADER} must be an integer from 1 to "
                            f"{MAX_SEND_BATCH}, got {value[:40]!r}")
    return int(value)


def append_send_record(parts: list[bytes | memoryview], block: bytes,
                       body: bytes | memoryview) -> None:
    """One SEND record, as pieces for one `b"".join`; `block` comes from `header_block`."""
    parts.append(SEND_HEAD.pack(len(block), len(body)))
    parts.append(block)
    parts.append(body)


def encode_send_records(records: Iterable[SendRecord]) -> bytes:
    """A batched SEND's body: each message's headers and body."""
    parts: list[bytes | memoryview] = []
    for headers, body in records:
        append_send_record(parts, header_block(headers.items()), body)
    return b"".join(parts)


def decode_send_records(body: bytes, count: int) -> list[SendRecord]:
    """Every message of a batched SEND's body, which must pack exactly `count` of them
    (its `pairmq-batch`). Records with the same header block share one dict: do not change it."""
    size = len(body)
    unpack = SEND_HEAD.unpack_from
    head = SEND_HEAD.size
    parsed: dict[bytes, dict[str, str]] = {}
    records: list[SendRecord] = []
    append = records.append
    at = 0
    while at < size:
        if at + head > size:
            raise ProtocolError(f"batched SEND body cut inside the header of message "
                                f"{len(records) + 1} (byte {at})")
        block_len, body_len = unpack(body, at)
        block_at = at + head
        body_at = block_at + block_len
        end = body_at + body_len
        if end > size:
            raise ProtocolError(f"batched SEND message {len(records) + 1} runs past the "
                                f"body ({end} > {size} bytes)")
        block = body[block_at:body_at]
        headers = parsed.get(block)
        if headers is None:
            headers = parsed[block] = parse_header_block(block)
        append((headers, body[body_at:end]))
        at = end
        if len(records) > count:
            break
    if len(records) != count:
        raise ProtocolError(f"batched SEND body packs {'more than ' if at < size else ''}"
                            f"{len(records)} messages, its {SEND_BATCH_HEADER} header says "
                            f"{count}")
    return records
