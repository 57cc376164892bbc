"""What the management port (admin.py, status.py, metrics.py, operator_api.py,
console.py) asks of the server it runs in: one small interface, so that these modules do
not import the server (app.py imports them)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Protocol

from pairmq.core import Broker
from pairmq.server.cluster.node import ClusterNode
from pairmq.server.config import ServerConfig, User
from pairmq.server.guards.failed_logins import LoginThrottle
from pairmq.server.guards.passwords import PasswordCheck
from pairmq.server.loop_lag import LoopWatch
from pairmq.server.pair.database import DatabaseJournal
from pairmq.server.pair.policy import PairPolicy
from pairmq.server.role.role import Role
from pairmq.server.tls import TlsContexts
from pairmq.store.store import Store


class ManagedServer(Protocol):
    config: ServerConfig
    tls: TlsContexts | None
    watch: LoopWatch | None  # the event loop's lag and GC pauses
    passwords: PasswordCheck
    logins: LoginThrottle
    failovers: int  # times it took over from its peer since it started
    changes: deque[dict[str, object]]  # the last HA state changes, with their reasons
    disk_usage_percent: float | None  # the data directory's disk, last sampled
    cluster: ClusterNode | None  # [cluster]: the bridges to the other members
    database: DatabaseJournal | None  # [store] url: the journal kept in PostgreSQL

    @property
    def pair(self) -> PairPolicy: ...

    @property
    def role(self) -> Role: ...

    @property
    def broker(self) -> Broker: ...

    @property
    def store(self) -> Store: ...

    @property
    def serving(self) -> bool: ...

    @property
    def confirmed_seq(self) -> int: ...

    @property
    def client_address(self) -> str: ...

    @property
    def users(self) -> Mapping[str, User]: ...

    @property
    def active_address(self) -> str | None: ...

    def reload_tls(self) -> str:
        """Read [tls]'s files again; returns what happened (TlsError if unusable)."""
