"""A cluster of members on loopback, as real processes: each member a pair (two servers and
a witness, tests/ha/pair.py) or one standalone server.

    cluster = PairCluster(tmp_path, members=3)   # allocates every port, starts nothing
    cluster.start()                              # every pair, formed; every bridge forwarding
    cluster.url(1)                               # "failover:(stomp://...,stomp://...)"
    cluster.pairs[1].kill(cluster.active(1))     # SIGKILL the active server of member 1
    PairCluster(tmp_path, 2, etcd=etcd.url)      # pairs on etcd, members found there
    cluster.status(0)                            # GET /status of member 0's active server

    members = StandaloneCluster(tmp_path, 3)     # three standalone servers
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.ha.pair import Pair
from tests.serverproc import ServerProcess, free_port, start_server
from tests.support.admin import admin_status, admin_user_flags
from tests.support.waiting import wait_until

CLUSTER = "c1"


def member_name(i: int) -> str:
    return f"m{i}"


def cluster_flags(name: str, member: str, others: Sequence[str]) -> list[str]:
    flags = ["--cluster-name", name, "--cluster-member", member]
    return [*flags, "--cluster-members", " ".join(others)] if others else flags


def bridges_forwarding(status: dict[str, Any] | None, count: int) -> bool:
    """`status` (GET /status) shows `count` bridges, each forwarding."""
    if not status or "cluster" not in status:
        return False
    bridges = status["cluster"]["bridges"]
    return len(bridges) == count and all(b["state"] == "forwarding" for b in bridges)


class PairCluster:
    def __init__(self, workdir: Path, members: int = 3, *, name: str = CLUSTER,
                 flags: Sequence[str] = (), etcd: str = "",
                 flags_for: Mapping[int, Mapping[str, Sequence[str]]] | None = None) -> None:
        """`etcd`: each pair's arbiter, and where members find each other (no static
        [cluster] members). `flags_for`: member -> server ("primary", "backup") -> flags."""
        self.name = name
        self.pairs = [Pair(Path(workdir) / member_name(i), group=member_name(i),
                           flags=list(flags), etcd=etcd,
                           flags_for=(flags_for or {}).get(i)) for i in range(members)]
        for i, pair in enumerate(self.pairs):
            others = [] if etcd else [self.url(j) for j in range(members) if j != i]
            pair.flags += cluster_flags(name, member_name(i), others)

    def url(self, i: int) -> str:
        pair = self.pairs[i]
        return "failover:(" + ",".join(f"stomp://{pair.stomp_address(n)}"
                                       for n in ("primary", "backup")) + ")"

    def start(self, timeout: float = 30.0) -> PairCluster:
        for pair in self.pairs:
            pair.start(parallel=True)
        for pair in self.pairs:
            pair.wait_formed(timeout)
        self.wait_bridges(timeout)
        return self

    def active(self, i: int) -> str:
        name = self.pairs[i].active()
        assert name is not None, f"member {i} has no active server"
        return name

    def status(self, i: int) -> dict[str, Any] | None:
        pair = self.pairs[i]
        name = pair.active()
        return pair.status(name) if name is not None else None

    def wait_bridges(self, timeout: float = 30.0) -> None:
        """Every member's active server has a forwarding bridge to every other member."""
        count = len(self.pairs) - 1
        for i in range(len(self.pairs)):
            wait_until(lambda i=i: bridges_forwarding(self.status(i), count),
                       f"member {i}'s bridges forwarding", timeout)

    def stop(self) -> None:
        for pair in self.pairs:
            pair.close()


class StandaloneCluster:
    """Members that are one server each (no pair), with an admin port each."""

    def __init__(self, workdir: Path, members: int = 3, *, name: str = CLUSTER,
                 flags_for: dict[int, Sequence[str]] | None = None) -> None:
        self.workdir = Path(workdir)
        self.name = name
        self.ports = [free_port() for _ in range(members)]
        self.admin_ports = [free_port() for _ in range(members)]
        self.flags_for = {i: list(f) for i, f in (flags_for or {}).items()}
        self.servers: list[ServerProcess | None] = [None] * members

    def url(self, i: int) -> str:
        return f"stomp://127.0.0.1:{self.ports[i]}"

    def flags(self, i: int) -> list[str]:
        others = [self.url(j) for j in range(len(self.ports)) if j != i]
        return [*cluster_flags(self.name, member_name(i), others),
                "--admin", f"127.0.0.1:{self.admin_ports[i]}", *admin_user_flags(),
                *self.flags_for.get(i, [])]

    def start(self, wait: bool = True, timeout: float = 20.0) -> StandaloneCluster:
        for i in range(len(self.ports)):
            self.start_member(i)
        if wait:
            self.wait_bridges(timeout)
        return self

    def start_member(self, i: int) -> ServerProcess:
        server = start_server(self.workdir, *self.flags(i), name=member_name(i),
                              port=self.ports[i])
        self.servers[i] = server
        return server

    def status(self, i: int) -> dict[str, Any] | None:
        return admin_status(f"127.0.0.1:{self.admin_ports[i]}")

    def wait_bridges(self, timeout: float = 20.0) -> None:
        count = len(self.ports) - 1
        for i in range(len(self.ports)):
            wait_until(lambda i=i: bridges_forwarding(self.status(i), count),
                       f"member {i}'s bridges forwarding", timeout)

    def stop(self) -> None:
        for server in self.servers:
            if server is not None:
                server.stop()
