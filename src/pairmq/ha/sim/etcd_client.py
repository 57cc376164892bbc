"""A simulated server's driver of its lease on etcd: what server/pair/etcd_arbiter.py does
for the machine's `AskWitness`, on simulated time.

- **A request** runs its `LeaseSession`'s steps (ha/etcd_lease.py) against the cluster
  (etcd.py), one etcd call at a time, within the witness's deadline (witness_client.py
  `reply_timeout`: a heartbeat; half an activation interval for a renewal), counted from
  when the request began. On timeout the machine hears None, timed from then; a late
  answer is dropped.
- **A call** goes to the member that answered last; one that fails ("no leader",
  connection refused) or leaves it unanswered for its share of the time left (a third,
  at least 50 ms) is passed over for the next, until the deadline. A transaction is
  sent again like a read: an earlier send may still commit, and the session recognises
  its own write in the failure branch's read.
- **Between requests** the server polls the record every heartbeat with a serializable
  read (any member, its own copy) and watches it on the member it prefers, and tells its
  session (`observe`), so that a backup counts the holder's lease from about its last
  renewal.
- A new process starts a new session: what it saw of the record, and when, dies with
  the old one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pairmq.ha import events as ev
from pairmq.ha.etcd_lease import LeaseSession, Next, Stage, fingerprint
from pairmq.ha.messages import WitnessPurpose
from pairmq.ha.sim.etcd import MEMBERS, Answer, Failed, Op, Read, SimEtcd, Txn, Value
from pairmq.ha.sim.net import Process

Trace = Callable[[Process | None, str, Any], None]  # the world's trace

GROUP = "sim"
PAIR = fingerprint(GROUP, "sim-secret")
ATTEMPT_MIN = 0.05  # etcd_arbiter.py's: an attempt on one member gets at least this


@dataclass
class _Ask:
    purpose: WitnessPurpose
    request: dict[str, Any]
    requested_at: float  # the server's clock when the request began, before any read
    deadline: float  # simulated time


@dataclass
class _Call:
    """One etcd call, tried on one member after another until the deadline."""

    op: Op
    deadline: float
    share: float  # each try's time
    done: Callable[[Answer], None]
    gave_up: Callable[[], None]
    tries: int = 0
    over: bool = False


class SimEtcdClient:
    """One server's etcd driver: one request at a time, as the machine asks them, and the
    record observed between them."""

    def __init__(self, server: Process, feed: Callable[[ev.Event], None], trace: Trace,
                 cluster: SimEtcd, heartbeat: float, activation: float) -> None:
        self.server = server
        self._feed = feed  # the server's machine, fed what the driver hears
        self._trace = trace
        self.cluster = cluster
        self.heartbeat = heartbeat
        self.activation = activation
        self.session = LeaseSession(GROUP, PAIR)
        self.preferred = 0  # index in MEMBERS of the member asked first
        self.asking: _Ask | None = None

    def restart(self) -> None:
        """A new process: a new session, nothing asked, a member drawn to be asked first;
        its polling and its watch start."""
        self.session = LeaseSession(GROUP, PAIR)
        self.preferred = self.cluster.rng.randrange(len(MEMBERS))
        self.asking = None
        self.server.later(0.0, self._poll)
        self.server.later(0.0, self._watch)

    def timeout(self, request: dict[str, Any]) -> float:
        """witness_client.py `reply_timeout`: a renewal may wait as long as half the lease
        it renews; other requests give up after a heartbeat."""
        if request.get("op") == "renew":
            return max(self.heartbeat, self.activation / 2)
        return self.heartbeat

    # ------------------------------------------------------------ requests

    def ask(self, purpose: WitnessPurpose, request: dict[str, Any]) -> None:
        server = self.server
        ask = _Ask(purpose, request, server.clock(),
                   server.sched.now + self.timeout(request))
        self.asking = ask
        self._next(ask, self.session.begin(request, ask.requested_at))

    def _next(self, ask: _Ask, step: Next) -> None:
        if step.stage is Stage.DONE:
            self.asking = None
            self._feed(ev.witness_replied(ask.purpose, step.reply, ask.requested_at))
            return
        op: Op = Read() if step.stage is Stage.READ else Txn(step.compare, step.value)
        self._call(op, ask.deadline, lambda answer: self._answered(ask, answer),
                   lambda: self._gave_up(ask))

    def _answered(self, ask: _Ask, answer: Answer) -> None:
        if self.asking is not ask:
            return
        now = self.server.clock()
        if isinstance(answer, Value):
            step = self.session.read(answer.raw, answer.revision, now)
        elif isinstance(answer, Failed):
            raise AssertionError("a call ends with an answer or gives up")
        elif answer.succeeded:
            step = self.session.wrote(answer.revision, now)
        else:
            step = self.session.write_failed(answer.raw, answer.revision, now)
        self._next(ask, step)

    def _gave_up(self, ask: _Ask) -> None:
        if self.asking is not ask:
            return
        self.asking = None
        self._trace(self.server, "etcd timeout", ask.request.get("op"))
        self._feed(ev.witness_replied(ask.purpose, None, ask.requested_at))

    # ------------------------------------------------------------ calls

    def _call(self, op: Op, deadline: float, done: Callable[[Answer], None],
              gave_up: Callable[[], None]) -> None:
        share = max(ATTEMPT_MIN, (deadline - self.server.sched.now) / len(MEMBERS))
        self._try(_Call(op, deadline, share, done, gave_up))

    def _try(self, call: _Call) -> None:
        server = self.server
        left = call.deadline - server.sched.now
        if left <= 0:
            call.over = True
            call.gave_up()
            return
        call.tries += 1
        tries = call.tries
        member = MEMBERS[self.preferred]
        incarnation = server.incarnation

        def reply(answer: Answer) -> None:
            server.run(incarnation, self._reply, (call, tries, member, answer))

        self.cluster.request(server, member, call.op, reply)
        server.later(min(call.share, left), self._try_timed_out, call, tries)

    def _reply(self, call: _Call, tries: int, member: str, answer: Answer) -> None:
        if call.over or tries != call.tries:
            self._trace(self.server, "late etcd answer dropped", (member, answer))
            return
        if isinstance(answer, Failed):
            self._trace(self.server, "etcd failed", (member, answer.reason))
            self._rotate()
            self._try(call)
            return
        call.over = True
        self.preferred = MEMBERS.index(member)
        call.done(answer)

    def _try_timed_out(self, call: _Call, tries: int) -> None:
        if not call.over and tries == call.tries:
            self._rotate()
            self._try(call)

    def _rotate(self) -> None:
        self.preferred = (self.preferred + 1) % len(MEMBERS)

    # ------------------------------------------------------------ between requests

    def _poll(self) -> None:
        """etcd_arbiter.py `_poll`: every heartbeat a serializable read of the record."""
        self._call(Read(serializable=True), self.server.sched.now + self.heartbeat,
                   self._polled, self._poll_again)

    def _polled(self, answer: Answer) -> None:
        if isinstance(answer, Value):
            self.session.observe(answer.raw, answer.revision, self.server.clock())
        self._poll_again()

    def _poll_again(self) -> None:
        self.server.later(self.heartbeat, self._poll)

    def _watch(self) -> None:
        """etcd_arbiter.py `_stream_record`: a watch on the member preferred; when it ends
        or cannot connect, again after a heartbeat."""
        server = self.server
        incarnation = server.incarnation

        def event(value: Value) -> None:
            server.run(incarnation, self._event, (value,))

        def ended() -> None:
            server.run(incarnation, self._watch_ended, ())

        if not self.cluster.watch(server, MEMBERS[self.preferred], event, ended):
            server.later(2 * self.heartbeat, self._watch)  # connect timeout, then sleep

    def _event(self, value: Value) -> None:
        self.session.observe(value.raw, value.revision, self.server.clock())

    def _watch_ended(self) -> None:
        self.server.later(self.heartbeat, self._watch)
