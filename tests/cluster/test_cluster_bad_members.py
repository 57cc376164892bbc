"""Members that are not what the configuration says: unreachable, of another cluster, named
twice, with other destination settings. Each is named in the log and in /status, the
server goes on serving, and no message is lost (docs/cluster.md)."""

from __future__ import annotations

import time
from pathlib import Path

from pairmq.client import connect
from pairmq.core.cluster import sf_queue
from tests.serverproc import free_port
from tests.support.admin import metric_samples, sample_value
from tests.support.cluster import StandaloneCluster, member_name
from tests.support.waiting import wait_until


def _bridges(cluster: StandaloneCluster, i: int) -> list[dict]:
    status = cluster.status(i)
    return status["cluster"]["bridges"] if status else []


def test_member_of_another_cluster_is_refused_and_keeps_its_messages(tmp_path: Path) -> None:
    cluster = StandaloneCluster(tmp_path, 2, flags_for={1: ["--cluster-name", "other"]})
    try:
        cluster.start(wait=False)
        wait_until(lambda: any(b["state"] == "refused" for b in _bridges(cluster, 0)),
                   "member 0 refusing member 1", 15)
        problem = _bridges(cluster, 0)[0]["problem"]
        assert "belongs to cluster 'other'" in problem and "'c1'" in problem, problem
        server = cluster.servers[0]
        assert server is not None and server.log_lines("belongs to cluster 'other'")
        # a consumer on member 0 does not drain member 1 (nothing moves between them) ...
        producer = connect(cluster.url(1))
        for k in range(50):
            producer.send("/queue/apart", f"m{k}")
        consumer = connect(cluster.url(0))
        sub = consumer.subscribe("/queue/apart")
        assert sub.receive(2.0) is None
        consumer.close()
        # ... and member 1 keeps every one for its own consumers
        local = connect(cluster.url(1))
        sub = local.subscribe("/queue/apart", ack="client-individual")
        got = []
        for _ in range(50):
            message = sub.receive(5)
            assert message is not None
            got.append(message.text)
            local.ack(message)
        assert sorted(got) == sorted(f"m{k}" for k in range(50))
        local.close()
        producer.close()
    finally:
        cluster.stop()


def test_two_members_with_one_name_and_an_unreachable_member(tmp_path: Path) -> None:
    """Member 2 says it is m1 too; a fourth URL has no server behind it. Member 0 forwards
    from one m1 only, names the other, names the unreachable one, and serves."""
    dead = f"stomp://127.0.0.1:{free_port()}"
    cluster = StandaloneCluster(tmp_path, 3, flags_for={2: ["--cluster-member", "m1"]})
    cluster.flags_for[0] = ["--cluster-members", " ".join(
        [cluster.url(1), cluster.url(2), dead])]
    try:
        cluster.start(wait=False)

        def settled() -> bool:
            states = sorted(b["state"] for b in _bridges(cluster, 0))
            return states == ["connecting", "forwarding", "refused"]

        wait_until(settled, "member 0: one m1 forwarding, one refused, one unreachable", 20)
        by_state = {b["state"]: b for b in _bridges(cluster, 0)}
        assert "both named 'm1'" in by_state["refused"]["problem"]
        assert by_state["connecting"]["url"] == dead
        assert "unreachable" in by_state["connecting"]["problem"]
        server = cluster.servers[0]
        assert server is not None
        assert server.log_lines("both named 'm1'") and server.log_lines(dead, "unreachable")
        client = connect(cluster.url(0))  # member 0 serves its clients all along
        client.send("/queue/still", "served")
        assert client.subscribe("/queue/still").receive(5) is not None
        client.close()
    finally:
        cluster.stop()


def test_destination_settings_that_differ_are_named(tmp_path: Path) -> None:
    cluster = StandaloneCluster(tmp_path, 2, flags_for={1: ["--dup-cache-size", "5000"]})
    try:
        cluster.start()
        wait_until(lambda: _bridges(cluster, 0)[0]["settings_differ"] == ["*"],
                   "member 0 naming the settings that differ", 10)
        server = cluster.servers[0]
        assert server is not None
        wait_until(lambda: server.log_lines("destination settings differ between member "
                                            f"{member_name(1)}", "defaults"), "the log", 5)
        # messages still move: the difference is reported, not a reason to strand them
        producer = connect(cluster.url(1))
        consumer = connect(cluster.url(0))
        sub = consumer.subscribe("/queue/differ")
        time.sleep(1.0)
        producer.send("/queue/differ", "across")
        message = sub.receive(10)
        assert message is not None and message.text == "across"
        producer.close()
        consumer.close()
    finally:
        cluster.stop()


def test_metrics_show_the_members_bridges_and_what_they_carried(tmp_path: Path) -> None:
    """GET /metrics of a member: the bridges (connected, forwarding, in flight, carried)
    and the messages waiting on each member; a member lost shows at once."""
    cluster = StandaloneCluster(tmp_path, 2)
    try:
        cluster.start()
        consumer = connect(cluster.url(0))
        sub = consumer.subscribe("/queue/metered", ack="client-individual")
        wait_until(lambda: sf_queue("m0", "/queue/metered")
                   in _bridges(cluster, 0)[0]["subscriptions"], "member 0's bridge subscribed", 10)
        producer = connect(cluster.url(1))
        for k in range(20):
            producer.send("/queue/metered", f"m{k}")
        producer.send("/queue/kept-on-1", "waits")  # nobody consumes it anywhere
        for _ in range(20):
            message = sub.receive(10)
            assert message is not None
            consumer.ack(message)
        admin = f"127.0.0.1:{cluster.admin_ports[0]}"
        labels = {"member": "m1", "url": cluster.url(1)}
        wait_until(lambda: sample_value(metric_samples(admin),
                                        "pairmq_cluster_bridge_forwarded_total",
                                        **labels) == 20, "20 carried in /metrics", 10)
        samples = metric_samples(admin)
        assert sample_value(samples, "pairmq_cluster_members") == 2
        assert sample_value(samples, "pairmq_cluster_forwarded_total") == 20
        assert sample_value(samples, "pairmq_cluster_bridge_connected", **labels) == 1
        assert sample_value(samples, "pairmq_cluster_bridge_forwarding", **labels) == 1
        assert sample_value(samples, "pairmq_cluster_bridge_in_flight", **labels) == 0
        wait_until(lambda: sample_value(metric_samples(admin), "pairmq_cluster_member_waiting",
                                        member="m1") == 1, "member 1's waiting message", 10)
        producer.close()
        server = cluster.servers[1]
        assert server is not None
        server.kill()
        wait_until(lambda: sample_value(metric_samples(admin),
                                        "pairmq_cluster_bridge_connected", **labels) == 0,
                   "the lost member in /metrics", 10)
        wait_until(lambda: _bridges(cluster, 0)[0]["state"] == "reconnecting",
                   "the bridge reconnecting", 5)
        consumer.close()
    finally:
        cluster.stop()
