"""A colocated member's part (docs/cluster.md, "Colocated backups"): its live asks the
cluster for a backup, and it hosts backups of other lives. The decisions are
core/colocation.py's; this reads the other members' statuses off the bridges, publishes
this member's in its own status, and starts and stops the hosted backups (hosting.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from pairmq.core.colocation import (
    Ask,
    BackupRequest,
    Candidate,
    RequestLimits,
    RequestPhase,
    RequestView,
    hosting_plan,
    step,
)
from pairmq.server.cluster.bridge import Bridge, BridgeState
from pairmq.server.cluster.hosting import HostedBackups
from pairmq.server.config import ServerConfig

log = logging.getLogger("pairmq.cluster")
BACKUPS_DIR = "backups"  # in the member's data directory: one directory per live hosted


def _shift(address: str, offset: int) -> str:
    if not address:
        return address
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) + offset}"


def hosted_backup_config(host: ServerConfig, ask: Ask, slot: int, host_url: str
                         ) -> ServerConfig:
    """The configuration of the backup this member hosts for `ask`'s live: this member's
    own (Artemis copies the host's configuration too), with the backup's name, a data
    directory under this member's, every port moved by the offset (once per slot), and the
    live's pair: its HA channel to dial, its group, its member name."""
    offset = host.backup_port_offset * slot
    members = tuple(dict.fromkeys((*host.cluster_members, host_url))) \
        if host.cluster_members else ()
    return replace(
        host, name=f"{ask.server}-backup-on-{host.member_name}",
        data_dir=str(Path(host.data_dir) / BACKUPS_DIR / ask.live),
        stomp=_shift(host.stomp, offset), stomp_tls=_shift(host.stomp_tls, offset),
        stomp_ws=_shift(host.stomp_ws, offset), admin=_shift(host.admin, offset),
        policy="replication", role="backup", listen=_shift(host.listen, offset),
        peer=ask.ha, group=ask.group, cluster_member=ask.live, cluster_members=members,
        request_backup=False, max_backups=0,
        source=f"{host.source}, as the backup of live {ask.live} hosted by member "
               f"{host.member_name}")


def _forwarding(bridges: Iterable[Bridge]) -> list[tuple[str, dict[str, Any]]]:
    return [(b.remote_member, b.remote) for b in bridges
            if b.state is BridgeState.FORWARDING and b.remote_member is not None]


class Colocation:
    def __init__(self, config: ServerConfig, backup_linked: Callable[[], bool]) -> None:
        self.config = config
        self.member = config.member_name
        self._linked = backup_linked
        self.limits = RequestLimits(config.backup_request_retries,
                                    config.backup_request_retry_interval_ms / 1000)
        self.request = BackupRequest.start(config.request_backup, time.monotonic())
        self.hosted = HostedBackups()
        self.refusing: dict[str, str] = {}  # live -> why its ask was not taken here

    def serve(self) -> None:
        """This member serves again (a new role): its live's request starts over."""
        self.request = BackupRequest.start(self.config.request_backup, time.monotonic())

    def tick(self, bridges: Iterable[Bridge], own_url: str) -> None:
        """Once per status: what the others published decides what this member does."""
        bridges = list(bridges)
        statuses = _forwarding(bridges)
        self._request(statuses, len(bridges))
        self._host(statuses, own_url)

    def _request(self, statuses: list[tuple[str, dict[str, Any]]], known: int) -> None:
        candidates = []
        for member, status in statuses:
            hosting = status.get("hosting")
            if not isinstance(hosting, dict):
                continue  # not a colocated member: it hosts no backups
            lives = hosting.get("lives") or {}
            refusing = hosting.get("refusing") or {}
            most = hosting.get("max_backups")
            count = len(lives)
            candidates.append(Candidate(member, self.member in lives,
                                        refusing.get(self.member),
                                        isinstance(most, int) and count < most, count))
        view = RequestView(self.member, time.monotonic(), self._linked(), tuple(candidates),
                           unreachable=known - len(statuses))
        before = self.request.phase
        self.request, lines = step(self.request, view, self.limits)
        after = self.request.phase
        # a backup lost, or none to be had: a warning; the rest of the asking: info
        worse = after is RequestPhase.GIVEN_UP or (before is RequestPhase.BACKED_UP
                                                    and after is not before)
        for line in lines:
            log.log(logging.WARNING if worse else logging.INFO, "Colocated live %s: %s",
                    self.member, line)

    def _host(self, statuses: list[tuple[str, dict[str, Any]]], own_url: str) -> None:
        asks = []
        for member, status in statuses:
            ask = status.get("backup_ask")
            if isinstance(ask, dict) and isinstance(ask.get("member"), str):
                asks.append(Ask(member, ask["member"], str(ask.get("ha") or ""),
                                str(ask.get("server") or member), str(ask.get("group") or "")))
        plan = hosting_plan(self.member, tuple(asks), self.hosted.lives,
                            self.config.max_backups)
        for live, why in plan.refuse.items():
            if self.refusing.get(live) != why:
                log.info("Colocated member %s: no backup for live %s: %s", self.member, live,
                         why)
        self.refusing = plan.refuse
        for live in plan.stop:
            self.hosted.stop_soon(live, "its live asked another member")
        for ask in plan.start:
            slot = self.hosted.free_slot()
            config = hosted_backup_config(self.config, ask, slot, own_url)
            log.info("Colocated member %s starts a backup for live %s (STOMP %s, HA %s)",
                     self.member, ask.live, config.client_listener, config.listen)
            self.hosted.start(ask.live, slot, config)

    def published(self) -> dict[str, Any]:
        """What the other members read of this one, in its status."""
        asking = self.request.asking
        return {
            "backup_ask": None if asking is None else {
                "member": asking, "ha": self.config.listen, "server": self.config.name,
                "group": self.config.group},
            "hosting": {"max_backups": self.config.max_backups,
                        "lives": {b["live"]: {"stomp": b["stomp"], "ha": b["ha"]}
                                  for b in self.hosted.status() if b["state"] != "stopped"},
                        "refusing": self.refusing}}

    def status(self) -> dict[str, Any]:
        """GET /status' `cluster.colocated`."""
        return {"request_backup": self.config.request_backup,
                "max_backups": self.config.max_backups,
                "backup": self.request.status(), "hosted": self.hosted.status()}

    async def close(self) -> None:
        await self.hosted.close()
