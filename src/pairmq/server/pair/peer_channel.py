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
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
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


MAX_UNHANDLED_BYTES = 64 * 1024 * 1024  # read ahead of the handling up to this much


class InOrder:
    """The messages of one link, handled one after the other in the order they came, while
    the link goes on being read. A message whose handling is slow (a chunk of records a
    backup applies in slices) holds those behind it, not the reading: each is shown to
    `ahead` as it is read, so a heartbeat behind megabytes of records is seen at once
    (an in-sync backup promises on it, ha/steps.py `step_in_sync`), and handled in its
    turn. Without slow work, a message is handled as it is read. Read-ahead stops at
    MAX_UNHANDLED_BYTES (the active throttles its clients well before, replication.py)."""

    def __init__(self, link: Link, handle: Callable[[Link, int, bytes], Awaitable[None] | None],
                 ahead: Callable[[Link, int, bytes], None], current: Callable[[], bool]) -> None:
        self._link = link
        self._current = current  # whether the link is still the channel's, and open
        self._handle = handle
        self._ahead = ahead
        self._waiting: deque[tuple[int, bytes]] = deque()
        self._bytes = 0
        self._worker: asyncio.Task[None] | None = None
        self._drained = asyncio.Event()
        self._failure: str | None = None

    def add(self, kind: int, payload: bytes) -> None:
        """A message read (a ChannelError of its handling, done here, ends the link)."""
        if self._worker is None:
            work = self._handle(self._link, kind, payload)
            if work is not None:
                self._worker = asyncio.get_running_loop().create_task(self._work(work))
            return
        self._ahead(self._link, kind, payload)
        self._waiting.append((kind, payload))
        self._bytes += len(payload)

    async def room(self) -> None:
        """Until what waits is under MAX_UNHANDLED_BYTES."""
        while self._bytes > MAX_UNHANDLED_BYTES and self._worker is not None:
            self._drained.clear()
            await self._drained.wait()

    async def _work(self, first: Awaitable[None]) -> None:
        try:
            await first
            while self._waiting:
                if not self._current():
                    # Closed here, or replaced by a newer link: what it still carried is
                    # not applied (the peer sends it again on the new link, from what
                    # this server says it holds).
                    self._waiting.clear()
                    self._bytes = 0
                    break
                kind, payload = self._waiting.popleft()
                self._bytes -= len(payload)
                if self._bytes <= MAX_UNHANDLED_BYTES // 2:
                    self._drained.set()
                work = self._handle(self._link, kind, payload)
                if work is not None:
                    await work
        except ch.ChannelError as e:
            self._failure = f"protocol error: {e}"
            log.warning("HA channel with %s: %s", self._link.peer, e)
        except Exception:
            log.exception("HA channel handler failed")
            self._failure = "internal error"
        finally:
            if self._failure is not None:
                self._waiting.clear()
                self._bytes = 0
                self._link.close()  # the reading ends too
            self._worker = None
            self._drained.set()

    async def finish(self) -> str | None:
        """The link ended: handle what was read before, in order; the failure of that
        handling, if any (it ended the link)."""
        worker = self._worker
        if worker is not None:
            await worker
        return self._failure

    def cancel(self) -> None:
        if self._worker is not None:
            self._worker.cancel()


class PeerChannel:
    def __init__(self, server: PairHost | SharedStoreHost, tasks: BackgroundTasks, *,
                 hello: Callable[[], dict[str, Any]], activation: float, heartbeat: float,
                 adopted: Callable[[Link, PeerHello], None],
                 received: Callable[[Link, int, bytes], Awaitable[None] | None],
                 ahead: Callable[[Link, int, bytes], None] = lambda link, kind, payload: None,
                 ended: Callable[[Link, str], None],
                 stopped: Callable[[], bool]) -> None:
        self._server = server
        self._tasks = tasks
        self._hello = hello  # what this server says of itself now
        self._activation = activation
        self._heartbeat = heartbeat
        self._adopted = adopted  # a link to the peer is up (the driver feeds its machine)
        # a message on it (ChannelError: a protocol error); work that would hold the event
        # loop comes back as an awaitable, and the messages after it wait for it (InOrder)
        self._received = received
        self._ahead = ahead  # a message read while those before it are still handled
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
        handling = InOrder(link, self._received, self._ahead,
                           lambda: self.link is link and not link.closed)
        try:
            while True:
                await handling.room()
                kind, payload = await link.recv(self._activation)
                handling.add(kind, payload)
        except TimeoutError:
            reason = f"no heartbeat for {round(self._activation * 1000)} ms"
        except (ConnectionError, OSError, asyncio.IncompleteReadError) as e:
            reason = str(e) or type(e).__name__
        except ch.ChannelError as e:
            reason = f"protocol error: {e}"
            log.warning("HA channel with %s: %s", peer, e)
        except asyncio.CancelledError:
            handling.cancel()
            link.close()
            raise
        except Exception:
            log.exception("HA channel handler failed")
            reason = "internal error"
        failure = await handling.finish()  # what was read before the end, in its turn
        if failure is not None:
            reason = failure
        link.close()
        if self.link is link:
            self.link = None
            self._ended(link, reason)
