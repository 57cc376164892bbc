"""The simulated pair: two servers, an arbiter (a witness, or an etcd cluster: etcd.py), a
producer, the network, and the invariants checked after every step (docs/ha.md,
"Simulator")."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from random import Random
from typing import Any

from pairmq.ha.lease import WitnessLeases, answer
from pairmq.ha.phases import Settings
from pairmq.ha.sim.etcd import MEMBERS, EtcdMember, SimEtcd
from pairmq.ha.sim.etcd_client import SimEtcdClient
from pairmq.ha.sim.journal import Rec
from pairmq.ha.sim.net import Conn, Net, Process, Scheduler
from pairmq.ha.sim.server import SERVING, SimServer, Ticket

PRIMARY, BACKUP, WITNESS = "primary", "backup", "witness"


class Violation(Exception):
    """An invariant broke: the message says which, the world's trace says how."""


@dataclass
class SimConfig:
    heartbeat: float = 0.5
    activation_ms: int = 1500
    sync_timeout: float = 10.0
    allow_failback: bool = True
    failover_on_shutdown: bool = False
    witness: bool = True  # an arbiter exists (`arbiter` says which)
    arbiter: str = "witness"  # "witness" (SimWitness) | "etcd" (etcd.py's cluster)
    latency: tuple[float, float] = (0.0005, 0.005)
    etcd_latency: tuple[float, float] = (0.0002, 0.002)  # between etcd members (one site)
    etcd_client_latency: tuple[float, float] = (0.0005, 0.005)  # a server to a member
    late_requests: float = 0.0  # probability that a witness (or etcd) request arrives late
    disk: tuple[float, float] = (0.001, 0.01)
    slow_disk: float = 0.0  # probability of an fsync taking up to a heartbeat
    # [store] stall_timeout_ms: above the longest heartbeat timeout the runner draws (4 s),
    # so that a silent backup is dropped for its silence first, as before stalls existed
    stall_timeout: float = 5.0
    recovery: tuple[float, float] = (0.005, 0.05)
    rates: dict[str, float] = field(default_factory=dict)  # clock rates by process
    produce_every: float | None = 0.1  # None: no producer
    trace_size: int = 400


@dataclass
class Confirmed:
    msg: int
    seq: int
    server: str
    epoch: int
    at: float


class SimWitness(Process):
    def __init__(self, world: World, rate: float, offset: float) -> None:
        super().__init__(WITNESS, world.sched, rate, offset)
        self.world = world
        self.leases = WitnessLeases()
        self.saved: tuple[Any, ...] | None = None

    def boot(self) -> None:
        self.up = True
        if self.saved is not None:  # `--state FILE`: sit out the longest lease granted
            holder, epoch, standby, last_ms = self.saved
            self.leases = WitnessLeases(holder, epoch, self.clock() + last_ms / 1000,
                                        standby, last_ms)
        else:
            self.leases = WitnessLeases()
        self.world.trace(self, "boot", self.saved)

    def crash(self, keep_state: bool = True) -> None:
        self.kill()
        if not keep_state:
            self.saved = None
        self.world.trace(self, "crash", "state kept" if keep_state else "state lost")

    def request(self, server: SimServer, key: tuple[int, int], request: dict[str, Any]) -> None:
        leases = self.leases
        before = leases.epoch
        reply = answer(leases, request, self.clock())
        self.saved = (leases.holder, leases.epoch, leases.standby, leases.last_ms)
        self.world.trace(self, f"answer {server.name}", (request, reply))
        if leases.epoch < before:
            self.world.violation(f"the witness's epoch went down from {before} to "
                                 f"{leases.epoch}")
        self.sched.at(self.sched.now + self.world.net.latency(), self._reply, server,
                      server.incarnation, key, reply)

    def _reply(self, server: SimServer, incarnation: int, key: tuple[int, int],
               reply: dict[str, Any]) -> None:
        """An answer over a link cut while it travels is lost (the server times out)."""
        if not self.world.net.links.is_cut(WITNESS, server.name):
            server.run(incarnation, server.witness_reply, (key, reply))


class World:
    def __init__(self, config: SimConfig, seed: int = 0) -> None:
        self.config = config
        self.rng = Random(seed)
        self.sched = Scheduler()
        self.net = Net(self.rng, config.latency, config.late_requests, 3 * config.heartbeat)
        self.activation = config.activation_ms / 1000
        self.stall_timeout = config.stall_timeout
        self.stalled_until: dict[str, float] = {}  # a server's disk completes no write before
        self.servers = {name: self._server(name) for name in (PRIMARY, BACKUP)}
        rate = config.rates.get(WITNESS, 1.0)
        self.witness = SimWitness(self, rate, self.rng.uniform(0, 1000))
        self.witness.on_step = self._after_step
        self.etcd: SimEtcd | None = None
        self.arbiters: tuple[str, ...] = (WITNESS,)  # the processes that arbitrate
        if config.arbiter == "etcd":
            self._with_etcd()
        elif config.arbiter != "witness":
            raise ValueError(f"unknown arbiter {config.arbiter!r}: witness or etcd")
        self.confirmations: list[Confirmed] = []
        self._msgs = 0
        self._markers = 0
        self._trace: deque[tuple[float, str, str, Any]] = deque(maxlen=config.trace_size)
        self.full_trace: list[tuple[float, str, str, Any]] | None = None
        self.violations: list[str] = []
        self.confirmers: dict[str, float] = {}  # who may confirm now: since when
        self.producing = config.produce_every is not None
        self.forced = False  # an operator forced an activation: it vouches for the journal
        if self.producing:
            self.sched.at(0.0, self._produce)

    def _server(self, name: str) -> SimServer:
        cfg = self.config
        settings = Settings(
            name=name, identity=f"{name}#{name[:1]}0", role=name, stomp=f"{name}:61613",
            witness=cfg.witness, heartbeat=cfg.heartbeat, activation_ms=cfg.activation_ms,
            sync_timeout=cfg.sync_timeout, allow_failback=cfg.allow_failback,
            failover_on_shutdown=cfg.failover_on_shutdown, synchronous=True,
            backup_ack_fsync=True)
        server = SimServer(self, name, name, settings, cfg.rates.get(name, 1.0),
                           self.rng.uniform(0, 1000))
        server.on_step = self._after_step
        self.net.receive[name] = server.on_message
        return server

    def _with_etcd(self) -> None:
        """The servers ask an etcd cluster instead of the witness."""
        self.etcd = etcd = SimEtcd(self, self.config.etcd_latency,
                                   self.config.etcd_client_latency)
        self.arbiters = MEMBERS
        for server in self.servers.values():
            server.etcd_client = SimEtcdClient(server, server.feed, self.trace, etcd,
                                               self.config.heartbeat, self.activation)

    # ------------------------------------------------------------ randomness of the world

    def recovery_delay(self) -> float:
        return self.rng.uniform(*self.config.recovery)

    def disk_delay(self) -> float:
        if self.config.slow_disk and self.rng.random() < self.config.slow_disk:
            return self.rng.uniform(0, self.config.heartbeat)
        return self.rng.uniform(*self.config.disk)

    def disk_stall_left(self, server: SimServer) -> float:
        return max(0.0, self.stalled_until.get(server.name, 0.0) - self.sched.now)

    def stall_disk(self, name: str, duration: float) -> None:
        """The server's disk completes no write for `duration` (fsfreeze, a frozen
        volume): the process and its network go on."""
        self.stalled_until[name] = max(self.stalled_until.get(name, 0.0),
                                       self.sched.now + duration)
        self.trace(None, "disk stall", f"{name} for {duration:.3f} s")

    def sync_delay(self, records: int) -> float:
        return self.rng.uniform(0.001, 0.01) + records * 0.00001

    def new_marker(self) -> int:
        self._markers += 1
        return -self._markers

    # ------------------------------------------------------------ the network

    def dial(self, server: SimServer) -> None:
        """server/pair/ha_link.py open_link: the handshake needs both directions and a listener
        that runs; a silent listener makes the dialer give up after the activation time."""
        other = self.servers[PRIMARY if server.name == BACKUP else BACKUP]
        conn = Conn(self.net, server, other)
        server.dialing = conn
        server.later(self.activation, server.dial_timeout, conn)
        links = self.net.links
        if not other.up or links.is_cut(server.name, other.name) \
                or links.is_cut(other.name, server.name):
            conn.closed.add(other.name)
            return
        other.later(self.net.latency(), self._accept, other, conn,
                    server.machine.hello(server.clock()).to_wire())

    def _accept(self, server: SimServer, conn: Conn, hello: dict[str, Any]) -> None:
        server.accept(conn, hello)

    def to_witness(self, server: SimServer, key: tuple[int, int],
                   request: dict[str, Any]) -> None:
        if not self.config.witness or self.net.links.is_cut(server.name, WITNESS):
            return
        self.sched.at(self.sched.now + self.net.request_latency(), self._request_arrives,
                      server, key, request)

    def _request_arrives(self, server: SimServer, key: tuple[int, int],
                         request: dict[str, Any]) -> None:
        witness = self.witness
        if not self.net.links.is_cut(server.name, WITNESS):
            witness.run(witness.incarnation, witness.request, (server, key, request))

    def cut(self, a: str, b: str, both: bool = True) -> None:
        self.trace(None, "cut", f"{a} -> {b}" + (" both ways" if both else ""))
        self.net.links.set_cut(a, b)
        if both:
            self.net.links.set_cut(b, a)

    def heal(self, a: str, b: str, both: bool = True) -> None:
        self.trace(None, "heal", f"{a} -> {b}" + (" both ways" if both else ""))
        self.net.links.heal(a, b)
        if both:
            self.net.links.heal(b, a)

    def isolate(self, name: str) -> None:
        """Cut from the other server and the arbiter (with etcd: every member)."""
        for other in (PRIMARY, BACKUP, *self.arbiters):
            if other != name:
                self.cut(name, other)

    def rejoin(self, name: str) -> None:
        for other in (PRIMARY, BACKUP, *self.arbiters):
            if other != name:
                self.heal(name, other)

    def heal_all(self) -> None:
        for a, b in sorted(self.net.links.cut):
            self.heal(a, b, both=False)

    # ------------------------------------------------------------ processes

    def process(self, name: str) -> SimServer | SimWitness | EtcdMember:
        if name == WITNESS:
            return self.witness
        if self.etcd is not None and name in self.etcd.members:
            return self.etcd.members[name]
        return self.servers[name]

    def start(self, name: str) -> None:
        proc = self.process(name)
        proc.boot()
        if isinstance(proc, EtcdMember):
            self.trace(None, "boot", name)
        self._after_step(None)

    def crash(self, name: str, keep_state: bool = True) -> None:
        proc = self.process(name)
        if proc.up:
            if isinstance(proc, SimWitness):
                proc.crash(keep_state)
            else:
                proc.crash()
                if isinstance(proc, EtcdMember) and self.etcd is not None:
                    self.etcd.crashed(name)
                    self.trace(None, "crash", name)
            self._after_step(None)

    def pause(self, name: str, duration: float) -> None:
        proc = self.process(name)
        if proc.up:
            self.trace(proc, "pause", f"{duration:.3f} s")
            proc.pause(duration)

    def shutdown(self, name: str) -> None:
        server = self.servers[name]
        if server.up:
            server.shutdown(lambda: self._after_step(None))
            self._after_step(None)

    def force(self, name: str) -> str | None:
        refused = self.servers[name].force()
        self.forced = self.forced or refused is None
        self._after_step(None)
        return refused

    # ------------------------------------------------------------ running

    def run_until(self, until: float, stop: Callable[[], bool] | None = None) -> bool:
        """Run events up to time `until` (or until `stop()` is true: returns True)."""
        sched = self.sched
        while True:
            if stop is not None and stop():
                return True
            when = sched.next_time()
            if when is None or when > until:
                sched.now = max(sched.now, until)
                return False
            fn, args = sched.pop()
            fn(*args)

    def run_for(self, seconds: float, stop: Callable[[], bool] | None = None) -> bool:
        return self.run_until(self.sched.now + seconds, stop)

    def _produce(self) -> None:
        if not self.producing:
            return
        targets = [s for s in self.servers.values() if s.up and s.paused_until is None
                   and s.kind == SERVING and s.machine.state.serving]
        if targets:
            server = targets[0] if len(targets) == 1 else self.rng.choice(targets)
            self._msgs += 1
            rec = server.produce(self._msgs)
            self.trace(server, "produce", rec)
            self._after_step(server)
        every = self.config.produce_every or 0.1
        self.sched.at(self.sched.now + self.rng.uniform(0.5, 1.5) * every, self._produce)

    # ------------------------------------------------------------ what happened

    def appended(self, server: SimServer, rec: Rec) -> None:
        """An original record (not mirrored): no other journal may hold a different record
        at the same sequence number in the same epoch (epochs name one history)."""
        for other in self.servers.values():
            if other is not server:
                theirs = other.journal.get(rec.seq)
                if theirs is not None and theirs.epoch == rec.epoch and theirs.msg != rec.msg:
                    self.violation(f"{server.name} appended seq {rec.seq} in epoch {rec.epoch} "
                                   f"(message {rec.msg}) but {other.name}'s journal holds "
                                   f"message {theirs.msg} there in the same epoch: two "
                                   "histories share an epoch")

    def confirmed(self, server: SimServer, ticket: Ticket) -> None:
        rec = server.journal.get(ticket.seq)
        if rec is None or rec.msg != ticket.msg:
            self.violation(f"{server.name} confirmed message {ticket.msg} at seq {ticket.seq} "
                           f"that its journal does not hold")
        self.confirmations.append(Confirmed(ticket.msg, ticket.seq, server.name,
                                            rec.epoch if rec else -1, self.sched.now))
        self.trace(server, "RECEIPT", f"message {ticket.msg} seq {ticket.seq}")

    def violation(self, message: str) -> None:
        text = f"t={self.sched.now:.4f}: {message}"
        self.violations.append(text)
        self.trace(None, "VIOLATION", message)
        raise Violation(text)

    # ------------------------------------------------------------ invariants

    def may_confirm(self, server: SimServer) -> bool:
        """The machine would let this server confirm a new record at this instant."""
        return server.up and server.kind == SERVING and \
            server.machine.confirmable(1 << 62, -1, server.clock()) >= 0

    def _after_step(self, _proc: Process | None) -> None:
        now = self.sched.now
        able = []
        for server in self.servers.values():
            if self.may_confirm(server):
                able.append(server.name)
                self.confirmers.setdefault(server.name, now)
                if not server.machine.state.serving:
                    self.violation(f"{server.name} may confirm but reports "
                                   f"{server.machine.state.value}")
                if self.config.witness and not self.forced:
                    self._holds_everything(server)
            else:
                self.confirmers.pop(server.name, None)
            if self.config.witness and server.up and server.machine.state.value == "ACTIVE":
                self._active_has_grounds(server)
        if len(able) > 1 and self.config.witness:
            self.violation("both servers may confirm writes at this instant (" + ", ".join(
                f"{s.name}: {s.machine.phase.value} epoch {s.journal.epoch}"
                for s in self.servers.values()) + ")")

    def _active_has_grounds(self, server: SimServer) -> None:
        """A server that reports ACTIVE holds the witness's lease, or its in-sync backup's
        promise, or hands over to that backup on a live channel (issue 21)."""
        if server.paused_until is not None:
            return  # a paused process answers nobody
        if self._grounded(server):
            return
        # What /status does before it answers (server/pair/replication.py): the machine
        # checks its lease at this instant. Here a step came first (at the instant of the
        # check scheduled at the deadline, or the first step after a pause).
        server.check_now()
        m = server.machine
        if m.state.value != "ACTIVE" or self._grounded(server):
            return
        self.violation(f"{server.name} reports ACTIVE ({m.phase.value}) with neither the "
                       "witness's lease nor its backup's promise")

    @staticmethod
    def _grounded(server: SimServer) -> bool:
        m, now = server.machine, server.clock()
        return m.witness_lease.valid(now) or m.peer_lease.valid(now) or (
            m.hand_over is not None and m.connected)

    def _holds_everything(self, server: SimServer) -> None:
        """A server that may confirm holds every record confirmed by anyone before."""
        generation, version, checked = server.serve_check
        journal = server.journal
        if (generation, version) != (server.generation, journal.version):
            checked = 0
        for c in self.confirmations[checked:]:
            rec = journal.get(c.seq)
            if rec is None or rec.msg != c.msg:
                self.violation(f"{server.name} may confirm (epoch {journal.epoch}) but its "
                               f"journal lacks message {c.msg} (seq {c.seq}) confirmed by "
                               f"{c.server} at t={c.at:.4f}: a confirmed message is lost")
        server.serve_check = (server.generation, journal.version, len(self.confirmations))

    def lost(self) -> list[Confirmed]:
        """Confirmed records missing from a serving server's journal."""
        out = []
        for server in self.servers.values():
            if server.up and server.machine.serving:
                for c in self.confirmations:
                    rec = server.journal.get(c.seq)
                    if rec is None or rec.msg != c.msg:
                        out.append(c)
        return out

    # ------------------------------------------------------------ trace

    def trace(self, proc: Process | None, what: str, detail: Any) -> None:
        entry = (self.sched.now, proc.name if proc is not None else "world", what, detail)
        self._trace.append(entry)
        if self.full_trace is not None:
            self.full_trace.append(entry)

    def format_trace(self, entries: list[tuple[float, str, str, Any]] | None = None) -> str:
        lines = []
        for at, who, what, detail in (entries if entries is not None else self._trace):
            text = "" if detail is None else repr(detail) if not isinstance(detail, str) \
                else detail
            lines.append(f"{at:10.4f} {who:8} {what:8} {text}")
        return "\n".join(lines)

    # ------------------------------------------------------------ queries for scenarios

    def state(self, name: str) -> str:
        server = self.servers[name]
        if not server.up:
            return "DOWN"
        server.status()
        return server.machine.state.value

    def serving(self) -> list[str]:
        return [n for n in self.servers if self.state(n) in ("ACTIVE", "STANDALONE")]

    def epoch(self, name: str) -> int:
        return self.servers[name].journal.epoch

    def confirmed_by(self, name: str) -> int:
        return sum(1 for c in self.confirmations if c.server == name)
