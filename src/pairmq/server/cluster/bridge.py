"""One bridge: this member's pull of messages from one other member (core/cluster.py says
what it pulls and why that is exact).

The bridge is a pairmq client of the other member's pair (its failover URL), logged in with
the client-id `pairmq-bridge.THIS-MEMBER`, so the pair's failover is the client's: it
reconnects to whichever server of that pair is active and subscribes again. A message it
receives is sent to this member's own broker (`LocalMember.send`) with the dup-id
`cluster:MESSAGE-ID`; once this member confirmed it, the bridge acknowledges it on the
other member. Either side may die in between: the other member delivers it again (it was
not acknowledged), and this member recognises the dup-id and confirms without storing it
twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from pairmq.client.aio import AsyncClient, AsyncSubscription, connect_async
from pairmq.client.errors import ClientError
from pairmq.client.members import parse_member_list
from pairmq.client.results import Message
from pairmq.core.cluster import (
    BRIDGE_CLIENT_ID,
    STATUS_TOPIC,
    Interest,
    LoadBalancing,
    Want,
    carried,
    drains,
    wanted,
)
from pairmq.server.cluster.intake import Taken

log = logging.getLogger("pairmq.cluster")
TICK_S = 0.25  # how often a bridge compares what it holds with what it wants
STATUS_STALE_S = 5.0  # a member's status older than this: its queues' idleness is unknown
DEPTH_PAUSE_S = 0.02  # a full local queue: how long a bridge waits before looking again
TAKEN_PER_TURN = 32  # messages a bridge hands to the broker before it lets the loop turn
STOP_CHECK_S = 0.2  # a subscription being given up: how often it looks whether it is done
DRAIN_WAIT_S = 2.0  # how long one reconcile waits for it (then the next one does)
REFUSED_PAUSE_S = 1.0  # a message refused here: how long a subscription's bridge takes no more


class BridgeState(StrEnum):
    CONNECTING = "connecting"  # no server of the member reachable yet (or any more)
    IDENTIFYING = "identifying"  # connected, waiting for the member's status
    FORWARDING = "forwarding"  # a member of this cluster: messages move
    # was forwarding, and no server of the member answers now: what the bridge pulls waits
    # there (its subscriptions stay as they are, durable ones keep their messages)
    RECONNECTING = "reconnecting"
    REFUSED = "refused"  # not a member of this cluster (`problem` says why): nothing moves
    STOPPED = "stopped"


@dataclass
class _Held:
    """A subscription the bridge holds on the other member, and its forwarding task."""

    want: Want
    sub: AsyncSubscription
    task: asyncio.Task[None]
    stopping: asyncio.Event  # set: take no more, end once what was taken is acknowledged


class _Settling:
    """One subscription's messages between its forwarder and its acknowledger: those handed
    to this member, in the order they were delivered, and until when the forwarder takes no
    more (this member refused one: its destination is full, say)."""

    def __init__(self) -> None:
        self.taken: deque[_Taken] = deque()
        self.settled = asyncio.Event()  # one of them was confirmed or refused here
        self.refused_until = 0.0  # time.monotonic()
        self.refusals = 0  # refused since the acknowledger last looked


class _Taken:
    """A message handed to this member, as delivered by the other: confirmed here (True),
    refused (False, and why), or not yet known (None); `take` hands it again."""

    __slots__ = ("message", "ok", "take", "why")

    def __init__(self, message: Message) -> None:
        self.message = message
        self.ok: bool | None = None
        self.why = ""
        self.take: Callable[[], None] = lambda: None


class LocalMember(Protocol):
    """What a bridge needs of this member (server/cluster/node.py, intake.py)."""

    def interest(self) -> Interest: ...

    def depth(self, queue: str) -> int: ...

    def take(self, destination: str, headers: dict[str, str], body: bytes, persistent: bool,
             taken: Taken) -> None: ...

    def identify(self, bridge: Bridge, status: Mapping[str, Any]) -> str | None: ...


@dataclass(frozen=True)
class BridgeSettings:
    cluster: str
    member: str  # this member's name
    mode: LoadBalancing
    redistribution_delay_ms: int
    window: int
    login: str | None
    passcode: str | None


class Bridge:
    def __init__(self, url: str, settings: BridgeSettings, local: LocalMember) -> None:
        self.url = url
        self.settings = settings
        self.local = local
        self.state = BridgeState.CONNECTING
        self.problem: str | None = None
        self.remote: dict[str, Any] = {}  # the member's latest status
        self._remote_at = 0.0  # when it came (monotonic)
        self.forwarded = 0  # messages confirmed here and acknowledged there
        self._outstanding: dict[str, int] = {}  # destination -> received, not acknowledged
        self._client: AsyncClient | None = None
        self._subs: dict[str, _Held] = {}
        self._task: asyncio.Task[None] | None = None
        self._status_task: asyncio.Task[None] | None = None

    @property
    def in_flight(self) -> int:
        """Messages received from the member and not yet acknowledged there."""
        return sum(self._outstanding.values())

    @property
    def remote_member(self) -> str | None:
        name = self.remote.get("member")
        return name if isinstance(name, str) else None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self.state = BridgeState.STOPPED
        for task in (self._task, self._status_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for held in self._subs.values():
            held.task.cancel()
        self._subs.clear()
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close(0.5)
            self._client = None

    def status(self) -> dict[str, Any]:
        remote = self.remote
        connected = self._client is not None and self._client.connected
        return {"url": self.url, "member": self.remote_member, "state": self.state.value,
                "connected": connected, "server": self._client.server if connected and
                self._client else None, "problem": self.problem,
                "in_flight": self.in_flight, "forwarded": self.forwarded,
                "subscriptions": sorted(self._subs),
                "waiting": remote.get("waiting") if self._fresh() else None,
                "role": remote.get("role")}

    def _fresh(self) -> bool:
        return time.monotonic() - self._remote_at < STATUS_STALE_S

    # ------------------------------------------------------------ the connection

    async def _run(self) -> None:
        s = self.settings
        while True:
            try:
                self._client = await connect_async(
                    self.url, login=s.login, passcode=s.passcode, name=f"bridge-{s.member}",
                    client_id=f"{BRIDGE_CLIENT_ID}{s.member}", connection_ttl=0,
                    reconnect_attempts=-1, initial_connect_attempts=1,
                    call_failover_timeout=-1)
                break
            except ClientError as e:
                self._set_problem(BridgeState.CONNECTING, f"member {self.url} unreachable: {e}")
                await asyncio.sleep(1.0)
        client = self._client
        if self.problem and self.state is BridgeState.CONNECTING:
            log.info("Cluster bridge to %s connected (%s)", self.url, client.server)
        self.state, self.problem = BridgeState.IDENTIFYING, None
        status = await client.subscribe(STATUS_TOPIC, ack="auto", id="cluster-status")
        self._status_task = asyncio.get_running_loop().create_task(self._statuses(status))
        while True:
            await asyncio.sleep(TICK_S)
            if not client.connected and self.state is BridgeState.FORWARDING:
                self._set_problem(BridgeState.RECONNECTING,
                                  f"member {self.url}: no server reachable, reconnecting")
            elif client.connected and self.state is BridgeState.RECONNECTING:
                log.info("Cluster bridge to member %s (%s) forwarding again (%s)",
                         self.remote_member, self.url, client.server)
                self.state, self.problem = BridgeState.FORWARDING, None
            if not client.connected:
                continue  # what it holds stays as it is until the member answers again
            try:
                await self._reconcile()
            except ClientError as e:
                log.debug("Cluster bridge to %s: %s", self.url, e)

    def _set_problem(self, state: BridgeState, problem: str) -> None:
        if problem != self.problem:
            log.warning("Cluster bridge to %s: %s", self.url, problem)
        self.state, self.problem = state, problem

    async def _statuses(self, sub: AsyncSubscription) -> None:
        while True:
            try:
                message = await sub.receive()
            except ClientError as e:  # the bridge stops
                log.debug("Cluster bridge to %s: statuses end: %s", self.url, e)
                return
            if message is None:
                continue
            try:
                status = json.loads(message.body)
            except ValueError:
                continue
            if not isinstance(status, dict):
                continue
            self.remote, self._remote_at = status, time.monotonic()
            url = status.get("url")
            if isinstance(url, str) and self._client is not None:
                # the member's servers now: a colocated live's backup, found after this
                # bridge connected, is where it serves next (docs/cluster.md)
                for servers in parse_member_list(url, tls="+ssl://" in url)[:1]:
                    self._client.learn_servers(",".join(f"{h}:{p}" for h, p in servers))
            problem = self.local.identify(self, status)
            if problem is not None:
                self._set_problem(BridgeState.REFUSED, problem)
            elif self.state not in (BridgeState.FORWARDING, BridgeState.RECONNECTING):
                log.info("Cluster bridge to member %s (%s) forwarding", self.remote_member,
                         self.url)
                self.state, self.problem = BridgeState.FORWARDING, None

    # ------------------------------------------------------------ subscriptions

    def _wanted(self) -> dict[str, Want]:
        if self.state not in (BridgeState.FORWARDING, BridgeState.RECONNECTING):
            return {}
        member = self.settings.member
        want = wanted(self.settings.mode, member, self.local.interest())
        held = self.remote.get("sf", {}).get(member) if self._fresh() else None
        if isinstance(held, dict):  # what that member holds for this one: drained
            # (all of it, however deep the queue here, when that member scales down)
            want = {**drains(member, held, not self.remote.get("scaling_down")), **want}
        return want

    def asked(self) -> frozenset[str]:
        """The queues the member asks this one to feed (its latest status)."""
        fed = self.remote.get("fed") if self._fresh() else None
        return frozenset(fed) if isinstance(fed, list) else frozenset()

    async def _reconcile(self) -> None:
        client = self._client
        assert client is not None
        want = self._wanted()
        for destination, held in list(self._subs.items()):
            if want.get(destination) != held.want and not await self._drained(held):
                continue  # what it took is not all confirmed here yet: next tick
            if want.get(destination) != held.want:
                del self._subs[destination]
                headers = {"activemq.subscriptionName": destination} \
                    if held.want.durable and destination not in want else None
                await held.sub.unsubscribe(headers)
        for destination, w in want.items():
            if destination in self._subs:
                continue
            headers = {"prefetch-count": str(self.settings.window)}
            if w.selector is not None:
                headers["selector"] = w.selector
            if w.durable:
                headers["activemq.subscriptionName"] = destination
            # Mode client: one cumulative ACK for a run of messages confirmed here (a frame
            # each made the other member parse and apply a window of ACKs a round).
            sub = await client.subscribe(destination, "client", headers,
                                         id=f"bridge:{destination}")
            stopping = asyncio.Event()
            task = asyncio.get_running_loop().create_task(self._forward(w, sub, stopping))
            self._subs[destination] = _Held(w, sub, task, stopping)

    @staticmethod
    async def _drained(held: _Held) -> bool:
        """Stop taking from a subscription, and wait (a while) until everything it took is
        confirmed here and acknowledged there: only then may it end. Ended earlier, the
        other member would hand what this one holds to another consumer as well."""
        held.stopping.set()
        try:
            await asyncio.wait_for(asyncio.shield(held.task), DRAIN_WAIT_S)
        except TimeoutError:
            return False
        return True

    # ------------------------------------------------------------ moving messages

    async def _forward(self, want: Want, sub: AsyncSubscription, stopping: asyncio.Event
                       ) -> None:
        """Receive, hand to this member, acknowledge there once confirmed here, with up to
        `window` in flight (the subscription's prefetch on the other member). Once
        `stopping` is set: take no more, and end once what was taken is acknowledged."""
        settling = _Settling()
        destination = want.destination
        deliver_to = want.deliver_to
        acker = asyncio.get_running_loop().create_task(
            self._acknowledge(destination, settling))
        queue = deliver_to.startswith("/queue/")
        window = self.settings.window
        name = self.remote_member or self.url
        local = self.local
        outstanding = self._outstanding
        outstanding[destination] = 0
        taken_in_turn = 0

        def hand(message: Message) -> None:
            """Hand a message to this member, and again after a refusal."""
            entry = _Taken(message)
            persistent = message.headers.get("persistent") == "true"

            def taken(ok: bool, why: str) -> None:
                entry.ok, entry.why = ok, why
                if not ok:
                    settling.refusals += 1
                settling.settled.set()

            def take() -> None:
                entry.ok = None
                local.take(deliver_to, carried(message.headers, name), message.body,
                           persistent, taken)

            entry.take = take
            settling.taken.append(entry)
            take()

        try:
            while not stopping.is_set():
                if queue and want.bounded and local.depth(deliver_to) >= window:
                    await asyncio.sleep(DEPTH_PAUSE_S)
                    continue
                refused_for = settling.refused_until - time.monotonic()
                if refused_for > 0:
                    await asyncio.sleep(min(refused_for, STOP_CHECK_S))
                    continue
                message = await sub.receive(STOP_CHECK_S)
                if message is None:
                    continue
                outstanding[destination] += 1
                hand(message)
                taken_in_turn += 1
                if taken_in_turn >= TAKEN_PER_TURN:
                    # let the journal write what was taken, and acknowledgements go out, while
                    # the rest is taken: the other member sends more meanwhile (a window
                    # taken in one turn made the two members wait for each other in turn)
                    taken_in_turn = 0
                    await asyncio.sleep(0)
            while outstanding[destination] > 0:  # stopping: the rest is confirmed, then acked
                await asyncio.sleep(STOP_CHECK_S)
        except ClientError as e:  # the subscription ended (the bridge stops)
            log.debug("Cluster bridge to %s: %s ends: %s", self.url, destination, e)
        finally:
            acker.cancel()
            outstanding.pop(destination, None)  # what was not acknowledged comes again

    async def _acknowledge(self, destination: str, settling: _Settling) -> None:
        """Acknowledge on the other member what this one confirmed, in the order it was
        delivered: the run of confirmed messages at the head in one cumulative ACK (of its
        last), never past a message not yet confirmed here (a persistent one waits for the
        disk while a later non-persistent one is confirmed at once). Messages refused here
        (a destination full, the journal full) stay this bridge's, unacknowledged there:
        the forwarder takes no more for REFUSED_PAUSE_S, then they are handed again. (Given
        back with a NACK, each counted as a failed delivery there, and went to that
        member's dead-letter queue after a few refusals.)"""
        client = self._client
        assert client is not None
        taken = settling.taken
        while True:
            if not taken or taken[0].ok is None:
                settling.settled.clear()
                await settling.settled.wait()
                continue
            confirmed = 0
            last: Message | None = None
            while taken and taken[0].ok:
                last = taken.popleft().message
                confirmed += 1
            if destination in self._outstanding:
                self._outstanding[destination] -= confirmed
            if last is not None:
                try:
                    await client.ack(last)
                    self.forwarded += confirmed
                except ClientError as e:  # the other member failed over: it delivers again
                    log.debug("Cluster bridge to %s: acknowledgement lost (%s)", self.url, e)
            if settling.refusals or (taken and taken[0].ok is False):
                settling.refusals = 0
                refused = [entry for entry in taken if entry.ok is False]
                if refused:
                    await self._hand_again(settling, refused)

    async def _hand_again(self, settling: _Settling, refused: list[_Taken]) -> None:
        """Messages refused here: not taken here now, handed again after a pause."""
        settling.refused_until = time.monotonic() + REFUSED_PAUSE_S
        log.warning("Cluster bridge from %s: %d message(s) for %s not taken here now (%s); "
                    "held by the bridge, unacknowledged on member %s, and handed again in "
                    "%.0f s", self.url, len(refused), refused[0].message.destination,
                    refused[0].why, self.remote_member, REFUSED_PAUSE_S)
        await asyncio.sleep(REFUSED_PAUSE_S)
        for entry in refused:
            entry.take()
