"""Which pair policy a server runs, by `[ha] policy` and `[store] url`. Each driver is
imported here, and only when chosen: a start loads its own and no other (a replicated
pair's driver alone brings the HA machine; the database's, asyncpg; start-up time in
docs/benchmarks.md, "Start-up, restart and the per-message profile")."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from pairmq.server.pair.policy import NoPair, PairHost, PairPolicy, SharedStoreHost

if TYPE_CHECKING:
    from pairmq.server.pair.database import DatabaseJournal


class PolicyHost(PairHost, SharedStoreHost, Protocol):
    """The server, as every policy's driver sees it."""


def pair_policy(host: PolicyHost, database: DatabaseJournal | None,
                serve_alone: Callable[[], Awaitable[None]]) -> PairPolicy:
    """The driver of `host.config.policy`, wrapped in the database's when the journal is
    kept in PostgreSQL."""
    policy = host.config.policy
    pair: PairPolicy
    if policy in ("replication", "colocated"):  # colocated: a replicating live
        from pairmq.server.pair.replication import ReplicationDriver

        pair = ReplicationDriver(host)
    elif policy == "shared-store":
        from pairmq.server.pair.database_pair import DatabaseLock
        from pairmq.server.pair.shared_store import SharedStorePair

        pair = SharedStorePair(host, DatabaseLock(database) if database is not None else None)
    else:
        pair = NoPair(serve_alone)
    if database is not None:
        from pairmq.server.pair.database_pair import DatabaseBacked

        pair = DatabaseBacked(pair, database)
    return pair


def backup_linked(pair: PairPolicy) -> bool:
    """A replicating live's backup has its HA channel up (a colocated live's, for the
    cluster)."""
    from pairmq.server.pair.replication import ReplicationDriver

    return isinstance(pair, ReplicationDriver) and pair.link is not None
