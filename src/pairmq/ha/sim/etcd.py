"""The simulated etcd cluster that arbitrates the pair when `SimConfig.arbiter` is "etcd":
three members, a leader, the pair's one key (ha/etcd_lease.py keeps its lease there).

What is modelled, and why that is what the lease's safety rests on:

- **One linearizable key**: its value, its `mod_revision`, the cluster's revision, as
  committed; and each member's copy, as far as it applied the log (a member the leader
  cannot reach, a paused or crashed one, lags behind and catches up when it is back).
  A write or a linearizable read goes through a leader that reaches a majority: a write
  commits on a majority, a read is confirmed by the leader with a majority first
  (ReadIndex) and returns the committed value of that moment. A member that cannot reach
  such a leader serves neither: the request hangs, or fails fast with "no leader"
  (nothing was proposed, so the server may send it to another member). A serializable
  read (`Read(serializable=True)`, what a server's driver polls between requests) is
  answered by any running member from its own copy, however stale, and a watch streams
  the revisions one member applies: both only ever show a revision after its commit.
- **A transaction's compare is evaluated when it is applied**, not when it was sent. A
  request may be applied long after it was sent: it arrives late (`late_requests`),
  waits in a paused member or leader and is carried out when it resumes, or is caught by
  the loss of its leader; such a proposal is committed by that leader if it gets its
  majority back before an election, else by the next leader (it reached a majority's
  logs) or dropped, one in two, and its answer may still come back, to a server that
  gave up on it long ago (it drops it).
- **The leader** stays while it is up, not paused, and reaches a majority (both
  directions of each link). Otherwise, after an election timeout of 1 to 2 s (etcd's
  default 1 s, randomised up to twice), a member that reaches a majority is elected;
  requests stall meanwhile. A majority lost: no leader until it comes back.
- **Latency**: between a server and a member `SimConfig.etcd_client_latency`, a request
  maybe late (`late_requests`, as to the witness); between members
  `SimConfig.etcd_latency` (etcd runs on one site: its heartbeat of 100 ms assumes
  round trips well below it). A write costs the leader a round trip to the others, so
  does a linearizable read (ReadIndex); a follower forwards to the leader and back.
- **Crashes** lose nothing committed (each member fsyncs its log); a restarted member
  catches up from the leader.
- **etcd's own leases are not modelled.** pairmq attaches none to its record and never
  reads a TTL (ha/etcd_lease.py says why: a new leader extends every lease it
  inherits), so a leader change that extends them changes nothing the servers see.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from random import Random
from typing import Any, Protocol

from pairmq.ha.sim.net import Net, Process, Scheduler

MEMBERS = ("etcd1", "etcd2", "etcd3")
RAFT_TICK = 0.1  # etcd's --heartbeat-interval: how often the leader's health is looked at
ELECTION = (1.0, 2.0)  # etcd's --election-timeout (1 s), randomised as raft does


@dataclass(frozen=True)
class Read:
    """A read of the key: linearizable, or `serializable` (the member's own copy)."""

    serializable: bool = False


@dataclass(frozen=True)
class Txn:
    """If the key's mod_revision is `compare`, put `value`; else read the key."""

    compare: int
    value: bytes


@dataclass(frozen=True)
class Value:
    """The key as a read found it (None, revision 0: it does not exist)."""

    raw: bytes | None
    revision: int


@dataclass(frozen=True)
class Committed:
    """A transaction applied: `succeeded` (then `revision` is the new mod_revision) or
    the failure branch's read of the key (`raw`, `revision`)."""

    succeeded: bool
    raw: bytes | None
    revision: int


@dataclass(frozen=True)
class Failed:
    """An error before anything was proposed ("no leader", connection refused)."""

    reason: str


Op = Read | Txn
Answer = Value | Committed | Failed
Reply = Callable[[Answer], None]  # runs on the requesting server (its incarnation)
Event = Callable[[Value], None]  # a watch's: a revision its member applied


class EtcdWorld(Protocol):
    """What the cluster needs of the world: time, randomness, the network, bookkeeping."""

    sched: Scheduler
    rng: Random
    net: Net

    def trace(self, proc: Process | None, what: str, detail: Any) -> None: ...

    def violation(self, message: str) -> None: ...


class EtcdMember(Process):
    """One etcd process: up or down, maybe paused (SIGSTOP); its clock is never read."""

    def boot(self) -> None:
        self.up = True

    def crash(self) -> None:
        self.kill()


@dataclass
class _Proposal:
    """A transaction in a leader's log, not yet known committed."""

    txn: Txn
    term: int
    via: EtcdMember  # the member the server asked: the answer goes back through it
    server: Process
    reply: Reply


@dataclass
class _Watch:
    server: Process
    incarnation: int
    event: Event  # each runs on the server (its incarnation)
    ended: Callable[[], None]


class SimEtcd:
    """The cluster: members, the leader of the moment, the key, and the committed history
    checked as it grows (revisions strictly increase, the record's epoch never goes
    down)."""

    def __init__(self, world: EtcdWorld, peer_latency: tuple[float, float],
                 client_latency: tuple[float, float]) -> None:
        self.world = world
        self.sched = world.sched
        self.rng = world.rng
        self.net = world.net
        self.latency = peer_latency  # between members
        self.client_latency = client_latency  # between a server and a member
        self.members = {name: EtcdMember(name, world.sched, 1.0, 0.0) for name in MEMBERS}
        self.value: bytes | None = None
        self.mod_revision = 0  # of the key
        self.revision = 0  # of the cluster: every committed write increments it
        self.epoch = 0  # of the record last committed
        self.commits = 0
        self.leader: str | None = None
        self.leader_incarnation = 0  # a leader that crashed comes back a follower
        self.term = 0
        self.elect_at: float | None = None  # when the members without a leader elect one
        self.limbo: list[_Proposal] = []  # proposals of a leader that lost its majority
        self.applied = {name: Value(None, 0) for name in MEMBERS}  # each member's copy
        self.watchers: dict[str, list[_Watch]] = {name: [] for name in MEMBERS}
        self.sched.at(0.0, self._tick)

    # ------------------------------------------------------------ leadership

    def reach(self, a: str, b: str) -> bool:
        links = self.net.links
        return a == b or not (links.is_cut(a, b) or links.is_cut(b, a))

    def _alive(self, name: str) -> bool:
        member = self.members[name]
        return member.up and member.paused_until is None

    def has_majority(self, name: str) -> bool:
        """`name` runs and reaches a majority of running members (itself included)."""
        if not self._alive(name):
            return False
        return sum(1 for m in MEMBERS if self._alive(m) and self.reach(name, m)) * 2 \
            > len(MEMBERS)

    def _leads(self, name: str, term: int) -> bool:
        return self.leader == name and self.term == term and self._leader_ok()

    def _leader_ok(self) -> bool:
        """The leader runs (the process it was elected in) and has a majority."""
        leader = self.leader
        return leader is not None and self.has_majority(leader) \
            and self.members[leader].incarnation == self.leader_incarnation

    def _tick(self) -> None:
        now = self.sched.now
        if self._leader_ok():
            self.elect_at = None
            self._settle_limbo()
            self._replicate()
        elif self.elect_at is None:
            self.elect_at = now + self.rng.uniform(*ELECTION)
        elif now >= self.elect_at:
            candidates = [m for m in MEMBERS if self.has_majority(m)]
            if candidates:
                self.leader = candidates[0] if len(candidates) == 1 \
                    else self.rng.choice(candidates)
                self.leader_incarnation = self.members[self.leader].incarnation
                self.term += 1
                self.elect_at = None
                self.world.trace(None, "etcd", f"{self.leader} elected leader, term "
                                               f"{self.term}")
                self._settle_limbo()
            else:
                if self.leader is not None:
                    self.world.trace(None, "etcd", "no leader: no majority")
                self.leader = None
                self.elect_at = now + self.rng.uniform(*ELECTION)
        self.sched.at(now + RAFT_TICK, self._tick)

    def _settle_limbo(self) -> None:
        """A leader with a majority: the proposals its predecessor (or itself, before it
        lost its majority) left are committed, in order, before anything newer. The same
        leader commits all of its own; a new one has each with probability 1/2 (whether it
        had reached a majority's logs)."""
        limbo, self.limbo = self.limbo, []
        for p in limbo:
            if p.term == self.term or self.rng.random() < 0.5:
                self._commit(p)
            else:
                self.world.trace(None, "etcd", f"proposal of term {p.term} from "
                                               f"{p.server.name} lost with its leader")

    # ------------------------------------------------------------ requests

    def request(self, server: Process, member: str, op: Op, reply: Reply) -> None:
        """A server's request to one member. It may never be answered."""
        if self.net.links.is_cut(server.name, member):
            return  # lost: the server's attempt times out
        self.sched.at(self.sched.now + self._request_latency(), self._arrives, server,
                      self.members[member], op, reply)

    def _arrives(self, server: Process, member: EtcdMember, op: Op, reply: Reply) -> None:
        if self.net.links.is_cut(server.name, member.name):
            return
        if not member.up:
            if self.rng.random() < 0.5:  # the host answers with a reset, or is silent
                self._answer(member, server, reply, Failed("connection refused"))
            return
        member.run(member.incarnation, self._at_member, (member, server, op, reply))

    def _at_member(self, member: EtcdMember, server: Process, op: Op, reply: Reply) -> None:
        if isinstance(op, Read) and op.serializable:
            self._answer(member, server, reply, self.applied[member.name])
            return
        leader = self.leader
        if leader is None or not self.reach(member.name, leader):
            if self.rng.random() < 0.5:
                self._answer(member, server, reply, Failed("etcdserver: no leader"))
            return  # else: dropped, the request times out
        if leader == member.name:
            self._at_leader(member, member, server, op, reply)
        else:
            to = self.members[leader]
            self._hop(member, to, self._at_leader, to, member, server, op, reply)

    def _at_leader(self, leader: EtcdMember, via: EtcdMember, server: Process, op: Op,
                   reply: Reply) -> None:
        """The leader of the moment proposes (a write) or confirms its leadership with a
        majority (a read); a deposed one, or one cut from the majority, lets it hang."""
        term = self.term
        if self.leader != leader.name or leader.incarnation != self.leader_incarnation:
            return  # deposed while the request travelled: raft drops the proposal
        round_trip = 2 * self._peer_latency()
        if isinstance(op, Read):
            if self._leader_ok():
                self.sched.at(self.sched.now + round_trip, self._read_confirmed, leader,
                              term, via, server, reply)
        elif self._leader_ok():
            self.sched.at(self.sched.now + round_trip, self._replicated,
                          _Proposal(op, term, via, server, reply), leader)
        else:  # in its log, committed if it gets its majority back (or by a successor)
            self.limbo.append(_Proposal(op, term, via, server, reply))

    def _read_confirmed(self, leader: EtcdMember, term: int, via: EtcdMember,
                        server: Process, reply: Reply) -> None:
        if not self._leads(leader.name, term):
            return  # not confirmed: the read hangs
        self._settle_limbo()
        self._back(leader, via, server, reply, Value(self.value, self.mod_revision))

    def _replicated(self, proposal: _Proposal, leader: EtcdMember) -> None:
        if self._leads(leader.name, proposal.term):
            self._settle_limbo()
            self._commit(proposal)
        else:
            self.limbo.append(proposal)

    def _commit(self, p: _Proposal) -> None:
        """Apply a transaction: its compare reads the key as it is now."""
        txn = p.txn
        if txn.compare != self.mod_revision:
            answer: Answer = Committed(False, self.value, self.mod_revision)
        else:
            self._check_record(txn.value, self.revision + 1)
            self.revision += 1
            self.commits += 1
            self.value = txn.value
            self.mod_revision = self.revision
            answer = Committed(True, None, self.revision)
            self.world.trace(None, "etcd", f"revision {self.revision} by {p.server.name}: "
                                           f"{txn.value.decode()}")
            self._replicate()
        leader = self.members[self.leader] if self.leader is not None else p.via
        self._back(leader, p.via, p.server, p.reply, answer)

    def _check_record(self, value: bytes, revision: int) -> None:
        """Across committed revisions the revision strictly increases and the record's
        epoch never goes down."""
        if revision <= self.mod_revision:
            self.world.violation(f"etcd: revision {revision} committed after "
                                 f"{self.mod_revision}")
        epoch = int(json.loads(value)["epoch"])
        if epoch < self.epoch:
            self.world.violation(f"etcd: the record's epoch went down from {self.epoch} to "
                                 f"{epoch} at revision {revision}")
        self.epoch = epoch

    # ------------------------------------------------------------ members' copies, watches

    def _replicate(self) -> None:
        """The members that run and reach the leader apply what is committed (the leader
        first: it committed it); the others lag behind."""
        current = Value(self.value, self.mod_revision)
        leader = self.leader
        for name in MEMBERS:
            if self.applied[name].revision < current.revision and self._alive(name) \
                    and leader is not None and self.reach(leader, name):
                self.applied[name] = current
                self._notify(name, current)

    def watch(self, server: Process, member: str, event: Event,
              ended: Callable[[], None]) -> bool:
        """A server's watch of the key on one member: `event` for each revision the member
        applies from now on, `ended` when the member dies. False: it cannot connect."""
        if not self.members[member].up or self.net.links.is_cut(server.name, member) \
                or self.net.links.is_cut(member, server.name):
            return False
        self.watchers[member].append(_Watch(server, server.incarnation, event, ended))
        return True

    def _notify(self, member: str, value: Value) -> None:
        """Over a cut link an event is lost (the stream stays open, silent)."""
        watchers = self.watchers[member]
        watchers[:] = [w for w in watchers if w.incarnation == w.server.incarnation]
        for w in watchers:
            self.sched.at(self.sched.now + self._client_latency(), self._streamed, member, w,
                          value)

    def _streamed(self, member: str, w: _Watch, value: Value) -> None:
        if not self.net.links.is_cut(member, w.server.name):
            w.event(value)

    def crashed(self, member: str) -> None:
        """The member's watches end (the connection is reset)."""
        watchers, self.watchers[member] = self.watchers[member], []
        for w in watchers:
            self.sched.at(self.sched.now + self._client_latency(), w.ended)

    # ------------------------------------------------------------ the way back

    def _back(self, leader: EtcdMember, via: EtcdMember, server: Process, reply: Reply,
              answer: Answer) -> None:
        if via is leader:
            self._answer(via, server, reply, answer)
        else:
            self._hop(leader, via, self._answer, via, server, reply, answer)

    def _answer(self, member: EtcdMember, server: Process, reply: Reply,
                answer: Answer) -> None:
        self.sched.at(self.sched.now + self._client_latency(), self._delivered, member.name,
                      server, reply, answer)

    def _delivered(self, member: str, server: Process, reply: Reply, answer: Answer) -> None:
        if not self.net.links.is_cut(member, server.name):
            reply(answer)

    def _hop(self, src: EtcdMember, dst: EtcdMember, fn: Callable[..., None],
             *args: Any) -> None:
        """A message between members: lost over a cut link or to a process that died."""
        incarnation = dst.incarnation
        self.sched.at(self.sched.now + self._peer_latency(), self._hopped, src.name, dst,
                      incarnation, fn, args)

    def _peer_latency(self) -> float:
        return self.rng.uniform(*self.latency)

    def _client_latency(self) -> float:
        return self.rng.uniform(*self.client_latency)

    def _request_latency(self) -> float:
        """A server's request: sometimes it arrives late, after the server gave up on it
        (`SimConfig.late_requests`, as a witness request)."""
        net = self.net
        if net.late and self.rng.random() < net.late:
            return self.rng.uniform(0, net.late_delay)
        return self._client_latency()

    def _hopped(self, src: str, dst: EtcdMember, incarnation: int, fn: Callable[..., None],
                args: tuple[Any, ...]) -> None:
        if not self.net.links.is_cut(src, dst.name):
            dst.run(incarnation, fn, args)
