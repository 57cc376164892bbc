"""What a subscription selects. A queue consumer's message selector, as an index: the
waiting entries of its queue that match it, highest priority first, FIFO within a priority;
and a stream subscription's filter (`stream_match`: a selector, RabbitMQ's
x-stream-filter).

Why an index: a consumer whose selector matches 1 message in 10 on a queue of 100,000 sees
its queue's head fill with messages it does not want (they stay for other consumers, as
JMS requires). Scanning from the head at every dispatch costs O(n) per delivery, O(n²) in
all. Instead the queue offers every entry that comes to each selective consumer's index
once (`Queue.push`, `push_front`, `extend`); the consumer takes from its index, and takes
the entry out of the middle of the queue in O(1) (`Queue.take`). An entry that left the
queue another way (another consumer, expiry, a purge) is no longer `waiting`, and the index
skips it when it reaches it.

Costs: one selector evaluation per entry per selective consumer, when the entry enters the
queue (and once over the queue when a selective consumer subscribes); memory of one
reference per matching entry. Entries that others took are dropped from the index when it
holds more than twice what its queue holds (a compaction, amortised O(1)).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from pairmq.core.errors import CoreError
from pairmq.core.message import PRIORITY_LEVELS, Entry
from pairmq.core.selector import Selector, compile_selector


class SelectorIndex:
    """The entries of one queue that match one subscription's selector."""

    __slots__ = ("_levels", "_top", "selector", "size")

    def __init__(self, selector: Selector) -> None:
        self.selector = selector
        self._levels: list[deque[Entry] | None] = [None] * PRIORITY_LEVELS
        self._top = -1
        self.size = 0  # references held, stale ones included

    def _level(self, p: int) -> deque[Entry]:
        level = self._levels[p]
        if level is None:
            level = self._levels[p] = deque()
        if p > self._top:
            self._top = p
        return level

    def offer(self, entry: Entry) -> None:
        """An entry entered the queue at its tail: kept when it matches."""
        if self.selector.matches_message(entry.message):
            self._level(entry.message.priority).append(entry)
            self.size += 1

    def offer_front(self, entries: list[Entry]) -> None:
        """Entries returned to the queue's head (in their order): kept when they match."""
        for entry in reversed(entries):
            if self.selector.matches_message(entry.message):
                self._level(entry.message.priority).appendleft(entry)
                self.size += 1

    def fill(self, entries: Iterable[Entry]) -> None:
        """The waiting entries of the queue, in its order (a new selective consumer)."""
        for entry in entries:
            self.offer(entry)

    def first(self) -> Entry | None:
        """The first matching entry still waiting (stale references are dropped)."""
        levels = self._levels
        top = self._top
        while top >= 0:
            level = levels[top]
            while level:
                entry = level[0]
                if entry.waiting:
                    self._top = top
                    return entry
                level.popleft()
                self.size -= 1
            top -= 1
        self._top = -1
        return None

    def compact(self, waiting: int) -> None:
        """Drop references to entries that left the queue, once they outnumber what the
        queue holds (`waiting`): the index's memory stays within twice its queue's."""
        if self.size <= 2 * waiting + 1024:
            return
        for i, level in enumerate(self._levels):
            if level:
                self._levels[i] = deque(e for e in level if e.waiting)
        self.size = sum(len(level) for level in self._levels if level)


# RabbitMQ 3.13's stream filtering (docs/streams.md): a SEND's filter value, and what a
# SUBSCRIBE wants. pairmq filters exactly: RabbitMQ's Bloom filter lets some others through.
FILTER_VALUE: Final = "x-stream-filter-value"
FILTER: Final = "x-stream-filter"
MATCH_UNFILTERED: Final = "x-stream-match-unfiltered"

Match = Callable[[Mapping[str, str]], bool]


def stream_match(headers: Mapping[str, str]) -> Match | None:
    """What a stream SUBSCRIBE keeps, from its `selector`, `x-stream-filter` (values, comma
    separated) and `x-stream-match-unfiltered` headers; None: every record. A record passes
    when it passes both: its filter value is one of the values (a record without one passes
    only with match-unfiltered), and the selector matches its headers."""
    text = headers.get("selector")
    chosen = compile_selector(text) if text is not None else None
    wanted = headers.get(FILTER)
    unfiltered_text = headers.get(MATCH_UNFILTERED, "false").strip().lower()
    if unfiltered_text not in ("true", "false"):
        raise CoreError(f"{MATCH_UNFILTERED} must be true or false, got "
                        f"{headers[MATCH_UNFILTERED][:40]!r}")
    values: frozenset[str] | None = None
    if wanted is not None:
        values = frozenset(v.strip() for v in wanted.split(",") if v.strip())
        if not values:
            raise CoreError(f"{FILTER} names no value (a comma-separated list)")
    if values is None:
        return chosen.matches if chosen is not None else None
    unfiltered = unfiltered_text == "true"
    chosen_values = values

    def by_value(record: Mapping[str, str]) -> bool:
        value = record.get(FILTER_VALUE)
        if value is None:
            return unfiltered
        return value in chosen_values

    if chosen is None:
        return by_value
    matches = chosen.matches
    return lambda record: by_value(record) and matches(record)
