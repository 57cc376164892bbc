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
from pairmq.core.broker.intake import Intake
from pairmq.core.destinations import STREAM_PREFIX, TEMP
from pairmq.core.errors import CoreError


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
