"""What a scaling-down member hands over besides its messages: per destination, its
producers' sequences and the dup-ids it remembers (docs/cluster.md, "Scale-down").

A producer that resends after its member scaled down resends to the member that took the
messages, with the numbers and dup-ids it used; that member must answer "taken already"
for what the old one took, whether the message waits there now or was consumed long ago.
The messages alone cannot tell it (a consumed message leaves nothing to move), so the
tables move as they are, journaled on the member that adopts them as its own entries are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pairmq.core import records as rec
from pairmq.core.broker.intake import TRANSPORT_HEADERS, Intake
from pairmq.core.destinations import STREAM_PREFIX, TEMP, TOPIC, parse_destination
from pairmq.core.errors import CoreError
from pairmq.core.message import DEFAULT_PRIORITY, Message
from pairmq.core.queue import Queue


class Handover(Intake):
    def handover_state(self) -> dict[str, dict[str, list[Any]]]:
        """Destination -> {"producers": [[producer, epoch, seq], ...], "dups": [id, ...]}:
        every queue's and topic's (streams and temporary destinations stay: they do not
        move). Oldest first, as each table keeps them."""
        out: dict[str, dict[str, list[Any]]] = {}
        for name, address in self.addresses.items():
            if address.kind == TEMP or name.startswith(STREAM_PREFIX):
                continue
            producers = [[p, s.epoch, s.seq] for p, s in address.producers.items()] \
                if address.producers is not None else []
            if producers or address.dups:
                out[name] = {"producers": producers, "dups": list(address.dups)}
        return out

    def adopt(self, state: Mapping[str, Any], now: int) -> int:
        """Take over another member's tables (`handover_state`'s form): a producer's entry
        replaces this member's only when it is newer (a later epoch, or a higher number in
        the same one); dup-ids join those remembered. Journaled; returns how many entries
        changed. Raises CoreError, changing nothing, on a malformed state."""
        parsed = _parse(state)
        changed = 0
        for destination, (producers, dups) in parsed.items():
            if destination.startswith(STREAM_PREFIX) or not destination.startswith(
                    ("/queue/", "/topic/")):
                continue
            address = self._dup_address(destination)
            table = self._producers_of(address)
            for producer, epoch, seq in producers:
                kept = table.get(producer)
                if kept is not None and (kept.epoch, kept.seq) >= (epoch, seq):
                    continue
                evicted = table.restore(producer, epoch, seq, now, self.settings.max_producers)
                self.records.append((rec.PRODUCER, address.name, producer, epoch, seq, now))
                if evicted is not None:
                    self.records.append((rec.PRODUCER_FORGET, address.name, evicted))
                changed += 1
            for dup_id in dups:
                if dup_id not in address.dups:
                    self._remember_dup(address, dup_id)
                    changed += 1
        return changed

    def put_durable(self, key: str, topic: str, headers: dict[str, str], body: bytes,
                    persistent: bool, now: int) -> bool:
        """A message of another member's durable subscription `key` (of `topic`), handed
        over by its scale-down: into this member's durable subscription of that key, made
        (journaled) if new, for its subscriber to find when it comes back here. False: a
        duplicate (its dup-id is remembered), nothing stored. Its selector is not known
        here (a subscriber's selector lives in memory); what was kept there matched it."""
        kind, name = parse_destination(topic)
        if kind != TOPIC:
            raise CoreError(f"durable subscription {key!r}: {topic} is not a topic")
        address = self._address(topic, TOPIC)
        dup_id = headers.get("dup-id")
        if dup_id is not None and dup_id in address.dups:
            self.stats["duplicates"] += 1
            return False
        q = self.durables.get(key)
        if q is None:
            q = Queue(f"durable:{key}", address, name)
            q.durable_key = key
            q.key = f"durable:{key}"
            address.queues.append(q)
            self.durables[key] = q
            self.records.append((rec.DURABLE, key, address.name))
        elif q.address is not address:
            raise CoreError(f"durable subscription {key!r} is of {q.address.name} here and "
                            f"of {topic} on the member scaling down")
        if dup_id is not None:
            self._remember_dup(address, dup_id)
        stored = {k: v for k, v in headers.items() if k not in TRANSPORT_HEADERS}
        size = 64 + len(body) + sum(len(k) + len(v) for k, v in stored.items())
        self._message_seq += 1
        message = Message(f"{self.id_prefix}{self._message_seq}", topic, stored, body,
                          persistent, int(stored.get("priority", DEFAULT_PRIORITY)),
                          int(stored.get("expires", 0) or 0), size, 0)
        self.stats["received"] += 1
        address.enqueued += 1
        self._copy_to(q, message, stored, message.expires, now)
        return True

    def take_back(self, sf_name: str, source: str, marks: tuple[str, str], now: int) -> int:
        """A scale-down that failed: what waits in store-and-forward queue `sf_name`, moved
        there for a member that did not take it, goes back where it came from: queue
        `source`, or the durable subscription its first mark names (`marks`: the headers
        naming a durable subscription and its topic, dropped). What that member's bridge
        holds unacknowledged stays its own. Journaled as a move; returns how many."""
        sf = self.queues.get(sf_name)
        if sf is None:
            return 0
        key_header, topic_header = marks
        back = 0
        kept = []
        while (entry := sf.pop()) is not None:
            old = entry.message
            headers = dict(old.headers)
            key = headers.pop(key_header, None)
            headers.pop(topic_header, None)
            to = self.durables.get(key) if key is not None else self._plain_queue(source)
            if to is None:  # its durable subscription was deleted meanwhile: it stays
                kept.append(entry)
                continue
            self._consumed(sf, entry)
            self._copy_to(to, old, headers, old.expires, now)
            back += 1
        if kept:
            sf.push_front(kept)
        return back


def _parse(state: Mapping[str, Any]) -> dict[str, tuple[list[tuple[str, int, int]], list[str]]]:
    out: dict[str, tuple[list[tuple[str, int, int]], list[str]]] = {}
    for destination, tables in state.items():
        if not isinstance(destination, str) or not isinstance(tables, Mapping):
            raise CoreError(f"handover: {destination!r} is not a destination's tables")
        producers = []
        for entry in tables.get("producers", []):
            if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                    and all(isinstance(n, int) and n >= 0 for n in entry[1:])):
                raise CoreError(f"handover: {destination}: bad producer entry {entry!r}")
            producers.append((entry[0], entry[1], entry[2]))
        dups = tables.get("dups", [])
        if not isinstance(dups, list) or not all(isinstance(d, str) for d in dups):
            raise CoreError(f"handover: {destination}: dups must be a list of strings")
        out[destination] = (producers, dups)
    return out
