"""GET /metrics of a real server, read by prometheus_client's own parser: Prometheus'
names (a pairmq_ prefix, base units, _total on counters), per-destination figures that
follow what stomp.py clients do, the journal's fsync times, and the switch that turns the
per-destination series off (docs/operations.md, "Metrics")."""

from __future__ import annotations

from tests.support.admin import managed_server, metric_samples, sample_value
from tests.support.waiting import wait_until

QUEUE = "/queue/metered"


def test_destination_figures_follow_what_clients_do(server_factory, stomp_client) -> None:
    srv, admin = managed_server(server_factory)
    producer = stomp_client(srv)
    for i in range(5):
        producer.send(QUEUE, f"m{i}", persistent="true")
    consumer = stomp_client(srv)
    consumer.subscribe(QUEUE, id="c", ack="client-individual",
                       headers={"prefetch-count": "2"})
    first, _second = consumer.wait_messages(2)
    consumer.ack(first)

    samples = metric_samples(admin)
    dest = {"destination": QUEUE}
    assert sample_value(samples, "pairmq_destination_enqueued_total", **dest) == 5
    assert sample_value(samples, "pairmq_destination_dequeued_total", **dest) == 1
    assert sample_value(samples, "pairmq_destination_messages", **dest) == 2  # waiting
    assert sample_value(samples, "pairmq_destination_unacknowledged", **dest) == 2  # prefetch-count
    assert sample_value(samples, "pairmq_destination_consumers", **dest) == 1
    assert sample_value(samples, "pairmq_destination_paged_messages", **dest) == 0
    assert sample_value(samples, "pairmq_messages_received_total") == 5
    assert sample_value(samples, "pairmq_connections") == 2
    # a lone server reports itself STANDALONE, and no other state
    assert sample_value(samples, "pairmq_ha_state", state="STANDALONE") == 1
    assert sum(samples["pairmq_ha_state"].values()) == 1
    # five receipted persistent SENDs and an ACK: at least one real fdatasync, timed
    assert sample_value(samples, "pairmq_journal_fsync_seconds_count") >= 1
    assert sample_value(samples, "pairmq_journal_fsync_seconds_bucket", le="+Inf") == \
        sample_value(samples, "pairmq_journal_fsync_seconds_count")
    assert sample_value(samples, "pairmq_event_loop_lag_seconds_count") > 0
    assert "pairmq_gc_pause_seconds_bucket" in samples

    consumer.unsubscribe("c")
    wait_until(lambda: sample_value(metric_samples(admin), "pairmq_destination_consumers",
                                    **dest) == 0, "the consumer to leave")


def test_names_follow_prometheus_conventions(server_factory) -> None:
    _srv, admin = managed_server(server_factory)
    samples = metric_samples(admin)
    assert samples and all(name.startswith("pairmq_") for name in samples), sorted(samples)
    counters = [name for name in samples if name.endswith("_total")]
    assert "pairmq_messages_delivered_total" in counters
    # base units only: seconds and bytes, never ms or KiB
    assert not [name for name in samples if "_ms" in name or "milli" in name
                or "kib" in name or "_mb" in name], sorted(samples)


def test_per_destination_series_can_be_turned_off(server_factory, stomp_client) -> None:
    srv, admin = managed_server(server_factory, "--max-destination-metrics", "0")
    producer = stomp_client(srv)
    producer.send(QUEUE, "x")
    samples = metric_samples(admin)
    assert sample_value(samples, "pairmq_destinations") == 1
    assert not [name for name in samples if name.startswith("pairmq_destination_")]
