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
from collections.abc import Callable, ItemsView, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

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
_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")
_U8_U32: Final = struct.Struct("<BI")  # packed: no padding with "<"
_U32_U64: Final = struct.Struct("<IQ")
# type, order, expires, priority, persistent, deliveries
_ADD_FIXED: Final = struct.Struct("<BQQBBI")


# What decoding damaged bytes raises: turned into CorruptRecord (or JournalCorrupt).
BAD_BYTES: Final = (struct.error, UnicodeDecodeError, IndexError, ValueError, TypeError)


class CorruptRecord(Exception):
    """A record whose bytes do not decode; the caller decides torn tail or corruption."""


def _s(value: str) -> bytes:
    raw = value.encode()
    return _U32.pack(len(raw)) + raw


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
    head = b"".join((_ADD_FIXED.pack(ADD, order, expires, priority, persistent, deliveries),
                     _U32.pack(len(meta)), meta, _U32.pack(len(body))))
    return head + body, len(head)


def encode_del(queue: str, message_id: str, order: int) -> bytes:
    # _s(queue), _s(message_id) written out: two of these per message acknowledged
    q = queue.encode()
    m = message_id.encode()
    return b"".join((_U8_U32.pack(DEL_ORDER, len(q)), q, _U32.pack(len(m)), m,
                     _U64.pack(order)))


def encode_delivered(queue: str, message_id: str, deliveries: int, order: int) -> bytes:
    q = queue.encode()
    m = message_id.encode()
    return b"".join((_U8_U32.pack(DELIVERED_ORDER, len(q)), q, _U32.pack(len(m)), m,
                     _U32_U64.pack(deliveries, order)))


_ADD_BEFORE_META: Final = 1 + 8 + 8 + 1 + 1 + 4 + 4  # _ADD_FIXED, then the metadata's length
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
    return b"".join((_U8.pack(USER), _s(name), _s(password), _U32.pack(len(roles)),
                     *(_s(role) for role in roles)))


def encode_unuser(name: str) -> bytes:
    return _U8.pack(UNUSER) + _s(name)


def encode_undest(destination: str) -> bytes:
    return _U8.pack(UNDEST) + _s(destination)


def encode_rule(pattern: str, grants: tuple[tuple[str, tuple[str, ...]], ...]) -> bytes:
    parts = [_U8.pack(RULE), _s(pattern), _U32.pack(len(grants))]
    for permission, roles in grants:
        parts += [_s(permission), _U32.pack(len(roles)), *(_s(role) for role in roles)]
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
    return b"".join((_U8.pack(DUPS), _s(destination), _U32.pack(len(dup_ids)),
                     *(_s(i) for i in dup_ids)))


def encode_group(stream: str, group: str, offset: int) -> bytes:
    return b"".join((_U8.pack(GROUP), _s(stream), _s(group), _U64.pack(offset)))


_PRODUCER_NUMBERS: Final = struct.Struct("<QQQ")  # epoch, seq, ms


def encode_producer(destination: str, producer: str, epoch: int, seq: int, seen: int
                    ) -> bytes:
    return b"".join((_U8.pack(PRODUCER), _s(destination), _s(producer),
                     _PRODUCER_NUMBERS.pack(epoch, seq, seen)))


def encode_epoch(epoch: int) -> bytes:
    return _U8.pack(EPOCH) + _U32.pack(epoch)


_KEY_COUNT: Final = struct.Struct("<BQI")  # entry type, commit key, a count


def encode_tx_send(key: int, destination: str, headers: Mapping[str, str], body: bytes
                   ) -> bytes:
    parts = [_U8.pack(TX_SEND), _U64.pack(key), _s(destination), _U32.pack(len(headers))]
    for name, value in headers.items():
        parts.append(_s(name))
        parts.append(_s(value))
    parts.append(_U32.pack(len(body)))
    parts.append(body)
    return b"".join(parts)


def encode_tx_end(key: int, sends: int) -> bytes:
    return _KEY_COUNT.pack(TX_END, key, sends)


def encode_tx_done(key: int, routed: int) -> bytes:
    return _KEY_COUNT.pack(TX_DONE, key, routed)


def encode_tx_drop(key: int) -> bytes:
    return _U8.pack(TX_DROP) + _U64.pack(key)


def frame_record(seq: int, epoch: int, payload: bytes, kind: int = KIND_BATCH) -> bytes:
    crc = zlib.crc32(payload, zlib.crc32(CRC_PART.pack(seq, epoch, kind)))
    return RECORD_HEADER.pack(len(payload), crc, seq, epoch, kind) + payload


@dataclass(slots=True, init=False)
class AddEntry:
    """One decoded ADD (its `__init__` written out for the compiled build, as Message's)."""

    order: int
    message_id: str
    destination: str
    priority: int
    expires: int
    persistent: bool
    deliveries: int
    headers: Mapping[str, str]  # PackedHeaders when read from a journal
    queues: list[str]
    body: bytes | None  # None when decoded without bodies
    body_offset: int  # offset of the body inside the payload, for paging
    body_length: int
    meta_length: int  # bytes of id, destination and headers: sizes the message cheaply

    def __init__(self, order: int, message_id: str, destination: str, priority: int,
                 expires: int, persistent: bool, deliveries: int, headers: Mapping[str, str],
                 queues: list[str], body: bytes | None, body_offset: int, body_length: int,
                 meta_length: int) -> None:
        self.order = order
        self.message_id = message_id
        self.destination = destination
        self.priority = priority
        self.expires = expires
        self.persistent = persistent
        self.deliveries = deliveries
        self.headers = headers
        self.queues = queues
        self.body = body
        self.body_offset = body_offset
        self.body_length = body_length
        self.meta_length = meta_length


_ADD_HEAD: Final = struct.Struct("<BQQBBII")  # the fixed part, then the metadata's length

# One decoded entry: (ADD, AddEntry), (DEL, queue, id, order), ... (`decode_entries`)
DecodedEntry = tuple[Any, ...]
# One message added, its headers left packed (`decode_lone_add`, `decode_adds`): order,
# expires, priority, persistent, deliveries, message id, destination, headers, queues, body
# offset, body length, metadata length
LoneAdd = tuple[int, int, int, int, int, str, str, Mapping[str, str], list[str], int, int, int]
AckEntry = tuple[int, str, str, int, int]  # (DEL or DELIVERED, queue, id, count, order)


def decode_lone_add(buf: memoryview) -> LoneAdd | None:
    """The common record, one message added, decoded without the general loop or an
    AddEntry, its headers left packed: (order, expires, priority, persistent, deliveries,
    message id, destination, PackedHeaders, queues, body offset, body length, metadata
    length), or None when other entries follow. Raises BAD_BYTES on damaged bytes."""
    _, order, expires, priority, persistent, deliveries, n = _ADD_HEAD.unpack_from(buf, 0)
    body_len_at = _ADD_HEAD.size + n
    (body_length,) = _U32.unpack_from(buf, body_len_at)
    body_at = body_len_at + 4
    if body_at + body_length != len(buf):
        return None
    message_id, destination, headers, queues = decode_meta_lazily(
        str(buf[_ADD_HEAD.size:body_len_at], "utf-8"))
    return (order, expires, priority, persistent, deliveries, message_id, destination, headers,
            queues, body_at, body_length, n)


def decode_adds(buf: memoryview, producers: list[DecodedEntry],
                acks: list[tuple[int, AckEntry]] | None = None) -> list[LoneAdd] | None:
    """A record made only of ADD entries (one SEND, or a group of them written together)
    and the PRODUCER entries of their producers, decoded without AddEntry objects and with
    headers left packed: one tuple per message, as `decode_lone_add` returns them (the
    PRODUCER entries appended to `producers`), or None when the record holds other entries
    (the general loop decodes it then). A recovery reads a million of these. Raises
    BAD_BYTES or CorruptRecord on damaged bytes.

    With `acks`, DEL_ORDER and DELIVERED_ORDER entries are read too, each appended as
    (how many ADDs came before it, its `decode_acks` tuple): a record of a turn in which
    messages were added and handed to a consumer at once, ADD and DELIVERED by turns,
    which a backup follows as fast as the active serves them."""
    end = len(buf)
    pos = 0
    out: list[LoneAdd] = []
    head, u32, head_size = _ADD_HEAD.unpack_from, _U32.unpack_from, _ADD_HEAD.size
    while pos < end:
        if buf[pos] != ADD:
            kind = buf[pos]
            if kind == PRODUCER:
                pos = _decode_producer(buf, pos, producers)
            elif acks is not None and kind in (DEL_ORDER, DELIVERED_ORDER):
                pos = _decode_ack(buf, pos, len(out), acks)
            else:
                return None
            continue
        _, order, expires, priority, persistent, deliveries, n = head(buf, pos)
        meta_at = pos + head_size
        body_len_at = meta_at + n
        if body_len_at + 4 > end:
            raise CorruptRecord("metadata runs past the end of its record")
        (body_length,) = u32(buf, body_len_at)
        body_at = body_len_at + 4
        pos = body_at + body_length
        if pos > end:
            raise CorruptRecord("body runs past the end of its record")
        message_id, destination, headers, queues = decode_meta_lazily(
            str(buf[meta_at:body_len_at], "utf-8"))
        out.append((order, expires, priority, persistent, deliveries, message_id, destination,
                    headers, queues, body_at, body_length, n))
    return out


def _decode_ack(buf: memoryview, pos: int, adds_before: int,
                out: list[tuple[int, AckEntry]]) -> int:
    """One DEL_ORDER or DELIVERED_ORDER entry at `pos` into `out`, as `decode_acks` reads
    it; returns where the next entry starts."""
    etype, n = _U8_U32.unpack_from(buf, pos)
    queue = str(buf[pos + 5:pos + 5 + n], "utf-8")
    pos += 5 + n
    (n,) = _U32.unpack_from(buf, pos)
    message_id = str(buf[pos + 4:pos + 4 + n], "utf-8")
    pos += 4 + n
    if etype == DEL_ORDER:
        (order,) = _U64.unpack_from(buf, pos)
        out.append((adds_before, (DEL, queue, message_id, 0, order)))
        return pos + 8
    count, order = _U32_U64.unpack_from(buf, pos)
    out.append((adds_before, (DELIVERED, queue, message_id, count, order)))
    return pos + 12


def _decode_producer(buf: memoryview, pos: int, out: list[DecodedEntry]) -> int:
    """One PRODUCER entry at `pos` into `out`; returns where the next entry starts."""
    u32 = _U32.unpack_from
    pos += 1
    (n,) = u32(buf, pos)
    destination = str(buf[pos + 4:pos + 4 + n], "utf-8")
    pos += 4 + n
    (n,) = u32(buf, pos)
    producer = str(buf[pos + 4:pos + 4 + n], "utf-8")
    pos += 4 + n
    if pos + _PRODUCER_NUMBERS.size > len(buf):
        raise CorruptRecord("a producer entry runs past the end of its record")
    epoch, seq, seen = _PRODUCER_NUMBERS.unpack_from(buf, pos)
    out.append((PRODUCER, destination, producer, epoch, seq, seen))
    return pos + _PRODUCER_NUMBERS.size


def _single_add(buf: memoryview, load_bodies: bool) -> AddEntry | None:
    fields = decode_lone_add(buf)
    if fields is None:
        return None  # more entries follow: the general loop handles it
    (order, expires, priority, persistent, deliveries, message_id, destination, headers, queues,
     body_at, body_length, meta_length) = fields
    body = bytes(buf[body_at:body_at + body_length]) if load_bodies else None
    return AddEntry(order, message_id, destination, priority, expires, bool(persistent),
                    deliveries, headers, queues, body, body_at, body_length, meta_length)


def decode_acks(buf: memoryview, held_below: Callable[[str], int] | None = None
                ) -> list[AckEntry] | None:
    """The other common record, acknowledgements and deliveries only (DEL_ORDER and
    DELIVERED_ORDER entries), in one loop: a start after consumers took a million paged
    messages replays two million such entries. A DEL's count is 0. None when the record
    holds any other kind (`decode_entries` then decodes it).

    With `held_below` (queue -> an order below which the queue holds nothing, asked once a
    queue per record), the entries of older messages are left out unread: most of a
    start's after a long drain, whose messages' segments were let go."""
    out: list[AckEntry] = []
    bounds: dict[str, int] = {}
    pos, end = 0, len(buf)
    if end and buf[0] != DEL_ORDER and buf[0] != DELIVERED_ORDER:
        return None  # before the copy: most records are not these
    # Only short strings and numbers: copied once into bytes, the record's strings are made
    # by bytes.decode, which the compiled build calls directly, at about half the cost of
    # str() over a memoryview's slice. (Not for ADD records: a large body would be copied
    # to save a string.)
    data = bytes(buf)
    head, u32, u64, u32_u64 = (_U8_U32.unpack_from, _U32.unpack_from, _U64.unpack_from,
                               _U32_U64.unpack_from)
    try:
        while pos < end:
            etype, n = head(data, pos)
            if etype != DEL_ORDER and etype != DELIVERED_ORDER:
                return None
            queue = data[pos + 5:pos + 5 + n].decode()
            pos += 5 + n
            (n,) = u32(data, pos)
            at = pos + 4
            pos = at + n
            if etype == DEL_ORDER:
                (order,) = u64(data, pos)
                pos += 8
                kind, count = DEL, 0
            else:
                count, order = u32_u64(data, pos)
                pos += 12
                kind = DELIVERED
            if held_below is not None:
                bound = bounds.get(queue)
                if bound is None:
                    bound = bounds[queue] = held_below(queue)
                if order < bound:
                    continue
            out.append((kind, queue, data[at:at + n].decode(), count, order))
    except BAD_BYTES as e:
        raise CorruptRecord(str(e)) from None
    if pos != end:
        raise CorruptRecord("an acknowledgement runs past the end of its record")
    return out


def decode_entries(payload: bytes | memoryview, load_bodies: bool = True
                   ) -> list[DecodedEntry]:
    """Decode a batch payload into tuples: (ADD, AddEntry), (DEL, queue, id, order), ..."""
    buf = memoryview(payload)
    end = len(buf)
    if end > _ADD_HEAD.size and buf[0] == ADD:
        try:
            single = _single_add(buf, load_bodies)
        except BAD_BYTES as e:
            raise CorruptRecord(str(e)) from None
        if single is not None:
            return [(ADD, single)]
    pos = 0
    out: list[DecodedEntry] = []
    u32 = _U32.unpack_from

    def string() -> str:
        nonlocal pos
        (n,) = u32(buf, pos)
        pos += 4
        if pos + n > end:
            raise CorruptRecord("string runs past the end of its record")
        value = str(buf[pos:pos + n], "utf-8")
        pos += n
        return value

    try:
        while pos < end:
            etype = buf[pos]
            if etype == ADD:
                _, order, expires, priority, persistent, deliveries = _ADD_FIXED.unpack_from(
                    buf, pos)
                pos += _ADD_FIXED.size
                (n,) = u32(buf, pos)
                meta_n = n
                pos += 4
                if pos + n > end:
                    raise CorruptRecord("metadata runs past the end of its record")
                message_id, destination, headers, queues = decode_meta_lazily(
                    str(buf[pos:pos + n], "utf-8"))
                pos += n
                (n,) = u32(buf, pos)
                pos += 4
                if pos + n > end:
                    raise CorruptRecord("body runs past the end of its record")
                body = bytes(buf[pos:pos + n]) if load_bodies else None
                out.append((ADD, AddEntry(order, message_id, destination, priority, expires,
                                          bool(persistent), deliveries, headers, queues, body,
                                          pos, n, meta_n)))
                pos += n
            elif etype == DEL_ORDER:
                pos += 1
                queue = string()
                message_id = string()
                (order,) = _U64.unpack_from(buf, pos)
                pos += 8
                out.append((DEL, queue, message_id, order))
            elif etype == DEL:
                pos += 1
                queue = string()
                out.append((DEL, queue, string(), -1))
            elif etype == DELIVERED:
                pos += 1
                queue = string()
                message_id = string()
                (count,) = u32(buf, pos)
                pos += 4
                out.append((DELIVERED, queue, message_id, count, -1))
            elif etype == DELIVERED_ORDER:
                pos += 1
                queue = string()
                message_id = string()
                (count,) = u32(buf, pos)
                (order,) = _U64.unpack_from(buf, pos + 4)
                pos += 12
                out.append((DELIVERED, queue, message_id, count, order))
            elif etype == DURABLE:
                pos += 1
                key = string()
                out.append((DURABLE, key, string()))
            elif etype == UNDURABLE:
                pos += 1
                out.append((UNDURABLE, string()))
            elif etype == DEST:
                pos += 1
                out.append((DEST, string()))
            elif etype == DEST_ARGS:
                pos += 1
                destination = string()
                out.append((DEST, destination, string()))
            elif etype == USER:
                pos += 1
                name = string()
                password = string()
                (count,) = u32(buf, pos)
                pos += 4
                out.append((USER, name, password, tuple(string() for _ in range(count))))
            elif etype == UNUSER:
                pos += 1
                out.append((UNUSER, string()))
            elif etype == UNDEST:
                pos += 1
                out.append((UNDEST, string()))
            elif etype == RULE:
                pos += 1
                pattern = string()
                (count,) = u32(buf, pos)
                pos += 4
                grants = []
                for _ in range(count):
                    permission = string()
                    (roles,) = u32(buf, pos)
                    pos += 4
                    grants.append((permission, tuple(string() for _ in range(roles))))
                out.append((RULE, pattern, tuple(grants)))
            elif etype == UNRULE:
                pos += 1
                out.append((UNRULE, string()))
            elif etype == DUP:
                pos += 1
                destination = string()
                out.append((DUP, destination, string()))
            elif etype == DUPS:
                pos += 1
                destination = string()
                (count,) = u32(buf, pos)
                pos += 4
                out.append((DUPS, destination, [string() for _ in range(count)]))
            elif etype == GROUP:
                pos += 1
                stream = string()
                group = string()
                (offset,) = _U64.unpack_from(buf, pos)
                pos += 8
                out.append((GROUP, stream, group, offset))
            elif etype == EPOCH:
                (epoch,) = u32(buf, pos + 1)
                pos += 5
                out.append((EPOCH, epoch))
            elif etype == PRODUCER:
                pos = _decode_producer(buf, pos, out)
            elif etype == TX_SEND:
                (tx_key,) = _U64.unpack_from(buf, pos + 1)  # an int (DURABLE's key: a str)
                pos += 9
                destination = string()
                (count,) = u32(buf, pos)
                pos += 4
                headers = {}
                for _ in range(count):
                    name = string()
                    headers[name] = string()
                (n,) = u32(buf, pos)
                pos += 4
                if pos + n > end:
                    raise CorruptRecord("body runs past the end of its record")
                out.append((TX_SEND, tx_key, destination, headers, bytes(buf[pos:pos + n])))
                pos += n
            elif etype in (TX_END, TX_DONE):
                _, tx_key, count = _KEY_COUNT.unpack_from(buf, pos)
                pos += _KEY_COUNT.size
                out.append((etype, tx_key, count))
            elif etype == TX_DROP:
                (tx_key,) = _U64.unpack_from(buf, pos + 1)
                pos += 9
                out.append((TX_DROP, tx_key))
            else:
                raise CorruptRecord(f"unknown entry type {etype}")
    except BAD_BYTES as e:
        raise CorruptRecord(str(e)) from None
    if pos != end:
        raise CorruptRecord("entries do not fill their record")
    return out
