"""Queues configured by the RabbitMQ queue arguments of the SUBSCRIBE that made them
(core/queue_args.py reads them; docs/stomp.md, "Queue arguments"). Part of the Broker (a
mixin, as core/broker/paging.py is). Deterministic.

The settings live beside the queue (`queue_args`, by destination) for as long as it does,
and are journaled with it: the DEST record of a queue made with settings carries them as
the x- header lines that gave them (`QueueArgs.text`), compaction re-writes them, and a
recovery or a backup following the journal makes the queue with the same settings. So a
durable queue keeps them through a restart and a failover.

- `x-max-length-bytes` is the queue's `max_size_bytes`;
- `x-overflow: reject-publish` is its address_full_policy `fail`;
- drop-head (asked for, or RabbitMQ's default once a limit is set): after each message
  comes (and was offered to the consumers), the oldest waiting messages go while the queue
  has more than `x-max-length` of them waiting or its address holds more than its byte
  limit: dead-lettered (`dead-letter-reason: maxlen`) when the queue names a dead-letter
  destination, else discarded and counted as dropped (RabbitMQ discards them without a
  dead-letter exchange); a message dropped so once already is discarded (no cycles). The
  address's policy is `drop` then, which only applies while nothing waits
  (unacknowledged messages alone hold more than the limit): the new message is the head
  then. Such a queue never pages;
- `x-message-ttl`: each message sent to the queue expires that long after it came, or at
  its own `expires` if earlier; an expired message goes as any does (`expired_policy`);
- a dead-letter destination replaces `/queue/DLQ.NAME` for every reason.

One bound: recovery pages by `max_size_bytes` (`[destinations]`), before it knows a
queue's settings; a queue whose `x-max-length-bytes` is above that may come back from a
restart with messages paged, and new ones join them in the journal until the queue has
read them back: drop-head trims what is in memory only, as it comes.
"""

from __future__ import annotations

from typing import Final

from pairmq.core import records as rec
from pairmq.core.broker.state import BrokerState
from pairmq.core.queue import Queue
from pairmq.core.queue_args import REJECT_PUBLISH, QueueArgs
from pairmq.core.records import Record
from pairmq.core.settings import AddressFullPolicy

MAXLEN: Final = "maxlen"  # the dead-letter-reason of what drop-head drops (RabbitMQ's word)


class ConfiguredQueues(BrokerState):
    """The Broker's per-queue settings (a mixin)."""

    def _configured(self, q: Queue, args: QueueArgs | None) -> Record:
        """Give the plain queue `q` its settings (None: the defaults); returns the DEST
        record that journals it with them."""
        if args is None or args.empty:
            return (rec.DEST, q.name)
        self.queue_args[q.name] = args
        address = q.address
        if args.max_length_bytes is not None:
            address.limit = args.max_length_bytes
        if args.overflow == REJECT_PUBLISH:
            address.policy = AddressFullPolicy.FAIL
        elif args.drops_head:
            address.policy = AddressFullPolicy.DROP
        return (rec.DEST, q.name, args.text())

    def dest_record(self, destination: str) -> Record:
        """The DEST record of a destination as it is now (compaction writes it again)."""
        args = self.queue_args.get(destination)
        return (rec.DEST, destination) if args is None else \
            (rec.DEST, destination, args.text())

    def _queue_expires(self, destination: str, expires: int, now: int) -> int:
        """A message's expiry in the queue `destination`, with its x-message-ttl. A TTL of
        0 lets a message reach a consumer ready when it comes, and no other (RabbitMQ)."""
        args = self.queue_args.get(destination)
        if args is None or args.message_ttl is None:
            return expires
        due = now + max(args.message_ttl, 1)
        return min(expires, due) if expires else due

    def _bound(self, q: Queue, now: int) -> None:
        """drop-head: the oldest waiting messages go while `q` is past a limit."""
        args = self.queue_args.get(q.name)
        if args is None or not args.drops_head:
            return
        most = args.max_length
        address = q.address
        limit = address.limit
        while q.count and ((most is not None and q.count > most)
                           or (limit and address.size > limit)):
            entry = q.pop()
            if entry is None:
                break
            self.stats["dropped"] += 1
            address.dropped += 1
            # One dropped so already is discarded: two full queues dead-lettering to each
            # other would otherwise pass messages back and forth forever, in one turn.
            if args.dead_letter is not None \
                    and entry.message.headers.get("dead-letter-reason") != MAXLEN:
                self._dead_letter(q, entry, MAXLEN, now)
            else:
                self._consumed(q, entry)

    def _dead_letter_destination(self, q: Queue) -> str:
        """Where `q`'s dead letters go: its x-dead-letter-routing-key's queue, else
        /queue/DLQ.NAME (`dead_letter_prefix`)."""
        args = self.queue_args.get(q.name) if self.queue_args else None
        if args is not None and args.dead_letter is not None:
            return args.dead_letter
        return f"/queue/{self.settings.dead_letter_prefix}{q.dead_letter_name}"
