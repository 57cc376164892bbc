"""The server process: listener, connections, timers, and the broker they share."""

from __future__ import annotations

import asyncio
import collections
import fcntl
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pairmq.core import Broker, BrokerEvent
from pairmq.core.queue import Address
from pairmq.ha.states import State
from pairmq.server.config import ServerConfig
from pairmq.server.connection import StompConnection, now_ms
from pairmq.server.process import setup_logging, until_stop_signal
from pairmq.store.gcpause import gc_paused
from pairmq.store.store import JournalCorrupt, Store

if TYPE_CHECKING:
    from pairmq.server.ha import HaNode

DRAIN_TIMEOUT_S = 10.0


class StartupError(Exception):
    """The server cannot start; the message says why and what to do."""


log = logging.getLogger("pairmq.server")

EXPIRY_SWEEP_S = 1.0
# The journal thread needs the GIL back after each write and fdatasync; from a busy event
# loop that takes up to this long (Python's default is 5 ms, which would add milliseconds
# to every receipt). Only a thread waiting for the GIL shortens the loop's turn.
GIL_SWITCH_S = 0.0002


class PairmqServer:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.broker = self._new_broker()
        self.connections: dict[int, StompConnection] = {}
        self.dirty: set[StompConnection] = set()  # connections with output waiting
        self.waiters: dict[Address, set[StompConnection]] = {}  # full address -> producers
        self.store = Store(Path(config.data_dir) / "journal", config.store_settings())
        self.store_waiters: set[StompConnection] = set()  # held while the journal is full
        self._lock_fd: int | None = None
        self.confirmed_seq = 0  # receipts may go out for everything journaled up to here
        self._confirm_waiters: collections.deque[tuple[int, Callable[[], None]]] = \
            collections.deque()
        self._conn_seq = 0
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop = asyncio.get_event_loop()
        self.port = config.stomp_port
        self._admin = None
        self.ha: HaNode | None = None
        if config.policy == "replication":
            from pairmq.server.ha import HaNode

            self.ha = HaNode(self)

    def _new_broker(self) -> Broker:
        boot = format(time.time_ns() // 1000, "x")
        return Broker(self.config.core_settings(), id_prefix=f"ID:{self.config.name}-{boot}-")

    @property
    def serving(self) -> bool:
        return self.ha is None or self.ha.state.serving

    @property
    def client_address(self) -> str:
        return f"{self.config.stomp_host}:{self.port}"

    @property
    def active_address(self) -> str | None:
        """Where clients should go when this server does not serve."""
        if self.ha is not None and self.ha.peer_state.serving:
            return self.ha.peer.get("stomp")
        return None

    def topology(self) -> str:
        addresses = [self.client_address]
        if self.ha is not None and self.ha.peer.get("stomp"):
            addresses.append(str(self.ha.peer["stomp"]))
        return ",".join(addresses)

    def next_conn_id(self) -> int:
        self._conn_seq += 1
        return self._conn_seq

    def _lock_data_dir(self) -> None:
        data_dir = Path(self.config.data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(data_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StartupError(f"data directory {data_dir} is in use by another pairmq server "
                               f"(pid {holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _recover(self, recovered: tuple | None = None) -> None:
        replay, report = recovered or self.store.recover(self.config.dup_cache_size)
        self.broker.restore(replay)
        log.info("%s (epoch %d, last seq %d)", report.describe(), self.store.epoch,
                 self.store.appended_seq)

    def _open_for_serving(self) -> None:
        """Account the recovered state and open the journal for appends (this server serves)."""
        self.store.start(self.broker, self.loop)
        writer = self.store.writer
        assert writer is not None
        writer.on_synced(lambda _seq: self._synced())
        if self.ha is not None:
            writer.on_append(self.ha.on_append)
        self.store.on_full_change(self._store_full_changed)
        self.confirmed_seq = self.store.synced_seq

    def _synced(self) -> None:
        self.update_confirmed()
        self.flush()

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._lock_data_dir()
        with gc_paused(freeze=True):
            self._recover()
            if self.ha is None:
                self._open_for_serving()
        self._server = await self.loop.create_server(
            lambda: StompConnection(self), self.config.stomp_host, self.config.stomp_port,
            reuse_address=True, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = self.loop.call_later(EXPIRY_SWEEP_S, self._sweep)
        if not self.config.users and not self.config.allow_anonymous:
            log.warning("No users are configured and anonymous access is off: nobody can "
                        "connect. Add [auth.users] or set allow_anonymous = true.")
        log.info("pairmq server %s ready: STOMP on %s:%d", self.config.name,
                 self.config.stomp_host, self.port)
        if self.config.admin:
            from pairmq.server.admin import start_admin

            self._admin = await start_admin(self, self.config.admin)
        if self.ha is not None:
            await self.ha.start()

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.ha is not None:
            await self.ha.stop()
        if self._admin is not None:
            await self._admin.cleanup()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections.values()):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()
        if self.store.writer is not None:
            self.persist()
        try:
            await asyncio.wait_for(self.synced(self.store.appended_seq), DRAIN_TIMEOUT_S)
        except TimeoutError:
            log.error("Journal did not reach the disk within %.0f s of stopping: records "
                      "not yet confirmed to clients may be lost", DRAIN_TIMEOUT_S)
        self.store.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        log.info("pairmq server %s stopped", self.config.name)

    # ------------------------------------------------------------ confirmations

    async def synced(self, seq: int) -> None:
        """Wait until the local journal has everything up to seq on disk."""
        if self.store.writer is None or seq <= self.store.synced_seq:
            return
        done = self.loop.create_future()
        self.store.when_synced(seq, lambda: done.done() or done.set_result(None))
        await done

    def update_confirmed(self) -> None:
        """Receipts wait for the local disk and, in a pair, for the backup and the lease."""
        local = self.store.synced_seq
        new = self.ha.confirmable(local, self.confirmed_seq) if self.ha else local
        if new <= self.confirmed_seq:
            return
        self.confirmed_seq = new
        waiters = self._confirm_waiters
        while waiters and waiters[0][0] <= new:
            waiters.popleft()[1]()
        self.flush()

    def when_confirmed(self, seq: int, callback: Callable[[], None]) -> None:
        if seq <= self.confirmed_seq:
            callback()
        else:
            self._confirm_waiters.append((seq, callback))

    # ------------------------------------------------------------ roles (the pair)

    async def become_active(self, epoch: int) -> None:
        """Serve from this server's journal with a new epoch (recovering it if mirrored)."""
        if self.store.mirror:
            await self.synced(self.store.appended_seq)
            self.store.close()
            store = Store(Path(self.config.data_dir) / "journal", self.config.store_settings())
            with gc_paused(freeze=True):
                # Reading a large journal takes seconds: keep the event loop (heartbeats)
                # going meanwhile.
                recovered = await self.loop.run_in_executor(None, store.recover,
                                                            self.config.dup_cache_size)
                self.store = store
                self.broker = self._new_broker()
                self._recover(recovered)
                self._open_for_serving()
        if self.store.writer is None:
            self._open_for_serving()
        self.store.begin_epoch(epoch)
        self._confirm_waiters.clear()

    def become_passive(self, why: str) -> None:
        """Stop serving: drop clients, reopen the journal as a mirror of the peer's."""
        self.close_clients(f"this server is no longer active: {why}", self.active_address)
        self.store.close()
        self.store = Store(Path(self.config.data_dir) / "journal", self.config.store_settings())
        self.store.recover(rebuild=False)  # where the journal ends: the mirror appends there
        self.store.open_mirror(self.loop)
        self.watch_mirror()
        self.broker = self._new_broker()
        self._confirm_waiters.clear()
        self.confirmed_seq = 0

    def watch_mirror(self) -> None:
        writer = self.store.writer
        assert writer is not None and self.ha is not None
        writer.on_synced(self.ha.mirror_synced)

    def close_clients(self, message: str, active: str | None) -> None:
        extra = {"active-server": active} if active else None
        for conn in list(self.connections.values()):
            conn.fail(message, extra=extra)
        self.flush()

    def state_changed(self, old: State, new: State) -> None:
        if old.serving and not new.serving:
            self.close_clients(f"this server switched to {new.value}", self.active_address)
        self.update_confirmed()

    def forget(self, conn: StompConnection) -> None:
        self.connections.pop(conn.conn_id, None)
        self.dirty.discard(conn)
        for address in conn.blocked_on:
            waiting = self.waiters.get(address)
            if waiting is not None:
                waiting.discard(conn)
                if not waiting:
                    del self.waiters[address]
        conn.blocked_on.clear()
        self.store_waiters.discard(conn)

    def persist(self) -> None:
        """Journal what the broker changed since the last call (one atomic group)."""
        if self.broker.records and self.store.writer is not None and not self.store.mirror:
            self.store.persist(self.broker.take_records())

    def _store_full_changed(self, full: bool) -> None:
        if full:
            action = ("held" if self.store.settings.full_policy == "block"
                      else "refused with an ERROR")
            log.warning("%s: new persistent messages are %s until there is room",
                        self.store.full_reason().capitalize(), action)
            return
        if self.store_waiters:
            log.info("Journal has room again: %d held connections resume",
                     len(self.store_waiters))
        waiting, self.store_waiters = self.store_waiters, set()
        for conn in waiting:
            if not conn.closing:
                conn.release_backlog()

    def flush(self) -> None:
        """Turn the broker's deliveries and events into socket writes, once per read."""
        broker = self.broker
        if broker.records:
            self.persist()
        if broker.outbox:
            for conn_id, deliveries in broker.take_outbox().items():
                conn = self.connections.get(conn_id)
                if conn is not None and not conn.closing:
                    conn.write_deliveries(deliveries)
        if broker.events:
            for event in broker.take_events():
                self._on_event(event)
        if self.dirty:
            for conn in self.dirty:
                conn.flush_out()
            self.dirty.clear()

    def _on_event(self, event: BrokerEvent) -> None:
        address = event.address
        if event.kind == "blocked" and address is not None:
            log.warning("Destination %s is full (%s): blocking its producers until consumers "
                        "catch up", address.name, event.detail)
        elif event.kind == "unblocked" and address is not None:
            log.info("Destination %s is below its limit again (%s): producers resume",
                     address.name, event.detail)
            for conn in self.waiters.pop(address, set()):
                conn.unblock(address)
        elif event.kind == "dead-lettered":
            log.debug("Dead-lettered %s into %s", event.detail,
                      address.name if address else "?")
        elif event.kind == "expired":
            log.debug("Dropped expired message %s", event.detail)

    def _sweep(self) -> None:
        self.broker.sweep_expired(now_ms())
        self.flush()
        self._sweeper = self.loop.call_later(EXPIRY_SWEEP_S, self._sweep)


async def serve(config: ServerConfig) -> None:
    server = PairmqServer(config)
    await server.start()
    await until_stop_signal()
    await server.stop()


def run(config: ServerConfig) -> None:
    """Run a server in this process until SIGTERM or SIGINT."""
    setup_logging(config.log_level)
    sys.setswitchinterval(GIL_SWITCH_S)
    log.info("Starting pairmq server %s (pid %d, config %s)", config.name, os.getpid(),
             config.source)
    try:
        import uvloop
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(serve(config))
    except (StartupError, JournalCorrupt) as e:
        log.error("Cannot start: %s", e)
        sys.exit(3)
