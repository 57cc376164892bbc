"""GET /metrics: what a server counts, in Prometheus' form (docs/operations.md, "Metrics").

Names follow Prometheus' conventions: a `pairmq_` prefix, base units (seconds, bytes), and
`_total` on counters (prometheus_client adds it to a counter family's name). The figures
are read on the event loop, where they change; the management port writes the text in a
thread. Per-destination series stop past `max_destination_metrics` destinations (0: never
any), as RabbitMQ learned to do: a server with 100,000 queues would spend seconds on them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from pairmq.core import Broker
from pairmq.core.capacity import Shortage
from pairmq.core.queue import Address
from pairmq.ha.states import State
from pairmq.server.manage.managed_server import ManagedServer
from pairmq.store.stall import Disk
from pairmq.store.synctimes import SYNC_TIMES

MESSAGE_COUNTERS = ("received", "delivered", "acknowledged", "expired", "dead_lettered",
                    "duplicates", "dropped")
REPORTED_STATES = tuple(s for s in State if s is not State.DEAD)  # DEAD names a lost peer
Family = GaugeMetricFamily | CounterMetricFamily  # the per-destination ones
DESTINATIONS_PER_TURN = 500  # destinations read per turn of the loop by GET /metrics


def server_shortages(server: ManagedServer) -> list[str]:
    """Why new messages are held or refused server-wide now (empty: they are not)."""
    found = [s.value for s in server.broker.capacity.shortages]
    if server.store.full:
        found.append(Shortage.JOURNAL.value)
    return sorted(found)


def unacknowledged(address: Address) -> int:
    """Messages of the destination delivered to its consumers and not yet acknowledged."""
    return sum(len(sub.unacked) for q in address.queues for sub in q.consumers)


def _chunks(items: list[tuple[str, Address]]) -> Iterator[list[tuple[str, Address]]]:
    for start in range(0, len(items), DESTINATIONS_PER_TURN):
        yield items[start:start + DESTINATIONS_PER_TURN]


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class Collector:
    """One server's figures, for prometheus_client's text writer."""

    def __init__(self, server: ManagedServer) -> None:
        self.server = server

    async def snapshot(self) -> list[Metric]:
        """Every family, read on the event loop: the per-destination ones in slices of
        DESTINATIONS_PER_TURN, the loop serving clients between them (9,000 destinations
        took 100 ms of reading in one go)."""
        families: list[Metric] = list(self._server_wide())
        families.extend(await self._destinations_sliced())
        return families

    def _server_wide(self) -> Iterator[Metric]:
        server = self.server
        stats = server.broker.stats
        for name in MESSAGE_COUNTERS:
            yield _counter(f"pairmq_messages_{name}", f"messages {name}", stats.get(name, 0))
        yield _counter("pairmq_producers_evicted", "producer sequences forgotten before "
                       "producer_expiry_ms because a destination had max_producers others",
                       stats.get("producers_evicted", 0))
        yield _gauge("pairmq_connections", "open client connections",
                     len(server.role.connections))
        yield from self._pair(server.pair.status())
        yield _gauge("pairmq_destinations", "destinations held",
                     len(server.broker.addresses))
        commits = server.broker.commit_status()
        yield _gauge("pairmq_commits_under_way", "COMMITs of more than 1,000 messages being "
                     "applied a slice per turn", commits["under_way"])
        yield _gauge("pairmq_commit_messages_to_route", "messages of those COMMITs not "
                     "routed yet", commits["messages_to_route"])
        yield from self._capacity()
        yield _gauge("pairmq_serving", "1 when this server serves clients",
                     1 if server.serving else 0)
        buckets, total = SYNC_TIMES.snapshot()
        yield HistogramMetricFamily(
            "pairmq_journal_fsync_seconds",
            "time of each group commit's writes and their data sync (one pwritev2 with "
            "RWF_DSYNC, or writev and fdatasync)",
            buckets=buckets, sum_value=total)
        yield from self._disk()
        if server.database is not None:
            yield from _database_metrics(server.database.status())
        if server.cluster is not None:
            yield from _cluster_metrics(server.cluster.status())
        if server.watch is not None:
            yield from server.watch.metrics()  # event-loop lag, GC pauses (server/loop_lag.py)

    def _disk(self) -> Iterator[Metric]:
        """Whether the journal's disk completes writes (store/stall.py, issue 35)."""
        disk = self.server.store.stall_view()
        if disk is None:
            return
        yield _gauge("pairmq_journal_stalled", "1 while a journal write has been in flight "
                     "longer than stall_timeout_ms", 1 if disk.disk is Disk.STALLED else 0)
        yield _gauge("pairmq_journal_write_in_flight_seconds", "how long the journal write "
                     "in flight has waited (0: none)", disk.in_flight_s)
        yield _gauge("pairmq_journal_write_longest_seconds", "the longest journal write "
                     "(a group's writes and fdatasync) completed since the start",
                     disk.longest_s)
        yield _counter("pairmq_journal_stalls", "journal writes that stalled past "
                       "stall_timeout_ms", disk.stalls)

    def _pair(self, pair: dict[str, Any] | None) -> Iterator[Metric]:
        """The pair's view: state, epoch, the backup's lag, the witness, the lease."""
        server = self.server
        state = server.pair.state
        states = GaugeMetricFamily("pairmq_ha_state", "1 for the state this server is in",
                                   labels=["state"])
        for candidate in REPORTED_STATES:
            states.add_metric([candidate.value], 1 if candidate is state else 0)
        yield states
        yield _gauge("pairmq_ha_epoch", "the pair's epoch in this server's journal",
                     server.store.epoch)
        if pair is None:
            return
        lag = pair.get("backup_lag")
        if lag is not None:  # serving, with a backup attached
            yield _gauge("pairmq_replication_lag_records",
                         "records appended here and not yet held by the backup",
                         lag["records"])
            yield _gauge("pairmq_replication_lag_bytes",
                         "bytes sent to the backup and not yet acknowledged", lag["bytes"])
            yield _gauge("pairmq_replication_lag_seconds",
                         "age of the oldest record sent and not yet acknowledged",
                         lag["seconds"])
        witness = pair.get("witness")
        if witness is not None and witness.get("address"):
            yield _gauge("pairmq_witness_reachable",
                         "1 when the witness answered within an activation interval",
                         1 if witness.get("reachable") else 0)
            yield from _arbiter_metrics(witness, pair.get("lease_remaining_ms", 0))
        if "lease_remaining_ms" in pair:
            yield _gauge("pairmq_lease_remaining_seconds",
                         "how long this server may still confirm on the witness's lease",
                         pair["lease_remaining_ms"] / 1000)
        yield _counter("pairmq_failovers", "times this server took over from its peer since "
                       "it started", server.failovers)

    def _per_destination_on(self) -> bool:
        return len(self.server.broker.addresses) <= self.server.config.max_destination_metrics

    async def _destinations_sliced(self) -> list[Family]:
        if not self._per_destination_on():
            return []
        families = self._destination_families()
        for chunk in _chunks(list(self.server.broker.addresses.items())):
            self._add_destinations(families, chunk)
            await asyncio.sleep(0)  # clients' frames between two slices
        return families

    @staticmethod
    def _destination_families() -> list[Family]:
        labels = ["destination"]
        return [
            GaugeMetricFamily("pairmq_destination_messages",
                              "messages waiting for delivery, paged ones included",
                              labels=labels),
            GaugeMetricFamily("pairmq_destination_paged_messages",
                              "messages kept in the journal only, read back when consumers "
                              "reach them", labels=labels),
            GaugeMetricFamily("pairmq_destination_bytes",
                              "bytes held (counted against max_size_bytes)", labels=labels),
            GaugeMetricFamily("pairmq_destination_paged_bytes",
                              "bytes of message bodies kept on disk only", labels=labels),
            GaugeMetricFamily("pairmq_destination_consumers", "consumers attached",
                              labels=labels),
            GaugeMetricFamily("pairmq_destination_unacknowledged",
                              "messages delivered and not yet acknowledged (not in "
                              "pairmq_destination_messages)", labels=labels),
            CounterMetricFamily("pairmq_destination_enqueued",
                                "messages taken since this server started", labels=labels),
            CounterMetricFamily("pairmq_destination_dequeued",
                                "messages that left the destination since this server "
                                "started (acknowledged, expired, dead-lettered, purged)",
                                labels=labels),
            GaugeMetricFamily("pairmq_destination_full",
                              "1 while past max_size_bytes (the policy applies)",
                              labels=["destination", "policy"]),
        ]

    def _add_destinations(self, families: list[Family],
                          chunk: list[tuple[str, Address]]) -> None:
        (depth, paged_messages, held, paged, consumers, unacked, enqueued, dequeued,
         full) = families
        paged_by = self.server.store.paged.by_destination
        for name, address in chunk:
            labels = [name]
            waiting = sum(Broker.paged_waiting(q) for q in address.queues)
            depth.add_metric(labels, sum(q.count for q in address.queues) + waiting)
            paged_messages.add_metric(labels, waiting)
            held.add_metric(labels, address.size)
            paged.add_metric(labels, paged_by.get(name, 0) + Broker.paged_bytes(address))
            consumers.add_metric(labels, sum(len(q.consumers) for q in address.queues))
            unacked.add_metric(labels, unacknowledged(address))
            enqueued.add_metric(labels, address.enqueued)
            dequeued.add_metric(labels, address.dequeued)
            full.add_metric([name, address.policy.value], 1 if address.full else 0)

    def _capacity(self) -> Iterator[Metric]:
        server = self.server
        capacity = server.broker.capacity
        yield _gauge("pairmq_memory_bytes", "bytes of messages held in memory, all "
                     "destinations", capacity.memory)
        yield _gauge("pairmq_memory_limit_bytes", "global_max_size_bytes (0 = no limit)",
                     capacity.memory_limit)
        if server.disk_usage_percent is not None:
            yield _gauge("pairmq_disk_usage_percent", "data directory's file system in use",
                         server.disk_usage_percent)
        short = server_shortages(server)
        blocking = GaugeMetricFamily(
            "pairmq_server_full", "1 while new messages are held or refused server-wide for "
            "this reason (policy: [store] full_policy)", labels=["reason", "policy"])
        for reason in Shortage:
            blocking.add_metric([reason.value, capacity.full_policy],
                                1 if reason.value in short else 0)
        yield blocking


def _arbiter_metrics(arbiter: dict[str, Any], lease_ms: int) -> Iterator[Family]:
    """pairmq_arbiter_*: what grants the lease, whatever its kind (`pairmq witness`,
    etcd), and for etcd each member's reachability."""
    kind = str(arbiter.get("kind", "witness"))
    info = GaugeMetricFamily("pairmq_arbiter_info", "the arbiter's kind (witness or etcd)",
                             labels=["kind"])
    info.add_metric([kind], 1)
    yield info
    yield _gauge("pairmq_arbiter_reachable",
                 "1 when the arbiter answered within an activation interval",
                 1 if arbiter.get("reachable") else 0)
    yield _gauge("pairmq_arbiter_lease_held", "1 while this server holds the arbiter's lease",
                 1 if arbiter.get("lease_valid") else 0)
    yield _gauge("pairmq_arbiter_lease_remaining_seconds",
                 "how long this server may still confirm on the arbiter's lease",
                 lease_ms / 1000)
    members = arbiter.get("members")
    if members is not None:
        yield _gauge("pairmq_arbiter_members", "etcd members named in [ha] witness",
                     len(members))
        yield _gauge("pairmq_arbiter_members_reachable",
                     "etcd members that answered within two activation intervals",
                     sum(1 for m in members if m.get("reachable")))
        reachable = GaugeMetricFamily("pairmq_arbiter_member_reachable",
                                      "1 when this etcd member answered lately",
                                      labels=["member"])
        leader = GaugeMetricFamily("pairmq_arbiter_member_leader",
                                   "1 for the etcd member its members name the leader",
                                   labels=["member"])
        for m in members:
            reachable.add_metric([m["url"]], 1 if m.get("reachable") else 0)
            leader.add_metric([m["url"]], 1 if m.get("leader") else 0)
        yield reachable
        yield leader


def _cluster_metrics(cluster: dict[str, Any]) -> Iterator[Family]:
    """pairmq_cluster_*: this member's bridges to the other members (docs/cluster.md)."""
    bridges = cluster["bridges"]
    yield _gauge("pairmq_cluster_members", "members of the cluster this server knows, "
                 "itself included", 1 + len(bridges))
    yield _counter("pairmq_cluster_forwarded", "messages this member's bridges brought "
                   "here from the others since it began serving", cluster["forwarded"])
    own = cluster.get("waiting")
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        "connected": GaugeMetricFamily("pairmq_cluster_bridge_connected",
                                       "1 while the bridge to a member is connected",
                                       labels=["member", "url"]),
        "forwarding": GaugeMetricFamily("pairmq_cluster_bridge_forwarding",
                                        "1 while the bridge to a member moves messages "
                                        "(0: connecting, identifying or refused)",
                                        labels=["member", "url"]),
        "in_flight": GaugeMetricFamily("pairmq_cluster_bridge_in_flight",
                                       "messages a bridge received and has not yet "
                                       "acknowledged on their member", labels=["member", "url"]),
        "forwarded": CounterMetricFamily("pairmq_cluster_bridge_forwarded",
                                         "messages a bridge brought here",
                                         labels=["member", "url"]),
    }
    waiting = GaugeMetricFamily("pairmq_cluster_member_waiting",
                                "messages waiting on each member, as its status says",
                                labels=["member"])
    if own is not None:
        waiting.add_metric([cluster["member"]], own)
    for b in bridges:
        labels = [b["member"] or "", b["url"]]
        families["connected"].add_metric(labels, 1 if b["connected"] else 0)
        families["forwarding"].add_metric(labels, 1 if b["state"] == "forwarding" else 0)
        families["in_flight"].add_metric(labels, b["in_flight"])
        families["forwarded"].add_metric(labels, b["forwarded"])
        if b["waiting"] is not None and b["member"]:
            waiting.add_metric([b["member"]], b["waiting"])
    yield from families.values()
    yield waiting


def _database_metrics(database: dict[str, Any]) -> Iterator[Metric]:
    """[store] url: the lease and the copy of the journal in the database."""
    yield _gauge("pairmq_database_lease_valid", "1 while this server can prove it holds the "
                 "database lease", 1 if database["lease_valid"] else 0)
    yield _gauge("pairmq_database_lease_epoch", "the database lease's epoch this server took",
                 database["epoch"])
    yield _gauge("pairmq_database_up", "1 while the database takes the journal's groups "
                 "(0: it is away, or this server is not copying)",
                 1 if database["copy"] == "copying" else 0)
    yield _gauge("pairmq_database_waiting_records", "records appended and not yet committed "
                 "in the database", database["waiting_records"])
    yield _gauge("pairmq_database_waiting_bytes", "bytes of those records",
                 database["waiting_bytes"])
    yield _gauge("pairmq_database_committed_seq", "the last journal record committed in the "
                 "database", database["committed_seq"])
    yield _counter("pairmq_database_groups", "group commits made in the database",
                   database["groups"])
