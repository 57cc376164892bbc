"""A simulated pairmq server: the replication machine with what server/pair/replication.py
and the server around it do for it (the HA channel, the replication stream,
synchronisation, witness requests with timeout and retry as server/pair/witness_client.py
makes them, or etcd requests as server/pair/etcd_arbiter.py does: etcd_client.py, roles,
receipts), on simulated time. What it asks of the world around it is
`SimWorld` (world.py's `World` is one)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol, assert_never

from pairmq.ha import channel as ch
from pairmq.ha import events as ev
from pairmq.ha.lag import ReplicationLag, backup_stalled
from pairmq.ha.messages import PeerHello, SeqMessage, SyncOffer, SyncRequest, WitnessPurpose
from pairmq.ha.phases import Settings
from pairmq.ha.pump import EffectPump
from pairmq.ha.replication import ReplicationMachine
from pairmq.ha.sim.etcd_client import SimEtcdClient
from pairmq.ha.sim.journal import JournalError, Rec, SimJournal
from pairmq.ha.sim.net import CLOSE, WELCOME, Conn, Process, Scheduler
from pairmq.ha.syncplan import plan_sync
from pairmq.store.stall import StallWatch

STANDBY, SERVING = "standby", "serving"  # the server's role kind (server/role/role.py)


@dataclass
class Ticket:
    """A producer's message waiting for its receipt."""

    seq: int
    msg: int
    generation: int


class SimWorld(Protocol):
    """What a simulated server asks of the world it runs in: the clock and the randomness
    of the disk and of recoveries, the network to its peer and the witness, and the
    invariants' bookkeeping (what was appended and confirmed, a violation, the trace)."""

    sched: Scheduler
    activation: float  # seconds of silence after which a channel is given up
    stall_timeout: float  # [store] stall_timeout_ms, in seconds

    def recovery_delay(self) -> float: ...

    def disk_delay(self) -> float: ...

    def disk_stall_left(self, server: SimServer) -> float:
        """How much longer the server's disk completes no write (0: it does)."""

    def sync_delay(self, records: int) -> float: ...

    def new_marker(self) -> int: ...

    def dial(self, server: SimServer) -> None: ...

    def to_witness(self, server: SimServer, key: tuple[int, int],
                   request: dict[str, Any]) -> None: ...

    def appended(self, server: SimServer, rec: Rec) -> None: ...

    def confirmed(self, server: SimServer, ticket: Ticket) -> None: ...

    def violation(self, message: str) -> None: ...

    def trace(self, proc: Process | None, what: str, detail: Any) -> None: ...


class SimServer(Process):
    def __init__(self, world: SimWorld, name: str, role: str, settings: Settings,
                 rate: float, offset: float) -> None:
        super().__init__(name, world.sched, rate, offset)
        self.world = world
        self.settings = settings
        self.role_cfg = role
        self.journal = SimJournal()
        self.machine = ReplicationMachine(settings, self.journal)
        self.announced = self.machine.state.value  # the state its StateChanged last named
        self.kind = STANDBY
        self.generation = 0
        self.confirmed_seq = 0
        self.tickets: list[Ticket] = []
        self.link: Conn | None = None
        self.dialing: Conn | None = None
        self.last_recv = 0.0
        self.live_buffer: list[Rec] | None = None
        self.outgoing: list[Rec] = []
        self.asking: tuple[int, WitnessPurpose, dict[str, Any], float, int] | None = None
        self._ask_ids = 0
        self.etcd_client: SimEtcdClient | None = None  # etcd as the arbiter (etcd_client.py)
        self.check_at: float | None = None
        self.fsync_pending = False
        self.stall = StallWatch(world.stall_timeout)  # store/stall.py, on this clock
        self.lag = ReplicationLag()  # the backup's, as server/pair/replication.py counts it
        self.pump = self._new_pump()
        self.boots = 0
        self.stopping_until: float | None = None
        self.serve_check = (-1, -1, 0)  # (generation, journal version, confirmed checked)

    # ------------------------------------------------------------ lifecycle

    def boot(self) -> None:
        self.up = True
        self.boots += 1  # each run of the process orders its witness requests anew
        self.machine = ReplicationMachine(replace(self.settings, boot=self.boots),
                                          self.journal, started=self.clock())
        self.announced = self.machine.state.value
        self.journal.mirror = False
        self._new_role(STANDBY)
        self.link = self.dialing = None
        self.live_buffer = None
        self.outgoing = []
        self.asking = None
        if self.etcd_client is not None:
            self.etcd_client.restart()
        self.check_at = None
        self.fsync_pending = False
        self.stall = StallWatch(self.world.stall_timeout)
        self.stopping_until = None
        self.pump = self._new_pump()  # what the dead process was to feed dies with it
        self.world.trace(self, "boot", f"journal {self.journal.appended_seq} "
                                       f"(synced {self.journal.synced_seq}) epoch "
                                       f"{self.journal.epoch}")
        self.later(0.0, self._tick)
        if self.role_cfg == "backup":
            self.later(0.0, self._dial)
        if self.journal.appended_seq > self.journal.synced_seq:
            self._want_fsync()

    def crash(self) -> None:
        """SIGKILL: what was not fsynced is lost; the kernel closes the connections."""
        self._close_conns()
        self.kill()
        self.journal.crash()
        self.tickets = []
        self.world.trace(self, "crash", f"journal kept up to {self.journal.appended_seq}")

    def _close_conns(self) -> None:
        for conn in (self.link, self.dialing):
            if conn is not None:
                conn.close(self)
        self.link = self.dialing = None

    def _new_role(self, kind: str) -> None:
        self.kind = kind
        self.generation += 1
        self.tickets = []  # the old role's connections are closed: no receipt goes out
        self.confirmed_seq = self.journal.synced_seq if kind == SERVING else 0

    # ------------------------------------------------------------ feeding the machine

    def _new_pump(self) -> EffectPump[ev.Event, ev.Effect]:
        return EffectPump(self._step, self._carry_out, self._after)

    def _step(self, event: ev.Event) -> list[ev.Effect]:
        self.world.trace(self, "in", event)
        return self.machine.handle(event, self.clock())

    def feed(self, event: ev.Event) -> None:
        self.pump.feed(event)

    def check_now(self) -> None:
        """The machine's lease check at this instant (what /status runs before answering)."""
        self._apply(self.machine.check(self.clock()))

    def _apply(self, effects: list[ev.Effect]) -> None:
        self.pump.apply(effects)

    def _after(self) -> None:
        if self.machine.state.value != self.announced:
            self.world.violation(f"{self.name} reports {self.machine.state.value} but last "
                                 f"announced {self.announced}: a silent change of state")
        self._flush_records()
        self.update_confirmed()
        self._schedule_check()

    def _carry_out(self, effect: ev.Effect) -> None:
        match effect:
            case ev.Send(kind, payload):
                if kind != ch.HORIZON and self.link is not None:
                    self.link.send(self, kind, payload.to_wire())  # the receiver's own copy
                return
            case ev.ConfirmationsChanged():
                self.update_confirmed()
                return
            case ev.AskWitness(purpose, request):
                self._ask_witness(purpose, request)
            case ev.BecomeActive(epoch):
                delay = self.world.recovery_delay() if self.kind != SERVING else 0.0
                self.later(delay, self._became_active, epoch)
            case ev.BecomePassive():
                if self.kind == SERVING:
                    self.world.violation(f"{self.name}: BecomePassive for a serving role "
                                         "(a serving role gets StepDown)")
                self.live_buffer = None
                self.outgoing = []
                self.journal.mirror = True
                self._new_role(STANDBY)
            case ev.StepDown():
                # server.stop_serving at once, then server.read_back (a thread: it takes
                # as long as a recovery, and the world goes on meanwhile)
                self.live_buffer = None
                self.outgoing = []
                self._new_role(STANDBY)
                self.later(self.world.recovery_delay(), self._read_back)
            case ev.BeginEpoch(epoch):
                self._begin_epoch(epoch)
            case ev.ServeSync(request):
                if self.link is not None:
                    self._serve_sync(self.link, request)
            case ev.WipeJournal(first):
                self.journal.wipe(first)
            case ev.CloseClients():
                self.tickets = []
            case ev.StateChanged(old, new):
                if old != self.announced:
                    self.world.violation(f"{self.name}: StateChanged from {old}, but the "
                                         f"state announced last was {self.announced}")
                self.announced = new
                if old in ("ACTIVE", "STANDALONE") and new not in ("ACTIVE", "STANDALONE"):
                    self.tickets = []
                self.update_confirmed()
            case ev.Persist() | ev.PeerStateChanged() | ev.Log():
                pass
            case _:
                assert_never(effect)
        self.world.trace(self, "out", effect)

    # ------------------------------------------------------------ timers

    def _tick(self) -> None:
        if self.machine.stopped:
            return
        self.world.trace(self, "tick", None)
        self._apply(self.machine.tick(self.clock()))
        waited = self.stall.check(self.clock())  # the writer's periodic look (writer.py)
        if waited is not None:
            self.feed(ev.JournalStalled(waited))
        self._drop_stalled_backup()
        self.later(self.settings.heartbeat, self._tick)

    def _drop_stalled_backup(self) -> None:
        """server/pair/replication.py's: a backup receipts wait for, silent past the stall
        timeout, loses its link."""
        link = self.link
        if link is None or not self.machine.receipts_wait_for_backup:
            return
        lag = self.lag.view(self.journal.appended_seq, self.clock())
        if backup_stalled(lag, self.world.stall_timeout):
            self._drop(link, f"backup stalled: no acknowledgement for {lag.seconds:.1f} s")

    def _schedule_check(self) -> None:
        now = self.clock()
        deadline = self.machine.deadline(now)
        if deadline is None:
            return
        at = self.sched.now + (deadline - now) / self.rate + 0.001
        if self.check_at is not None and self.sched.now < self.check_at <= at:
            return
        self.check_at = at
        self.later(at - self.sched.now, self._check, at)

    def _check(self, at: float) -> None:
        if self.check_at != at:
            return
        self.check_at = None
        self._apply(self.machine.check(self.clock()))

    def status(self) -> None:
        """What `GET /status` does: report what the server does at this instant."""
        self._apply(self.machine.check(self.clock()))

    # ------------------------------------------------------------ roles and the journal

    def _read_back(self) -> None:
        if self.fsync_pending and self.world.disk_stall_left(self):
            # store.close_off_loop waits for the write in flight, off the loop
            self.later(self.world.disk_stall_left(self), self._read_back)
            return
        self.journal.mirror = True
        self.feed(ev.SteppedDown())

    def _became_active(self, epoch: int) -> None:
        """server.become_active: a new serving role over this journal, the epoch journaled
        first (a serving role only journals the new epoch)."""
        if self.kind != SERVING:
            stalled = self.world.disk_stall_left(self)
            if stalled:  # so does its wait: the disk completes nothing before
                self.later(stalled, self._became_active, epoch)
                return
            self.journal.sync_all()  # recovery waits for the mirror to reach the disk
            self.journal.mirror = False
            self._new_role(SERVING)
            self.live_buffer = None
        self._begin_epoch(epoch)
        self.feed(ev.Recovered(epoch))

    def _begin_epoch(self, epoch: int) -> None:
        try:
            rec = self.journal.begin_epoch(epoch, self.world.new_marker())
        except JournalError as e:
            self.world.violation(f"{self.name}: {e}")
            return
        self.world.appended(self, rec)
        self._on_append(rec)
        self._want_fsync()

    def produce(self, msg: int) -> Rec:
        """A producer's SEND with a receipt: journaled, streamed, confirmed later."""
        rec = self.journal.append(msg)
        self.world.appended(self, rec)
        self.tickets.append(Ticket(rec.seq, msg, self.generation))
        self._on_append(rec)
        self._want_fsync()
        self._flush_records()
        self.update_confirmed()
        return rec

    def update_confirmed(self) -> None:
        """Role.update_confirmed: receipts go out up to what the machine allows now."""
        if self.kind != SERVING:
            return
        new = self.machine.confirmable(self.journal.synced_seq, self.confirmed_seq,
                                       self.clock())
        if new <= self.confirmed_seq:
            return
        self.confirmed_seq = new
        keep = []
        for ticket in self.tickets:
            if ticket.seq <= new:
                self.world.confirmed(self, ticket)
            else:
                keep.append(ticket)
        self.tickets = keep

    def _want_fsync(self) -> None:
        if not self.fsync_pending and self.journal.appended_seq > self.journal.synced_seq:
            self.fsync_pending = True
            self.stall.began(self.clock())
            self.later(self.world.disk_delay(), self._fsynced, self.journal.appended_seq,
                       self.journal.version)

    def _fsynced(self, upto: int, version: int) -> None:
        held = self.world.disk_stall_left(self)
        if held:  # a stalled disk holds the write in flight until it completes writes
            self.later(held, self._fsynced, upto, version)
            return
        self.fsync_pending = False
        if self.stall.ended(self.clock()) is not None:
            self.feed(ev.JournalFlowing())
        if version == self.journal.version:
            self.journal.fsynced(upto)
            if self.journal.mirror:
                self.feed(ev.MirrorProgress(self.journal.appended_seq, self.journal.synced_seq))
            else:
                self.update_confirmed()
        self._want_fsync()

    # ------------------------------------------------------------ the replication stream

    def _on_append(self, rec: Rec) -> None:
        if self.link is None or not self.machine.serving:
            return
        if self.live_buffer is not None:
            self.live_buffer.append(rec)
        elif self.machine.live_stream:
            self.outgoing.append(rec)

    def _flush_records(self) -> None:
        if self.outgoing:
            if self.link is not None:
                self.link.send(self, ch.RECORDS, self.outgoing)
                self.lag.sent(self.outgoing[-1].seq, 0, self.clock())
            self.outgoing = []

    def _serve_sync(self, link: Conn, request: SyncRequest) -> None:
        journal = self.journal
        plan = plan_sync(request, journal.appended_seq, journal.oldest_seq, journal.epochs)
        self.live_buffer = []
        link.send(self, ch.SYNC, SyncOffer(plan.mode, plan.first, plan.upto).to_wire())
        self.later(self.world.sync_delay(plan.upto - plan.first + 1), self._sync_read, link,
                   plan.first, plan.upto)

    def _sync_read(self, link: Conn, first: int, upto: int) -> None:
        if self.journal.synced_seq < min(upto, self.journal.appended_seq):
            self.later(self.world.disk_delay(), self._sync_read, link, first, upto)
            return  # await server.synced(upto)
        records = self.journal.span(first, upto)
        if records is None:
            self.world.trace(self, "sync", "aborted: records not held any more")
            if self.link is not link:
                self.live_buffer = None
            return
        if self.link is not link:
            self.live_buffer = None
            return
        buffered, self.live_buffer = self.live_buffer or [], None
        if records:
            link.send(self, ch.RECORDS, list(records))
        if buffered:
            link.send(self, ch.RECORDS, buffered)
        done = self.journal.appended_seq
        link.send(self, ch.SYNC_DONE, SeqMessage(done).to_wire())
        self.feed(ev.SyncServed(done))

    # ------------------------------------------------------------ the HA channel

    def _dial(self) -> None:
        """The backup-role server connects to the primary-role one every heartbeat."""
        if self.machine.stopped:
            return
        if self.link is None and self.dialing is None:
            self.world.dial(self)
        self.later(self.settings.heartbeat, self._dial)

    def accept(self, conn: Conn, hello: dict[str, Any]) -> None:
        """Listener side of a new connection: it replaces any older one."""
        conn.send(self, WELCOME, self.machine.hello(self.clock()).to_wire())  # the handshake's end
        self._adopt(conn, hello)

    def _adopt(self, conn: Conn, hello: dict[str, Any]) -> None:
        if self.link is not None and self.link is not conn:
            self.link.close(self)
        self.link = conn
        self.live_buffer = None
        self.outgoing = []
        self.lag.reset(PeerHello.from_wire(hello).last_seq)
        self.last_recv = self.sched.now
        self.later(self.world.activation, self._recv_timeout, conn)
        self.feed(ev.PeerConnected(PeerHello.from_wire(hello)))

    def dial_timeout(self, conn: Conn) -> None:
        if self.dialing is conn:
            self.dialing = None
            conn.close(self)

    def _recv_timeout(self, conn: Conn) -> None:
        if self.link is not conn:
            return
        due = self.last_recv + self.world.activation
        if self.sched.now < due:
            self.later(due - self.sched.now, self._recv_timeout, conn)
            return
        self._drop(conn, f"no heartbeat for {self.settings.activation_ms} ms")

    def _drop(self, conn: Conn, reason: str) -> None:
        conn.close(self)
        if self.link is conn:
            self.link = None
            self.live_buffer = None
            self.outgoing = []
            self.feed(ev.PeerLost(reason))

    def on_message(self, conn: Conn, kind: int, payload: Any) -> None:
        if kind == WELCOME:
            if self.dialing is conn:
                self.dialing = None
                self._adopt(conn, payload)
            else:
                conn.close(self)
            return
        if conn is not self.link:
            return
        self.last_recv = self.sched.now
        if kind == CLOSE:
            self._drop(conn, "closed by the peer")
        elif kind == ch.RECORDS:
            self._mirror(conn, payload)
        else:
            event = ev.from_channel(kind, payload)
            if isinstance(event, ev.BackupAcked):
                self.lag.acked(event.seq)
            if event is not None:
                self.feed(event)

    def _mirror(self, conn: Conn, records: list[Rec]) -> None:
        journal = self.journal
        if not journal.mirror:
            self._drop(conn, "protocol error: records arrived but this server is not a backup")
            return
        try:
            for rec in records:
                if rec.seq > journal.appended_seq:
                    journal.append_mirrored(rec)
        except JournalError as e:
            self._drop(conn, f"protocol error: {e}")
            return
        self._want_fsync()
        if not self.settings.backup_ack_fsync:
            self.feed(ev.MirrorProgress(journal.appended_seq, journal.synced_seq))

    # ------------------------------------------------------------ the witness

    def _ask_witness(self, purpose: WitnessPurpose, request: dict[str, Any]) -> None:
        if self.etcd_client is not None:
            self.etcd_client.ask(purpose, _copy(request))
            return
        self._ask_ids += 1
        self.asking = (self._ask_ids, purpose, _copy(request), self.clock(), 0)
        self._send_request()

    def _send_request(self) -> None:
        assert self.asking is not None
        ask_id, _, request, _, attempt = self.asking
        self.world.to_witness(self, (ask_id, attempt), request)
        self.later(self.settings.heartbeat, self._request_timeout, ask_id, attempt)

    def _request_timeout(self, ask_id: int, attempt: int) -> None:
        if self.asking is None or self.asking[0] != ask_id or self.asking[4] != attempt:
            return
        _, purpose, request, requested_at, _ = self.asking
        if attempt == 0:
            self.asking = (ask_id, purpose, request, requested_at, 1)
            self._send_request()
            return
        self.asking = None
        self.feed(ev.witness_replied(purpose, None, requested_at))

    def witness_reply(self, key: tuple[int, int], reply: dict[str, Any]) -> None:
        if self.asking is None or (self.asking[0], self.asking[4]) != key:
            self.world.trace(self, "late reply dropped", reply)
            return
        _, purpose, _, requested_at, _ = self.asking
        self.asking = None
        self.feed(ev.witness_replied(purpose, reply, requested_at))

    # ------------------------------------------------------------ operator

    def force(self) -> str | None:
        refused = self.machine.force_refused()
        if refused is None:
            self.feed(ev.Force())
        return refused

    def shutdown(self, on_stopped: Callable[[], None]) -> None:
        """SIGTERM: the machine stops (maybe after a hand-over), then the process ends."""
        self.stopping_until = self.sched.now + self.settings.sync_timeout + self.world.activation
        self.feed(ev.Shutdown())
        self._wait_stopped(on_stopped)

    def _wait_stopped(self, on_stopped: Callable[[], None]) -> None:
        assert self.stopping_until is not None
        if self.machine.stopped or self.sched.now >= self.stopping_until:
            self._flush_records()
            self._close_conns()
            self.kill()
            self.journal.sync_all()
            self.tickets = []
            self.world.trace(self, "stopped", None)
            on_stopped()
            return
        self.later(self.settings.heartbeat / 10, self._wait_stopped, on_stopped)


def _copy(payload: dict[str, Any]) -> dict[str, Any]:
    """What crossing the wire as JSON does to a payload: the receiver gets its own copy."""
    return {k: (list(v) if isinstance(v, list) else v) for k, v in payload.items()}
