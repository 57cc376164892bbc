"""A cluster of colocated members on loopback (docs/cluster.md, "Colocated backups"): each
member one server process that runs its live and hosts backups of other lives as child
processes, every pair arbitrated by a real etcd cluster.

    members = ColocatedCluster(tmp_path, 3, etcd=etcd_cluster.url)
    members.start()                   # every live serving, every bridge forwarding
    members.wait_backed_up()          # every live has its backup, hosted by another member
    members.host_of(0)                # the member hosting live 0's backup
    members.url(0)                    # failover URL of live 0: its server, then its backup's
    members.kill_tree(1)              # SIGKILL member 1: the backups it hosts die with it
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.serverproc import ServerProcess, free_port, reserve_ports, start_server
from tests.support.admin import admin_status, admin_user_flags
from tests.support.cluster import CLUSTER, bridges_forwarding, cluster_flags, member_name
from tests.support.waiting import wait_until

SECRET = "colocated-secret"


def _offset(ports: Sequence[int], slots: int) -> int:
    """A backup_port_offset that puts every hosted backup's ports on free ones, none of
    them a port handed out already (the lives' own ports among them: they are not bound
    yet when this looks, and once one of them was a hosted backup's too)."""
    for offset in range(1000, 20000, 97):
        if reserve_ports([p + offset * s for p in ports for s in range(1, slots + 1)]):
            return offset
    raise RuntimeError("no port offset with free ports for the hosted backups")


def children(pid: int) -> list[int]:
    """The processes `pid` started (its hosted backups)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:", 1)[1].split("\n")[0]
    except (OSError, IndexError):
        return "zombie"


class ColocatedCluster:
    def __init__(self, workdir: Path, members: int = 3, *, etcd: str,
                 max_backups: int = 1, flags: Sequence[str] = ()) -> None:
        self.workdir = Path(workdir)
        self.count = members
        self.etcd = etcd
        self.max_backups = max_backups
        self.flags = list(flags)
        self.stomp = [free_port() for _ in range(members)]
        self.ha = [free_port() for _ in range(members)]
        self.admin = [free_port() for _ in range(members)]
        self.offset = _offset([*self.stomp, *self.ha, *self.admin], max_backups)
        self.servers: list[ServerProcess | None] = [None] * members

    def member_flags(self, i: int) -> list[str]:
        others = [f"stomp://127.0.0.1:{self.stomp[j]}" for j in range(self.count) if j != i]
        return [*cluster_flags(CLUSTER, member_name(i), others),
                "--policy", "colocated", "--listen", f"127.0.0.1:{self.ha[i]}",
                "--secret", SECRET, "--witness", self.etcd, "--group", member_name(i),
                "--request-backup", "--max-backups", str(self.max_backups),
                "--backup-port-offset", str(self.offset),
                "--heartbeat-interval-ms", "200", "--activation-interval-ms", "1000",
                "--admin", f"127.0.0.1:{self.admin[i]}", *admin_user_flags(), *self.flags]

    def start(self, timeout: float = 30.0) -> ColocatedCluster:
        for i in range(self.count):
            self.start_member(i)
        for i in range(self.count):
            wait_until(lambda i=i: bridges_forwarding(self.status(i), self.count - 1),
                       f"member {i}'s bridges forwarding", timeout)
        return self

    def start_member(self, i: int) -> ServerProcess:
        server = start_server(self.workdir, *self.member_flags(i), name=member_name(i),
                              port=self.stomp[i])
        self.servers[i] = server
        return server

    def status(self, i: int) -> dict[str, Any] | None:
        return admin_status(f"127.0.0.1:{self.admin[i]}")

    def colocated(self, i: int) -> dict[str, Any] | None:
        status = self.status(i)
        if not status or not status.get("cluster"):
            return None
        return status["cluster"].get("colocated")

    def host_of(self, i: int) -> int | None:
        """The member hosting live i's backup, as live i sees it (None: none yet)."""
        c = self.colocated(i)
        if c is None or c["backup"]["phase"] != "backed_up" or not c["backup"]["member"]:
            return None
        return int(c["backup"]["member"][1:])

    def backup_stomp(self, i: int) -> int:
        """The STOMP port of live i's backup (on its host)."""
        host = self.host_of(i)
        assert host is not None, f"live {i} has no backup"
        c = self.colocated(host)
        assert c is not None
        hosted = next(b for b in c["hosted"] if b["live"] == member_name(i))
        return int(hosted["stomp"].rpartition(":")[2])

    def backed_up(self, i: int) -> bool:
        status = self.status(i)
        return bool(status and self.host_of(i) is not None
                    and (status.get("ha") or {}).get("synchronized-with-backup"))

    def wait_backed_up(self, lives: Sequence[int] | None = None, timeout: float = 60.0) -> None:
        for i in lives if lives is not None else range(self.count):
            wait_until(lambda i=i: self.backed_up(i), f"live {i} backed up and in sync",
                       timeout)

    def url(self, i: int) -> str:
        return (f"failover:(stomp://127.0.0.1:{self.stomp[i]},"
                f"stomp://127.0.0.1:{self.backup_stomp(i)})")

    def kill_tree(self, i: int) -> None:
        """SIGKILL member i's process: the backups it hosts die with it (the kernel kills
        them, PR_SET_PDEATHSIG), as with the machine's death; checked here."""
        server = self.servers[i]
        assert server is not None
        hosted = children(server.proc.pid)
        server.kill()
        wait_until(lambda: not any(Path(f"/proc/{pid}").exists() and
                                   "zombie" not in _state(pid) for pid in hosted),
                   f"the backups member {i} hosted dying with it", 5)

    def stop(self) -> None:
        for server in self.servers:
            if server is not None:
                server.stop(30)

    def kill_all(self) -> None:
        """SIGKILL every member's tree: the end of a test whose members would scale down
        one into another on a clean stop."""
        for i, server in enumerate(self.servers):
            if server is not None and server.alive():
                self.kill_tree(i)
