"""The simulator's clock, processes and network: a deterministic event queue.

What is modelled and why (docs/ha.md, "Simulator", says it for users):

- The HA channel is TCP: within one connection messages arrive in order, once. A cut
  direction holds its messages (retransmission); they arrive late, in order, when it
  heals, unless a side gave up first (no heartbeat for the activation interval: it
  closes the connection, the other side learns it from the close, or from its own
  timeout). So loss on the channel is the connection breaking; reordering exists only
  across connections (a new connection after a reconnect).
- A witness request is one exchange on a short-lived connection with a timeout and one
  retry (as server/pair/witness_client.py does): a request over a cut link is lost, an
  answer over a cut link is lost after the witness acted on the request; a request may
  also arrive late, after the server gave up on it, and still be carried out (a
  duplicate, out of order with the retry): the witness's state changes, the late answer
  is discarded.
- Processes crash (a new incarnation later: timers and messages of the old one are
  void), pause (SIGSTOP: inputs and timers queue up and are delivered late, in arrival
  order, when it resumes; its clock keeps running) and run on their own clocks, which
  differ in offset and in rate (within the DRIFT margin ha/lease.py allows).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from random import Random
from typing import Any


class Scheduler:
    """Global (true) time and the queue of what happens next; ties run in insertion order."""

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._count = 0

    def at(self, when: float, fn: Callable[..., None], *args: Any) -> None:
        self._count += 1
        heapq.heappush(self._queue, (max(when, self.now), self._count, fn, args))

    def next_time(self) -> float | None:
        return self._queue[0][0] if self._queue else None

    def pop(self) -> tuple[Callable[..., None], tuple[Any, ...]]:
        when, _, fn, args = heapq.heappop(self._queue)
        self.now = when
        return fn, args


class Process:
    """A process of the simulation: up or down (an incarnation number voids the timers and
    deliveries of a crashed one), maybe paused, with its own clock."""

    def __init__(self, name: str, sched: Scheduler, rate: float, offset: float) -> None:
        self.name = name
        self.sched = sched
        self.rate = rate
        self.offset = offset
        self.up = False
        self.incarnation = 0
        self.paused_until: float | None = None
        self.backlog: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self.on_step: Callable[[Process], None] = lambda _p: None

    def clock(self) -> float:
        """This process's monotonic clock."""
        return self.offset + self.sched.now * self.rate

    def later(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        """A timer or a delivery for this incarnation of the process."""
        self.sched.at(self.sched.now + delay, self.run, self.incarnation, fn, args)

    def run(self, incarnation: int, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        if not self.up or incarnation != self.incarnation:
            return
        if self.paused_until is not None:
            self.backlog.append((fn, args))
            return
        fn(*args)
        self.on_step(self)

    def pause(self, duration: float) -> None:
        until = self.sched.now + duration
        self.paused_until = max(self.paused_until or 0.0, until)
        self.sched.at(self.paused_until, self._resume, self.incarnation)

    def _resume(self, incarnation: int) -> None:
        if incarnation != self.incarnation or self.paused_until is None \
                or self.sched.now < self.paused_until:
            return
        self.paused_until = None
        backlog, self.backlog = self.backlog, []
        for fn, args in backlog:
            if not self.up or incarnation != self.incarnation:
                return
            fn(*args)
            self.on_step(self)

    def kill(self) -> None:
        self.up = False
        self.incarnation += 1
        self.paused_until = None
        self.backlog = []


class Links:
    """Which directed links are cut: (src, dst) process names."""

    def __init__(self) -> None:
        self.cut: set[tuple[str, str]] = set()
        self.on_heal: list[Callable[[str, str], None]] = []

    def is_cut(self, src: str, dst: str) -> bool:
        return (src, dst) in self.cut

    def set_cut(self, src: str, dst: str) -> None:
        self.cut.add((src, dst))

    def heal(self, src: str, dst: str) -> None:
        if (src, dst) in self.cut:
            self.cut.discard((src, dst))
            for fn in self.on_heal:
                fn(src, dst)


CLOSE = -1  # pseudo message kind: the other side closed the connection (FIN/RST)
WELCOME = -2  # pseudo message kind: the listener accepted (the handshake's last step)


class Pipe:
    """One direction of a TCP connection: FIFO, held while the link is cut."""

    def __init__(self, conn: Conn, src: Process, dst: Process) -> None:
        self.conn = conn
        self.src = src
        self.dst = dst
        self.queue: deque[tuple[float, int, Any]] = deque()
        self.last_ready = 0.0
        self.pump_at: float | None = None

    def send(self, kind: int, payload: Any) -> None:
        sched = self.src.sched
        ready = max(sched.now + self.conn.net.latency(), self.last_ready)
        self.last_ready = ready
        self.queue.append((ready, kind, payload))
        self._schedule(self.queue[0][0])

    def _schedule(self, when: float) -> None:
        if self.pump_at is not None and self.pump_at <= when:
            return
        self.pump_at = when
        self.src.sched.at(when, self._pump, when)

    def _pump(self, when: float) -> None:
        if self.pump_at != when:
            return
        self.pump_at = None
        links = self.conn.net.links
        now = self.src.sched.now
        while self.queue and self.queue[0][0] <= now:
            if links.is_cut(self.src.name, self.dst.name):
                return  # held: heal() pumps again
            _, kind, payload = self.queue.popleft()
            self.conn.deliver(self.dst, kind, payload)
        if self.queue:
            self._schedule(self.queue[0][0])

    def healed(self) -> None:
        if not self.queue:
            return
        at = self.src.sched.now + self.conn.net.latency()
        self.queue = deque((max(r, at), k, p) for r, k, p in self.queue)
        self.last_ready = max(self.last_ready, at)
        self.pump_at = None
        self._schedule(self.queue[0][0])


class Conn:
    """An HA channel connection between two processes."""

    _ids = 0

    def __init__(self, net: Net, a: Process, b: Process) -> None:
        Conn._ids += 1
        self.id = Conn._ids
        self.net = net
        self.pipes = {a.name: Pipe(self, a, b), b.name: Pipe(self, b, a)}
        self.closed: set[str] = set()  # sides that closed
        self.incarnations = {a.name: a.incarnation, b.name: b.incarnation}
        net.conns.append(self)

    def send(self, src: Process, kind: int, payload: Any) -> None:
        if src.name not in self.closed:
            self.pipes[src.name].send(kind, payload)

    def close(self, src: Process) -> None:
        """This side closes: the other side learns it after whatever was already sent."""
        if src.name in self.closed:
            return
        self.pipes[src.name].send(CLOSE, None)
        self.closed.add(src.name)
        if len(self.closed) == 2 and self in self.net.conns:
            self.net.conns.remove(self)

    def deliver(self, dst: Process, kind: int, payload: Any) -> None:
        if dst.name in self.closed or self.incarnations[dst.name] != dst.incarnation:
            return  # the receiving side is gone: the data is dropped (RST)
        dst.run(dst.incarnation, self.net.receive[dst.name], (self, kind, payload))

    def healed(self, src: str, dst: str) -> None:
        pipe = self.pipes.get(src)
        if pipe is not None and pipe.dst.name == dst:
            pipe.healed()


class Net:
    """Latencies, cuts and the connections the links carry."""

    def __init__(self, rng: Random, latency: tuple[float, float], late: float,
                 late_delay: float) -> None:
        self.rng = rng
        self.lat_lo, self.lat_hi = latency
        self.late = late  # probability that a witness request arrives late
        self.late_delay = late_delay
        self.links = Links()
        self.conns: list[Conn] = []
        self.receive: dict[str, Callable[..., None]] = {}
        self.links.on_heal.append(self._healed)

    def latency(self) -> float:
        return self.rng.uniform(self.lat_lo, self.lat_hi)

    def request_latency(self) -> float:
        """A witness request: sometimes it arrives after the sender's timeout."""
        if self.rng.random() < self.late:
            return self.rng.uniform(0, self.late_delay)
        return self.latency()

    def _healed(self, src: str, dst: str) -> None:
        for conn in list(self.conns):
            conn.healed(src, dst)
