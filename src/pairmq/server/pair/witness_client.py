"""The pair's arbiter as the replication driver asks it: one request at a time, its answer
or None.

`Arbiter` is what the driver needs of whoever grants the lease: ask (the machine's
`AskWitness` request, ha/witness_queue.py, as ha/lease.py `answer` reads it), whether it
answered lately, and close. `WitnessClient` is the one for `pairmq witness`
(server/pair/witness_server.py), over an authenticated link of the HA channel's protocol
(server/pair/ha_link.py); another arbiter goes beside it, behind the same interface.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any, Protocol

from pairmq.ha import channel as ch
from pairmq.ha.messages import MessageError, WitnessPurpose, WitnessReply
from pairmq.server.pair.ha_link import Link, open_link, split_address

log = logging.getLogger("pairmq.ha")
trace = logging.getLogger("pairmq.ha.trace")  # deeper HA tracing, at DEBUG


class Arbiter(Protocol):
    """Whoever grants the active server its lease, as the driver asks it."""

    async def ask(self, purpose: WitnessPurpose, request: dict[str, Any]) -> WitnessReply | None:
        """The answer to `request` (asked for `purpose`), or None: no answer in time, or
        one that makes no sense (the machine takes both as an unreachable arbiter)."""

    def reachable(self, now: float) -> bool:
        """Whether it answered lately (for GET /status and the metrics)."""

    def status(self, now: float) -> dict[str, Any]:
        """What /status shows of it beside reachability (its kind first)."""

    def start(self) -> None:
        """Begin what runs beside the requests (in the event loop)."""

    async def close(self) -> None: ...


def reply_timeout(request: dict[str, Any], heartbeat: float, activation: float) -> float:
    """How long to wait for the arbiter's answer. A renewal's answer is worth waiting for as
    long as the lease it asks for could still run (it counts from the request): a busy
    event loop that reads it late must not count as a lost arbiter. Other requests give
    up after a heartbeat, so an unreachable arbiter is known soon."""
    if request.get("op") == "renew":
        return max(heartbeat, activation / 2)
    return heartbeat


class WitnessClient:
    """`pairmq witness` over one connection, opened again when it breaks; one request on
    it at a time."""

    def __init__(self, address: str, secret: str, name: str, heartbeat: float,
                 activation: float, tls: Callable[[], ssl.SSLContext | None]) -> None:
        self._address = address
        self._secret = secret
        self._name = name
        self._heartbeat = heartbeat
        self._activation = activation
        self._tls = tls  # the context of the moment (certificates may be reloaded)
        self._link: Link | None = None
        self._lock = asyncio.Lock()
        self._answered: float | None = None  # when the witness last answered
        self._said = False  # that it cannot be reached, or refused: once until it answers
        self._probe: asyncio.Task[None] | None = None  # `_probe_loop`, once started

    async def ask(self, purpose: WitnessPurpose, request: dict[str, Any]) -> WitnessReply | None:
        raw = await self._request(request)
        if raw is None:
            return None
        try:
            reply = WitnessReply.from_wire(raw)
        except MessageError as e:
            log.warning("The witness's answer to %s makes no sense (%s): taken as no answer",
                        purpose.value, e)
            return None
        self._answered = time.monotonic()
        return reply

    def reachable(self, now: float) -> bool:
        """It answered within an activation interval (a renewal is asked every heartbeat)."""
        answered = self._answered
        return answered is not None and now - answered <= self._activation

    def status(self, now: float) -> dict[str, Any]:
        return {"kind": "witness"}

    def start(self) -> None:
        self._probe = asyncio.get_running_loop().create_task(self._probe_loop())

    async def _probe_loop(self) -> None:
        """Ask the witness who holds the lease when it did not answer for half an activation
        interval: a backup asks nothing while PASSIVE, and without this its /status and
        `pairmq_witness_reachable` said "unreachable" an activation interval after it
        started (and PairmqWitnessUnreachable fired for every backup). An active server
        renews every heartbeat, and never needs it. A query changes nothing at the witness
        (ha/lease.py `answer`). It is sent only while no request of the machine's is out;
        one that comes meanwhile waits for its answer: a round trip, or a heartbeat when
        the witness cannot be reached (then the machine's request would fail too)."""
        while True:
            await asyncio.sleep(self._heartbeat)
            answered = self._answered
            if self._lock.locked() or (answered is not None and time.monotonic() - answered
                                       < self._activation / 2):
                continue
            raw = await self._request({"op": "query", "name": self._name})
            if raw is not None:
                self._answered = time.monotonic()

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
        if self._link is not None:
            self._link.close()

    async def _request(self, request: dict[str, Any]) -> dict[str, Any] | None:
        async with self._lock:
            for _ in range(2):
                try:
                    if self._link is None or self._link.closed:
                        host, port = split_address(self._address)
                        self._link = await open_link(host, port, self._secret,
                                                     {"name": self._name}, self._heartbeat,
                                                     self._tls())
                        self._said = False
                    self._link.send_json(ch.LEASE, request)
                    return await self._link.recv_json(ch.LEASE_REPLY,
                                                      reply_timeout(request, self._heartbeat,
                                                                    self._activation))
                except ch.ChannelError as e:
                    if not self._said:
                        self._said = True
                        log.info("Witness at %s refused: %s", self._address, e)
                except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
                    trace.debug("Witness request failed: %s", e)
                if self._link is not None:
                    self._link.close()
                    self._link = None
            if not self._said:
                self._said = True
                log.info("Cannot reach the witness at %s", self._address)
            return None
