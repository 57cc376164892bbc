"""The server process: listener, connections, timers, and the broker they share."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import sys
import time
from pathlib import Path

from pairmq.core import Broker, BrokerEvent
from pairmq.core.queue import Address
from pairmq.server.config import ServerConfig
from pairmq.server.connection import StompConnection, now_ms
from pairmq.store.store import JournalCorrupt, Store

DRAIN_TIMEOUT_S = 10.0


class StartupError(Exception):
    """The server cannot start; the message says why and what to do."""

log = logging.getLogger("pairmq.server")

EXPIRY_SWEEP_S = 1.0


class PairmqServer:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        boot = format(int(time.time() * 1000), "x")
        self.broker = Broker(config.core_settings(), id_prefix=f"ID:{config.name}-{boot}-")
        self.connections: dict[int, StompConnection] = {}
        self.dirty: set[StompConnection] = set()  # connections with output waiting
        self.waiters: dict[Address, set[StompConnection]] = {}  # full address -> producers
        self.store = Store(Path(config.data_dir) / "journal", config.store_settings())
        self.store_waiters: set[StompConnection] = set()  # held while the journal is full
        self._lock_fd: int | None = None
        self._conn_seq = 0
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop = asyncio.get_event_loop()
        self.port = config.stomp_port

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

    def _recover(self) -> None:
        replay, report = self.store.recover(self.config.dup_cache_size)
        self.broker.restore(replay)
        log.info("%s", report.describe())

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._lock_data_dir()
        self._recover()
        self.store.start(self.broker, self.loop)
        assert self.store.writer is not None
        self.store.writer.on_synced(lambda _seq: self.flush())
        self.store.on_full_change(self._store_full_changed)
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

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections.values()):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()
        self.persist()
        drained = self.loop.create_future()
        self.store.when_synced(self.store.appended_seq,
                               lambda: drained.done() or drained.set_result(None))
        try:
            await asyncio.wait_for(drained, DRAIN_TIMEOUT_S)
        except TimeoutError:
            log.error("Journal did not reach the disk within %.0f s of stopping: records "
                      "not yet confirmed to clients may be lost", DRAIN_TIMEOUT_S)
        self.store.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        log.info("pairmq server %s stopped", self.config.name)

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
        if self.broker.records:
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


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


async def serve(config: ServerConfig) -> None:
    server = PairmqServer(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()


def run(config: ServerConfig) -> None:
    """Run a server in this process until SIGTERM or SIGINT."""
    setup_logging(config.log_level)
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
