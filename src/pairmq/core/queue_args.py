"""RabbitMQ's queue arguments (`x-` headers of a SUBSCRIBE) read as pairmq per-queue
settings (docs/stomp.md, "Queue arguments"). Pure: headers in, a frozen value or a
CoreError naming the header and its value out.

A SUBSCRIBE that creates a `/queue/` destination configures it with what these headers say
(core/broker/configured.py applies them); a queue that exists keeps its settings. What maps onto
pairmq:

- `x-max-length: N` (waiting messages) and `x-max-length-bytes: B` (pairmq counts a
  message's body, headers and 64 bytes until it is acknowledged, as `max_size_bytes`
  does): the queue's limits; `x-max-length-bytes` is its `max_size_bytes`;
- `x-overflow`: what happens past them. `drop-head` (RabbitMQ's default once a limit is
  set) drops the oldest waiting messages, dead-lettered when the queue names a
  dead-letter destination, else discarded; `reject-publish` is address_full_policy
  `fail` (the SEND gets an ERROR);
- `x-message-ttl: MS`: a message sent to the queue expires MS after it came (or at its own
  `expires`, whichever is first);
- `x-dead-letter-exchange: ""` (RabbitMQ's default exchange, which routes by queue name)
  with `x-dead-letter-routing-key: Q`: dead letters of the queue go to `/queue/Q` rather
  than `/queue/DLQ.NAME`.

Refused with an ERROR (pairmq has nothing that behaves so): another dead-letter exchange
(pairmq has no exchanges), `x-overflow: reject-publish-dlx`, `reject-publish` with
`x-max-length` (pairmq refuses SENDs by bytes only), `x-queue-type: stream` on a `/queue/`
destination (a stream is `/stream/NAME`, or `/amq/queue/NAME` as RabbitMQ writes it).
Accepted and without effect: `x-queue-type: classic | quorum` (every pairmq queue is
journaled and replicated by the pair), `x-max-priority` (every queue honours priorities
0 to 9), `x-expires` (pairmq deletes a queue only once it is empty and unused:
`auto_delete_delay_ms`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from pairmq.core.errors import CoreError

MAX_LENGTH: Final = "x-max-length"
MAX_LENGTH_BYTES: Final = "x-max-length-bytes"
MESSAGE_TTL: Final = "x-message-ttl"
OVERFLOW: Final = "x-overflow"
DLX: Final = "x-dead-letter-exchange"
DLX_KEY: Final = "x-dead-letter-routing-key"
QUEUE_TYPE: Final = "x-queue-type"
MAX_PRIORITY: Final = "x-max-priority"
EXPIRES: Final = "x-expires"

DROP_HEAD: Final = "drop-head"
REJECT_PUBLISH: Final = "reject-publish"

# Every header this module reads: a SUBSCRIBE with none of them configures nothing.
HEADERS: Final = (MAX_LENGTH, MAX_LENGTH_BYTES, MESSAGE_TTL, OVERFLOW, DLX, DLX_KEY,
                  QUEUE_TYPE, MAX_PRIORITY, EXPIRES)
# The settings that change a queue, in the order its journal text lists them.
_KEPT: Final = (MAX_LENGTH, MAX_LENGTH_BYTES, MESSAGE_TTL, OVERFLOW, DLX, DLX_KEY)
_BIGGEST: Final = 2 ** 62  # any count or time past this is a typo, not a setting


@dataclass(frozen=True, slots=True)
class QueueArgs:
    """The settings a SUBSCRIBE's x- headers give the queue it creates (None: not set)."""

    max_length: int | None = None  # waiting messages, at most
    max_length_bytes: int | None = None  # the queue's max_size_bytes
    message_ttl: int | None = None  # ms a message may wait
    overflow: str | None = None  # DROP_HEAD | REJECT_PUBLISH; None: the address rule's
    dead_letter: str | None = None  # "/queue/Q": where its dead letters go

    @property
    def empty(self) -> bool:
        return self == _NOTHING

    @property
    def drops_head(self) -> bool:
        """Past a limit, the oldest waiting messages go (RabbitMQ's drop-head: asked for,
        or the default once x-max-length or x-max-length-bytes is set)."""
        if self.overflow is not None:
            return self.overflow == DROP_HEAD
        return self.max_length is not None or self.max_length_bytes is not None

    def text(self) -> str:
        """The settings as the x- header lines that give them (what the journal keeps)."""
        lines = [f"{MAX_LENGTH}:{self.max_length}" if self.max_length is not None else "",
                 f"{MAX_LENGTH_BYTES}:{self.max_length_bytes}"
                 if self.max_length_bytes is not None else "",
                 f"{MESSAGE_TTL}:{self.message_ttl}" if self.message_ttl is not None else "",
                 f"{OVERFLOW}:{self.overflow}" if self.overflow is not None else ""]
        if self.dead_letter is not None:
            lines += [f"{DLX}:", f"{DLX_KEY}:{self.dead_letter[len('/queue/'):]}"]
        return "\n".join(line for line in lines if line)


_NOTHING: Final = QueueArgs()


def args_from_text(text: str, destination: str) -> QueueArgs:
    """What `QueueArgs.text` wrote, read back (recovery, a backup following)."""
    headers = dict(line.split(":", 1) for line in text.split("\n") if line)
    return parse_queue_args(headers, destination) or _NOTHING


def parse_queue_args(headers: Mapping[str, str], destination: str) -> QueueArgs | None:
    """The queue settings of a SUBSCRIBE to `destination` (None: it names none). Every x-
    header is checked whatever the destination, so that a bad value never goes unnoticed;
    only a /queue/ destination is configured by them (core/broker/configured.py)."""
    if not any(name in headers for name in HEADERS):
        return None
    queue_type = headers.get(QUEUE_TYPE)
    if queue_type is not None and queue_type not in ("classic", "quorum", "stream"):
        raise CoreError(f"{QUEUE_TYPE} must be classic, quorum or stream, got "
                        f"{queue_type[:40]!r}")
    if queue_type == "stream" and not destination.startswith("/stream/"):
        name = destination.split("/", 2)[-1]
        raise CoreError(f"{QUEUE_TYPE}:stream on {destination}: a pairmq stream is "
                        f"/stream/{name} (or /amq/queue/{name}, as RabbitMQ writes it)")
    _count(headers, MAX_PRIORITY, 0, 255)
    _count(headers, EXPIRES, 1)
    max_length = _count(headers, MAX_LENGTH, 0)
    max_length_bytes = _count(headers, MAX_LENGTH_BYTES, 1)
    ttl = _count(headers, MESSAGE_TTL, 0)
    overflow = headers.get(OVERFLOW)
    if overflow is not None:
        if overflow == "reject-publish-dlx":
            raise CoreError(f"{OVERFLOW}:reject-publish-dlx is not supported: pairmq refuses a "
                            "SEND it cannot take, it does not dead-letter it (use "
                            "reject-publish or drop-head)")
        if overflow not in (DROP_HEAD, REJECT_PUBLISH):
            raise CoreError(f"{OVERFLOW} must be drop-head or reject-publish, got "
                            f"{overflow[:40]!r}")
        if overflow == REJECT_PUBLISH and max_length is not None:
            raise CoreError(f"{OVERFLOW}:reject-publish with {MAX_LENGTH}: pairmq refuses "
                            f"SENDs by bytes only; use {MAX_LENGTH_BYTES} with it, or "
                            f"{OVERFLOW}:drop-head")
    dead_letter = _dead_letter(headers, destination)
    args = QueueArgs(max_length, max_length_bytes, ttl, overflow, dead_letter)
    return None if args.empty else args


def _count(headers: Mapping[str, str], name: str, least: int,
           most: int = _BIGGEST) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 19 \
            or not least <= int(value) <= most:
        bound = f"from {least} to {most}" if most != _BIGGEST else \
            "a non-negative integer" if least == 0 else f"an integer of at least {least}"
        raise CoreError(f"{name} must be {bound}, got {value[:40]!r}")
    return int(value)


def _dead_letter(headers: Mapping[str, str], destination: str) -> str | None:
    exchange = headers.get(DLX)
    key = headers.get(DLX_KEY)
    if exchange is None:
        if key is not None:
            raise CoreError(f"{DLX_KEY} {key[:40]!r} needs {DLX} (as RabbitMQ requires)")
        return None
    if exchange != "":
        raise CoreError(f"{DLX} {exchange[:40]!r} is not supported: pairmq has no exchanges; "
                        f"name the dead-letter queue with {DLX}:\"\" (the default exchange) "
                        f"and {DLX_KEY}:QUEUE")
    if not key:
        raise CoreError(f"{DLX}:\"\" needs {DLX_KEY} naming the dead-letter queue (the "
                        "default exchange would route dead letters back to their queue)")
    if "\n" in key or "\r" in key:
        raise CoreError(f"{DLX_KEY} must not hold a line break, got {key[:40]!r}")
    target = f"/queue/{key}"
    if target == destination:
        raise CoreError(f"{DLX_KEY} {key!r} names the queue itself: its dead letters would "
                        "come back to it")
    return target
