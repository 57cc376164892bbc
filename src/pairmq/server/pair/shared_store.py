"""The shared-store policy's driver: feeds ha/shared_store.py and carries out its effects.

Heartbeats and failback notices go over the HA channel (server/pair/ha_link.py); the lock is
the shared directory's lock file or the database's lease (server/pair/store_locks.py);
role changes are made one after the other in order (a release never overtakes the drain
before it). Decisions live in
`SharedStoreNode`; nothing here decides.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, assert_never

from pairmq.ha import channel as ch
from pairmq.ha import events as ev
from pairmq.ha import shared_store as m
from pairmq.ha.events import Heartbeat, from_channel
from pairmq.ha.messages import NO_PEER, PeerHello, StoreHello
from pairmq.ha.pump import EffectPump
from pairmq.ha.states import State
from pairmq.server.pair.ha_link import Link
from pairmq.server.pair.peer_channel import BackgroundTasks, PeerChannel
from pairmq.server.pair.policy import SharedStoreHost
from pairmq.server.pair.store_locks import Acquired, FileStoreLock, StoreLock

log = logging.getLogger("pairmq.ha")
trace = logging.getLogger("pairmq.ha.trace")

SHARED_KINDS = (ch.HEARTBEAT, ch.FAILBACK)  # no records cross the channel: the journal is shared
READ_AHEAD_BYTES = 8 << 20  # per pass of reading the journal ahead (~0.1 s of 1 KiB messages)


class SharedStorePair:
    """PairPolicy for `[ha] policy = "shared-store"`."""

    def __init__(self, server: SharedStoreHost, lock: StoreLock | None = None) -> None:
        cfg = server.config
        self.server = server
        self.name: str = cfg.name
        self.secret: str = cfg.secret
        self.heartbeat = cfg.heartbeat_interval_ms / 1000
        self.activation = cfg.activation_interval_ms / 1000
        self.node = m.SharedStoreNode(m.Settings(
            role=cfg.role, heartbeat=self.heartbeat, activation=self.activation,
            allow_failback=cfg.allow_failback, failover_on_shutdown=cfg.failover_on_shutdown))
        # the shared directory's lock file, or the database's lease ([store] url)
        self.lock: StoreLock = lock or FileStoreLock(Path(cfg.shared_dir), cfg.name,
                                                     self.activation)
        self.stopping = False
        self.tasks = BackgroundTasks()
        self.channel = PeerChannel(
            server, self.tasks, hello=self.hello, activation=self.activation,
            heartbeat=self.heartbeat, adopted=self._adopted, received=self._received,
            ended=self._ended, stopped=lambda: self.stopping)
        self.pump: EffectPump[m.Input, m.Effect] = EffectPump(
            self.node.step, self._carry_out, self.server.update_confirmed)
        self.peer: PeerHello = NO_PEER
        self.peer_state = State.DEAD
        self.holder = ""  # who holds the lock, as last seen while waiting for it
        self._roles: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue()
        self._expiry: asyncio.TimerHandle | None = None
        self._reading = asyncio.Lock()  # a pass of reading ahead, or the takeover's replay

    # ------------------------------------------------------------ PairPolicy

    @property
    def state(self) -> State:
        return self.node.state

    def active_address(self, tls: bool = False) -> str | None:
        return (self.peer.stomp_tls if tls else self.peer.stomp) or None \
            if self.peer_state.serving else None

    def handing_over_to(self, tls: bool = False) -> str | None:
        return None  # the lock is handed over in one step: no clients to hold off meanwhile

    def topology(self, own: str, tls: bool = False) -> str | None:
        peer = self.peer.stomp_tls if tls else self.peer.stomp
        return f"{own},{peer}" if peer else own

    def confirmable(self, local: int, current: int) -> int:
        return local if self.node.may_confirm(time.monotonic()) else current

    def may_write(self) -> bool:
        """The journal writer's guard (called from its thread too: a read of two fields)."""
        return self.node.may_write(time.monotonic())

    def on_append(self, seq: int, record: bytes) -> None:
        pass  # nothing is replicated: the journal itself is shared

    def mirror_synced(self, seq: int) -> None:
        raise RuntimeError("a shared-store server never mirrors a journal")

    def journal_stalled(self, waited: float | None) -> None:
        """The shared journal's disk stalled. The lock is not given up for it: a write in
        flight cannot be called back, and would meet the next holder's. On a stalled file
        system the lock's re-verification (a write and fsync there, every heartbeat) stalls
        too, and the proof lapses after the activation interval: that steps the server
        down (docs/ha.md, "Gray failures")."""
        if waited is not None and self.node.state.serving:
            log.warning("The shared journal has not completed a write for %.1f s: clients "
                        "wait; the lock lapses if its verification stalls too", waited)

    @property
    def link(self) -> Link | None:
        """The HA channel to the peer, while one is up."""
        return self.channel.link

    async def start(self) -> None:
        await self.channel.start(dial=self.node.settings.role == "backup")
        log.info("HA channel listening on %s (%s, role %s, shared store %s)",
                 self.server.config.listen, self.name, self.node.settings.role,
                 self.lock.status().get("dir") or self.lock.status().get("url"))
        self.tasks.spawn(self._role_worker(), "carry out role changes")
        self.tasks.spawn(self._tick_loop(), "tick")
        self.tasks.spawn(self._read_ahead_loop(), "read the journal ahead")

    async def stop(self) -> None:
        self.stopping = True
        self.step(ev.Shutdown())
        done = asyncio.get_running_loop().create_future()
        self._roles.put_nowait(lambda: _resolve(done))
        try:
            await asyncio.wait_for(done, 2 * self.activation + 10)
        except TimeoutError:
            log.error("Stopping: the shared store was not handed back in time")
        await self.channel.drain()
        self.tasks.cancel_all()
        if self._expiry is not None:
            self._expiry.cancel()
        self.channel.close()
        await self.lock.release()

    def status(self) -> dict[str, Any]:
        store = self.server.store
        now = time.monotonic()
        return {
            "name": self.name, "role": self.node.settings.role, "policy": "shared-store",
            "state": self.state.value, "phase": self.node.phase.value,
            "epoch": self.node.epoch, "appended_seq": store.appended_seq,
            "synced_seq": store.synced_seq, "confirmed_seq": self.server.confirmed_seq,
            "peer": {"name": self.peer.name or None, "state": self.peer_state.value,
                     "stomp": self.peer.stomp or None, "epoch": self.peer.epoch},
            "shared": {**self.lock.status(),
                       "proof_ms": max(0, int((self.node.proof.until - now) * 1000)),
                       "holder": self.holder or None,
                       "read_ahead_seq": self.server.read_ahead_seq},
        }

    def force(self) -> str | None:
        refused = self.node.force_refusal()
        if refused is None:
            self.step(ev.Force())
        return refused

    # ------------------------------------------------------------ the machine

    def hello(self) -> dict[str, Any]:
        """What this server says of itself now, on the wire (at the handshake, and in every
        heartbeat)."""
        return StoreHello(name=self.name, role=self.node.settings.role,
                          stomp=self.server.client_address, stomp_tls=self.server.tls_address,
                          ts=time.monotonic(), state=self.node.state,
                          epoch=self.node.epoch).to_wire()

    def step(self, event: m.Input) -> None:
        self.pump.feed(event)

    def _carry_out(self, effect: m.Effect) -> None:
        match effect:
            case ev.StateChanged(old, new, why):
                log.info("Local server switched to %s: %s (was %s)", new, why, old)
                self.server.state_changed(State(old), State(new), why)
            case ev.Send(kind, payload):
                if self.link is not None:
                    self.link.send_json(kind, payload.to_wire())
            case m.SayHello():
                if self.link is not None:
                    self.link.send_json(ch.HEARTBEAT, self.hello())
            case ev.CloseClients(message, active):
                self.server.close_clients(message, active)
            case m.VerifyLock():
                self.tasks.spawn(self._verify(), "verify the lock")
            case m.TryLock():
                self._roles.put_nowait(self._try_lock)
            case m.ReleaseLock():
                self._roles.put_nowait(self._release)
            case ev.BecomeActive():
                self._roles.put_nowait(self._become_active)
            case ev.BecomePassive(why, drain):
                self._roles.put_nowait(lambda: self.server.stand_by(
                    why, self.activation if drain else 0.0))
            case _:
                assert_never(effect)

    async def _role_worker(self) -> None:
        while True:
            job = await self._roles.get()
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("HA step failed")

    async def _try_lock(self) -> None:
        outcome = await self.lock.try_acquire()
        if isinstance(outcome, Acquired):
            self.holder = ""
            self.step(m.LockResult(m.LockOutcome.ACQUIRED, time.monotonic(), outcome.proof,
                                   ready_at=outcome.ready_at))
            self._expire_at(self.node.proof.until)
            return
        holder = outcome.holder
        if holder.partition(", record")[0] != self.holder.partition(", record")[0]:
            log.info("The shared store's lock is held by %s", holder)
            self.holder = holder
        self.step(m.LockResult(m.LockOutcome.BUSY, time.monotonic(), detail=holder,
                               retry_at=outcome.retry_at))
        if outcome.retry_at is not None and self.node.next_try < self.node.tried_at + \
                self.heartbeat:  # the next attempt as the holder's lease ends, not a tick on
            self._tick_at(self.node.next_try)

    async def _release(self) -> None:
        await self.lock.release()

    async def _become_active(self) -> None:
        async with self._reading:  # after the pass under way, if any: it is reused
            epoch = await self.server.take_over_journal(self.may_write)
        self.step(ev.Recovered(epoch, time.monotonic()))

    async def _read_ahead_loop(self) -> None:
        """While this server neither replays nor serves the journal, read it ahead of a
        takeover, in passes short enough that a takeover waits for one at most: the
        takeover then reads only what was appended since (failover does not grow with the
        journal)."""
        while not self.stopping:
            read = 0
            async with self._reading:
                if self.node.may_read_ahead():
                    read = await self.server.read_ahead(READ_AHEAD_BYTES)
            await asyncio.sleep(0 if read >= READ_AHEAD_BYTES else self.heartbeat)

    async def _verify(self) -> None:
        started = time.monotonic()
        proof = await self.lock.verify()
        if proof.reason:
            log.warning("Lock verification failed: %s", proof.reason)
        took = time.monotonic() - started
        if took > self.activation / 4:
            # Each verification proves the lock for the activation interval from its start:
            # slow ones (a slow shared file system, a stalled process) leave little margin.
            log.warning("Verifying the shared store's lock took %.2f s (activation interval "
                        "%.2f s)", took, self.activation)
        self.step(m.LockResult(m.LockOutcome.CHECKED, time.monotonic(), proof))
        self._expire_at(self.node.proof.until)

    def _tick_at(self, at: float) -> None:
        """One tick at `at` (besides the heartbeat's)."""
        asyncio.get_running_loop().call_later(max(0.0, at - time.monotonic()), self._tick)

    def _expire_at(self, until: float) -> None:
        """A tick at the very moment the proof runs out: the state changes then, not at the
        next heartbeat."""
        if self._expiry is not None:
            self._expiry.cancel()
        if until:
            delay = max(0.0, until - time.monotonic()) + 0.001
            self._expiry = asyncio.get_running_loop().call_later(delay, self._tick)

    # ------------------------------------------------------------ the channel

    def _adopted(self, link: Link, hello: PeerHello) -> None:
        self.peer = hello
        log.info("Connected to remote server %s over the HA channel (%s)", hello.name,
                 link.peer)
        self._set_peer_state(hello.state)
        self.step(ev.PeerConnected(hello))

    def _received(self, link: Link, kind: int, payload: bytes) -> None:
        message = ch.decode_json(payload)
        event = from_channel(kind, message) if kind in SHARED_KINDS else None
        if not isinstance(event, Heartbeat | ev.FailbackMessage):
            raise ch.ChannelError(f"unexpected message {ch.NAMES.get(kind, kind)}")
        if isinstance(event, Heartbeat):
            self.peer = event.hello
            self._set_peer_state(event.hello.state)
        self.step(event)

    def _ended(self, link: Link, reason: str) -> None:
        log.info("Lost the HA channel to %s: %s", self.peer.name, reason)
        self._set_peer_state(State.DEAD)
        self.step(ev.PeerLost(reason))

    def _set_peer_state(self, state: State) -> None:
        if state == self.peer_state:
            return
        log.info("Old status of remote server = %s", self.peer_state.value)
        log.info("New status of remote server = %s", state.value)
        self.peer_state = state

    # ------------------------------------------------------------ time

    async def _tick_loop(self) -> None:
        while not self.stopping:
            self._tick()
            await asyncio.sleep(self.heartbeat)

    def _tick(self) -> None:
        if self.stopping:
            return
        try:
            self.step(m.Tick(time.monotonic()))
        except Exception:
            log.exception("HA tick failed")


async def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
