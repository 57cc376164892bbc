"""A persistent message reaches a consumer only once its record is on disk (DESIGN.md, "The
journal is the unit of everything"), with the data directory on a frozen file system.

So a consumer never sees a message the server could lose, which its producer, never
receipted, would send again (to the next active server, under a new message id). A
non-persistent message needs no disk: it is delivered at once, unless it is queued behind
a held persistent one on the same connection (a connection's frames stay in order).
`[server] deliver_unconfirmed = true` brings back delivery before the disk.
"""

from __future__ import annotations

import time

import pytest

from tests.integration.rawstomp import RawStomp, unique
from tests.support.disk import frozen

P = {"persistent": "true"}
HELD_FOR = 1.5  # seconds a held message is watched for not arriving


def assert_nothing(client: RawStomp, wait: float = HELD_FOR) -> None:
    with pytest.raises(TimeoutError):
        frame = client.read_frame(wait)
        raise AssertionError(f"delivered before its record was on disk: {frame!r}")


def test_persistent_message_is_delivered_once_its_record_is_on_disk(
        server_factory, raw_client, loop_mounted_data_dir):
    mountpoint = loop_mounted_data_dir
    srv = server_factory(name="frozen")
    queue, other = f"/queue/{unique('gate')}", f"/queue/{unique('live')}"
    consumer, _ = raw_client(srv)
    consumer.request("SUBSCRIBE", {"destination": queue, "id": "q", "ack": "client-individual"})
    bystander, _ = raw_client(srv)
    bystander.request("SUBSCRIBE", {"destination": other, "id": "o"})
    producer, _ = raw_client(srv)
    light, _ = raw_client(srv)  # sends non-persistent messages only: no RECEIPT waits

    with frozen(mountpoint):
        producer.send_frame("SEND", {"destination": queue, "receipt": "p", **P}, b"persistent")
        # Needs no disk: at once, on a connection that waits for nothing.
        light.request("SEND", {"destination": other}, b"at once", timeout=2.0)
        assert bystander.read_message(2.0).body == b"at once"
        # Behind the held persistent message on the consumer's connection: waits for it.
        light.request("SEND", {"destination": queue}, b"behind", timeout=2.0)
        assert_nothing(consumer)
        assert_nothing(producer, 0.1)  # and the SEND has no RECEIPT either

    first = consumer.read_message(10.0)
    assert first.body == b"persistent"
    assert consumer.read_message(5.0).body == b"behind"
    assert producer.wait_receipt("p", 5.0).command == "RECEIPT"
    consumer.request("ACK", {"id": first.headers["ack"]})

    # A committed transaction's messages wait for the COMMIT's record.
    producer.request("BEGIN", {"transaction": "tx"})
    producer.request("SEND", {"destination": queue, "transaction": "tx", **P}, b"committed")
    with frozen(mountpoint):
        producer.send_frame("COMMIT", {"transaction": "tx", "receipt": "c"})
        assert_nothing(consumer)
    assert consumer.read_message(10.0).body == b"committed"
    assert producer.wait_receipt("c", 5.0).command == "RECEIPT"
    srv.stop()  # before the filesystem is unmounted


def test_held_deliveries_are_bounded_like_a_socket_buffer(
        server_factory, raw_client, loop_mounted_data_dir):
    """While the disk is frozen, an ack:auto consumer (no prefetch window) is handed no
    more than about 1 MiB of held messages, as a full socket would stop it: the rest stays
    in the queue, for a second consumer, instead of piling up in the server's memory."""
    mountpoint = loop_mounted_data_dir
    srv = server_factory(name="frozen")
    queue = f"/queue/{unique('bounded')}"
    first, _ = raw_client(srv)
    first.request("SUBSCRIBE", {"destination": queue, "id": "q"})
    producer, _ = raw_client(srv)
    echo = f"/topic/{unique('echo')}"
    producer.request("SUBSCRIBE", {"destination": echo, "id": "echo"})
    body = b"x" * 8192
    count = 400  # 3.2 MB
    with frozen(mountpoint):
        for i in range(count):
            producer.send_frame("SEND", {"destination": queue, "n": str(i), **P}, body)
        # Needs no disk, and comes back once every SEND before it was taken.
        producer.send_frame("SEND", {"destination": echo}, b"all sent")
        assert producer.read_message(10.0).body == b"all sent"
        second, _ = raw_client(srv)
        # No receipt: it would wait behind the messages this SUBSCRIBE is handed.
        second.send_frame("SUBSCRIBE", {"destination": queue, "id": "q"})
        assert_nothing(first, 0.5)
    got = {"first": [], "second": []}
    deadline = time.monotonic() + 30
    while sum(map(len, got.values())) < count and time.monotonic() < deadline:
        for name, client in (("first", first), ("second", second)):
            try:
                got[name].append(int(client.read_message(0.05).headers["n"]))
            except TimeoutError:
                pass
    everything = sorted(got["first"] + got["second"])
    assert everything == list(range(count)), f"{len(everything)} of {count} delivered"
    assert got["first"] == sorted(got["first"])  # in order on each consumer
    assert 0 < len(got["first"]) < count, len(got["first"])
    assert got["second"], "everything went to the first consumer while it was held"
    srv.stop()


def test_deliver_unconfirmed_hands_messages_over_before_the_disk(
        server_factory, raw_client, loop_mounted_data_dir):
    """The old behaviour, on request: delivered while the disk is frozen; the RECEIPT
    still waits for the disk."""
    mountpoint = loop_mounted_data_dir
    srv = server_factory("--deliver-unconfirmed", name="frozen")
    queue = f"/queue/{unique('early')}"
    consumer, _ = raw_client(srv)
    consumer.request("SUBSCRIBE", {"destination": queue, "id": "q"})
    producer, _ = raw_client(srv)
    with frozen(mountpoint):
        producer.send_frame("SEND", {"destination": queue, "receipt": "p", **P}, b"early")
        assert consumer.read_message(2.0).body == b"early"
        assert_nothing(producer, 0.5)
    assert producer.wait_receipt("p", 10.0).command == "RECEIPT"
    srv.stop()
