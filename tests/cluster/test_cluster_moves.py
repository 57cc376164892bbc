"""Consumers that move between members, and topics across members (docs/cluster.md), on
three standalone members; and a durable subscriber whose member fails over, on pairs."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
import stomp

from pairmq.client import Client, Subscription, connect
from tests.support.cluster import PairCluster, StandaloneCluster
from tests.support.waiting import wait_until

# Thousands of messages through three members at once: run alone, after the others (beside
# a pair's timing tests, on two cores, they held a failing-back server's loop past its
# 400 ms activation interval).
pytestmark = pytest.mark.slow
QUEUE = "/queue/moving"
LOCAL_SHARE = 200  # what member 0's own consumer takes between two of member 1's consumers


def _take(client: Client, destination: str, count: int, seen: Counter[str],
          hops: list[int], timeout: float = 20.0) -> None:
    """Consume `count` messages from `destination` (acknowledged one by one)."""
    sub = client.subscribe(destination, ack="client-individual",
                           headers={"prefetch-count": "20"})
    deadline = time.monotonic() + timeout
    taken = 0
    while taken < count and time.monotonic() < deadline:
        message = sub.receive(0.5)
        if message is None:
            continue
        seen[message.text] += 1
        assert message.dup_id == f"d-{message.text}"  # the producer's, wherever it went
        hops.append(int(message.headers.get("pairmq_hops", "0")))
        client.ack(message)
        taken += 1
    sub.unsubscribe()
    assert taken == count, f"took {taken} of {count} from {destination}"


def test_consumer_moves_from_member_to_member(tmp_path: Path) -> None:
    """3,000 messages sent to member 0 with no consumer anywhere. A consumer takes some on
    member 1, then moves to member 2, then to member 0: it gets every message exactly once;
    what member 1's bridge had brought when its consumer left is redistributed, not
    stranded (some of it back to member 0, where its dup-id is known); no message moved
    more often than the consumer did."""
    cluster = StandaloneCluster(tmp_path, 3, flags_for={
        i: ["--redistribution-delay-ms", "300", "--bridge-window", "64"] for i in range(3)})
    try:
        cluster.start()
        producer = connect(cluster.url(0))
        total = 3000
        for k in range(total):  # with the producer's own dup-ids: a message that comes
            # back to member 0 must not be taken for a duplicate of itself
            producer.send_async(QUEUE, f"m{k}", headers={"dup-id": f"d-m{k}"})
        producer.flush()
        seen: Counter[str] = Counter()
        hops: list[int] = []
        for member, count in ((1, 700), (2, 1300), (0, 1000)):
            client = connect(cluster.url(member))
            _take(client, QUEUE, count, seen, hops)
            client.close()
            time.sleep(0.5)
        assert len(seen) == total and set(seen.values()) == {1}, \
            f"{len(seen)} distinct, {sum(seen.values())} received"
        assert max(hops) <= 3, f"a message crossed {max(hops)} bridges for 3 consumer moves"
        # nothing left anywhere: every member's queue is empty
        for i in range(3):
            status = cluster.status(i)
            assert status is not None
            waiting = status["destinations"].get(QUEUE, {}).get("messages", 0)
            assert waiting == 0, f"member {i} still holds {waiting}"
        producer.close()
    finally:
        cluster.stop()


def test_topic_subscribers_on_three_members_get_each_message_once(tmp_path: Path) -> None:
    """A subscriber on each member (one with stomp.py, a third-party client): each gets
    every message published on any member, once."""
    cluster = StandaloneCluster(tmp_path, 3)
    try:
        cluster.start()
        topic = "/topic/prices"
        clients = [connect(cluster.url(i)) for i in range(2)]
        subs = [c.subscribe(topic, ack="auto") for c in clients]
        host, port = cluster.url(2).removeprefix("stomp://").split(":")
        received: list[str] = []
        third = stomp.Connection12([(host, int(port))])

        class Listener(stomp.ConnectionListener):
            def on_message(self, frame: stomp.utils.Frame) -> None:
                received.append(frame.body)

        third.set_listener("", Listener())
        third.connect(wait=True)
        third.subscribe(topic, id="s", ack="auto")
        # every member's bridges hold a subscription to the topic on the others
        wait_until(lambda: all(topic in b["subscriptions"] for i in range(3)
                               for b in cluster.status(i)["cluster"]["bridges"]),
                   "bridges subscribed to the topic", 10)
        publishers = [connect(cluster.url(i)) for i in range(3)]
        expected = set()
        for k in range(100):
            for i, p in enumerate(publishers):
                p.send(topic, f"{i}:{k}")
                expected.add(f"{i}:{k}")
        got: list[list[str]] = [[], []]
        for s, sub in enumerate(subs):
            deadline = time.monotonic() + 15
            while len(got[s]) < len(expected) and time.monotonic() < deadline:
                message = sub.receive(0.5)
                if message is not None:
                    got[s].append(message.text)
        wait_until(lambda: len(received) >= len(expected), "stomp.py's messages", 15)
        time.sleep(0.5)  # a duplicate would come by now
        for name, bodies in (("member 0", got[0]), ("member 1", got[1]),
                             ("member 2 (stomp.py)", received)):
            counts = Counter(bodies)
            assert set(counts) == expected, f"{name}: {len(expected - set(counts))} missing"
            assert set(counts.values()) == {1}, f"{name}: duplicates"
        third.disconnect()
        for c in clients + publishers:
            c.close()
    finally:
        cluster.stop()


def test_durable_subscriber_gets_what_it_missed_through_its_members_failover(
        tmp_path: Path) -> None:
    """A durable subscriber on member 1 goes away; messages are published on members 0 and
    2; member 1's active server is killed; the subscriber comes back to member 1 (now its
    backup) and gets every message it missed, once."""
    cluster = PairCluster(tmp_path, 3)
    try:
        cluster.start()
        topic = "/topic/orders"
        options = {"client_id": "durable-app"}
        subscriber = connect(cluster.url(1), **options)
        sub = subscriber.subscribe(topic, ack="client-individual",
                                   headers={"activemq.subscriptionName": "orders"})
        # member 1's bridges hold durable subscriptions to the topic on members 0 and 2
        wait_until(lambda: all(topic in b["subscriptions"]
                               for b in cluster.status(1)["cluster"]["bridges"]),
                   "member 1's bridges subscribed to the topic", 10)
        publishers = {i: connect(cluster.url(i)) for i in (0, 2)}
        publishers[0].send(topic, "before")
        first = sub.receive(10)
        assert first is not None and first.text == "before"
        subscriber.ack(first)
        subscriber.close()  # the durable subscription stays on member 1
        expected = set()
        for k in range(200):
            for i, p in publishers.items():
                p.send(topic, f"{i}:{k}")
                expected.add(f"{i}:{k}")
            if k == 100:
                pair = cluster.pairs[1]
                killed = cluster.active(1)
                pair.kill(killed)
        pair.wait_state(pair.other(killed), "STANDALONE", 20)
        subscriber = connect(cluster.url(1), **options)
        sub = subscriber.subscribe(topic, ack="client-individual",
                                   headers={"activemq.subscriptionName": "orders"})
        got: Counter[str] = Counter()
        deadline = time.monotonic() + 30
        while set(got) != expected and time.monotonic() < deadline:
            message = sub.receive(0.5)
            if message is not None:
                got[message.text] += 1
                subscriber.ack(message)
        assert set(got) == expected, f"{len(expected - set(got))} missed"
        assert set(got.values()) == {1}, "duplicates"
        subscriber.close()
        for p in publishers.values():
            p.close()
    finally:
        cluster.stop()


def test_a_member_whose_consumers_come_and_go_takes_nothing_twice(tmp_path: Path) -> None:
    """Member 0 has a consumer of its own and a producer; on member 1 a consumer comes and
    goes every few hundred milliseconds, so member 1's bridge subscribes and gives up its
    subscription again and again mid-transfer. A subscription is given up only once what
    it took is confirmed on member 1 and acknowledged on member 0: had member 0 got a
    message back unacknowledged, its own consumer would get it too. Every message is
    consumed once, on one member or the other."""
    cluster = StandaloneCluster(tmp_path, 2)
    try:
        cluster.start()
        seen: Counter[str] = Counter()
        local = connect(cluster.url(0))
        local_sub = local.subscribe(QUEUE, ack="client-individual",
                                    headers={"prefetch-count": "10"})
        producer = connect(cluster.url(0))
        total = 3000
        for k in range(total):
            producer.send_async(QUEUE, f"m{k}")
        remote = connect(cluster.url(1))

        def take(client: Client, subscription: Subscription, most: int) -> None:
            """Consume and acknowledge what comes within 10 ms of each other, `most` at most."""
            for _ in range(most):
                message = subscription.receive(0.01)
                if message is None:
                    return
                seen[message.text] += 1
                client.ack(message)

        deadline = time.monotonic() + 60
        comings = 0
        while sum(seen.values()) < total and time.monotonic() < deadline:
            sub = remote.subscribe(QUEUE, ack="client-individual",
                                   headers={"prefetch-count": "20"})
            comings += 1
            # the first consumer stays until member 1's bridge has carried something: member
            # 1 tells member 0 what it wants every 500 ms, which a 400 ms stay can miss
            first = comings == 1
            until = time.monotonic() + 0.4
            looked = 0.0
            while time.monotonic() < until or (first and time.monotonic() < deadline):
                take(remote, sub, 20)
                take(local, local_sub, 20)
                if first and time.monotonic() - looked > 0.1:
                    looked = time.monotonic()
                    first = cluster.status(1)["cluster"]["forwarded"] == 0
            sub.unsubscribe()
            time.sleep(0.3)  # member 1 has no consumer: its bridge gives its subscription up
            # member 0's own consumer takes a share, not everything: what it leaves waiting
            # brings member 1's bridge back when member 1's next consumer comes
            take(local, local_sub, LOCAL_SHARE)
        producer.flush()
        time.sleep(1.0)
        for client, s in ((local, local_sub),):
            message = s.receive(0.5)
            while message is not None:
                seen[message.text] += 1
                client.ack(message)
                message = s.receive(0.5)
        assert len(seen) == total, f"{total - len(seen)} never consumed"
        twice = [body for body, n in seen.items() if n > 1]
        assert not twice, f"{len(twice)} consumed twice, e.g. {twice[:5]}"
        forwarded = cluster.status(1)["cluster"]["forwarded"]
        assert forwarded > 0, "member 1's bridge carried nothing: the test tested nothing"
        assert comings >= 3, f"member 1's consumer came {comings} time(s) only"
        for c in (local, producer, remote):
            c.close()
    finally:
        cluster.stop()
