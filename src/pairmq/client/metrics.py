"""The client's figures as Prometheus metrics: failovers, resends, the durable connection's
outbox (depth, age of its oldest message, forwarded), for the application to export on its
own /metrics (prometheus-client's registry, start_http_server or a web framework's route).

    from pairmq.client.metrics import register
    register(client, name="orders-producer")        # into prometheus_client.REGISTRY
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class HasStats(Protocol):
    def stats(self) -> dict[str, Any]: ...


# name, help, kind, where in stats() ("a.b": stats["a"]["b"])
_METRICS = (
    ("pairmq_client_failovers", "Failovers (reconnections after a failure), resumed ones "
     "included", "counter", "failovers"),
    ("pairmq_client_resumed", "Failovers that resumed the session the server kept", "counter",
     "resumed"),
    ("pairmq_client_resent", "Persistent messages sent again after a failover (same dup-id)",
     "counter", "resent"),
    ("pairmq_client_in_doubt_acked", "Redelivered messages acknowledged by the client because "
     "the application had acknowledged them before a failover", "counter", "in_doubt_acked"),
    ("pairmq_client_transactions_rolled_back", "Transactions a failover rolled back",
     "counter", "rolled_back"),
    ("pairmq_client_unconfirmed", "Persistent messages waiting for the server's confirmation",
     "gauge", "unconfirmed"),
    ("pairmq_client_outbox_depth", "Messages waiting in the durable connection's outbox",
     "gauge", "outbox.depth"),
    ("pairmq_client_outbox_bytes", "Bytes waiting in the outbox", "gauge", "outbox.bytes"),
    ("pairmq_client_outbox_oldest_age_seconds", "How long the oldest message in the outbox "
     "has waited", "gauge", "outbox.oldest_age_s"),
    ("pairmq_client_outbox_forwarded", "Messages forwarded from the outbox and confirmed",
     "counter", "outbox.forwarded"),
)


def _value(stats: dict[str, Any], path: str) -> float | None:
    value: Any = stats
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return float(value)


class ClientCollector(Collector):
    """Reads the client's stats at every scrape (nothing is counted twice)."""

    def __init__(self, client: HasStats, name: str) -> None:
        self.client = client
        self.name = name

    def collect(self) -> Iterator[Metric]:
        stats = self.client.stats()
        labels = ["client"]
        up = GaugeMetricFamily("pairmq_client_connected", "1 while connected to a serving "
                               "server", labels=labels)
        up.add_metric([self.name], 1.0 if stats.get("link") == "up" else 0.0)
        yield up
        for metric, text, kind, path in _METRICS:
            value = _value(stats, path)
            if value is None:
                continue
            family = (CounterMetricFamily(metric, text, labels=labels) if kind == "counter"
                      else GaugeMetricFamily(metric, text, labels=labels))
            family.add_metric([self.name], value)
            yield family


def register(client: HasStats, name: str = "default",
             registry: CollectorRegistry = REGISTRY) -> ClientCollector:
    """Export `client`'s figures (label client=`name`); returns the collector, which
    `registry.unregister(collector)` removes."""
    collector = ClientCollector(client, name)
    registry.register(collector)
    return collector
