"""The asyncio failover client: the blocking client's API with `await`.

The same sans-IO `Engine` driven from the event loop: an `asyncio.Protocol` feeds it what
the socket reads, one task opens connections and keeps time (heart-beats, retries), and
every wait is on an event that is set after each batch the engine applies. The outbox's
SQLite calls run in a worker thread, off the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

from pairmq.client.batching import BatchItem, pack_batch
from pairmq.client.engine import Engine
from pairmq.client.errors import CallTimeout, ClientError, ConnectionFailed
from pairmq.client.link import Link
from pairmq.client.options import ClientOptions, parse_options
from pairmq.client.outbox import Outbox
from pairmq.client.outcomes import Outcome
from pairmq.client.results import FailoverEvent, Message, Op, SendResult
from pairmq.client.streams import info_headers, offsets_from_receipt, stream_destination
from pairmq.client.subscriptions import SubscriptionState
from pairmq.client.tls import client_context, tls_failure
from pairmq.client.waiting import Waiting, outcome_of

log = logging.getLogger("pairmq.client")

Listener = Callable[[FailoverEvent], Any]


class _Protocol(asyncio.Protocol):
    def __init__(self, client: AsyncClient, socket_id: int) -> None:
        self.client = client
        self.socket_id = socket_id

    def data_received(self, data: bytes) -> None:
        self.client._input(self.socket_id, data)

    def connection_lost(self, exc: Exception | None) -> None:
        why = f"connection error: {exc}" if exc else "the server closed the connection"
        self.client._lost(self.socket_id, why)


class AsyncSubscription:
    def __init__(self, client: AsyncClient, state: SubscriptionState) -> None:
        self._client = client
        self._state = state

    @property
    def id(self) -> str:
        return self._state.id

    @property
    def destination(self) -> str:
        return self._state.destination

    async def receive(self, timeout: float | None = None) -> Message | None:
        return await self._client._receive(self._state, timeout)

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        while True:
            message = await self.receive()
            if message is not None:
                yield message

    async def unsubscribe(self, headers: dict[str, str] | None = None) -> None:
        op = self._client._engine.unsubscribe(self._state.id, headers, time.monotonic())
        await self._client._after_call(op, raise_on_failure=False)


class AsyncClient:
    def __init__(self, options: ClientOptions, name: str | None = None) -> None:
        self.options = options
        self._engine = Engine(options, time.monotonic(), name)
        self._transport: tuple[int, asyncio.Transport] | None = None
        self._tls = client_context(options)  # None: plaintext
        self._progress = asyncio.Event()
        self._wake = asyncio.Event()
        self._listeners: list[Listener] = []
        self._listener_tasks: set[asyncio.Future[Any]] = set()
        self._task: asyncio.Task[None] | None = None
        self._outbox: Outbox | None = None
        self._outbox_lock = asyncio.Lock()

    async def start(self) -> AsyncClient:
        options = self.options
        if options.outbox:
            self._outbox = await asyncio.to_thread(
                Outbox, options.outbox, options.outbox_max_messages, options.outbox_max_bytes,
                options.outbox_full_policy)
            for stored in await asyncio.to_thread(self._outbox.stored):
                result = self._engine.send(stored.destination, stored.body, stored.headers,
                                           True, time.monotonic(), outbox_id=stored.seq)
                result.outcome = Outcome.STORED
        self._task = asyncio.get_running_loop().create_task(self._run())
        if self._outbox is not None:
            return self
        while self._engine.link is Link.CONNECTING:
            await self._changed(0.5)
        if self._engine.link is not Link.UP:
            error = self._engine.error
            raise error if isinstance(error, ConnectionFailed) else ConnectionFailed(str(error))
        return self

    async def close(self, timeout: float | None = None) -> None:
        if timeout is None:
            timeout = self.options.call_timeout / 1000
        try:
            await self.flush(timeout)
        except ClientError:
            pass
        op = self._engine.close(time.monotonic())
        self._after()
        try:
            await self._wait(op, min(timeout, 5.0), raise_on_failure=False)
        except ClientError:
            pass
        if self._engine.link is not Link.CLOSED:
            self._engine.lost("closed by the application", time.monotonic())
            self._after()
        if self._transport is not None:
            self._transport[1].close()
        if self._task is not None:
            self._wake.set()
            try:
                await asyncio.wait_for(self._task, 5.0)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
        if self._outbox is not None:
            await asyncio.to_thread(self._outbox.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def add_failover_listener(self, listener: Listener) -> None:
        """`listener(event)` (a function or a coroutine function) after each failover."""
        self._listeners.append(listener)

    # ------------------------------------------------------------ operations

    async def send(self, destination: str, body: bytes | str,
                   headers: dict[str, str] | None = None, persistent: bool = True,
                   timeout: float | None = None) -> SendResult:
        return await self._settle(await self.send_async(destination, body, headers,
                                                        persistent), timeout)

    async def _settle(self, result: SendResult, timeout: float | None) -> SendResult:
        if result.outcome is Outcome.PENDING and result.transaction is None:
            await self._wait(result, timeout, raise_on_failure=False)
            if not result.done:
                raise CallTimeout(f"send: not confirmed within {timeout} s (its outcome "
                                  "may still come)")
        outcome_of(result)  # refused, rolled back or unknown: raise, however fast it came
        return result

    async def send_batch(self, destination: str, messages: Iterable[BatchItem],
                         headers: dict[str, str] | None = None, persistent: bool = True,
                         timeout: float | None = None) -> SendResult:
        """Many messages in one frame: see `Client.send_batch`."""
        return await self._settle(await self.send_batch_async(destination, messages,
                                                              headers, persistent), timeout)

    async def send_batch_async(self, destination: str, messages: Iterable[BatchItem],
                               headers: dict[str, str] | None = None,
                               persistent: bool = True) -> SendResult:
        body, hdrs, dup_ids = pack_batch(messages, headers, persistent,
                                         self._engine.auto_dup_ids())
        result = await self.send_async(destination, body, hdrs, persistent,
                                       _app_dup_ids=len(dup_ids))
        result.dup_ids = dup_ids
        return result

    async def send_async(self, destination: str, body: bytes | str,
                         headers: dict[str, str] | None = None,
                         persistent: bool = True, _app_dup_ids: int | None = None
                         ) -> SendResult:
        data = body.encode() if isinstance(body, str) else body
        engine = self._engine
        if persistent and self._outbox is not None and engine.tx is None:
            return await self._store(destination, data, headers)
        if persistent and len(engine.unconfirmed) >= self.options.send_window:
            waiting = Waiting(self.options, None, "send (window full)", time.monotonic())
            while len(engine.unconfirmed) >= self.options.send_window:
                if engine.link in (Link.CLOSED, Link.FAILED, Link.CLOSING):
                    raise engine.closed_error()
                await self._changed(waiting.next_wait(engine, time.monotonic()))
        result = engine.send(destination, data, headers, persistent, time.monotonic(),
                             app_dup_ids=_app_dup_ids)
        self._after(write=not engine.may_wait_to_write())
        return result

    async def _store(self, destination: str, data: bytes, headers: dict[str, str] | None
                     ) -> SendResult:
        outbox = self._outbox
        assert outbox is not None
        hdrs = dict(headers or {})
        async with self._outbox_lock:
            self._engine.stamp(destination, hdrs)  # stored with it: a restart resends it so
            seq = await asyncio.to_thread(outbox.append, destination, hdrs, data)
            result = self._engine.send(destination, data, hdrs, True, time.monotonic(),
                                       outbox_id=seq)
            if not result.done:
                result.outcome = Outcome.STORED
        self._after()
        return result

    async def flush(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for result in list(self._engine.unconfirmed.values()):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            await self._wait(result, left)

    async def subscribe(self, destination: str, ack: str = "client-individual",
                        headers: dict[str, str] | None = None, id: str | None = None
                        ) -> AsyncSubscription:
        state, op = self._engine.subscribe(destination, ack, headers, id, time.monotonic())
        await self._after_call(op)
        return AsyncSubscription(self, state)

    async def stream_info(self, stream: str, must_exist: bool = True) -> tuple[int, int]:
        """(first offset still stored, next offset to be appended) of a stream: see
        `Client.stream_info`."""
        destination = stream_destination(stream)
        state, op = self._engine.subscribe(destination, "auto", info_headers(must_exist),
                                           None, time.monotonic())
        await self._after_call(op)
        offsets = offsets_from_receipt(destination, op.receipt_headers)
        unsubscribed = self._engine.unsubscribe(state.id, None, time.monotonic())
        await self._after_call(unsubscribed, raise_on_failure=False)
        return offsets

    async def _receive(self, state: SubscriptionState, timeout: float | None
                       ) -> Message | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        engine = self._engine
        while True:
            message = engine.take_message(state)
            if message is not None:
                return message
            error = engine.subscription_error(state)
            if error is not None:
                raise error
            if deadline is None:
                await self._changed(1.0)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            await self._changed(remaining)

    async def ack(self, message: Message) -> None:
        await self._wait_connected("ack")
        self._engine.ack(message, time.monotonic())
        self._after(write=not self._engine.may_wait_to_write())

    async def nack(self, message: Message) -> None:
        await self._wait_connected("nack")
        self._engine.ack(message, time.monotonic(), nack=True)
        self._after()

    async def _wait_connected(self, what: str) -> None:
        engine = self._engine
        if engine.failing_since() is None:
            return
        waiting = Waiting(self.options, None, what, time.monotonic())
        while engine.failing_since() is not None:
            await self._changed(waiting.next_wait(engine, time.monotonic()))

    async def begin(self) -> None:
        await self._after_call(self._engine.begin(time.monotonic()))

    async def commit(self) -> None:
        await self._after_call(self._engine.end_transaction(True, time.monotonic()))

    async def abort(self) -> None:
        await self._after_call(self._engine.end_transaction(False, time.monotonic()),
                               raise_on_failure=False)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncClient]:
        await self.begin()
        try:
            yield self
        except BaseException:
            await self.abort()
            raise
        await self.commit()

    @property
    def server(self) -> str | None:
        return self._engine.server

    @property
    def connected(self) -> bool:
        return self._engine.link is Link.UP

    def learn_servers(self, topology: str) -> None:
        """More servers of the current member ("HOST:PORT,HOST:PORT"), as a CONNECTED
        frame's `topology` header would add them: a colocated live's backup, which came
        after this client connected (server/cluster/bridge.py reads it off the member's
        status)."""
        self._engine.servers.learn(topology)

    def stats(self) -> dict[str, Any]:
        engine = self._engine
        stats: dict[str, Any] = {**engine.stats, "unconfirmed": len(engine.unconfirmed),
                                 "link": engine.link.value, "server": engine.server}
        if self._outbox is not None:
            stats["outbox"] = self._outbox.stats()
        return stats

    async def wait(self, op: Op, timeout: float | None = None) -> Outcome:
        """`result.wait()` of the blocking client: until the operation's outcome is final
        (or `timeout` s pass); returns it."""
        return await self._wait(op, timeout, raise_on_failure=False)

    # ------------------------------------------------------------ waiting

    async def _after_call(self, op: Op, raise_on_failure: bool = True) -> Outcome:
        self._after()
        return await self._wait(op, None, raise_on_failure)

    async def _wait(self, op: Op, timeout: float | None, raise_on_failure: bool = True
                    ) -> Outcome:
        if not op.done:
            self._after()  # whatever the engine held back for the reader goes out now
            waiting = Waiting(self.options, timeout, op.kind, time.monotonic())
            while not op.done:
                pause = waiting.next_wait(self._engine, time.monotonic())
                if pause is None:
                    return op.outcome
                await self._changed(pause)
        return outcome_of(op, raise_on_failure)

    async def _changed(self, timeout: float | None) -> None:
        """Until the engine applied something new, or `timeout` s."""
        progress = self._progress
        try:
            await asyncio.wait_for(progress.wait(), timeout)
        except TimeoutError:
            pass

    # ------------------------------------------------------------ I/O

    def _after(self, write: bool = True) -> None:
        """Write what the engine produced (unless the next read may do it, in one go with
        what else came meanwhile), hand events on, wake the waiters."""
        engine = self._engine
        if write:
            socket_id, data = engine.take_output()
            if data and self._transport is not None and self._transport[0] == socket_id:
                self._transport[1].write(data)
        forwarded = engine.take_forwarded()
        restamped = engine.take_restamped()
        if self._outbox is not None and (forwarded or restamped):
            asyncio.get_running_loop().run_in_executor(None, self._outbox.update, forwarded,
                                                       restamped)
        for event in engine.take_events():
            log.info("pairmq client: %s from %s to %s after %.2f s (%s)", event.kind,
                     event.old_server, event.new_server, event.seconds, event.reason)
            for listener in list(self._listeners):
                try:
                    outcome = listener(event)
                    if asyncio.iscoroutine(outcome):
                        task = asyncio.ensure_future(outcome)
                        self._listener_tasks.add(task)
                        task.add_done_callback(self._listener_tasks.discard)
                except Exception:
                    log.exception("failover listener %r failed", listener)
        if self._transport is not None and not engine.wants_socket(self._transport[0]):
            self._transport[1].close()
            self._transport = None
        progress, self._progress = self._progress, asyncio.Event()
        progress.set()

    def _input(self, socket_id: int, data: bytes) -> None:
        if self._engine.wants_socket(socket_id):
            self._engine.receive(data, time.monotonic())
            self._after()

    def _lost(self, socket_id: int, why: str) -> None:
        if self._transport is not None and self._transport[0] == socket_id:
            self._transport = None
        if self._engine.wants_socket(socket_id):
            self._engine.lost(why, time.monotonic())
            self._after()
        self._wake.set()  # the I/O task reconnects

    async def _run(self) -> None:
        engine = self._engine
        loop = asyncio.get_running_loop()
        while engine.link not in (Link.CLOSED, Link.FAILED):
            now = time.monotonic()
            engine.tick(now)
            self._after()
            if engine.link in (Link.CLOSED, Link.FAILED):
                break
            if self._transport is None:
                plan = engine.next_attempt(now)
                self._after()
                if plan is None:
                    await self._sleep(0.05)
                    continue
                address, at = plan
                if at > time.monotonic():
                    await self._sleep(at - time.monotonic())
                    continue
                engine.trying(address)
                await self._attempt(loop, address)
                continue
            deadline = engine.next_deadline()
            await self._sleep(1.0 if deadline is None else
                              max(0.0, min(deadline - time.monotonic(), 1.0)))

    async def _attempt(self, loop: asyncio.AbstractEventLoop, address: tuple[str, int]) -> None:
        engine = self._engine
        socket_id = engine.socket_id + 1
        tls = self._tls
        try:
            transport, _ = await asyncio.wait_for(
                loop.create_connection(lambda: _Protocol(self, socket_id), *address, ssl=tls,
                                       server_hostname=address[0] if tls else None),
                self.options.connect_timeout / 1000)
        except TimeoutError as e:
            engine.attempt_failed(address, str(e) or type(e).__name__, time.monotonic())
            return
        except OSError as e:
            engine.attempt_failed(address, tls_failure(e), time.monotonic())
            return
        if engine.link is not Link.CONNECTING:
            transport.close()
            return
        engine.opened(address, time.monotonic())
        assert engine.socket_id == socket_id
        self._transport = (socket_id, transport)
        self._after()

    async def _sleep(self, seconds: float) -> None:
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            pass


async def connect_async(url: str | list[str] | tuple[str, ...], *,
                        failover_listener: Listener | None = None, name: str | None = None,
                        **options: Any) -> AsyncClient:
    """The asyncio twin of `pairmq.client.connect`."""
    client = AsyncClient(parse_options(url, options), name=name)
    if failover_listener is not None:
        client.add_failover_listener(failover_listener)
    try:
        return await client.start()
    except BaseException:
        await client.close(0)
        raise
