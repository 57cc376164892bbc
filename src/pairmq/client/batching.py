"""Many messages in one SEND (`pairmq-batch`, docs/stomp.md): what `send_batch` packs.

The server takes the frame's messages as a whole (held or refused together) and answers
the frame with one RECEIPT, so a producer with many small messages pays for one frame, one
receipt and one confirmation wait instead of one per message. Each persistent message
keeps its own dup-id, fixed here once: a frame resent after a failover repeats them, and
the server drops each message it already has. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pairmq.client.errors import ClientError
from pairmq.protocol.batch import (
    MAX_SEND_BATCH,
    SEND_BATCH_HEADER,
    append_send_record,
    escape_value,
    header_block,
)

BatchItem = bytes | str | tuple[bytes | str, dict[str, str] | None]
"""One message of a batch: a body, or (body, its own headers)."""

# Set on the frame only: a message's own headers may not name them.
FRAME_ONLY = frozenset({"destination", "receipt", "transaction", "content-length",
                        SEND_BATCH_HEADER})


def pack_batch(items: Iterable[BatchItem], headers: dict[str, str] | None, persistent: bool,
               new_dup_id: Callable[[], str]) -> tuple[bytes, dict[str, str], tuple[str, ...]]:
    """(the SEND's body, its headers besides destination, the messages' dup-ids). A
    persistent message without a dup-id gets one from `new_dup_id`. `headers` apply to
    every message; each message's own win over them."""
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
        if persistent:
            dup_id = pairs.get("dup-id") or new_dup_id()
            pairs["dup-id"] = dup_id
            dup_ids.append(dup_id)
        append_send_record(parts, header_block(pairs.items()), data)
        count += 1
    if not 1 <= count <= MAX_SEND_BATCH:
        raise ClientError(f"send_batch: a batch holds 1 to {MAX_SEND_BATCH} messages, "
                          f"got {count}")
    common[SEND_BATCH_HEADER] = str(count)
    return b"".join(parts), common, tuple(dup_ids)


class BatchBuilder:
    """A batched SEND's body built message by message, for a producer that names its
    messages itself: each dup-id is `prefix` then the message's own suffix (the Spark sink:
    `{query}:{batch}:{partition}:` then the row). Cheap for a message whose only header is
    its dup-id. `take()` hands the body and its headers (`pairmq-batch`) to `send_async`."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._escaped = escape_value(prefix)
        self._parts: list[bytes | memoryview] = []
        self.count = 0  # messages packed since the last take()
        self.size = 0  # bytes packed since the last take()

    def add(self, body: bytes, suffix: int | str, headers: dict[str, str] | None = None
            ) -> None:
        """One message; `headers` (its own, if any) get its dup-id and are changed."""
        if headers:
            headers["dup-id"] = f"{self.prefix}{suffix}"
            block = header_block(headers.items())
        else:
            block = f"dup-id:{self._escaped}{suffix}\n".encode()
        append_send_record(self._parts, block, body)
        self.count += 1
        self.size += len(block) + len(body)

    def take(self) -> tuple[bytes, dict[str, str]]:
        """(the SEND's body, its headers) for what was added since the last take."""
        if not 1 <= self.count <= MAX_SEND_BATCH:
            raise ClientError(f"a batch holds 1 to {MAX_SEND_BATCH} messages, got "
                              f"{self.count}")
        body, headers = b"".join(self._parts), {SEND_BATCH_HEADER: str(self.count)}
        self._parts = []
        self.count = self.size = 0
        return body, headers
