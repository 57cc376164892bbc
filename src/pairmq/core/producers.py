"""Producer sequences: exactly once however many messages are in flight (as Kafka's
idempotent producer keeps them; docs/durability.md, "Producer sequences").

A producer stamps each persistent message it sends to a destination with its id, an epoch
and a sequence number that grows by one per message (`pairmq-producer`,
`pairmq-producer-epoch`, `pairmq-seq`; a batched SEND's frame names the first message's
number, the others follow). Per destination the server keeps, for each producer, the
epoch, the highest number it has taken and when: constant memory per producer, whatever
the producer has in flight. For a message (epoch E, number N) against what is kept
(epoch e, highest n):

| kept               | message             | verdict                                   |
|--------------------|---------------------|-------------------------------------------|
| nothing            | any                 | new: the producer starts here             |
| e                  | E > e               | new: a new epoch starts anywhere          |
| e                  | E < e               | refused: fenced by the newer epoch        |
| e, n               | E = e, N <= n       | duplicate: answered, stored nothing       |
| e, n               | E = e, N = n + 1    | new                                       |
| e, n               | E = e, N > n + 1    | refused: a gap (a message in between never came) |

Why this is exactly once: a producer's messages to one destination reach the server in
order on one connection, and after a failover it sends the unconfirmed ones again in the
same order with the same numbers. The server takes a number only when it takes every
smaller one first (the gap rule), so "at or below the highest" means "taken already", with
no window to outgrow. A message the server refuses ends its connection before anything
after it is applied, so the producer renumbers what followed it in the next epoch.

The table is journaled with the messages it concerns (one record per producer per group)
and replicated with them, so a backup or the next holder of a shared store knows it. An
entry is forgotten once its producer has stored nothing for `producer_expiry_ms`, or when
the destination holds `max_producers` others more recently active.

Deterministic: time comes in as `now`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from pairmq.core.errors import CoreError
from pairmq.protocol import ProtocolError
from pairmq.protocol.stamps import (
    EPOCH_HEADER,
    PRODUCER_HEADER,
    SEQ_HEADER,
    STAMP_HEADERS,
    Stamp,
    parse_stamp,
)

__all__ = ["STAMP_HEADERS", "ProducerState", "Producers", "SequenceRefused", "Stamp",
           "stamp_of"]

class ProducerState:
    """One producer of one destination: its epoch, highest number taken, when (ms)."""

    __slots__ = ("epoch", "seen", "seq")

    def __init__(self, epoch: int, seq: int, seen: int) -> None:
        self.epoch = epoch
        self.seq = seq
        self.seen = seen


def stamp_of(headers: dict[str, str]) -> Stamp | None:
    """The producer stamp of a SEND's headers (None: it has none); CoreError naming the
    header when it is malformed."""
    if PRODUCER_HEADER not in headers and SEQ_HEADER not in headers \
            and EPOCH_HEADER not in headers:
        return None
    try:
        return parse_stamp(headers)
    except ProtocolError as e:
        raise CoreError(str(e)) from None


class Producers:
    """One destination's producers, least recently active first."""

    __slots__ = ("_states",)

    def __init__(self) -> None:
        self._states: OrderedDict[str, ProducerState] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, producer: object) -> bool:
        return producer in self._states

    def get(self, producer: str) -> ProducerState | None:
        return self._states.get(producer)

    def items(self) -> Iterator[tuple[str, ProducerState]]:
        return iter(self._states.items())

    def duplicates(self, stamp: Stamp, count: int, destination: str) -> int:
        """How many of the `count` messages numbered from `stamp.seq` on were taken
        already (they come first); raises SequenceRefused for a gap or an older epoch."""
        state = self._states.get(stamp.producer)
        if state is None or stamp.epoch > state.epoch:
            return 0
        if stamp.epoch < state.epoch:
            raise SequenceRefused(
                f"producer {stamp.producer!r} sent epoch {stamp.epoch} to {destination}, "
                f"which already took epoch {state.epoch} from it: fenced (an older instance "
                "of the producer, or a retried task of an earlier batch)")
        if stamp.seq > state.seq + 1:
            raise SequenceRefused(
                f"producer {stamp.producer!r} sent {SEQ_HEADER} {stamp.seq} to {destination} "
                f"in epoch {stamp.epoch}, but the last one taken is {state.seq}: messages "
                f"{state.seq + 1} to {stamp.seq - 1} never came (a gap); not accepted")
        return min(count, state.seq - stamp.seq + 1)

    def took(self, producer: str, epoch: int, last: int, now: int, limit: int = 0
             ) -> str | None:
        """Messages up to number `last` of `epoch` are taken (stored, or dropped by the
        destination's policy). Returns the producer forgotten to make room for a new one
        past `limit` (0: no limit), if any."""
        states = self._states
        state = states.get(producer)
        if state is None:
            states[producer] = ProducerState(epoch, last, now)
            if limit and len(states) > limit:
                return states.popitem(last=False)[0]
            return None
        if epoch > state.epoch or last > state.seq:
            state.epoch = epoch
            state.seq = last
        state.seen = now
        states.move_to_end(producer)
        return None

    def restore(self, producer: str, epoch: int, seq: int, seen: int, limit: int = 0
                ) -> str | None:
        """A journaled entry: kept as it says (the journal holds the newest last). Returns
        the producer forgotten past `limit` (0: no limit), if any."""
        states = self._states
        states[producer] = ProducerState(epoch, seq, seen)
        states.move_to_end(producer)
        if limit and len(states) > limit:
            return states.popitem(last=False)[0]
        return None

    def order_by_time(self) -> None:
        """After a replay or a full synchronisation (compaction copies come in any order):
        least recently active first again."""
        self._states = OrderedDict(sorted(self._states.items(), key=lambda kv: kv[1].seen))

    def forget(self, producer: str) -> None:
        self._states.pop(producer, None)

    def expire(self, now: int, idle_ms: int, limit: int = 0) -> list[str]:
        """Forget producers idle for `idle_ms` (0: never), then the least recently active
        beyond `limit` (0: no limit); returns their ids."""
        states = self._states
        gone: list[str] = []
        if idle_ms:
            while states:
                producer, state = next(iter(states.items()))
                if state.seen > now - idle_ms:
                    break
                del states[producer]
                gone.append(producer)
        while limit and len(states) > limit:
            gone.append(states.popitem(last=False)[0])
        return gone


class SequenceRefused(CoreError):
    """A producer's message out of order (a gap) or from a fenced epoch."""
