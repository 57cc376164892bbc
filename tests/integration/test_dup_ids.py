"""Duplicate detection: a SEND whose `dup-id` was already accepted for its destination is
receipted but not delivered again. The cache (--dup-cache-size per destination, default
20,000) is journaled: it survives a clean restart and a kill -9, keeps its eviction order
(an id older than the last N is accepted again), and works inside transactions."""

from __future__ import annotations

import time

import pytest

from tests.integration.rawstomp import RawStomp, unique
from tests.serverproc import ServerProcess
from tests.support.servers import restart

P = {"persistent": "true"}


def send(client: RawStomp, destination: str, body: str, dup: str | None = None,
         **headers: str) -> None:
    """A persistent SEND, receipted (a duplicate gets its RECEIPT too)."""
    if dup is not None:
        headers["dup-id"] = dup
    client.request("SEND", {"destination": destination, **P, **headers}, body)


def listen(srv: ServerProcess, raw_client, destination: str, **headers: str) -> RawStomp:
    client, _ = raw_client(srv)
    client.request("SUBSCRIBE", {"destination": destination, "id": "s", **headers})
    return client


# ----------------------------------------------------------------------------- basics


def test_a_duplicate_send_to_a_queue_is_receipted_but_delivered_once(server_factory,
                                                                     raw_client):
    srv = server_factory()
    queue, other = f"/queue/{unique('dq')}", f"/queue/{unique('dq')}"
    producer, _ = raw_client(srv)
    consumer = listen(srv, raw_client, queue)
    send(producer, queue, "first", dup="a")
    send(producer, queue, "second", dup="a")  # request() asserts the RECEIPT, no ERROR
    send(producer, queue, "third", dup="b")
    send(producer, queue, "no dup-id")
    send(producer, queue, "no dup-id")
    send(producer, other, "same id, other queue", dup="a")
    messages = [consumer.read_message() for _ in range(4)]
    assert [m.body for m in messages] == [b"first", b"third", b"no dup-id", b"no dup-id"]
    assert messages[0].headers["dup-id"] == "a"
    assert consumer.bodies_until_quiet() == []
    assert listen(srv, raw_client, other).bodies_until_quiet() == [b"same id, other queue"]


def test_a_duplicate_publish_to_a_topic_reaches_each_subscriber_once(server_factory,
                                                                      raw_client):
    srv = server_factory()
    topic = f"/topic/{unique('dt')}"
    plain = listen(srv, raw_client, topic)
    durable = listen(srv, raw_client, topic, durable="true", ack="client-individual")
    producer, _ = raw_client(srv)
    for body in ("one", "one again", "one more time"):
        send(producer, topic, body, dup="x")
    send(producer, topic, "two", dup="y")
    assert plain.bodies_until_quiet() == [b"one", b"two"]
    assert durable.bodies_until_quiet() == [b"one", b"two"]


def test_dup_ids_inside_transactions(server_factory, raw_client):
    srv = server_factory()
    queue = f"/queue/{unique('dtx')}"
    producer, _ = raw_client(srv)
    consumer = listen(srv, raw_client, queue)

    # Twice in one transaction: once.
    producer.request("BEGIN", {"transaction": "t1"})
    send(producer, queue, "t1-a", dup="in-tx", transaction="t1")
    send(producer, queue, "t1-b", dup="in-tx", transaction="t1")
    producer.request("COMMIT", {"transaction": "t1"})
    # Accepted before, sent again in a transaction: dropped at COMMIT, the rest goes.
    send(producer, queue, "outside", dup="pre")
    producer.request("BEGIN", {"transaction": "t2"})
    send(producer, queue, "pre again", dup="pre", transaction="t2")
    send(producer, queue, "new", dup="new", transaction="t2")
    producer.request("COMMIT", {"transaction": "t2"})
    # An aborted transaction remembers nothing.
    producer.request("BEGIN", {"transaction": "t3"})
    send(producer, queue, "aborted", dup="ab", transaction="t3")
    producer.request("ABORT", {"transaction": "t3"})
    send(producer, queue, "after abort", dup="ab")
    # Accepted outside while a transaction holding the same id is open: the commit drops it.
    producer.request("BEGIN", {"transaction": "t4"})
    send(producer, queue, "late in tx", dup="race", transaction="t4")
    send(producer, queue, "won the race", dup="race")
    producer.request("COMMIT", {"transaction": "t4"})

    assert consumer.bodies_until_quiet() == [b"t1-a", b"outside", b"new", b"after abort",
                                  b"won the race"]


# ----------------------------------------------------------------------------- restarts


@pytest.mark.parametrize("crash", [True, False], ids=["sigkill", "sigterm"])
def test_the_dup_id_cache_survives_a_restart(server_factory, raw_client, crash):
    srv = server_factory()
    queue, topic = f"/queue/{unique('rq')}", f"/topic/{unique('rt')}"
    subscriber = listen(srv, raw_client, topic, durable="true")
    subscriber.request("UNSUBSCRIBE", {"id": "s"})  # away: the durable one keeps a backlog
    producer, _ = raw_client(srv)
    for i in range(5):
        send(producer, queue, f"q{i}", dup=f"q{i}")
    for i in range(3):
        send(producer, topic, f"t{i}", dup=f"t{i}")
    producer.request("BEGIN", {"transaction": "tx"})
    send(producer, queue, "in tx", dup="tx", transaction="tx")
    producer.request("COMMIT", {"transaction": "tx"})

    srv = restart(srv, crash=crash)
    producer, _ = raw_client(srv)
    for i in range(5):  # a producer that never saw its receipts sends everything again
        send(producer, queue, f"q{i} resent", dup=f"q{i}")
    for i in range(3):
        send(producer, topic, f"t{i} resent", dup=f"t{i}")
    producer.request("BEGIN", {"transaction": "tx"})
    send(producer, queue, "in tx resent", dup="tx", transaction="tx")
    producer.request("COMMIT", {"transaction": "tx"})
    send(producer, queue, "new", dup="new")

    assert listen(srv, raw_client, queue).bodies_until_quiet() == [
        *(f"q{i}".encode() for i in range(5)), b"in tx", b"new"]
    assert listen(srv, raw_client, topic, durable="true").bodies_until_quiet() == [
        f"t{i}".encode() for i in range(3)]


# ----------------------------------------------------------------------------- eviction


def test_an_id_older_than_the_last_n_is_accepted_again(server_factory, raw_client):
    srv = server_factory("--dup-cache-size", "10")
    queue = f"/queue/{unique('ev')}"
    producer, _ = raw_client(srv)
    consumer = listen(srv, raw_client, queue)
    for i in range(11):
        send(producer, queue, f"d{i}", dup=f"d{i}")
    assert len(consumer.bodies_until_quiet()) == 11
    for i in range(10, 0, -1):  # the last 10, newest first: all still remembered
        send(producer, queue, f"d{i} again", dup=f"d{i}")
    assert consumer.bodies_until_quiet() == []
    send(producer, queue, "d0 again", dup="d0")  # the 11th newest: forgotten
    assert consumer.bodies_until_quiet() == [b"d0 again"]


def test_eviction_survives_sigkill(server_factory, raw_client):
    flags = ("--dup-cache-size", "10")
    srv = server_factory(*flags)
    queue = f"/queue/{unique('evk')}"
    producer, _ = raw_client(srv)
    for i in range(15):
        send(producer, queue, f"d{i}", dup=f"d{i}")

    srv = restart(srv, *flags)
    producer, _ = raw_client(srv)
    consumer = listen(srv, raw_client, queue)
    assert consumer.bodies_until_quiet() == [f"d{i}".encode() for i in range(15)]
    for i in range(14, 4, -1):  # the last 10, newest first
        send(producer, queue, f"d{i} again", dup=f"d{i}")
    assert consumer.bodies_until_quiet() == []
    send(producer, queue, "d4 again", dup="d4")
    assert consumer.bodies_until_quiet() == [b"d4 again"]


def test_eviction_order_survives_compaction_and_sigkill(server_factory, raw_client):
    """Compaction re-writes the remembered ids of an old segment at the head of the
    journal, after ids accepted later. Recovery must still evict the oldest ones."""
    flags = ("--dup-cache-size", "10", "--segment-bytes", "65536")
    srv = server_factory(*flags)
    journal = srv.data_dir / "journal"
    ids, filler = f"/queue/{unique('ids')}", f"/queue/{unique('fill')}"
    producer, _ = raw_client(srv)
    for i in range(1, 11):
        send(producer, ids, f"d{i}", dup=f"d{i}")
    for _ in range(20):  # fill the first segment so the journal rolls to a second one
        send(producer, filler, "f" * 10000)
        if (journal / "journal-00000002.seg").exists():
            break
    assert (journal / "journal-00000002.seg").exists()
    for i in range(11, 14):  # in the second segment; d1..d3 are forgotten
        send(producer, ids, f"d{i}", dup=f"d{i}")
    # Consume everything: the first segment keeps only d4..d10 alive, so it is compacted
    # (they are re-written in the second segment) and deleted.
    consumer = listen(srv, raw_client, ids)
    consumer.request("SUBSCRIBE", {"destination": filler, "id": "f"})
    consumer.bodies_until_quiet()
    deadline = time.monotonic() + 10
    while (journal / "journal-00000001.seg").exists():
        assert time.monotonic() < deadline, "the first segment was never compacted away"
        send(producer, filler, "nudge")  # each journal write may start compaction
        time.sleep(0.05)
    send(producer, ids, "d14", dup="d14")  # d4 is forgotten: the last 10 are d5..d14

    srv = restart(srv, *flags)
    producer, _ = raw_client(srv)
    consumer = listen(srv, raw_client, ids)
    for i in range(14, 4, -1):  # newest first, so a wrongly accepted one evicts nothing
        send(producer, ids, f"d{i} again", dup=f"d{i}")
    assert consumer.bodies_until_quiet() == [], "ids among the last 10 were delivered again"
    send(producer, ids, "d4 again", dup="d4")
    assert consumer.bodies_until_quiet() == [b"d4 again"]


# ------------------------------------------------------------------------ sized per destination


def test_the_cache_is_sized_per_destination_and_connected_names_the_smallest(
        server_factory, raw_client):
    srv = server_factory("--dup-cache-size", "3", config_text=(
        '[destinations.overrides."/queue/big.#"]\ndup_cache_size = 50\n'))
    producer, connected = raw_client(srv)
    assert connected.headers["dup-cache-size"] == "3"
    small, big = f"/queue/{unique('small')}", f"/queue/big.{unique('b')}"
    for destination in (small, big):
        for i in range(4):
            send(producer, destination, f"d{i}", dup=f"d{i}")
        send(producer, destination, "d0 again", dup="d0")
    assert listen(srv, raw_client, small).bodies_until_quiet() == [
        b"d0", b"d1", b"d2", b"d3", b"d0 again"], "3 remembered: d0 was forgotten"
    assert listen(srv, raw_client, big).bodies_until_quiet() == [b"d0", b"d1", b"d2", b"d3"]
    # the smallest of the overrides too
    other = server_factory(config_text=(
        '[destinations.overrides."/queue/tiny"]\ndup_cache_size = 7\n'))
    assert raw_client(other)[1].headers["dup-cache-size"] == "7"


def test_an_override_of_dup_cache_size_must_be_a_positive_integer(tmp_path):
    from pairmq.server.config import ConfigError, load_config

    path = tmp_path / "bad.toml"
    path.write_text('[destinations.overrides."/queue/x"]\ndup_cache_size = 0\n')
    with pytest.raises(ConfigError, match=r'overrides."/queue/x"\] dup_cache_size'):
        load_config(path)
