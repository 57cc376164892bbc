"""Destinations that are empty and unused go away (Artemis' auto-delete-queues; issue 20):
a client that subscribes to a hundred thousand new queue names must not leave them behind
for good, in memory and, for queues, in the journal. Part of the Broker (a mixin, as
core/broker/paging.py is). Deterministic: `now` is given.

A queue or topic is idle when it holds no message (in memory or paged), has no consumer
and no durable subscription, and remembers no dup-id and no producer sequence: those
guard against a producer's resend storing a message twice, so a destination that keeps
them stays until they expire (producer_expiry_ms). Streams keep their records by their
retention and are never deleted this way. A destination idle at two looks
`auto_delete_delay_ms` apart is deleted: a queue with a DEST record gets an UNDEST, so it
does not come back at a restart nor on the backup.

Each look (`delete_idle`, from the server's sweep, every second) checks at most
IDLE_CHECKS destinations, round after round over all of them, so that a server holding
very many costs a bounded slice of a turn, not a pass over all of them.
"""

from __future__ import annotations

from typing import Final

from pairmq.core import records as rec
from pairmq.core.broker.events import BrokerEvent
from pairmq.core.broker.operations import Operations
from pairmq.core.destinations import QUEUE, TOPIC
from pairmq.core.queue import Address

IDLE_CHECKS: Final = 5000  # destinations looked at per call, at most


class IdleDestinations(Operations):
    """The Broker's auto-delete (a mixin)."""

    def delete_idle(self, now: int) -> list[str]:
        """Look at the next destinations of the round; delete those idle since the last
        look at least auto_delete_delay_ms ago. Returns their names."""
        delay = self.settings.auto_delete_delay_ms
        if delay < 0:
            return []
        since, left = self._idle_since, self._idle_round
        if not left:
            left.extend(self.addresses)  # a new round, over what exists now
        deleted: list[str] = []
        for _ in range(min(IDLE_CHECKS, len(left))):
            name = left.pop()
            address = self.addresses.get(name)
            if address is None or not self._idle(address):
                since.pop(name, None)
                continue
            first = since.setdefault(name, now)
            if now - first >= delay:
                del since[name]
                self._delete_destination(address)
                deleted.append(name)
        if deleted:
            shown = ", ".join(deleted[:5]) + (f" and {len(deleted) - 5} more"
                                               if len(deleted) > 5 else "")
            self.events.append(BrokerEvent("destinations-deleted", None,
                                           f"{len(deleted)} ({shown})"))
        return deleted

    def _idle(self, address: Address) -> bool:
        if address.kind != QUEUE and address.kind != TOPIC:
            return False
        if address.dups or address.producers or address.log is not None or address.size:
            return False
        for q in address.queues:
            if q.count or q.consumers or q.durable_key is not None or self.paged_waiting(q):
                return False
        return True

    def _delete_destination(self, address: Address) -> None:
        name = address.name
        del self.addresses[name]
        self.queue_args.pop(name, None)  # its x- arguments (core/broker/configured.py) go with it
        for q in address.queues:
            q.deleted = True
            self.page_wanted.pop(q, None)
        if self.queues.pop(name, None) is not None:
            self.records.append((rec.UNDEST, name))
