"""Failover against a pairmq pair with the plain `stomp.py` library (tested with 9.0).

pairmq's own client does all this and more (docs/clients.md); this recipe is for
applications that stay on stomp.py. `FailoverClient(["h1:61613", "h2:61614"])`:

- connects to whichever server accepts: a PASSIVE/WAITING server's ERROR names the active
  one (`active-server`), tried next; CONNECTED's `topology` names both servers;
- reconnects in a background thread when the connection drops (a crash closes it; a server
  that stops serving, e.g. on failback, sends ERROR with `active-server` and closes it);
- `send(destination, body, dup_id)` sends `persistent:true` with your dup-id and a receipt,
  and keeps the message until its RECEIPT (= stored on both servers); after a reconnection
  the unreceipted ones go again, in order, with the same dup-id, before anything new (the
  server stores a dup-id once per destination: nothing lost, nothing doubled);
- `subscribe(destination, handler)` uses `ack:client-individual`, ACKs after the handler
  returned, and subscribes again after every reconnection.

Limits: after a failover a consumer gets its unacknowledged messages again
(`redelivered:true`), including those whose ACK was lost with the connection. With
`dedupe=True` the client skips dup-ids it already handled, but only in this process's
memory (the last `dedupe_size`): if a consumer crash must not repeat an effect, make the
handler idempotent or store the dup-id with the effect. dup-ids must be unique per
destination (the server remembers the last 20,000 by default). Handlers run on stomp.py's
receiver thread: keep them short, and never `send(wait=True)` in one (its receipt would
arrive on that very thread). No transactions across a failover, no TLS here.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Callable, Iterable

import stomp
from stomp.utils import Frame

log = logging.getLogger("stomp_py_failover")
Address = tuple[str, int]
Handler = Callable[[Frame], None]


def parse_address(text: str) -> Address:
    host, _, port = text.strip().rpartition(":")
    return host, int(port)


def _quietly(call: Callable[..., object], *args: object, **kwargs: object) -> None:
    """Writes on a connection that just died raise various errors in stomp.py; they are
    ignored because its on_disconnected follows, and that starts the reconnection."""
    try:
        call(*args, **kwargs)
    except Exception as e:
        log.debug("write failed: %r", e)


class _Link(stomp.ConnectionListener):
    """One stomp.py connection to one server: its events go to the client, tagged with it,
    so that the client can ignore a connection it has already replaced."""

    def __init__(self, client: FailoverClient, address: Address) -> None:
        self.client, self.address, self.lost = client, address, False
        self.answer: queue.Queue[Frame | None] = queue.Queue()  # CONNECTED, ERROR or closed
        self.conn = stomp.Connection12(
            [address], prefer_localhost=False, try_loopback_connect=False,
            reconnect_attempts_max=1, reconnect_sleep_initial=0,  # the client picks servers
            heartbeats=client.heartbeats, timeout=client.connect_timeout)
        self.conn.set_listener("failover", self)

    def on_connected(self, frame: Frame) -> None:
        self.answer.put(frame)

    def on_error(self, frame: Frame) -> None:
        self.client._on_error(frame)
        self.answer.put(frame)

    def on_disconnected(self) -> None:
        self.client._on_lost(self)
        self.answer.put(None)

    def on_receipt(self, frame: Frame) -> None:
        self.client._on_receipt(frame)

    def on_message(self, frame: Frame) -> None:
        self.client._on_message(self, frame)


class FailoverClient:
    """A producer and/or consumer that follows the pair's active server (see above)."""

    def __init__(self, servers: Iterable[str], *, login: str | None = None,
                 passcode: str | None = None, heartbeats: tuple[int, int] = (4000, 4000),
                 connect_timeout: float = 5.0, dedupe: bool = True,
                 dedupe_size: int = 100_000) -> None:
        self.servers = [parse_address(s) for s in servers]  # grows with `topology`
        self.login, self.passcode, self.heartbeats = login, passcode, heartbeats
        self.connect_timeout, self.dedupe, self.dedupe_size = connect_timeout, dedupe, dedupe_size
        self.hint: Address | None = None  # the last `active-server` a server named
        self.history: list[Address] = []  # every server connected to, in order
        self.pending: dict[str, tuple[str, str | bytes, dict[str, str]]] = {}  # by receipt
        self.refused: dict[str, str] = {}  # receipt -> the server's reason
        self.subscriptions: dict[str, tuple[str, Handler]] = {}  # id -> (destination, handler)
        self.seen: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
        self.resent = self.skipped = self._count = 0
        self._link: _Link | None = None
        self._closed = False
        self._state = threading.Condition()  # guards the fields above; notified on changes
        self._writing = threading.Lock()  # so that resends go out before anything new
        self._handling = threading.Lock()  # a replaced connection may still deliver
        threading.Thread(target=self._reconnect_loop, daemon=True).start()

    def send(self, destination: str, body: str | bytes, dup_id: str,
             headers: dict[str, str] | None = None, *, wait: bool = True,
             timeout: float = 30.0) -> None:
        """Returns once the pair stored it. With `wait=False`, call flush() later."""
        with self._writing:  # never write holding _state: receipts need it to get in
            with self._state:
                if self._closed:
                    raise RuntimeError("client closed")
                self._count += 1
                receipt = f"send-{self._count}"
                frame_headers = {**(headers or {}), "persistent": "true", "dup-id": dup_id,
                                 "receipt": receipt}
                self.pending[receipt] = (destination, body, frame_headers)
                link = self._link
            if link is not None:  # else the reconnection sends it
                _quietly(link.conn.send, destination, body, headers=frame_headers)
        if wait:
            self._wait(lambda: receipt not in self.pending, timeout)
            if receipt in self.refused:
                raise RuntimeError(f"{dup_id} refused: {self.refused.pop(receipt)}")

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every message sent so far is receipted (or in `refused`)."""
        self._wait(lambda: not self.pending, timeout)

    def subscribe(self, destination: str, handler: Handler, sub_id: str = "1") -> None:
        with self._writing:
            self.subscriptions[sub_id] = (destination, handler)
            if (link := self._link) is not None:
                _quietly(link.conn.subscribe, destination, sub_id, ack="client-individual")

    def close(self) -> None:
        with self._state:
            self._closed, link = True, self._link
            self._state.notify_all()
        if link is not None:
            _quietly(link.conn.disconnect)

    def _wait(self, done: Callable[[], bool], timeout: float) -> None:
        with self._state:
            if not self._state.wait_for(done, timeout):
                raise TimeoutError(f"{len(self.pending)} messages unreceipted after {timeout} s")

    def _reconnect_loop(self) -> None:
        while True:
            with self._state:
                self._state.wait_for(lambda: self._link is None or self._closed)
            link = self._connect_any()
            if link is None:
                return  # closed
            with self._writing:
                with self._state:
                    if link.lost:  # dropped already
                        continue
                    self._link = link
                    unreceipted = list(self.pending.values())
                    self.resent += len(unreceipted) if self.history else 0
                    self.history.append(link.address)
                log.info("connected to %s:%d", *link.address)
                for sub_id, (destination, _) in self.subscriptions.items():
                    _quietly(link.conn.subscribe, destination, sub_id, ack="client-individual")
                for destination, body, frame_headers in unreceipted:
                    _quietly(link.conn.send, destination, body, headers=frame_headers)

    def _connect_any(self) -> _Link | None:
        delay = 0.1
        while not self._closed:
            todo, tried = [self.hint, *self.history[-1:], *self.servers], set()
            while todo:
                address = todo.pop(0)
                if address is None or address in tried:
                    continue
                tried.add(address)
                if link := self._try(address):
                    return link
                todo.insert(0, self.hint)  # a refusal's hint goes next (once a round)
            with self._state:  # every server refused: wait a little, then another round
                self._state.wait_for(lambda: self._closed, delay)
            delay = min(delay * 1.5, 0.5)
        return None

    def _try(self, address: Address) -> _Link | None:
        link = _Link(self, address)
        try:
            link.conn.connect(self.login, self.passcode, wait=False)
            answer = link.answer.get(timeout=self.connect_timeout)
        except (stomp.exception.StompException, OSError, queue.Empty):
            answer = None
        if answer is not None and answer.cmd == "CONNECTED" and not self._closed:
            for server in filter(None, answer.headers.get("topology", "").split(",")):
                if parse_address(server) not in self.servers:
                    self.servers.append(parse_address(server))
            return link
        _quietly(link.conn.transport.disconnect_socket)
        return None

    def _on_error(self, frame: Frame) -> None:
        active, receipt = frame.headers.get("active-server"), frame.headers.get("receipt-id")
        log.info("server says %r (active-server %s)", frame.headers.get("message"), active)
        with self._state:
            if active:  # the server stops serving (or never did): go there
                self.hint = parse_address(active)
                if self.hint not in self.servers:
                    self.servers.append(self.hint)
            elif receipt in self.pending:  # this SEND itself was refused: resending is futile
                self.refused[receipt] = frame.headers.get("message", "refused")
                del self.pending[receipt]
                self._state.notify_all()

    def _on_lost(self, link: _Link) -> None:
        with self._state:
            link.lost = True
            if self._link is link:
                self._link = None
                self._state.notify_all()

    def _on_receipt(self, frame: Frame) -> None:
        with self._state:
            self.pending.pop(frame.headers.get("receipt-id", ""), None)
            self._state.notify_all()

    def _on_message(self, link: _Link, frame: Frame) -> None:
        key = (frame.headers.get("destination", ""), frame.headers.get("dup-id", ""))
        with self._handling:
            if self.dedupe and key[1] and key in self.seen:
                self.skipped += 1  # handled before: its ACK was lost with a connection
            else:
                try:
                    self.subscriptions[frame.headers["subscription"]][1](frame)
                except Exception:
                    log.exception("handler failed: message given back (NACK)")
                    _quietly(link.conn.nack, frame.headers["ack"])
                    return
                self.seen[key] = None
                if len(self.seen) > self.dedupe_size:
                    self.seen.popitem(last=False)
        _quietly(link.conn.ack, frame.headers["ack"])  # lost with the link: redelivered
