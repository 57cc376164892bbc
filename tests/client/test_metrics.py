"""The client's figures as Prometheus metrics, read through a real registry."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, generate_latest

from pairmq.client.metrics import register


def test_outbox_and_failover_figures_are_exported(server, client_factory, tmp_path):
    client = client_factory(f"failover:(stomp://{server.host}:{server.port})",
                            outbox=str(tmp_path / "out.db"))
    for i in range(3):
        client.send("/queue/metrics", b"%d" % i)
    client.flush(10)
    deadline = time.monotonic() + 5
    while client.stats()["outbox"]["depth"] and time.monotonic() < deadline:
        time.sleep(0.01)  # confirmed rows leave the outbox just after the confirmation
    registry = CollectorRegistry()
    register(client, name="producer", registry=registry)
    text = generate_latest(registry).decode()
    assert 'pairmq_client_connected{client="producer"} 1.0' in text
    assert 'pairmq_client_outbox_forwarded_total{client="producer"} 3.0' in text
    assert 'pairmq_client_outbox_depth{client="producer"} 0.0' in text
    assert 'pairmq_client_failovers_total{client="producer"} 0.0' in text
    assert "pairmq_client_outbox_oldest_age_seconds" in text
