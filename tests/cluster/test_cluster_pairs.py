"""A cluster of three pairs (six servers, three witnesses) on loopback: messages move between
members exactly once through a kill -9 of each pair's active server (docs/cluster.md)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pairmq.core.cluster import sf_queue
from tests.ha.clients import FailoverConsumer, FailoverProducer
from tests.support.cluster import PairCluster
from tests.support.exactly_once import NumberedLoad, assert_consumed_once
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

QUEUE = "/queue/clustered"


def test_producers_everywhere_consumer_on_one_member_through_kills(tmp_path: Path) -> None:
    """Producers on every member, one consumer on member 0. The active server of member 1
    is killed (the far end of member 0's bridge, mid-transfer), then member 2's, then
    member 0's (where the bridges run and the consumer is): every receipted message is
    consumed once, none twice, and nothing was consumed that no producer sent."""
    cluster = PairCluster(tmp_path, 3)
    try:
        cluster.start()
        consumer = FailoverConsumer(cluster.pairs[0].client_addresses(), QUEUE,
                                    prefetch=50).start()
        # member 0's bridges subscribe on the others once its consumer exists
        wait_until(lambda: all(sf_queue("m0", QUEUE) in b["subscriptions"]
                               for b in cluster.status(0)["cluster"]["bridges"]),
                   "member 0's bridges subscribed", 10)
        producers = [FailoverProducer(cluster.pairs[i].client_addresses(), QUEUE, window=32)
                     for i in range(3)]
        load = NumberedLoad(producers, "from member").start()
        for victim in (1, 2, 0):
            time.sleep(2.0)
            pair = cluster.pairs[victim]
            killed = cluster.active(victim)
            pair.kill(killed)
            pair.wait_state(pair.other(killed), "STANDALONE", 20)
        load.finish()
        receipted = load.receipted()
        assert len(receipted) > 1000
        assert_consumed_once(consumer, receipted, load.sent_ids())
        assert not consumer.after_ack, consumer.after_ack[:10]
        # the members' bridges really carried them: two thirds came from members 1 and 2
        forwarded = sum(1 for d in consumer.consumed if not d.startswith("m0-"))
        assert forwarded > len(receipted) // 2
        consumer.close()
        for p in producers:
            p.close()
    finally:
        cluster.stop()


@pytest.mark.long  # CI time: kills of a cluster's pairs are tested in make test
def test_consumers_on_both_members_through_a_kill_of_each_side(tmp_path: Path) -> None:
    """A producer and a consumer on member 0, a consumer on member 1: member 1's bridge
    takes a share of member 0's messages while member 0's own consumer takes the rest. The
    active server of member 1 is killed mid-transfer, then member 0's. What member 0 gave
    member 1's bridge went through a store-and-forward queue that only that bridge reads:
    after either kill it comes again to member 1 (which recognises it), never to member 0's
    own consumer. Every receipted message is consumed once, on one member or the other."""
    cluster = PairCluster(tmp_path, 2)
    try:
        cluster.start()
        consumers = [FailoverConsumer(cluster.pairs[i].client_addresses(), QUEUE,
                                      prefetch=20).start() for i in (0, 1)]
        wait_until(lambda: sf_queue("m1", QUEUE) in cluster.status(1)["cluster"]["bridges"][0]
                   ["subscriptions"], "member 1's bridge subscribed", 10)
        producer = FailoverProducer(cluster.pairs[0].client_addresses(), QUEUE, window=32)
        victims = {1500: 1, 3500: 0}
        for k in range(5000):
            producer.send(f"p-{k}", b"both sides")
            if k in victims:
                pair = cluster.pairs[victims[k]]
                killed = cluster.active(victims[k])
                pair.kill(killed)
                pair.wait_state(pair.other(killed), "STANDALONE", 20)
            if k % 50 == 0:
                time.sleep(0.01)
        producer.flush()
        receipted = set(producer.receipted)

        def consumed() -> set[str]:
            return set(consumers[0].consumed) | set(consumers[1].consumed)

        wait_until(lambda: receipted <= consumed(), "every receipted message consumed", 90)
        for c in consumers:
            c.wait_idle(2.0)
        both = set(consumers[0].consumed) & set(consumers[1].consumed)
        assert not both, f"{len(both)} consumed on both members, e.g. {sorted(both)[:5]}"
        for c in consumers:
            twice = [d for d, n in c.consumed.items() if n > 1]
            assert not twice and not c.after_ack, (twice[:5], c.after_ack[:5])
        # the scenario happened: member 1's bridge took messages across before its own
        # kill and after it (how many depends on the machine: 86 of 5,000 seen on a busy
        # one, where a count of more than 100 used to be asked for)
        across = sorted(int(d.removeprefix("p-")) for d in consumers[1].consumed)
        assert across and across[0] < 1500 < across[-1], \
            f"member 1 took nothing across on one side of its kill: {across[:3]}..."
        for c in consumers:
            c.close()
        producer.close()
    finally:
        cluster.stop()
