"""The driver of the replication pair: sockets, timers and the witness around the machine.

Every decision is taken by `ReplicationMachine` (ha/replication.py), which is fed what
happens here (a channel message, a lost link, a witness answer, a tick) and returns the
effects this driver carries out in order. What stays here is I/O: the HA channel
(peer_channel.py), the replication stream (records sent to the backup, a synchronisation
read from segment files), the witness's requests (through an `Arbiter`,
witness_client.py), and the timers.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Iterator
from dataclasses import asdict, replace
from itertools import islice
from pathlib import Path
from typing import Any, assert_never

from pairmq.ha import channel as ch
from pairmq.ha import events as ev
from pairmq.ha.lag import FollowerLag, ReplicationLag, backup_stalled
from pairmq.ha.lease import LeaseView
from pairmq.ha.messages import PeerHello, SeqMessage, SyncOffer, SyncRequest, WitnessPurpose
from pairmq.ha.phases import Settings
from pairmq.ha.pump import EffectPump
from pairmq.ha.replication import ReplicationMachine
from pairmq.ha.states import State
from pairmq.ha.syncplan import plan_sync
from pairmq.server.pair.ha_link import Link, peer_tls
from pairmq.server.pair.peer_channel import BackgroundTasks, PeerChannel
from pairmq.server.pair.policy import PairHost
from pairmq.server.pair.witness_client import Arbiter, WitnessClient
from pairmq.server.tls import etcd_tls_context
from pairmq.store.replication_frames import MirrorError, new_records, segment_chunks

REPLICATION_HIGH = 32 * 1024 * 1024  # bytes the backup has not applied, past which clients wait
REPLICATION_LOW = 8 * 1024 * 1024  # ... until it is back under this

log = logging.getLogger("pairmq.ha")
trace = logging.getLogger("pairmq.ha.trace")  # deeper HA tracing, at DEBUG

RECORDS_CHUNK = 1024 * 1024
MIRROR_SLICE_S = 0.02  # a backup applies records for this long, then lets the loop run
MIRROR_BATCH = 256  # records appended, handed to the writer, then applied, in one go


class ReplicationDriver:
    """The replication policy as the server sees it (server/pair/policy.py's PairPolicy)."""

    def __init__(self, server: PairHost) -> None:
        cfg = server.config
        self.server = server
        self.config = cfg
        self.heartbeat = cfg.heartbeat_interval_ms / 1000
        self.activation = cfg.activation_interval_ms / 1000
        self.witness_address: str = cfg.witness
        self.machine = ReplicationMachine(Settings(
            name=cfg.name, identity=f"{cfg.name}#{_node_id(Path(cfg.data_dir))}",
            role=cfg.role, stomp="", witness=bool(cfg.witness), heartbeat=self.heartbeat,
            activation_ms=cfg.activation_interval_ms,
            sync_timeout=cfg.initial_replication_sync_timeout_ms / 1000,
            allow_failback=cfg.allow_failback, failover_on_shutdown=cfg.failover_on_shutdown,
            synchronous=cfg.replication_mode == "sync",
            backup_ack_fsync=cfg.backup_ack == "fsync", boot=time.time_ns() // 1000),
            _CurrentJournal(server), started=time.monotonic())
        self.tasks = BackgroundTasks()
        self.channel = PeerChannel(
            server, self.tasks, hello=lambda: self.machine.hello(time.monotonic()).to_wire(),
            activation=self.activation, heartbeat=self.heartbeat, adopted=self._adopted,
            received=self._on_message, ahead=self._heard_ahead, ended=self._ended,
            stopped=lambda: self.machine.stopped)
        self.pump: EffectPump[ev.Event, ev.Effect] = EffectPump(
            lambda event: self.machine.handle(event, time.monotonic()), self._carry_out,
            self._after)
        self.arbiter: Arbiter = _arbiter(server, self.heartbeat, self.activation)
        self.live_buffer: list[bytes] | None = None  # records appended during a sync
        self.lag = ReplicationLag()  # the backup's, as this server counts it while active
        self.following = FollowerLag()  # its own, as this server counts it while a backup
        self.outgoing: list[bytes] = []  # records appended, not yet sent to the backup
        self._flush_scheduled = False
        self._throttled = False  # clients paused: the replication stream is too far ahead
        self._timer: asyncio.TimerHandle | None = None  # the next `_on_timer`
        self._next_tick = 0.0
        self._deadline: float | None = None
        self._stepping_down: asyncio.Task[None] | None = None  # the journal read back (StepDown)
        self._dropping: tuple[Link, str] | None = None  # a stalled backup's link, and why
        if not self.witness_address:
            log.warning("No witness is configured: if the network splits the pair, both "
                        "servers may serve at once (split brain). Configure [ha] witness.")

    # ------------------------------------------------------------ what the server asks

    @property
    def state(self) -> State:
        return self.machine.state

    @property
    def link(self) -> Link | None:
        """The HA channel to the peer, while one is up."""
        return self.channel.link

    def confirmable(self, local: int, current: int) -> int:
        return self.machine.confirmable(local, current, time.monotonic())

    def active_address(self, tls: bool = False) -> str | None:
        return self.machine.active_address(tls)

    def handing_over_to(self, tls: bool = False) -> str | None:
        return self.machine.handing_over_to(tls)

    def topology(self, own: str, tls: bool = False) -> str:
        peer = self.machine.peer.stomp_tls if tls else self.machine.peer.stomp
        return f"{own},{peer}" if peer else own

    def force(self) -> str | None:
        """`pairmq activate`: taken by a server that cannot decide (WAITING, STARTING)."""
        refused = self.machine.force_refused()
        if refused is None:
            self._feed(ev.Force())
        return refused

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        self._apply(self.machine.check(now))  # report what the server does at this instant
        m = self.machine
        store = self.server.store
        info = m.witness_info
        return {
            "name": m.cfg.name, "identity": m.cfg.identity, "role": m.cfg.role,
            "state": m.state.value, "phase": m.phase.value,
            "epoch": store.epoch, "appended_seq": store.appended_seq,
            "synced_seq": store.synced_seq, "confirmed_seq": self.server.confirmed_seq,
            "synchronized-with-backup": m.backup_in_sync and m.serving,
            "synchronized-with-live": not m.serving and m.in_sync_with_live,
            "peer": {"name": m.peer.name or None, "state": m.peer_state.value,
                     "stomp": m.peer.stomp or None, "epoch": m.peer.epoch,
                     "last_seq": m.peer.last_seq},
            # how long this server may still confirm on the strength of each (0: it may not)
            "lease_remaining_ms": _remaining_ms(m.witness_lease, now),
            "backup_promise_remaining_ms": (_remaining_ms(m.peer_lease, now)
                                            if m.backup_in_sync else 0),
            "witness": {**self.arbiter.status(now),
                        "address": self.witness_address or None,
                        "reachable": self.arbiter.reachable(now),
                        "lease_valid": m.witness_lease.valid(now),
                        "holder": info.holder_name, "holder_identity": info.holder,
                        "holder_remaining_ms": info.remaining_ms,
                        # the in-sync backup it would let take over (None: none yet)
                        "standby": info.standby},  # at its last answer
            # while it serves with a backup attached (ha/lag.py; records exact)
            "backup_lag": (asdict(self.lag.view(store.appended_seq, now))
                           if m.serving and m.connected else None),
            # while it follows a serving peer: records it lacks, and since when (no bytes)
            "lag_behind_active": self._behind(now),
        }

    def _behind(self, now: float) -> dict[str, Any] | None:
        if self.machine.serving:
            return None
        seen = self.following.view(self.server.store.appended_seq, now)
        return None if seen is None else {"records": seen[0], "bytes": None,
                                          "seconds": round(seen[1], 3)}

    def _heard(self, hello: PeerHello) -> None:
        """A backup counts its own lag from the serving peer's heartbeats."""
        if hello.state.serving and not self.machine.serving:
            self.following.heard(hello.last_seq, self.server.store.appended_seq,
                                 time.monotonic())
        else:
            self.following.forget()

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.machine.cfg = replace(self.machine.cfg, stomp=self.server.client_address,
                                   stomp_tls=self.server.tls_address)
        await self.channel.start(dial=self.config.role == "backup")
        log.info("HA channel listening on %s (%s, role %s)", self.config.listen,
                 self.config.name, self.config.role)
        self._on_timer()
        self.arbiter.start()

    async def stop(self) -> None:
        self._feed(ev.Shutdown())
        deadline = time.monotonic() + self.machine.cfg.sync_timeout + self.activation
        while not self.machine.stopped and time.monotonic() < deadline:
            await asyncio.sleep(self.heartbeat / 10)
        await self.channel.drain()
        if self._stepping_down is not None:
            await asyncio.wait([self._stepping_down])  # a thread: the server closes its store
        self.tasks.cancel_all()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.channel.close()
        await self.arbiter.close()

    # ------------------------------------------------------------ feeding the machine

    def _feed(self, event: ev.Event) -> None:
        self.pump.feed(event)

    def _apply(self, effects: list[ev.Effect]) -> None:
        self.pump.apply(effects)

    def _after(self) -> None:
        deadline = self.machine.deadline(time.monotonic())
        if deadline != self._deadline:  # set the timer again only when its deadline moved
            self._deadline = deadline
            if self._timer is not None:  # (none while it runs: it sets itself at the end)
                self._set_timer()

    def _carry_out(self, effect: ev.Effect) -> None:
        server = self.server
        match effect:
            case ev.Send(kind, payload):
                if self.link is not None:
                    self.link.send_json(kind, payload.to_wire())
            case ev.ConfirmationsChanged():
                server.update_confirmed()
            case ev.AskWitness(purpose, request):
                self.tasks.spawn(self._ask_witness(purpose, request), "ask the witness")
            case ev.BecomeActive(epoch):
                self.tasks.spawn(self._become_active(epoch), "activate")
            case ev.BecomePassive(why):
                self.live_buffer = None
                self.outgoing.clear()
                server.become_passive(why)
            case ev.StepDown(why):
                self.live_buffer = None
                self.outgoing.clear()
                server.stop_serving(why)
                self._stepping_down = asyncio.get_running_loop().create_task(
                    self._read_back(why))
            case ev.BeginEpoch(epoch):
                server.store.begin_epoch(epoch)
            case ev.ServeSync(request):
                if self.link is not None:
                    self.tasks.spawn(self._serve_sync(self.link, request), "synchronise the backup")
            case ev.WipeJournal(first):
                server.store.wipe(first, asyncio.get_running_loop())
                server.watch_mirror()
            case ev.CloseClients(message, active):
                server.close_clients(message, active)
            case ev.Persist():
                server.persist()
            case ev.StateChanged(old, new, why):
                log.info("Local server switched to %s%s (was %s)", new,
                         f": {why}" if why else "", old)
                server.state_changed(State(old), State(new), why)
            case ev.PeerStateChanged(old, new):
                log.info("Old status of remote server = %s", old)
                log.info("New status of remote server = %s", new)
            case ev.Log(level, message):
                log.log(level, message)
            case _:
                assert_never(effect)

    async def _become_active(self, epoch: int | None) -> None:
        assert epoch is not None  # the replication machine always opens a new epoch
        await self.server.become_active(epoch)
        self._feed(ev.Recovered(epoch))

    async def _read_back(self, why: str) -> None:
        try:
            await self.server.read_back(why)
        except Exception:
            # The journal it was serving a moment ago cannot be read: nothing is served or
            # followed from it; an operator must look (the machine stays WAITING).
            log.exception("Cannot read the journal back after stepping down: this server "
                          "stays WAITING until it is restarted")
            return
        self._feed(ev.SteppedDown())

    # ------------------------------------------------------------ timers

    def _on_timer(self) -> None:
        """Heartbeats, renewals and decisions every heartbeat; the lease's end exactly. A
        timer callback, not a task: on a loop busy with clients a woken task waits a few
        turns to run (three, through asyncio.wait_for), a timer runs in the first turn
        after its time, and heartbeats late by a few turns of a loaded loop cost the
        pair its lease."""
        self._timer = None
        if self.machine.stopped:
            return
        now = time.monotonic()
        try:
            if now >= self._next_tick:
                self._next_tick = now + self.heartbeat
                self._apply(self.machine.tick(now))
                self._drop_stalled_backup(now)
            else:
                self._apply(self.machine.check(now))
        except Exception:
            log.exception("HA tick failed")
        self._set_timer()

    def _set_timer(self) -> None:
        """The next tick, or the machine's deadline (a lease's end) if sooner."""
        if self._timer is not None:
            self._timer.cancel()
        now = time.monotonic()
        wake = self._next_tick
        deadline = self.machine.deadline(now)
        if deadline is not None:
            wake = min(wake, deadline + 0.001)
        self._timer = asyncio.get_running_loop().call_later(max(0.0, wake - now),
                                                            self._on_timer)

    def _drop_stalled_backup(self, now: float) -> None:
        """A backup whose acknowledgements stopped while receipts wait for them (its disk
        stalled, say, while its heartbeats go on) is dropped from synchronous replication
        after [store] stall_timeout_ms, as a dead one is: its link is closed, this server
        confirms alone once the witness knows (STANDALONE), and takes it back once it has
        caught up (JOINING, then ACTIVE)."""
        link = self.link
        timeout = self.config.stall_timeout_ms / 1000
        if link is None or not timeout or not self.machine.receipts_wait_for_backup:
            return
        lag = self.lag.view(self.server.store.appended_seq, now)
        if not backup_stalled(lag, timeout):
            return
        why = (f"no acknowledgement for {lag.seconds:.1f} s ({lag.records} records behind, "
               f"stall_timeout_ms = {self.config.stall_timeout_ms})")
        log.warning("Backup %s dropped from synchronous replication: %s", self.machine.peer.name,
                    why)
        self._dropping = (link, f"backup stalled: {why}")
        link.close()

    # ------------------------------------------------------------ the HA channel

    def _adopted(self, link: Link, hello: PeerHello) -> None:
        self.live_buffer = None
        self.outgoing.clear()
        self.lag.reset(hello.last_seq)
        self._feed(ev.PeerConnected(hello))

    def _ended(self, link: Link, reason: str) -> None:
        self.live_buffer = None
        self.outgoing.clear()
        dropping, self._dropping = self._dropping, None
        if dropping is not None and dropping[0] is link:
            reason = dropping[1]
        self._feed(ev.PeerLost(reason))

    def _on_message(self, link: Link, kind: int, payload: bytes) -> Awaitable[None] | None:
        if kind == ch.RECORDS:
            return self._mirror(link, payload)
        message = ch.decode_json(payload)
        event = ev.from_channel(kind, message)
        if isinstance(event, ev.BackupAcked):
            self.lag.acked(event.seq)
        elif isinstance(event, ev.Heartbeat):
            self._heard(event.hello)
        if event is not None:
            self._feed(event)
        elif kind == ch.HORIZON:
            if self.server.store.mirror:
                self.server.store.drop_below(SeqMessage.from_wire(message).seq)
        else:
            raise ch.ChannelError(f"unexpected message {ch.NAMES.get(kind, kind)}")
        return None

    def _heard_ahead(self, link: Link, kind: int, payload: bytes) -> None:
        """A message read while records before it are still being applied
        (peer_channel.py `InOrder`): the active's heartbeat renews this backup's promise now
        (`ev.HeartbeatAhead`); every message is handled in its turn besides."""
        if kind != ch.HEARTBEAT:
            return
        try:
            event = ev.from_channel(kind, ch.decode_json(payload))
        except ch.ChannelError:
            return  # said in its turn
        if isinstance(event, ev.Heartbeat):
            self._feed(ev.HeartbeatAhead(event.hello))

    # ------------------------------------------------------------ backup: the mirror

    def _mirror(self, link: Link, payload: bytes) -> Awaitable[None] | None:
        """Apply one chunk of the active's records. A chunk of a synchronisation holds up to
        RECORDS_CHUNK bytes, thousands of messages: applied at once, it would hold the event
        loop past the activation interval on a busy machine, and the peer would count this
        server's heartbeats as lost. So it is applied in slices of MIRROR_SLICE_S: the first
        at once (a live chunk is one slice, and its acknowledgement must not wait a turn),
        the others with the loop free in between, the messages after the chunk waiting for
        it while the link is read on (peer_channel.py `InOrder`)."""
        if not self.server.store.mirror:
            raise ch.ChannelError("records arrived but this server is not a backup")
        records = new_records(payload, self.server.store.appended_seq)
        if self._apply_slice(records):
            self._mirrored()
            return None
        return self._mirror_rest(link, records)

    def _apply_slice(self, records: Iterator[tuple[int, int, bytes]]) -> bool:
        """Append records for up to MIRROR_SLICE_S, MIRROR_BATCH at a time (each batch is
        written while it is applied: store/mirror.py); True: none is left."""
        store = self.server.store
        until = time.monotonic() + MIRROR_SLICE_S
        try:
            while batch := list(islice(records, MIRROR_BATCH)):
                store.append_mirrored(batch)
                if time.monotonic() >= until:
                    return False
        except MirrorError as e:
            raise ch.ChannelError(str(e)) from None
        return True

    async def _mirror_rest(self, link: Link, records: Iterator[tuple[int, int, bytes]]) -> None:
        """The rest of a chunk, a slice a turn. Should the link or the mirror end meanwhile,
        the rest is dropped: the active sends it again from what this server says it
        appended."""
        while True:
            self._mirrored()
            await asyncio.sleep(0)
            if link.closed or self.link is not link or not self.server.store.mirror:
                return
            if self._apply_slice(records):
                break
        self._mirrored()

    def _mirrored(self) -> None:
        """Records were appended: with backup_ack = write, the active hears so now."""
        if self.config.backup_ack == "write":
            store = self.server.store
            self._feed(ev.MirrorProgress(store.appended_seq, store.synced_seq))

    def mirror_synced(self, seq: int) -> None:
        """The backup's journal reached the disk up to seq."""
        self._feed(ev.MirrorProgress(self.server.store.appended_seq, seq))

    def journal_stalled(self, waited: float | None) -> None:
        """This server's journal disk stalled, or completes writes again (store/stall.py):
        an ACTIVE server hands over (ha/handover.py)."""
        self._feed(ev.JournalFlowing() if waited is None else ev.JournalStalled(waited))

    # ------------------------------------------------------------ active: the stream

    async def _serve_sync(self, link: Link, request: SyncRequest) -> None:
        try:
            await asyncio.wait_for(self._sync(link, request), self.machine.cfg.sync_timeout)
        except TimeoutError:
            log.warning("Synchronisation of %s took longer than "
                        "initial_replication_sync_timeout_ms: restarting it",
                        self.machine.peer.name)
            link.close()
        except (ConnectionError, OSError) as e:
            trace.debug("Synchronisation aborted: %s", e)
        finally:
            if self.link is not link:
                self.live_buffer = None

    async def _sync(self, link: Link, request: SyncRequest) -> None:
        store = self.server.store
        plan = plan_sync(request, store.appended_seq, store.oldest_seq, store.epochs)
        self.live_buffer = []
        link.send_json(ch.SYNC, SyncOffer(plan.mode, plan.first, plan.upto).to_wire())
        log.info("Synchronising %s: %s, records %d to %d", self.machine.peer.name,
                 "incremental" if plan.mode == "incremental" else "full copy", plan.first,
                 plan.upto)
        if plan.upto >= plan.first:
            await self.server.synced(plan.upto)
            store.hold_compaction += 1
            loop = asyncio.get_running_loop()
            try:
                for segment_id, path in store.segments_for(plan.first):
                    chunks = await loop.run_in_executor(None, segment_chunks, path,
                                                        segment_id, plan.first, plan.upto,
                                                        RECORDS_CHUNK)
                    for chunk in chunks:
                        link.send(ch.encode(ch.RECORDS, chunk))
                        await link.drain()
            finally:
                store.release_compaction()
        if self.link is not link:
            return
        buffered, self.live_buffer = self.live_buffer or [], None
        if buffered:
            link.send(ch.encode(ch.RECORDS, b"".join(buffered)))
        done = store.appended_seq
        link.send_json(ch.SYNC_DONE, SeqMessage(done).to_wire())
        self._feed(ev.SyncServed(done))

    def on_append(self, seq: int, record: bytes) -> None:
        """The replication stream: every record the active appends goes to the backup."""
        if self.link is None or not self.machine.serving:
            return
        if self.live_buffer is not None:
            self.live_buffer.append(record)
            return
        if not self.machine.live_stream:
            return  # no synchronisation started: the backup will ask for what it lacks
        self.outgoing.append(record)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_records)

    def _flush_records(self) -> None:
        self._flush_scheduled = False
        link = self.link
        outgoing = self.outgoing
        if link is not None and outgoing:
            size = sum(map(len, outgoing))
            link.send_parts([ch.header(ch.RECORDS, size), *outgoing])  # the records not joined
            self.lag.sent(self.server.store.appended_seq, size, time.monotonic())
            if self._unapplied(link) > REPLICATION_HIGH and not self._throttled:
                self._throttle(link)
        outgoing.clear()

    def _unapplied(self, link: Link) -> int:
        """Bytes of the stream the backup has not applied: unsent here, or sent and not yet
        acknowledged (the backup reads ahead of applying, peer_channel.py `InOrder`)."""
        return max(link.buffered, self.lag.unacked_bytes)

    def _throttle(self, link: Link) -> None:
        """The backup takes the records more slowly than clients send them: stop reading
        from clients until the backup has caught up (REPLICATION_LOW), instead of letting
        the replication stream grow in memory without bound."""
        self._throttled = True
        self.server.throttle(True)
        trace.debug("Replication stream %d bytes behind: clients paused", self._unapplied(link))

        async def until_drained() -> None:
            try:
                while not link.closed and self._unapplied(link) > REPLICATION_LOW:
                    await asyncio.sleep(0.005)
            finally:
                self._throttled = False
                self.server.throttle(False)

        self.tasks.spawn(until_drained(), "wait for the backup to catch up")

    # ------------------------------------------------------------ the witness

    async def _ask_witness(self, purpose: WitnessPurpose, request: dict[str, Any]) -> None:
        requested = time.monotonic()
        try:
            reply = await self.arbiter.ask(purpose, request)
        except Exception:  # a bug: the machine must still hear, or it waits for ever
            log.exception("The %s request to the arbiter failed: taken as no answer",
                          purpose.value)
            reply = None
        self._feed(ev.WitnessReplied(purpose, reply, requested))


def _arbiter(server: PairHost, heartbeat: float, activation: float) -> Arbiter:
    """Whoever `[ha] witness` names: an etcd cluster, or `pairmq witness`."""
    cfg = server.config
    cluster = cfg.etcd
    if cluster is None:
        return WitnessClient(cfg.witness, cfg.secret, cfg.name, heartbeat, activation,
                             lambda: peer_tls(server, "peer_client"))
    from pairmq.server.pair.etcd_arbiter import EtcdArbiter  # aiohttp: only for etcd

    context = etcd_tls_context(*cfg.etcd_tls_files) if cluster.tls else None
    return EtcdArbiter(cluster, cfg.group, cfg.secret, heartbeat, activation,
                       lambda: context)


class _CurrentJournal:
    """The machine's read-only view of the journal of the server's current role (the
    store is replaced at every role change)."""

    def __init__(self, server: PairHost) -> None:
        self._server = server

    @property
    def epoch(self) -> int:
        return self._server.store.epoch

    @property
    def appended_seq(self) -> int:
        return self._server.store.appended_seq

    @property
    def synced_seq(self) -> int:
        return self._server.store.synced_seq

    @property
    def oldest_seq(self) -> int:
        return self._server.store.oldest_seq

    @property
    def mirror(self) -> bool:
        return self._server.store.mirror

    @property
    def epochs(self) -> list[tuple[int, int]]:
        return self._server.store.epochs


def _node_id(data_dir: Path) -> str:
    path = data_dir / "node-id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        data_dir.mkdir(parents=True, exist_ok=True)
        node_id = secrets.token_hex(4)
        path.write_text(node_id + "\n")
        return node_id


def _remaining_ms(lease: LeaseView, now: float) -> int:
    """Rounded up: a lease valid for another 0.3 ms is not reported as gone."""
    return max(0, math.ceil((lease.valid_until - now) * 1000))
