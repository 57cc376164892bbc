"""The cluster's members found in etcd, when `[ha] witness` is an etcd URL and `[cluster]
members` is empty (docs/cluster.md, "Discovery").

The active server of each member registers the member under
`/pairmq/clusters/CLUSTER/members/MEMBER`: its URL, its servers and the messages waiting
there, attached to an etcd lease of `TTL_S` that it renews every `EVERY_S`. A member whose
active server dies leaves the directory when the lease runs out, unless its backup, having
taken over, registers it again first (same key, the backup's own lease). Every `EVERY_S`
the server also reads the whole directory and bridges to the members it lists.

A name registered by servers other than this pair's is another member with the same name:
the key is left alone, and the problem is named in the log and /status.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from pairmq.server.etcd_gateway import EtcdGateway, NoAnswer, b64, keepalive, prefix_end

log = logging.getLogger("pairmq.cluster")
TTL_S = 10  # a member whose active server died is listed this long at most
EVERY_S = 1.0  # renewal of the registration, and a read of the directory


def directory_prefix(cluster: str) -> str:
    return f"/pairmq/clusters/{cluster}/members/"


class EtcdDirectory:
    def __init__(self, gateway: EtcdGateway, cluster: str, member: str,
                 registration: Callable[[], dict[str, Any]],
                 on_members: Callable[[list[str]], None]) -> None:
        self._etcd = gateway
        self.prefix = directory_prefix(cluster)
        self._key = (self.prefix + member).encode()
        self._member = member
        self._registration = registration  # url, servers, waiting: what others read
        self._on_members = on_members
        self._lease = ""  # the etcd lease of this registration ("" : none yet)
        self.problem = ""
        self.members: dict[str, dict[str, Any]] = {}  # member -> what it registered

    async def run(self) -> None:
        while True:
            try:
                await self._register()
                await self._read()
                if self.problem.startswith("etcd"):
                    log.info("Cluster directory in etcd answers again")
                    self.problem = ""
            except NoAnswer as e:
                self._say(f"etcd does not answer: {e}")
            except (KeyError, TypeError, ValueError) as e:
                self._say(f"etcd's answer makes no sense ({type(e).__name__}: {e})")
            await asyncio.sleep(EVERY_S)

    async def _register(self) -> None:
        deadline = time.monotonic() + EVERY_S
        if self._lease and await keepalive(self._etcd, self._lease, deadline) <= 0:
            self._lease = ""
        if not self._lease:
            answer = await self._etcd.call("/v3/lease/grant", {"TTL": TTL_S}, deadline)
            self._lease = str(answer["ID"])
        mine = self._registration()
        current = await self._etcd.call("/v3/kv/range", {"key": b64(self._key)}, deadline)
        kvs = current.get("kvs") or []
        if kvs:
            held = json.loads(_value(kvs[0]))
            if sorted(held.get("servers", [])) != sorted(mine["servers"]):
                self._say(f"member name {self._member!r} is registered in etcd by "
                          f"{held.get('url')}: two members with one name; this one is not "
                          "listed (give each pair its own [cluster] member)")
                return
        await self._etcd.call("/v3/kv/put", {"key": b64(self._key),
                                             "value": b64(json.dumps(mine).encode()),
                                             "lease": self._lease}, deadline)
        if self.problem.startswith("member name"):
            self.problem = ""

    async def _read(self) -> None:
        key = self.prefix.encode()
        answer = await self._etcd.call("/v3/kv/range", {
            "key": b64(key), "range_end": b64(prefix_end(key))},
            time.monotonic() + EVERY_S)
        found = {}
        for kv in answer.get("kvs") or []:
            entry = json.loads(_value(kv))
            if isinstance(entry, dict) and isinstance(entry.get("url"), str):
                found[str(entry.get("member"))] = entry
        self.members = found
        self._on_members([e["url"] for name, e in sorted(found.items())
                          if name != self._member])

    async def withdraw(self) -> None:
        """This server stops serving its member: its registration goes now, not in TTL_S."""
        if self._lease:
            try:
                await self._etcd.call("/v3/lease/revoke", {"ID": self._lease},
                                      time.monotonic() + EVERY_S)
            except NoAnswer:
                pass
            self._lease = ""
        await self._etcd.close()

    def _say(self, problem: str) -> None:
        if problem != self.problem:
            log.warning("Cluster directory %s: %s", self.prefix, problem)
        self.problem = problem

    def status(self) -> dict[str, Any]:
        return {"kind": "etcd", "prefix": self.prefix, "problem": self.problem or None,
                "registered": sorted(self.members)}


def _value(kv: dict[str, Any]) -> bytes:
    return base64.b64decode(kv.get("value", ""))
