"""etcd's HTTP/JSON gateway (`/v3/...`) over aiohttp, for whoever keeps state in etcd: the
pair's arbiter (server/pair/etcd_arbiter.py) and the cluster's directory of members
(server/cluster/etcd_directory.py). Why the gateway and not gRPC: docs/ha.md, "The arbiter
on etcd".

Which member to ask: the one that answered last, then the others in turn. A request has a
deadline, shared equally among the members, so that one member that hangs leaves time for
the others.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from pairmq.server.arbiter_url import EtcdCluster

trace = logging.getLogger("pairmq.ha.trace")

ATTEMPT_MIN = 0.05  # an attempt on one member gets at least this (seconds)


class NoAnswer(Exception):
    """No member answered in time (or each said it cannot serve: no leader, no quorum)."""


class EtcdError(Exception):
    """A member answered with an error (etcd's text)."""


@dataclass
class Member:
    url: str
    answered: float | None = None  # when it last answered anything
    member_id: str = ""
    leader_id: str = ""
    failed: str = ""  # why the last call to it failed


class EtcdGateway:
    def __init__(self, cluster: EtcdCluster, tls: Callable[[], ssl.SSLContext | None]) -> None:
        self.members = [Member(url) for url in cluster.urls()]
        self.preferred = 0  # index of the member asked first
        self.tls = tls
        self._http: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    async def call(self, path: str, body: dict[str, Any], deadline: float) -> dict[str, Any]:
        """POST to the preferred member, then the others in turn, until one answers or the
        deadline passes. A member that answers with an error (no leader, no quorum) is
        passed over like one that does not answer."""
        http = self.session()
        share = max(ATTEMPT_MIN, (deadline - time.monotonic()) / len(self.members))
        problems: dict[str, str] = {}
        while (left := deadline - time.monotonic()) > 0:
            member = self.members[self.preferred]
            try:
                async with http.post(member.url + path, json=body,
                                     timeout=aiohttp.ClientTimeout(total=min(share, left)),
                                     ssl=self.tls() or False) as response:
                    answer = await response.json(content_type=None)
                    if response.status != 200 or "error" in answer or "header" not in answer:
                        raise EtcdError(str(answer.get("error") or answer.get("message")
                                            or f"HTTP {response.status}"))
                member.answered = time.monotonic()
                member.failed = ""
                return dict(answer)
            except (aiohttp.ClientError, TimeoutError, ValueError, EtcdError) as e:
                why = str(e) or type(e).__name__
                member.failed = problems[member.url] = why
                trace.debug("etcd %s at %s failed: %s", path, member.url, why)
                self.preferred = (self.preferred + 1) % len(self.members)
        raise NoAnswer("; ".join(f"{url}: {why}" for url, why in problems.items())
                       or "no time left")


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def prefix_end(prefix: bytes) -> bytes:
    """etcd's range_end for every key that starts with `prefix`."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


async def keepalive(gateway: EtcdGateway, lease_id: str, deadline: float) -> int:
    """Renew an etcd lease; returns its TTL left in seconds (0: it had expired). The
    gateway answers `/v3/lease/keepalive` as a stream: its first line is the answer."""
    problems: dict[str, str] = {}
    while (left := deadline - time.monotonic()) > 0:
        member = gateway.members[gateway.preferred]
        try:
            async with gateway.session().post(
                    member.url + "/v3/lease/keepalive", json={"ID": lease_id},
                    timeout=aiohttp.ClientTimeout(total=left),
                    ssl=gateway.tls() or False) as response:
                line = await response.content.readline()
            result = json.loads(line).get("result")
            if not isinstance(result, dict):
                raise EtcdError(line.decode(errors="replace")[:200])
            member.answered = time.monotonic()
            return int(result.get("TTL", 0))
        except (aiohttp.ClientError, TimeoutError, ValueError, EtcdError) as e:
            problems[member.url] = str(e) or type(e).__name__
            gateway.preferred = (gateway.preferred + 1) % len(gateway.members)
    raise NoAnswer("; ".join(f"{url}: {why}" for url, why in problems.items())
                   or "no time left")
