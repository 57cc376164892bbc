"""Flow control: the per-subscription window of unacknowledged messages, and producer
blocking when a destination under address_full_policy block is full (server memory stays
bounded). The other policies and the server-wide guards: test_address_full.py."""

from __future__ import annotations

import socket
import threading
import time

import psutil
import pytest

from tests.integration.clients import fill
from tests.integration.rawstomp import ConnectionClosed, encode_frame, unique
from tests.support.waiting import wait_until


def settle(client, expected: int, wait: float = 0.5) -> None:
    """Check that exactly `expected` messages arrived and no more arrive for `wait` seconds
    (there is no event for "nothing more comes", so this one wait is bounded and short)."""
    client.wait_messages(expected)
    client.sync()
    time.sleep(wait)
    assert len(client.messages) == expected, client.bodies()


@pytest.mark.parametrize("header", ["prefetch-count", "activemq.prefetchSize"])
def test_window_of_unacked_messages(server, stomp_client, header):
    queue = f"/queue/{unique('win')}"
    fill(server, stomp_client, queue, 20)
    consumer = stomp_client(server)
    consumer.subscribe(queue, ack="client-individual", headers={header: "5"})
    settle(consumer, 5)
    consumer.ack(consumer.messages[0])
    settle(consumer, 6)
    for m in consumer.messages[1:6]:
        consumer.ack(m)
    settle(consumer, 11)
    assert consumer.bodies() == [f"m{i}" for i in range(11)]


def test_window_in_client_mode_opens_by_cumulative_ack(server, stomp_client):
    queue = f"/queue/{unique('winc')}"
    fill(server, stomp_client, queue, 20)
    consumer = stomp_client(server)
    consumer.subscribe(queue, ack="client", headers={"prefetch-count": "5"})
    settle(consumer, 5)
    consumer.ack(consumer.messages[2])  # acknowledges three messages
    settle(consumer, 8)


def test_window_fills_as_messages_arrive(server, stomp_client):
    queue = f"/queue/{unique('winl')}"
    consumer = stomp_client(server)
    consumer.subscribe(queue, ack="client-individual", headers={"prefetch-count": "3"})
    fill(server, stomp_client, queue, 10)
    settle(consumer, 3)
    # The rest is still in the queue, for another consumer.
    other = stomp_client(server)
    other.subscribe(queue, ack="client-individual", headers={"prefetch-count": "100"})
    other.wait_messages(7)
    assert sorted(consumer.bodies() + other.bodies()) == sorted(f"m{i}" for i in range(10))


def test_default_prefetch_is_configurable_and_auto_has_no_window(server_factory, stomp_client):
    srv = server_factory("--default-prefetch", "4")
    queue = f"/queue/{unique('defp')}"
    fill(srv, stomp_client, queue, 20)
    consumer = stomp_client(srv)
    consumer.subscribe(queue, ack="client-individual")
    settle(consumer, 4)
    auto_queue = f"/queue/{unique('auto')}"
    fill(srv, stomp_client, auto_queue, 20)
    auto = stomp_client(srv)
    auto.subscribe(auto_queue)
    auto.wait_messages(20)


# -- producer flow control ---------------------------------------------------------------------


def receipts_until_stalled(client, stall: float, limit: float) -> list[str]:
    """Collect RECEIPT ids until none arrived for `stall` seconds (or `limit` passed)."""
    got: list[str] = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            frame = client.read_frame(timeout=stall)
        except TimeoutError:
            return got
        assert frame.command == "RECEIPT", frame
        got.append(frame.headers["receipt-id"])
    return got


def test_full_destination_blocks_its_producer_until_drained(server_factory, raw_client):
    srv = server_factory("--max-size-bytes", "20000", "--address-full-policy", "block")
    name = unique("full")
    queue = f"/queue/{name}"
    producer, _ = raw_client(srv)
    body = b"x" * 1024
    total = 100
    frames = b"".join(
        encode_frame("SEND", {"destination": queue, "receipt": f"p{i}", "seq": str(i)}, body)
        for i in range(total)
    )
    # The writer gets its own socket object (same connection) so that the reader's timeouts
    # do not apply to it.
    writer_sock = producer.sock.dup()
    writer_sock.settimeout(60)
    writer = threading.Thread(target=writer_sock.sendall, args=(frames,), daemon=True)
    writer.start()

    first = receipts_until_stalled(producer, stall=1.5, limit=20)
    assert first == [f"p{i}" for i in range(len(first))], "receipts in order"
    # 20000 bytes hold 19 of these 1 KiB bodies: the 20th SEND (or an earlier one, if the
    # server counts headers too) takes the queue past its limit and is receipted; the SENDs
    # after it must not take effect until the queue drains (docs/stomp.md, Flow control).
    assert 10 <= len(first) <= 20, (
        f"{len(first)} SENDs were accepted into a queue limited to 20000 bytes "
        f"({len(first) * len(body)} bytes of bodies): the producer was not blocked"
    )
    warnings = wait_until(lambda: srv.log_lines(name, "full"), "a log line saying full", 5)
    assert any("WARNING" in line for line in warnings), warnings

    # Other connections and destinations are unaffected.
    bystander, _ = raw_client(srv)
    bystander.request("SEND", {"destination": f"/queue/{unique('other')}"}, body)

    consumer, _ = raw_client(srv)
    consumer.send_frame("SUBSCRIBE", {"destination": queue, "id": "drain"})
    seqs = [int(consumer.read_message(timeout=10).headers["seq"]) for _ in range(total)]
    assert seqs == list(range(total)), "every message arrives, in order"
    rest = []
    while len(first) + len(rest) < total:
        rest.append(producer.expect("RECEIPT", timeout=10).headers["receipt-id"])
    assert first + rest == [f"p{i}" for i in range(total)]
    writer.join(10)
    assert not writer.is_alive()
    writer_sock.close()
    resumed = srv.log_lines(name, "INFO")
    assert resumed, "an INFO log when the destination is back under its limit"


def test_server_memory_stays_bounded_under_a_flood(server_factory, raw_client):
    limit = 1 << 20
    srv = server_factory("--max-size-bytes", str(limit), "--address-full-policy", "block")
    proc = psutil.Process(srv.proc.pid)
    warmup, _ = raw_client(srv)
    warmup.request("SEND", {"destination": "/queue/warmup"}, b"w" * 65536)
    baseline = proc.memory_info().rss

    producer, _ = raw_client(srv)
    queue = f"/queue/{unique('flood')}"
    frame = encode_frame("SEND", {"destination": queue}, b"f" * 16384)
    sent = {"bytes": 0, "blocked": False}
    stop = threading.Event()

    def flood() -> None:
        producer.sock.settimeout(2.0)
        try:
            while not stop.is_set():
                producer.sock.sendall(frame)
                sent["bytes"] += len(frame)
        except TimeoutError:
            sent["blocked"] = True
        except (OSError, ConnectionClosed):
            pass

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    peak = baseline
    deadline = time.monotonic() + 6.0
    while time.monotonic() < deadline and thread.is_alive():
        peak = max(peak, proc.memory_info().rss)
        time.sleep(0.05)
    stop.set()
    thread.join(10)
    peak = max(peak, proc.memory_info().rss)
    growth = peak - baseline
    assert sent["blocked"], f"the producer wrote {sent['bytes']} bytes without ever being blocked"
    assert growth < 48 * (1 << 20), (
        f"server RSS grew by {growth / 2**20:.1f} MiB with max-size-bytes of 1 MiB "
        f"(producer wrote {sent['bytes'] / 2**20:.1f} MiB)"
    )
    assert srv.alive()
    # The server still answers.
    probe, _ = raw_client(srv)
    probe.request("SUBSCRIBE", {"destination": "/queue/probe", "id": "1"})
    producer.sock.shutdown(socket.SHUT_RDWR)
