"""The HA channel's plumbing, written once for both policies' drivers.

A driver (replication.py for replication, shared_store.py for the shared store) says
what its server says of itself (`hello`), and what to do when a link to the peer is
adopted, with each message on it, and when it ends. `PeerChannel` does the rest: the
listener, the backup's dialling loop, adopting one link at a time (a newer one replaces
an older; none while stopping; a hello that does not say what it must is refused),
reading it with the activation interval as the silence that ends it, and draining it
at stop. `BackgroundTasks` runs the drivers' background steps, logging a failure rather
than losing it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from pairmq.ha import channel as ch
from pairmq.ha.messages import MessageError, PeerHello
from pairmq.server.pair.ha_link import (
    Link,
    accept_link,
    listen,
    logged_refusals,
    open_link,
    peer_tls,
    split_address,
)
from pairmq.server.pair.policy import PairHost, SharedStoreHost

log = logging.getLogger("pairmq.ha")
trace = logging.getLogger("pairmq.ha.trace")


class BackgroundTasks:
    """The driver's background steps: each one's failure is logged, never lost."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[Any]] = []

    def spawn(self, coro: Coroutine[Any, Any, Any], what: str) -> None:
        task = asyncio.get_running_loop().create_task(coro)

        def done(t: asyncio.Task[Any]) -> None:
            if not t.cancelled() and t.exception() is not None:
                log.error("HA step %r failed", what, exc_info=t.exception())

        task.add_done_callback(done)
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(task)

    def cancel_all(self) -> None:
        for task in self._tasks:
            task.cancel()


class PeerChannel:
    def __init__(self, server: PairHost | SharedStoreHost, tasks: BackgroundTasks, *,
                 hello: Callable[[], dict[str, Any]], activation: float, heartbeat: float,
                 adopted: Callable[[Link, PeerHello], None],
                 received: Callable[[Link, int, bytes], None],
                 ended: Callable[[Link, str], None],
                 stopped: Callable[[], bool]) -> None:
        self._server = server
        self._tasks = tasks
        self._hello = hello  # what this server says of itself now
        self._activation = activation
        self._heartbeat = heartbeat
        self._adopted = adopted  # a link to the peer is up (the driver feeds its machine)
        self._received = received  # a message on it (ChannelError: a protocol error)
        self._ended = ended  # the current link ended, and why
        self._stopped = stopped  # no new link from then on
        self._listener: asyncio.AbstractServer | None = None
        self._refusal: str | None = None  # the peer's last refusal, logged once
        self.link: Link | None = None

    async def start(self, dial: bool) -> None:
        """Listen for the peer; with `dial` (the backup role), also connect to it."""
        config = self._server.config
        host, port = split_address(config.listen)
        self._listener = await listen(self._accept, host, port,
                                      peer_tls(self._server, "peer_server"),
                                      logged_refusals(log, "HA connection"))
        if dial:
            self._tasks.spawn(self._connect_loop(), "connect to the peer")

    async def drain(self) -> None:
        """What was sent on the link reaches the peer (or an activation interval passes)."""
        if self.link is None:
            return
        try:
            await asyncio.wait_for(self.link.drain(), self._activation)
        except (OSError, TimeoutError):
            pass

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        if self.link is not None:
            self.link.close()

    # ------------------------------------------------------------ links

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            link = await accept_link(reader, writer, self._server.config.secret, self._hello(),
                                     self._activation)
        except (ch.ChannelError, OSError, TimeoutError, asyncio.IncompleteReadError) as e:
            log.warning("Refused HA connection from %s: %s", writer.get_extra_info("peername"),
                        e)
            writer.close()
            return
        self._adopt(link)

    async def _connect_loop(self) -> None:
        host, port = split_address(self._server.config.peer)
        while not self._stopped():
            if self.link is None:
                try:
                    link = await open_link(host, port, self._server.config.secret,
                                           self._hello(), self._activation,
                                           peer_tls(self._server, "peer_client"))
                except ch.ChannelError as e:
                    if str(e) != self._refusal:  # once, not every heartbeat
                        self._refusal = str(e)
                        log.error("HA connection to %s:%d refused: %s", host, port, e)
                except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
                    trace.debug("HA connection to %s:%d failed: %s", host, port, e)
                else:
                    self._adopt(link)
            await asyncio.sleep(self._heartbeat)

    def _adopt(self, link: Link) -> None:
        if self._stopped():  # a connection that completed while this server stopped
            link.close()
            return
        try:
            hello = PeerHello.from_wire(link.hello)
        except MessageError as e:
            log.warning("Refused HA connection from %s: its hello %s", link.peer, e)
            link.close()
            return
        if self.link is not None:
            self.link.close()
        self.link = link
        self._refusal = None
        trace.debug("HA channel to %s", link.peer)
        self._tasks.spawn(self._read_loop(link, hello.name), "read the HA channel")
        self._adopted(link, hello)

    async def _read_loop(self, link: Link, peer: str) -> None:
        reason = "closed"
        try:
            while True:
                kind, payload = await link.recv(self._activation)
                self._received(link, kind, payload)
        except TimeoutError:
            reason = f"no heartbeat for {round(self._activation * 1000)} ms"
        except (ConnectionError, OSError, asyncio.IncompleteReadError) as e:
            reason = str(e) or type(e).__name__
        except ch.ChannelError as e:
            reason = f"protocol error: {e}"
            log.warning("HA channel with %s: %s", peer, e)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("HA channel handler failed")
            reason = "internal error"
        finally:
            link.close()
        if self.link is link:
            self.link = None
            self._ended(link, reason)
