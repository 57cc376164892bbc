"""Journal record encoding: compact, length-prefixed, typed, checksummed, versioned.

A physical record is one atomic group of entries (everything one broker command
changed), so a transaction's sends and acks, or a dead-letter move, are replayed
all or nothing:

    u32 payload length | u32 crc32(seq, epoch, kind, payload) | u64 seq | u32 epoch | u8 kind
    | payload

The epoch is the pair's epoch when the record was written: a backup compares
(epoch, sequence) histories to know whether its journal is a prefix of the active's.

The payload of kind BATCH is a sequence of entries, each a u8 entry type followed
by its fields. Strings are u32 length + UTF-8, bytes are u32 length + raw; a
message's id, destination, header count, headers and queues are one UTF-8 block of
newline-separated fields (backslash-escaped only when a value needs it), decoded
with one split: recovery of a million messages must take seconds, not minutes.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import ItemsView, Iterator, Mapping
from typing import Final

FORMAT_VERSION: Final = 1
SEGMENT_MAGIC: Final = b"PMQJ"
SEGMENT_HEADER: Final = struct.Struct("<4sHHI")  # magic, format version, reserved, segment id
RECORD_HEADER: Final = struct.Struct("<IIQIB")  # length, crc, seq, epoch, kind
CRC_PART: Final = struct.Struct("<QIB")
CRC_FROM: Final = 8  # the checksum covers the header from here (seq, epoch, kind) and the payload

KIND_BATCH: Final = 1

# Entry types inside a batch.
ADD: Final = 1  # a persistent message enters one or more durable queues
DEL: Final = 2  # it leaves one queue (acknowledged, expired, moved)
DELIVERED: Final = 3  # handed to a consumer (so recovery marks it redelivered)
DURABLE: Final = 4  # a durable topic subscription is created
UNDURABLE: Final = 5  # ... or deleted
DEST: Final = 6  # a destination created at run time
DUP: Final = 7  # a duplicate id accepted for a destination
EPOCH: Final = 8  # the pair's epoch changed: this server became active with it
DUPS: Final = 9  # a destination's whole dup-id cache, oldest first (written by compaction)
GROUP: Final = 10  # a stream's consumer group processed every offset below this one
PRODUCER: Final = 11  # a producer's messages to a destination are taken up to a sequence number
DEL_ORDER: Final = 12  # DEL naming the message's enqueue order too (a paged message has no id in
#                 memory, store/pages.py); decoded as (DEL, queue, id, order), a plain DEL
#                 (older journals) as (DEL, queue, id, -1)
DELIVERED_ORDER: Final = 13  # DELIVERED with the order too: (DELIVERED, queue, id, count, order)
USER: Final = 14  # a user added or changed at run time: (USER, name, password hash, [roles])
UNUSER: Final = 15  # ... or removed: (UNUSER, name)
RULE: Final = 16  # a permission rule set at run time: (RULE, pattern, ((permission, roles), ...))
UNRULE: Final = 17  # ... or removed: (UNRULE, pattern)
UNDEST: Final = 18  # an empty, unused destination is deleted: (UNDEST, destination)
DEST_ARGS: Final = 19  # a queue made with x- arguments (core/broker/configured.py): decoded as
#                 (DEST, destination, settings), a plain DEST as (DEST, destination)
# A COMMIT applied in slices (core/broker/committing.py), named by its key (u64):
TX_SEND: Final = 20  # one of its sends: (TX_SEND, key, destination, headers, body)
TX_END: Final = 21  # decided, every send above journaled: (TX_END, key, sends)
TX_DONE: Final = 22  # its first `routed` sends are routed: (TX_DONE, key, routed)
TX_DROP: Final = 23  # never decided; its sends mean nothing: (TX_DROP, key)

_U8: Final = struct.Struct("<B")
U32: Final = struct.Struct("<I")
U64: Final = struct.Struct("<Q")
U8_U32: Final = struct.Struct("<BI")  # packed: no padding with "<"
U32_U64: Final = struct.Struct("<IQ")
# type, order, expires, priority, persistent, deliveries
ADD_FIXED: Final = struct.Struct("<BQQBBI")


# What decoding damaged bytes raises: turned into CorruptRecord (or JournalCorrupt).
BAD_BYTES: Final = (struct.error, UnicodeDecodeError, IndexError, ValueError, TypeError)


class CorruptRecord(Exception):
    """A record whose bytes do not decode; the caller decides torn tail or corruption."""


def _s(value: str) -> bytes:
    raw = value.encode()
    return U32.pack(len(raw)) + raw


_UNESCAPE: Final = re.compile(r"\\(.)", re.DOTALL)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _unescape(value: str) -> str:
    return _UNESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def encode_meta(message_id: str, destination: str, headers: Mapping[str, str],
                queues: list[str]) -> bytes:
    parts = [message_id, destination, str(len(headers))]
    for name, value in headers.items():
        parts.append(name)
        parts.append(value)
    parts.extend(queues)
    text = "\n".join(parts)
    if "\\" in text or text.count("\n") != len(parts) - 1:
        text = "\n".join(_escape(part) for part in parts)
    return text.encode()


class PackedHeaders(Mapping[str, str]):
    """A recovered message's headers, still in their journal form: decoded on first use
    (its first delivery), because a start must not build a million dicts it may never
    need, and the text is smaller than the dict."""

    __slots__ = ("_headers", "_text")

    def __init__(self, text: str) -> None:
        self._text = text  # the whole metadata block (see decode_meta)
        self._headers: dict[str, str] | None = None

    def _decoded(self) -> dict[str, str]:
        headers = self._headers
        if headers is None:
            headers = self._headers = decode_meta(self._text)[2]
            self._text = ""
        return headers

    def __getitem__(self, name: str) -> str:
        return self._decoded()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._decoded())

    def __len__(self) -> int:
        return len(self._decoded())

    def items(self) -> ItemsView[str, str]:
        return self._decoded().items()

    def __repr__(self) -> str:
        return repr(self._decoded())


def decode_meta(text: str) -> tuple[str, str, dict[str, str], list[str]]:
    parts = text.split("\n")
    if "\\" in text:
        parts = [_unescape(part) for part in parts]
    count = int(parts[2])
    pairs = iter(parts[3:3 + 2 * count])
    headers = dict(zip(pairs, pairs, strict=True))
    return parts[0], parts[1], headers, parts[3 + 2 * count:]


def decode_meta_lazily(text: str) -> tuple[str, str, Mapping[str, str], list[str]]:
    """`decode_meta`, the headers left packed (`PackedHeaders`) in the common case: a
    recovery reads a million of them and delivers few soon."""
    parts = text.split("\n")
    count = int(parts[2])
    if "\\" in text or len(parts) <= 3 + 2 * count:  # escapes (rare) or no queue: now
        return decode_meta(text)
    return parts[0], parts[1], PackedHeaders(text), parts[3 + 2 * count:]


def encode_add(order: int, message_id: str, destination: str, priority: int, expires: int,
               persistent: bool, deliveries: int, headers: Mapping[str, str], body: bytes,
               queues: list[str]) -> tuple[bytes, int]:
    """Returns the entry and the offset of the body inside it (for paging)."""
    meta = encode_meta(message_id, destination, headers, queues)
    head = b"".join((ADD_FIXED.pack(ADD, order, expires, priority, persistent, deliveries),
                     U32.pack(len(meta)), meta, U32.pack(len(body))))
    return head + body, len(head)


def encode_del(queue: str, message_id: str, order: int) -> bytes:
    # _s(queue), _s(message_id) written out: two of these per message acknowledged
    q = queue.encode()
    m = message_id.encode()
    return b"".join((U8_U32.pack(DEL_ORDER, len(q)), q, U32.pack(len(m)), m,
                     U64.pack(order)))


def encode_delivered(queue: str, message_id: str, deliveries: int, order: int) -> bytes:
    q = queue.encode()
    m = message_id.encode()
    return b"".join((U8_U32.pack(DELIVERED_ORDER, len(q)), q, U32.pack(len(m)), m,
                     U32_U64.pack(deliveries, order)))


_ADD_BEFORE_META: Final = 1 + 8 + 8 + 1 + 1 + 4 + 4  # ADD_FIXED, then the metadata's length
# What a message counts (body + metadata + 64, as recovery sizes it) over its entry's length
ADD_SIZE_OVER_ENTRY: Final = 64 - _ADD_BEFORE_META - 4


def add_span(body_offset: int, body_length: int, meta_length: int) -> tuple[int, int]:
    """(start, length) of an ADD entry in its payload, from where its body lies."""
    start = body_offset - 4 - meta_length - _ADD_BEFORE_META
    return start, body_offset + body_length - start


def encode_durable(key: str, topic: str) -> bytes:
    return b"".join((_U8.pack(DURABLE), _s(key), _s(topic)))


def encode_undurable(key: str) -> bytes:
    return _U8.pack(UNDURABLE) + _s(key)


def encode_user(name: str, password: str, roles: tuple[str, ...]) -> bytes:
    return b"".join((_U8.pack(USER), _s(name), _s(password), U32.pack(len(roles)),
                     *(_s(role) for role in roles)))


def encode_unuser(name: str) -> bytes:
    return _U8.pack(UNUSER) + _s(name)


def encode_undest(destination: str) -> bytes:
    return _U8.pack(UNDEST) + _s(destination)


def encode_rule(pattern: str, grants: tuple[tuple[str, tuple[str, ...]], ...]) -> bytes:
    parts = [_U8.pack(RULE), _s(pattern), U32.pack(len(grants))]
    for permission, roles in grants:
        parts += [_s(permission), U32.pack(len(roles)), *(_s(role) for role in roles)]
    return b"".join(parts)


def encode_unrule(pattern: str) -> bytes:
    return _U8.pack(UNRULE) + _s(pattern)


def encode_dest(destination: str, settings: str = "") -> bytes:
    if settings:
        return _U8.pack(DEST_ARGS) + _s(destination) + _s(settings)
    return _U8.pack(DEST) + _s(destination)


def encode_dup(destination: str, dup_id: str) -> bytes:
    return b"".join((_U8.pack(DUP), _s(destination), _s(dup_id)))


def encode_dups(destination: str, dup_ids: list[str]) -> bytes:
    return b"".join((_U8.pack(DUPS), _s(destination), U32.pack(len(dup_ids)),
                     *(_s(i) for i in dup_ids)))


def encode_group(stream: str, group: str, offset: int) -> bytes:
    return b"".join((_U8.pack(GROUP), _s(stream), _s(group), U64.pack(offset)))


PRODUCER_NUMBERS: Final = struct.Struct("<QQQ")  # epoch, seq, ms


def encode_producer(destination: str, producer: str, epoch: int, seq: int, seen: int
                    ) -> bytes:
    return b"".join((_U8.pack(PRODUCER), _s(destination), _s(producer),
                     PRODUCER_NUMBERS.pack(epoch, seq, seen)))


def encode_epoch(epoch: int) -> bytes:
    return _U8.pack(EPOCH) + U32.pack(epoch)


KEY_COUNT: Final = struct.Struct("<BQI")  # entry type, commit key, a count


def encode_tx_send(key: int, destination: str, headers: Mapping[str, str], body: bytes
                   ) -> bytes:
    parts = [_U8.pack(TX_SEND), U64.pack(key), _s(destination), U32.pack(len(headers))]
    for name, value in headers.items():
        parts.append(_s(name))
        parts.append(_s(value))
    parts.append(U32.pack(len(body)))
    parts.append(body)
    return b"".join(parts)


def encode_tx_end(key: int, sends: int) -> bytes:
    return KEY_COUNT.pack(TX_END, key, sends)


def encode_tx_done(key: int, routed: int) -> bytes:
    return KEY_COUNT.pack(TX_DONE, key, routed)


def encode_tx_drop(key: int) -> bytes:
    return _U8.pack(TX_DROP) + U64.pack(key)


def frame_record(seq: int, epoch: int, payload: bytes, kind: int = KIND_BATCH) -> bytes:
    crc = zlib.crc32(payload, zlib.crc32(CRC_PART.pack(seq, epoch, kind)))
    return RECORD_HEADER.pack(len(payload), crc, seq, epoch, kind) + payload
