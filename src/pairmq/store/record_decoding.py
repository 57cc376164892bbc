"""Journal record decoding: a record's payload back into entries (records.py writes them).

Recovery reads a million messages through these, and a backup every record its active
sends: the paths a journal is mostly made of (a record of ADDs, a record of
acknowledgements, a lone ADD) each have a decoder of their own that skips the general
loop of `decode_entries`. Split from records.py, which holds the format and its encoders.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pairmq.store.records import (
    ADD,
    ADD_FIXED,
    BAD_BYTES,
    DEL,
    DEL_ORDER,
    DELIVERED,
    DELIVERED_ORDER,
    DEST,
    DEST_ARGS,
    DUP,
    DUPS,
    DURABLE,
    EPOCH,
    GROUP,
    KEY_COUNT,
    PRODUCER,
    PRODUCER_NUMBERS,
    RULE,
    TX_DONE,
    TX_DROP,
    TX_END,
    TX_SEND,
    U8_U32,
    U32,
    U32_U64,
    U64,
    UNDEST,
    UNDURABLE,
    UNRULE,
    UNUSER,
    USER,
    CorruptRecord,
    decode_meta_lazily,
)


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
    (body_length,) = U32.unpack_from(buf, body_len_at)
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
    head, u32, head_size = _ADD_HEAD.unpack_from, U32.unpack_from, _ADD_HEAD.size
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
    etype, n = U8_U32.unpack_from(buf, pos)
    queue = str(buf[pos + 5:pos + 5 + n], "utf-8")
    pos += 5 + n
    (n,) = U32.unpack_from(buf, pos)
    message_id = str(buf[pos + 4:pos + 4 + n], "utf-8")
    pos += 4 + n
    if etype == DEL_ORDER:
        (order,) = U64.unpack_from(buf, pos)
        out.append((adds_before, (DEL, queue, message_id, 0, order)))
        return pos + 8
    count, order = U32_U64.unpack_from(buf, pos)
    out.append((adds_before, (DELIVERED, queue, message_id, count, order)))
    return pos + 12


def _decode_producer(buf: memoryview, pos: int, out: list[DecodedEntry]) -> int:
    """One PRODUCER entry at `pos` into `out`; returns where the next entry starts."""
    u32 = U32.unpack_from
    pos += 1
    (n,) = u32(buf, pos)
    destination = str(buf[pos + 4:pos + 4 + n], "utf-8")
    pos += 4 + n
    (n,) = u32(buf, pos)
    producer = str(buf[pos + 4:pos + 4 + n], "utf-8")
    pos += 4 + n
    if pos + PRODUCER_NUMBERS.size > len(buf):
        raise CorruptRecord("a producer entry runs past the end of its record")
    epoch, seq, seen = PRODUCER_NUMBERS.unpack_from(buf, pos)
    out.append((PRODUCER, destination, producer, epoch, seq, seen))
    return pos + PRODUCER_NUMBERS.size


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
    head, u32, u64, u32_u64 = (U8_U32.unpack_from, U32.unpack_from, U64.unpack_from,
                               U32_U64.unpack_from)
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
    u32 = U32.unpack_from

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
                _, order, expires, priority, persistent, deliveries = ADD_FIXED.unpack_from(
                    buf, pos)
                pos += ADD_FIXED.size
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
                (order,) = U64.unpack_from(buf, pos)
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
                (order,) = U64.unpack_from(buf, pos + 4)
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
                (offset,) = U64.unpack_from(buf, pos)
                pos += 8
                out.append((GROUP, stream, group, offset))
            elif etype == EPOCH:
                (epoch,) = u32(buf, pos + 1)
                pos += 5
                out.append((EPOCH, epoch))
            elif etype == PRODUCER:
                pos = _decode_producer(buf, pos, out)
            elif etype == TX_SEND:
                (tx_key,) = U64.unpack_from(buf, pos + 1)  # an int (DURABLE's key: a str)
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
                _, tx_key, count = KEY_COUNT.unpack_from(buf, pos)
                pos += KEY_COUNT.size
                out.append((etype, tx_key, count))
            elif etype == TX_DROP:
                (tx_key,) = U64.unpack_from(buf, pos + 1)
                pos += 9
                out.append((TX_DROP, tx_key))
            else:
                raise CorruptRecord(f"unknown entry type {etype}")
    except BAD_BYTES as e:
        raise CorruptRecord(str(e)) from None
    if pos != end:
        raise CorruptRecord("entries do not fill their record")
    return out
