"""The server process: listener, connections, timers, and the broker they share."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from pathlib import Path

from pairmq.core import Broker, BrokerEvent
from pairmq.core.queue import Address
from pairmq.server.config import ServerConfig
from pairmq.server.connection import StompConnection, now_ms

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
        self._conn_seq = 0
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop = asyncio.get_event_loop()
        self.port = config.stomp_port

    def next_conn_id(self) -> int:
        self._conn_seq += 1
        return self._conn_seq

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        Path(self.config.data_dir).mkdir(parents=True, exist_ok=True)
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

    def flush(self) -> None:
        """Turn the broker's deliveries and events into socket writes, once per read."""
        broker = self.broker
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
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))
