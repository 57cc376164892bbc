"""Members found in etcd (`[ha] witness = "etcd://..."`, no `[cluster] members`): a real
3-member etcd cluster, two pairs on it (docs/cluster.md, "Discovery")."""

from __future__ import annotations

from pathlib import Path

import pytest

from pairmq.core.cluster import sf_queue
from tests.ha.clients import FailoverConsumer, FailoverProducer
from tests.support.cluster import PairCluster
from tests.support.etcd import EtcdCluster
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow
QUEUE = "/queue/found"


def test_members_find_each_other_in_etcd_and_move_messages_through_a_kill(
        tmp_path: Path, etcd_cluster: EtcdCluster) -> None:
    cluster = PairCluster(tmp_path, 2, etcd=etcd_cluster.url)
    try:
        cluster.start(timeout=40)
        for i in (0, 1):
            discovery = cluster.status(i)["cluster"]["discovery"]
            assert discovery["kind"] == "etcd", discovery
            assert discovery["registered"] == ["m0", "m1"], discovery
        registered = etcd_cluster.get_prefix("/pairmq/clusters/c1/members/")
        assert sorted(registered) == ["/pairmq/clusters/c1/members/m0",
                                      "/pairmq/clusters/c1/members/m1"], registered
        consumer = FailoverConsumer(cluster.pairs[0].client_addresses(), QUEUE).start()
        wait_until(lambda: sf_queue("m0", QUEUE) in cluster.status(0)["cluster"]["bridges"][0]
                   ["subscriptions"],
                   "member 0's bridge subscribed", 10)
        producer = FailoverProducer(cluster.pairs[1].client_addresses(), QUEUE, window=32)
        for k in range(1500):
            producer.send(f"p-{k}", b"found in etcd")
            if k == 500:  # the far end of member 0's bridge, mid-transfer
                pair = cluster.pairs[1]
                killed = cluster.active(1)
                pair.kill(killed)
        producer.flush()
        pair.wait_state(pair.other(killed), "STANDALONE", 20)
        missing = consumer.wait_consumed(set(producer.receipted), 60)
        consumer.wait_idle(1.0)
        assert not missing, f"{len(missing)} never consumed"
        assert set(consumer.consumed.values()) == {1}, "consumed twice"
        # the backup that took over registered member 1 again (its own etcd lease)
        wait_until(lambda: cluster.status(1)["cluster"]["discovery"]["registered"]
                   == ["m0", "m1"], "member 1 registered by its new active server", 15)
        consumer.close()
        producer.close()
    finally:
        cluster.stop()
