"""This server's part in a cluster (docs/cluster.md): while it serves, one bridge per other
member (bridge.py), the intake the bridges hand what they bring to (intake.py), the feeder
of the other members' store-and-forward queues here (feeder.py), and the status it
publishes for the other members' bridges. A backup has none of it: the members' bridges
follow each pair's failover, so only the active server of a member pulls and feeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pairmq.core.cluster import (
    DURABLE_KEY,
    DURABLE_TOPIC,
    DURABLES_QUEUE,
    HANDOVER_QUEUE,
    STATUS_TOPIC,
    Interest,
    LoadBalancing,
    fed_queues,
    interest_of,
    store_and_forward,
    wanted,
)
from pairmq.core.scale_down import ScaleDown
from pairmq.server.clock import now_ms
from pairmq.server.cluster.bridge import Bridge, BridgeSettings, BridgeState
from pairmq.server.cluster.colocated import Colocation
from pairmq.server.cluster.etcd_directory import EtcdDirectory
from pairmq.server.cluster.feeder import Feeder
from pairmq.server.cluster.intake import LocalIntake, Taken
from pairmq.server.cluster.scale_down import ScaleDownDriver, Target
from pairmq.server.config import ServerConfig
from pairmq.server.etcd_gateway import EtcdGateway
from pairmq.server.role.role import Role
from pairmq.server.tls import etcd_tls_context

log = logging.getLogger("pairmq.cluster")
STATUS_EVERY_S = 0.5  # how often this member tells the others how it stands
FEED_EVERY_S = 0.005  # how often the other members' store-and-forward queues are fed
IDLE_FEED_EVERY_S = 0.05  # ... and looked at while none has anything to take
INTEREST_FRESH_S = 0.1  # bridges share one look at the broker made this recently
RATE_WINDOW_S = 5.0  # forwarded per second: over this much of the past


def settings_digest(config: ServerConfig) -> dict[str, str]:
    """A short hash of each destination setting, by pattern ("*": the defaults), so that
    members can name the settings where they differ without sending them."""
    core = config.core_settings()

    def short(*values: object) -> str:
        return hashlib.sha256(repr(values).encode()).hexdigest()[:12]

    digest = {"*": short(core.default_prefetch, core.max_delivery_attempts,
                         core.dead_letter_prefix, core.expired_policy, core.max_size_bytes,
                         core.dup_cache_size, core.address_full_policy)}
    for o in config.overrides:
        digest[o.pattern] = short(o.address_full_policy, o.max_size_bytes, o.dup_cache_size)
    return digest


def _ignore(ok: bool, why: str) -> None:
    """A status is a non-persistent message: nothing waits for it."""


def member_url(topology: str | None, own_address: str) -> str:
    """This member as clients reach it: its pair's failover URL, or one address."""
    if topology:
        return "failover:(" + ",".join(f"stomp://{a}" for a in topology.split(",")) + ")"
    return f"stomp://{own_address}"


def _servers(url: str) -> frozenset[str]:
    inner = url[len("failover:("):-1] if url.startswith("failover:(") else url
    return frozenset(part.split("://", 1)[-1].split("?")[0] for part in inner.split(","))


class ClusterNode:
    def __init__(self, config: ServerConfig, role: Callable[[], Role],
                 own_url: Callable[[], str], conn_id: Callable[[], int],
                 backup_linked: Callable[[], bool] = lambda: False) -> None:
        self.config = config
        self._role = role
        self._own_url = own_url
        self._conn_id = conn_id
        self.member = config.member_name
        self.digest = settings_digest(config)
        self.settings = BridgeSettings(
            config.cluster_name, self.member, LoadBalancing(config.message_load_balancing),
            config.redistribution_delay_ms, config.bridge_window,
            config.cluster_user or None, config.cluster_password or None)
        self.bridges: dict[str, Bridge] = {}
        self._intake: LocalIntake | None = None
        self._task: asyncio.Task[None] | None = None
        self._interest: tuple[float, Interest] | None = None
        self._feeder = Feeder(role, self._asked, self.settings.mode,
                              config.redistribution_delay_ms, config.bridge_window)
        self._rates: deque[tuple[float, int]] = deque()
        self.differences: dict[str, list[str]] = {}  # member -> settings that differ
        # no static members and an etcd witness: the members registered in etcd
        self.directory: EtcdDirectory | None = None
        self._directory_task: asyncio.Task[None] | None = None
        self.scaling: ScaleDownDriver | None = None  # this member scales down
        # [ha] policy = "colocated": its live's backup, and the backups it hosts
        self.colocation = Colocation(config, backup_linked) \
            if config.policy == "colocated" else None

    # ------------------------------------------------------------ lifecycle

    @property
    def serving(self) -> bool:
        return self._task is not None

    def serve(self) -> None:
        """This server became its member's active one: bridges to the others start."""
        if self._task is None:
            if self.colocation is not None:
                self.colocation.serve()
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        directory_task, self._directory_task = self._directory_task, None
        for t in (task, directory_task):
            if t is not None:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        directory, self.directory = self.directory, None
        if directory is not None:
            await directory.withdraw()
        bridges, self.bridges = self.bridges, {}
        await asyncio.gather(*(b.stop() for b in bridges.values()), return_exceptions=True)
        intake, self._intake = self._intake, None
        if intake is not None:
            intake.close()
        if bridges:
            log.info("Cluster %s: bridges of member %s stopped", self.config.cluster_name,
                     self.member)

    async def _run(self) -> None:
        c = self.config
        self._intake = LocalIntake(self._role(), self._conn_id())
        if c.cluster_members:
            log.info("Cluster %s: member %s is served here, bridging to %d member(s)",
                     c.cluster_name, self.member, len(c.cluster_members))
            self.members_changed(c.cluster_members)
        else:
            self.directory = self._etcd_directory()
            log.info("Cluster %s: member %s is served here, its members are in etcd under "
                     "%s", c.cluster_name, self.member, self.directory.prefix)
            self._directory_task = asyncio.get_running_loop().create_task(self.directory.run())
        published = 0.0
        while True:
            now = time.monotonic()
            if now - published >= STATUS_EVERY_S:
                published = now
                self._feeder.discover()
                if self.colocation is not None and not self.scaling_down:
                    self.colocation.tick(self.bridges.values(), self._own_url())
                self._publish()
            # other members' store-and-forward queues: fed every FEED_EVERY_S while one is
            # being fed (their bridges take what this member's consumers leave waiting),
            # looked at every IDLE_FEED_EVERY_S otherwise
            if self.scaling_down:  # what it holds goes to one member only now
                await asyncio.sleep(IDLE_FEED_EVERY_S)
            elif self._feeder.active and self._feeder.tick(now_ms()):
                await asyncio.sleep(FEED_EVERY_S)
            else:
                await asyncio.sleep(IDLE_FEED_EVERY_S)

    def _etcd_directory(self) -> EtcdDirectory:
        c = self.config
        etcd = c.etcd
        assert etcd is not None, "config.py: no [cluster] members needs an etcd witness"
        context = etcd_tls_context(*c.etcd_tls_files) if etcd.tls else None

        def registration() -> dict[str, Any]:
            url = self._own_url()
            return {"cluster": c.cluster_name, "member": self.member, "url": url,
                    "servers": sorted(_servers(url)), "waiting": self.interest().waiting,
                    "at": int(time.time() * 1000)}

        return EtcdDirectory(EtcdGateway(etcd, lambda: context), c.cluster_name, self.member,
                             registration, self.members_changed)

    def _asked(self, member: str) -> frozenset[str]:
        """The queues `member` asks this one to feed, as its bridge last heard."""
        for bridge in self.bridges.values():
            if bridge.remote_member == member and bridge.state in (
                    BridgeState.FORWARDING, BridgeState.RECONNECTING):
                return bridge.asked()
        return frozenset()

    def members_changed(self, urls: Iterable[str]) -> None:
        """The other members are these (static, or as found in etcd)."""
        own = _servers(self._own_url())
        wanted = [u for u in urls if not _servers(u) & own]
        for url in set(self.bridges) - set(wanted):
            asyncio.get_running_loop().create_task(self.bridges.pop(url).stop())
        for url in wanted:
            if url not in self.bridges:
                bridge = Bridge(url, self.settings, self)
                self.bridges[url] = bridge
                bridge.start()

    def _publish(self) -> None:
        intake = self._intake
        if intake is None:
            return
        interest = self.interest()
        broker = self._role().broker
        status = {"cluster": self.config.cluster_name, "member": self.member,
                  "url": self._own_url(), "role": "active", "waiting": interest.waiting,
                  # what this member's bridges take: the others feed these queues ...
                  "fed": fed_queues(wanted(self.settings.mode, self.member, interest)),
                  # ... and what it holds for each other member, which that one drains
                  "sf": store_and_forward(broker),
                  "settings": self.digest,
                  # where a member scaling down may send its messages (docs/cluster.md)
                  "scale_down_group": self.config.scale_down_group,
                  "scaling_down": self.scaling_down,
                  # colocated: who hosts this live's backup, and what it hosts
                  **(self.colocation.published() if self.colocation is not None else {})}
        intake.take(STATUS_TOPIC, {}, json.dumps(status).encode(), False, _ignore)
        now = time.monotonic()
        self._rates.append((now, self.forwarded()))
        while self._rates and now - self._rates[0][0] > RATE_WINDOW_S:
            self._rates.popleft()

    # ------------------------------------------------------------ scale-down

    @property
    def scaling_down(self) -> bool:
        return self.scaling is not None and self.scaling.active

    async def scale_down(self, serving: bool) -> ScaleDown:
        """Move everything this member holds to another member and send its clients there
        (core/scale_down.py); `serving`: clients were served until now (a live stopping),
        else none was let in (a backup whose live died)."""
        driver = self.scaling = ScaleDownDriver(
            self._role, self._scale_down_targets, self._hand, self._publish,
            self.config.bridge_window, serving)
        return await driver.run()

    def _scale_down_targets(self) -> list[Target]:
        """The members that may take this one's messages: of the configured
        scale_down_group, not scaling down themselves, their bridges forwarding (or
        reconnecting); the one with the fewest waiting messages first."""
        group = self.config.scale_down_group
        found = []
        for b in self.bridges.values():
            member = b.remote_member
            if member is None or b.state not in (BridgeState.FORWARDING,
                                                 BridgeState.RECONNECTING):
                continue
            remote = b.remote
            if remote.get("scaling_down") or (group and remote.get("scale_down_group") != group):
                continue
            waiting = remote.get("waiting")
            forwarding = b.state is BridgeState.FORWARDING
            found.append((not forwarding, waiting if isinstance(waiting, int) else 0, member,
                          Target(member, b.url, forwarding)))
        return [t for *_, t in sorted(found, key=lambda f: f[:3])]

    def _hand(self, destination: str, body: bytes, taken: Taken) -> None:
        if self._intake is None:
            taken(False, "this server no longer serves its member")
        else:
            self._intake.take(destination, {}, body, True, taken)

    # ------------------------------------------------------------ what bridges use

    def interest(self) -> Interest:
        if self.scaling_down:  # it takes nothing from the others any more
            return Interest({}, frozenset(), self.depth_total())
        now = time.monotonic()
        if self._interest is None or now - self._interest[0] > INTEREST_FRESH_S:
            self._interest = (now, interest_of(self._role().broker))
        return self._interest[1]

    def depth_total(self) -> int:
        return sum(q.count for q in self._role().broker.queues.values())

    def depth(self, queue: str) -> int:
        return self._intake.depth(queue) if self._intake is not None else 0

    def take(self, destination: str, headers: dict[str, str], body: bytes, persistent: bool,
             taken: Taken) -> None:
        if self._intake is None:
            taken(False, "this server no longer serves its member")
        elif destination == HANDOVER_QUEUE:
            self._intake.adopt(body, taken)
        elif destination == DURABLES_QUEUE:
            key, topic = headers.pop(DURABLE_KEY, ""), headers.pop(DURABLE_TOPIC, "")
            if not key or not topic:
                taken(False, "a durable subscription's message without its key and topic")
            else:
                self._intake.take_durable(key, topic, headers, body, persistent, taken)
        else:
            self._intake.take(destination, headers, body, persistent, taken)

    def identify(self, bridge: Bridge, status: Mapping[str, Any]) -> str | None:
        """None when the member behind `bridge` is one of this cluster's; else the problem
        (logged and shown by the bridge; nothing moves to or from that member)."""
        cluster, member = status.get("cluster"), status.get("member")
        if cluster != self.config.cluster_name:
            return (f"member {member!r} at {bridge.url} belongs to cluster {cluster!r}, this "
                    f"one is {self.config.cluster_name!r}: nothing is forwarded")
        if member == self.member:
            return (f"member at {bridge.url} is also named {member!r}: two members with one "
                    "name; nothing is forwarded (give each pair its own [cluster] member)")
        for other in self.bridges.values():
            if other is not bridge and other.remote_member == member and \
                    other.state in (BridgeState.FORWARDING, BridgeState.RECONNECTING):
                return (f"members at {other.url} and {bridge.url} are both named "
                        f"{member!r}: nothing is forwarded from the second")
        settings = status.get("settings")
        if isinstance(settings, dict) and isinstance(member, str):
            differ = sorted(p for p in set(settings) | set(self.digest)
                            if settings.get(p) != self.digest.get(p))
            if differ and self.differences.get(member) != differ:
                log.warning("Cluster %s: destination settings differ between member %s and "
                            "this one (%s): %s", self.config.cluster_name, member, self.member,
                            ", ".join("defaults" if p == "*" else f"overrides {p!r}"
                                      for p in differ))
            self.differences[member] = differ
        return None

    # ------------------------------------------------------------ what operators read

    def forwarded(self) -> int:
        return sum(b.forwarded for b in self.bridges.values())

    def rate(self) -> float:
        if len(self._rates) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self._rates[0], self._rates[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0

    def connected_headers(self) -> dict[str, str]:
        """What CONNECTED says of the cluster: its name, this member, and every member's
        URL, this one's first."""
        urls = [self._own_url(), *(b.url for b in self.bridges.values()
                                   if b.state is not BridgeState.REFUSED)]
        if not self.bridges:
            urls += [u for u in self.config.cluster_members if u not in urls]
        return {"cluster-name": self.config.cluster_name, "cluster-member": self.member,
                "cluster-members": " ".join(urls)}

    def status(self) -> dict[str, Any]:
        interest = self.interest() if self.serving else None
        bridges = [b.status() for b in self.bridges.values()]
        for b in bridges:
            b["settings_differ"] = self.differences.get(b["member"] or "", [])
        discovery = self.directory.status() if self.directory is not None else \
            {"kind": "static", "members": list(self.config.cluster_members)}
        return {"name": self.config.cluster_name, "member": self.member,
                "url": self._own_url(), "serving": self.serving, "discovery": discovery,
                "load_balancing": self.settings.mode.value,
                "redistribution_delay_ms": self.settings.redistribution_delay_ms,
                "waiting": interest.waiting if interest is not None else None,
                "forwarded": self.forwarded(), "forwarded_per_second": round(self.rate(), 1),
                "scale_down": self.scaling.status() if self.scaling is not None else None,
                "colocated": self.colocation.status() if self.colocation is not None else None,
                "bridges": bridges}

    async def close(self) -> None:
        """This process ends: the backups it hosts for other lives stop too."""
        await self.stop()
        if self.colocation is not None:
            await self.colocation.close()
