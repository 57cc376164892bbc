"""What RabbitMQ's STOMP users write, read as pairmq understands it (issue 23): the
`/amq/queue/NAME` destination and the `requeue` header of a NACK. Pure.

`/amq/queue/NAME` is how RabbitMQ's STOMP plugin names an existing queue, and the only way
its documentation subscribes to a stream (with `x-queue-type: stream`). pairmq has one
name per kind instead (`/queue/NAME`, `/stream/NAME`), so `/amq/queue/NAME` stands for:

- the stream `/stream/NAME` when a SUBSCRIBE says `x-queue-type: stream` (the stream is
  made if it is new, as a SUBSCRIBE to `/stream/NAME` makes it), or when that stream
  exists (a SEND appends to it, a SUBSCRIBE reads it, as RabbitMQ publishes to and
  consumes from the queue of that name, whatever its type);
- the queue `/queue/NAME` otherwise (made on first use, as every pairmq queue is; RabbitMQ
  would refuse a queue that does not exist).

The name is translated before anything else looks at the frame, so permissions, limits
and the delivered MESSAGE frames know one destination: a MESSAGE from the stream carries
`destination:/stream/NAME` whichever name its sender or subscriber used (RabbitMQ too
writes `/queue/NAME` on a MESSAGE whatever the SEND used).
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Final

from pairmq.core.errors import CoreError

AMQ_QUEUE_PREFIX: Final = "/amq/queue/"
QUEUE_TYPE: Final = "x-queue-type"
REQUEUE: Final = "requeue"


def amq_target(destination: str, headers: Mapping[str, str], streams: Container[str],
               subscribe: bool = False) -> str:
    """The pairmq destination that `/amq/queue/NAME` names (any other is returned as it
    is). `streams`: the names (`/stream/NAME`) of the streams that exist."""
    if not destination.startswith(AMQ_QUEUE_PREFIX):
        return destination
    name = destination[len(AMQ_QUEUE_PREFIX):]
    if not name:
        raise CoreError(f"destination {destination!r} has no name after {AMQ_QUEUE_PREFIX!r}")
    stream = f"/stream/{name}"
    if (subscribe and headers.get(QUEUE_TYPE) == "stream") or stream in streams:
        return stream
    return f"/queue/{name}"


def requeue_of(headers: Mapping[str, str]) -> bool:
    """A NACK's `requeue` header (RabbitMQ): false sends the message to its dead-letter
    destination rather than back to its queue; true, or no header, returns it."""
    value = headers.get(REQUEUE)
    if value is None or value == "true":
        return True
    if value == "false":
        return False
    raise CoreError(f"{REQUEUE} must be true or false, got {value[:40]!r}")
