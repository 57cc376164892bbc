"""The serving side of the other members' bridges: fill each store-and-forward queue
(`pairmq.sf:MEMBER:QUEUE`, core/cluster.py) from its queue, with the messages this member's
own consumers left waiting, as far as its bridge's window has room.

A store-and-forward queue is fed only while its member's status asks for that queue
(its own consumers want it), and only while its bridge is subscribed. A move into it is
journaled as an operator's move is (an ADD there, a DEL here, in one group), so what a
bridge was given stays that bridge's through a kill of either side: the bridge's member
recognises it when it comes again, and nobody else gets it. Nothing waits there for long:
this member's status lists what its store-and-forward queues hold, and each member's
bridge drains its own, whatever it consumes (core/cluster.py `drains`).
"""

from __future__ import annotations

from collections.abc import Callable

from pairmq.core.cluster import LoadBalancing, feedable, is_bridge, own_consumers, sf_parts
from pairmq.core.queue import Queue
from pairmq.server.role.role import Role

SCAN_FACTOR = 4  # a feed looks at this many waiting messages per message it may move


class Feeder:
    def __init__(self, role: Callable[[], Role], asked: Callable[[str], frozenset[str]],
                 mode: LoadBalancing, delay_ms: int, window: int) -> None:
        """`asked(member)`: the queues `member`'s latest status asks to be fed."""
        self._role = role
        self._asked = asked
        self._mode = mode
        self._delay_ms = delay_ms
        self._window = window
        self._queues: list[str] = []  # the store-and-forward queues found by `discover`
        self._no_consumer_since: dict[str, int] = {}  # queue -> first seen without own

    def discover(self) -> None:
        """Find the store-and-forward queues (made by bridges' SUBSCRIBEs); every status."""
        self._queues = [name for name in self._role().broker.queues if sf_parts(name)]

    @property
    def active(self) -> bool:
        return bool(self._queues)

    def tick(self, now: int) -> bool:
        """Feed every store-and-forward queue that has room; returns whether any is being
        fed (its member asks, its bridge is there, its queue has messages): the caller
        ticks again soon then, and seldom otherwise."""
        role = self._role()
        broker = role.broker
        moved = 0
        feeding = False
        for name in self._queues:
            sf = broker.queues.get(name)
            parts = sf_parts(name)
            if sf is None or parts is None:
                continue
            member, source = parts
            bridges = [sub for sub in sf.consumers if is_bridge(sub.session.client_id)]
            q = broker.queues.get(source)
            if q is None:
                continue
            idle_ms = self._idle_ms(source, q, now)  # counted whether or not it feeds now
            if not q.count or not bridges or source not in self._asked(member):
                continue
            room = self._window - sf.count - sum(len(sub.unacked) for sub in bridges)
            if room <= 0:
                feeding = True  # full: room comes back with the bridge's acknowledgements
                continue
            accept = feedable(self._mode, self._delay_ms, idle_ms)
            if accept is not None:
                feeding = True
                moved += broker.feed(source, name, room, now, accept, SCAN_FACTOR * room)
        if moved:
            role.flush()
        return feeding or moved > 0

    def _idle_ms(self, source: str, q: Queue, now: int) -> int | None:
        """How long `q` has had no consumer of its own (None: it has one)."""
        if own_consumers(q.consumers):
            self._no_consumer_since.pop(source, None)
            return None
        return now - self._no_consumer_since.setdefault(source, now)
