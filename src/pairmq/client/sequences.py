"""The client's side of producer sequences (the server's is core/producers.py; the rules
are in docs/clients.md, "Exactly once").

Every persistent message sent outside a transaction is stamped, when it is first sent,
with the client's producer id, an epoch and the next number for its destination
(`pairmq-producer`, `pairmq-producer-epoch`, `pairmq-seq`; a batch's frame carries its
first message's number and counts as many numbers as it has messages). A failover
resends unconfirmed messages with the stamps they have, in the order they were first
sent, so the server drops what it has and takes the rest: exactly once, however many
messages were in flight.

A message the server refuses (ERROR) was not taken, and neither was anything the client
sent after it on that connection (the server closes it): the numbers that follow have a
hole. The client therefore moves that producer's destination to a new epoch and numbers
the refused message's successors again from 0 (`renumber`); the server starts a new
epoch anywhere.

Pure: no I/O. The producer id is unique per client instance (its name plus a random part),
so a client restarted with the same name never repeats numbers the server has seen;
messages kept in a durable connection's outbox keep the stamps they were stored with.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, MutableMapping

from pairmq.client.errors import ClientError
from pairmq.protocol import ProtocolError
from pairmq.protocol.batch import SEND_BATCH_HEADER
from pairmq.protocol.stamps import Stamp, parse_stamp, write_stamp


def stamp_in(headers: Mapping[str, str]) -> Stamp | None:
    """The stamp a message's headers carry (None: none, or a malformed one, which the
    server will refuse by name)."""
    try:
        return parse_stamp(headers)
    except ProtocolError:
        return None


def new_producer_id(name: str) -> str:
    return f"{name}.{uuid.uuid4().hex[:8]}"


class Sequences:
    """Per (producer, destination): the current epoch and the next number. And, per
    destination, how many of the application's own dup-ids wait for confirmation, which
    may not outnumber what the server remembers (`dup_cache_size`, from CONNECTED)."""

    def __init__(self, producer: str) -> None:
        self.producer = producer
        self._next: dict[tuple[str, str], tuple[int, int]] = {}  # -> (epoch, next seq)
        self.dup_cache_size: int | None = None
        self._app_ids: dict[str, int] = {}

    def stamp(self, headers: MutableMapping[str, str], destination: str, count: int = 1
              ) -> None:
        """Give a message (or a batch of `count`) this client's next numbers; one that has
        a stamp already (an outbox row, a producer of its own) keeps it, and this
        producer's numbers go on after it."""
        existing = stamp_in(headers)
        if existing is not None:
            self._adopt(existing, destination, count)
            return
        key = (self.producer, destination)
        epoch, seq = self._next.get(key, (0, 0))
        self._next[key] = (epoch, seq + count)
        write_stamp(headers, Stamp(self.producer, epoch, seq))

    def _adopt(self, stamp: Stamp, destination: str, count: int) -> None:
        key = (stamp.producer, destination)
        epoch, seq = self._next.get(key, (-1, 0))
        if stamp.epoch > epoch or (stamp.epoch == epoch and stamp.seq + count > seq):
            self._next[key] = (stamp.epoch, stamp.seq + count)

    def renumber(self, refused: Stamp, destination: str,
                 later: list[tuple[MutableMapping[str, str], int]]) -> None:
        """`refused` was refused: its producer's messages to `destination` sent after it
        (`later`: headers and message count of each, in the order sent, all of its epoch)
        are numbered again in the next epoch, from 0."""
        key = (refused.producer, destination)
        epoch, _ = self._next.get(key, (refused.epoch, 0))
        epoch = max(epoch, refused.epoch) + 1
        seq = 0
        for headers, count in later:
            write_stamp(headers, Stamp(refused.producer, epoch, seq))
            seq += count
        self._next[key] = (epoch, seq)

    def count_app_ids(self, destination: str, count: int) -> None:
        """`count` more of the application's own dup-ids in flight to `destination`, or
        ClientError when the server could forget one before its resend."""
        waiting = self._app_ids.get(destination, 0) + count
        limit = self.dup_cache_size
        if limit is not None and waiting > limit:
            raise ClientError(
                f"send to {destination}: {waiting} messages with the application's own "
                f"dup-ids would be unconfirmed at once, more than the server's dup-id cache "
                f"holds ({limit} per destination, dup-cache-size on CONNECTED): after a "
                "failover a resent one could be taken as new. Lower sendWindow (or batch "
                "sizes), or leave naming messages to the client (producer sequences, "
                "docs/clients.md)")
        self._app_ids[destination] = waiting

    def settled_app_ids(self, destination: str, count: int) -> None:
        """`count` of them are confirmed or refused."""
        left = self._app_ids.get(destination, 0) - count
        if left > 0:
            self._app_ids[destination] = left
        else:
            self._app_ids.pop(destination, None)


def message_count(headers: Mapping[str, str]) -> int:
    """Messages in a SEND: a batch's count, else one (numbers it takes)."""
    count = headers.get(SEND_BATCH_HEADER)
    return int(count) if count is not None and count.isdigit() else 1
