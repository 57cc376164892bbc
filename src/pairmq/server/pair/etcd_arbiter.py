"""The pair's arbiter on etcd: the lease record (ha/etcd_lease.py) read and written through
etcd's HTTP/JSON gateway (`/v3/kv/range`, `/v3/kv/txn`) with aiohttp.

The decisions are `LeaseSession`'s; this is the I/O: which member to ask (the one that
answered last, then the others in turn), how long to wait (a request's deadline is the
witness's: ha/witness_client.py `reply_timeout`), and what to tell the operator (each
member's reachability, from a probe of `/v3/maintenance/status` every activation
interval). Why the gateway and not gRPC: docs/ha.md, "The lease on etcd".
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from pairmq.ha.etcd_lease import LeaseSession, Next, RecordError, Stage, fingerprint, prefix
from pairmq.ha.messages import MessageError, WitnessPurpose, WitnessReply
from pairmq.server.arbiter_url import EtcdCluster
from pairmq.server.etcd_gateway import EtcdGateway, Member, NoAnswer, b64
from pairmq.server.pair.witness_client import reply_timeout

log = logging.getLogger("pairmq.ha")
trace = logging.getLogger("pairmq.ha.trace")

class EtcdArbiter:
    """The lease on an etcd cluster: one request at a time, each one or two etcd calls."""

    def __init__(self, cluster: EtcdCluster, group: str, secret: str, heartbeat: float,
                 activation: float, tls: Callable[[], ssl.SSLContext | None]) -> None:
        self._etcd = EtcdGateway(cluster, tls)
        self._members = self._etcd.members
        self._group = group
        self._lease = LeaseSession(group, fingerprint(group, secret))
        self._heartbeat = heartbeat
        self._activation = activation
        self._tls = tls
        self._lock = asyncio.Lock()
        self._answered: float | None = None
        self._said = ""  # the last problem logged: once until it changes or etcd answers
        self.problem = ""  # why the last request had no answer ("" after an answer)
        self._polling: asyncio.Task[None] | None = None
        self._streaming: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ Arbiter

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._polling = loop.create_task(self._poll())
        self._streaming = loop.create_task(self._stream_record())

    async def ask(self, purpose: WitnessPurpose, request: dict[str, Any]) -> WitnessReply | None:
        async with self._lock:
            deadline = time.monotonic() + reply_timeout(request, self._heartbeat,
                                                        self._activation)
            try:
                step = self._lease.begin(request, time.monotonic())
                while step.stage is not Stage.DONE:
                    step = await self._carry_out(step, deadline)
                assert step.reply is not None
                reply = WitnessReply.from_wire(step.reply)
            except RecordError as e:
                self._say(logging.ERROR, f"The pair's lease in etcd is unusable: {e}", "")
                return None
            except NoAnswer as e:
                self._say(logging.INFO, "Cannot reach a majority of etcd at "
                          + ", ".join(m.url for m in self._members), str(e))
                return None
            except (KeyError, TypeError, ValueError, MessageError) as e:
                self._say(logging.ERROR, "An answer of etcd makes no sense: taken as no "
                          f"answer ({type(e).__name__}: {e})", "")
                return None
        self._answered = time.monotonic()
        if self._said:
            log.info("etcd answers again (group %s)", self._group)
            self._said = self.problem = ""
        return reply

    def reachable(self, now: float) -> bool:
        answered = self._answered
        return answered is not None and now - answered <= self._activation

    async def close(self) -> None:
        for task in (self._polling, self._streaming):
            if task is not None:
                task.cancel()
        await self._etcd.close()

    def status(self, now: float) -> dict[str, Any]:
        leader = next((m.url for m in self._members
                       if m.member_id and m.member_id == m.leader_id
                       and _recent(m.answered, now, 2 * self._activation)), None)
        return {"kind": "etcd", "group": self._group, "prefix": prefix(self._group),
                "members": [{"url": m.url,
                             "reachable": _recent(m.answered, now, 2 * self._activation),
                             "leader": m.url == leader, "problem": m.failed or None}
                            for m in self._members],
                "leader": leader, "problem": self.problem or None}

    # ------------------------------------------------------------ etcd calls

    async def _carry_out(self, step: Next, deadline: float) -> Next:
        key = b64(self._lease.key.encode())
        if step.stage is Stage.READ:
            answer = await self._etcd.call("/v3/kv/range", {"key": key}, deadline)
            raw, revision = _kv(answer.get("kvs"))
            return self._lease.read(raw, revision, time.monotonic())
        range_ = {"request_range": {"key": key}}
        answer = await self._etcd.call("/v3/kv/txn", {
            "compare": [{"key": key, "target": "MOD", "result": "EQUAL",
                         "mod_revision": str(step.compare)}],
            "success": [{"request_put": {"key": key, "value": b64(step.value)}}],
            "failure": [range_]}, deadline)
        now = time.monotonic()
        if answer.get("succeeded"):
            return self._lease.wrote(int(answer["header"]["revision"]), now)
        responses = answer.get("responses") or [{}]
        raw, revision = _kv(responses[0].get("response_range", {}).get("kvs"))
        return self._lease.write_failed(raw, revision, now)

    async def _poll(self) -> None:
        """Every heartbeat, the record as it is now (see `LeaseSession.observe`); every
        activation interval, each member's reachability and leader, for /status. Beside
        the requests, not under their lock: a member that hangs here delays no request."""
        probed = 0.0
        while True:
            await self._observe()
            if time.monotonic() - probed >= self._activation:
                probed = time.monotonic()
                await asyncio.gather(*(self._probe(m) for m in self._members))
            await asyncio.sleep(self._heartbeat)

    async def _stream_record(self) -> None:
        """An etcd watch of the record: each new revision seen the moment a member applied
        it (a revision comes only after its commit), so that a backup counts the holder's
        lease from about its last renewal. Polling (`_poll`) stays: a watch on a member
        that hangs says nothing, and its stream is not read for decisions."""
        key = b64(self._lease.key.encode())
        body = {"create_request": {"key": key}}
        while True:
            member = self._members[self._etcd.preferred]
            try:
                async with self._etcd.session().post(
                        member.url + "/v3/watch", json=body,
                        timeout=aiohttp.ClientTimeout(total=None, connect=self._heartbeat),
                        ssl=self._tls() or False) as response:
                    async for line in response.content:
                        result = json.loads(line).get("result", {})
                        for event in result.get("events", ()):
                            kv = event.get("kv", {})
                            deleted = event.get("type") == "DELETE"
                            self._lease.observe(
                                None if deleted else base64.b64decode(kv.get("value", "")),
                                0 if deleted else int(kv["mod_revision"]), time.monotonic())
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as e:
                trace.debug("etcd watch at %s ended: %s", member.url, e)
            except RecordError as e:
                self._say(logging.ERROR, f"The pair's lease in etcd is unusable: {e}", "")
            await asyncio.sleep(self._heartbeat)

    async def _observe(self) -> None:
        key = b64(self._lease.key.encode())
        try:
            answer = await self._etcd.call("/v3/kv/range", {"key": key, "serializable": True},
                                      time.monotonic() + self._heartbeat)
            raw, revision = _kv(answer.get("kvs"))
            self._lease.observe(raw, revision, time.monotonic())
        except (NoAnswer, KeyError, TypeError, ValueError):
            pass  # the requests say so
        except RecordError as e:
            self._say(logging.ERROR, f"The pair's lease in etcd is unusable: {e}", "")

    async def _probe(self, member: Member) -> None:
        try:
            async with self._etcd.session().post(
                    member.url + "/v3/maintenance/status", json={},
                    timeout=aiohttp.ClientTimeout(total=self._heartbeat),
                    ssl=self._tls() or False) as response:
                answer = await response.json(content_type=None)
            member.member_id = str(answer["header"]["member_id"])
            member.leader_id = str(answer.get("leader", ""))
            member.answered = time.monotonic()
            member.failed = ""
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as e:
            member.failed = str(e) or type(e).__name__
            member.leader_id = ""

    def _say(self, level: int, text: str, detail: str) -> None:
        """Log `text` once until it changes or etcd answers; /status shows the detail."""
        self.problem = f"{text}: {detail}" if detail else text
        if text != self._said:
            self._said = text
            log.log(level, "%s", text)


def _kv(kvs: Any) -> tuple[bytes | None, int]:
    """The record and its mod_revision from a range's `kvs` (none: None, 0)."""
    if not kvs:
        return None, 0
    kv = kvs[0]
    return base64.b64decode(kv.get("value", "")), int(kv["mod_revision"])


def _recent(at: float | None, now: float, within: float) -> bool:
    return at is not None and now - at <= within
