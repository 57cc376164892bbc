"""A persistent message reaches a consumer only once its record is on disk (DESIGN.md, "The
journal is the unit of everything"), with the data directory on a frozen file system.

So a consumer never sees a message the server could lose, which its producer, never
receipted, would send again (to the next active server, under a new message id). A
non-persistent message needs no disk: it is delivered at once, unless it is queued behind
a held persistent one on the same connection (a connection's frames stay in order).
`[server] deliver_unconfirmed = true` brings back delivery before the disk.
"""

from __future__ import annotations

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
