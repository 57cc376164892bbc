"""Many messages in one SEND (`pairmq-batch`, docs/stomp.md): what `send_batch` packs.

The server takes the frame's messages as a whole (held or refused together) and answers
the frame with one RECEIPT, so a producer with many small messages pays for one frame, one
receipt and one confirmation wait instead of one per message. The frame's producer stamp
numbers its messages (client/sequences.py): a frame resent after a failover repeats the
numbers, and the server drops each message it already has. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pairmq.client.errors import ClientError
from pairmq.protocol.batch import (
    MAX_SEND_BATCH,
    SEND_BATCH_HEADER,
    append_send_record,
    header_block,
)
from pairmq.protocol.stamps import STAMP_HEADERS, Stamp, write_stamp

BatchItem = bytes | str | tuple[bytes | str, dict[str, str] | None]
"""One message of a batch: a body, or (body, its own headers)."""

# Set on the frame only: a message's own headers may not name them.
FRAME_ONLY = frozenset({"destination", "receipt", "transaction", "content-length",
                        SEND_BATCH_HEADER})


def pack_batch(items: Iterable[BatchItem], headers: dict[str, str] | None, persistent: bool,
               new_dup_id: Callable[[], str] | None
               ) -> tuple[bytes, dict[str, str], tuple[str, ...]]:
    """(the SEND's body, its headers besides destination, the messages' dup-ids). With
    `new_dup_id` (inside a transaction) a persistent message without a dup-id gets one from
    it; otherwise the frame's producer stamp names the messages and only the application's
    own dup-ids are kept. `headers` apply to every message; each message's own win over
    them."""
    common = dict(headers or {})
    if "dup-id" in common:
        raise ClientError("send_batch: a dup-id names one message: give it in that "
                          "message's own headers, not in the batch's")
    parts: list[bytes | memoryview] = []
    dup_ids: list[str] = []
    count = 0
    for item in items:
        if isinstance(item, tuple):
            body, own = item
        else:
            body, own = item, None
        data = body.encode() if isinstance(body, str) else body
        pairs = dict(own) if own else {}
        clash = FRAME_ONLY.intersection(pairs)
        if clash:
            raise ClientError(f"send_batch: message {count + 1} sets {sorted(clash)}, which "
                              "only the frame may set")
        clash = STAMP_HEADERS.intersection(pairs)
        if clash:
            raise ClientError(f"send_batch: message {count + 1} sets {sorted(clash)}: a "
                              "batch's producer stamp is on the frame")
        if persistent:
            dup_id = pairs.get("dup-id")
            if dup_id is None and new_dup_id is not None:
                dup_id = pairs["dup-id"] = new_dup_id()
            if dup_id is not None:
                dup_ids.append(dup_id)
        append_send_record(parts, header_block(pairs.items()), data)
        count += 1
    if not 1 <= count <= MAX_SEND_BATCH:
        raise ClientError(f"send_batch: a batch holds 1 to {MAX_SEND_BATCH} messages, "
                          f"got {count}")
    common[SEND_BATCH_HEADER] = str(count)
    return b"".join(parts), common, tuple(dup_ids)


class BatchBuilder:
    """A batched SEND's body built message by message, for a producer that numbers its
    messages itself (the Spark sink: producer `{query}:{partition}`, epoch the micro-batch,
    numbers the rows of the task's input from 0, the same on every attempt). Each `take()`
    is one frame stamped with the number of its first message; the next frame goes on from
    there. `take()` hands the body and its headers to `send_async`."""

    def __init__(self, producer: str, epoch: int = 0, first: int = 0) -> None:
        self.producer = producer
        self.epoch = epoch
        self.next = first  # the number of the next message added
        self._parts: list[bytes | memoryview] = []
        self.count = 0  # messages packed since the last take()
        self.size = 0  # bytes packed since the last take()

    def add(self, body: bytes, headers: dict[str, str] | None = None) -> None:
        """One message, with its own headers (if any)."""
        block = header_block(headers.items()) if headers else b""
        append_send_record(self._parts, block, body)
        self.count += 1
        self.size += len(block) + len(body)

    def take(self) -> tuple[bytes, dict[str, str]]:
        """(the SEND's body, its headers) for what was added since the last take."""
        if not 1 <= self.count <= MAX_SEND_BATCH:
            raise ClientError(f"a batch holds 1 to {MAX_SEND_BATCH} messages, got "
                              f"{self.count}")
        headers = {SEND_BATCH_HEADER: str(self.count)}
        write_stamp(headers, Stamp(self.producer, self.epoch, self.next))
        body = b"".join(self._parts)
        self.next += self.count
        self._parts = []
        self.count = self.size = 0
        return body, headers
