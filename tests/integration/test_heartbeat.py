"""Heart-beat negotiation in both directions, on the wire."""

from __future__ import annotations

import itertools
import statistics
import threading
import time

import pytest

from tests.integration.rawstomp import RawStomp, unique


def listen_for_heartbeats(client: RawStomp, duration: float) -> list[float]:
    """Read for `duration` seconds; return the EOL arrival times (relative to the start)."""
    start = time.monotonic()
    first = len(client.heartbeats)
    deadline = start + duration
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            frame = client.read_frame(timeout=remaining)
        except TimeoutError:
            break
        assert frame.command == "MESSAGE", frame
    return [t - start for t in client.heartbeats[first:]]


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def time_until_closed(client: RawStomp, limit: float) -> float:
    start = time.monotonic()
    client.read_until_closed(timeout=limit)
    return time.monotonic() - start


def test_connected_offers_server_heartbeat(server, server_factory, raw_client):
    _, default = raw_client(server, headers={"heart-beat": "0,0"})
    assert default.headers["heart-beat"] == "10000,10000"
    fast = server_factory("--heartbeat-ms", "200")
    for offered in ("0,0", "100,5000", "5000,100"):
        _, frame = raw_client(fast, headers={"heart-beat": offered})
        assert frame.headers["heart-beat"] == "200,200", offered
    off = server_factory("--heartbeat-ms", "0")
    _, frame = raw_client(off, headers={"heart-beat": "100,100"})
    assert frame.headers["heart-beat"] == "0,0"


@pytest.mark.machine
def test_server_sends_eols_at_the_negotiated_interval(server_factory, raw_client):
    srv = server_factory("--heartbeat-ms", "200")
    # The client wants one every 500 ms: the server sends every max(200, 500) ms.
    slow, _ = raw_client(srv, headers={"heart-beat": "0,500"})
    # The client wants one every 100 ms: the server sends every max(200, 100) ms.
    fast, _ = raw_client(srv, headers={"heart-beat": "0,100"})
    results: dict[str, list[float]] = {}

    def listen(name: str, client: RawStomp) -> None:
        results[name] = listen_for_heartbeats(client, 2.6)

    threads = [
        threading.Thread(target=listen, args=("slow", slow)),
        threading.Thread(target=listen, args=("fast", fast)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    slow_times, fast_times = results["slow"], results["fast"]
    # Timers on a loaded machine jitter: judge the typical gap, and never more than twice
    # the interval (a client would then time the server out).
    assert 3 <= len(slow_times) <= 7, slow_times
    assert 0.4 <= statistics.median(gaps(slow_times)) <= 0.65, slow_times
    assert max(gaps(slow_times)) < 1.0, slow_times
    assert 8 <= len(fast_times) <= 15, fast_times
    assert 0.15 <= statistics.median(gaps(fast_times)) <= 0.3, fast_times
    assert max(gaps(fast_times)) < 0.4, fast_times


def test_no_eols_when_client_does_not_want_them(server_factory, raw_client):
    srv = server_factory("--heartbeat-ms", "200")
    client, _ = raw_client(srv, headers={"heart-beat": "0,0"})
    assert listen_for_heartbeats(client, 1.2) == []
    off = server_factory("--heartbeat-ms", "0")
    client, _ = raw_client(off, headers={"heart-beat": "100,100"})
    assert listen_for_heartbeats(client, 1.2) == []
    # heart-beat 0 on the server also means it does not expect anything.
    assert client.is_open()
    client.request("SUBSCRIBE", {"destination": "/topic/x", "id": "1"})


def test_no_eol_while_other_frames_flow(server_factory, raw_client):
    srv = server_factory("--heartbeat-ms", "200")
    # The server would owe an EOL every max(200, 1000) ms; a MESSAGE every 100 ms says enough.
    consumer, _ = raw_client(srv, headers={"heart-beat": "0,1000"})
    topic = f"/topic/{unique('hb')}"
    consumer.request("SUBSCRIBE", {"destination": topic, "id": "1"})
    producer, _ = raw_client(srv)
    stop = threading.Event()

    def publish() -> None:
        while not stop.is_set():
            producer.send_frame("SEND", {"destination": topic}, "tick")
            time.sleep(0.1)

    thread = threading.Thread(target=publish)
    thread.start()
    try:
        heartbeats = listen_for_heartbeats(consumer, 2.5)
    finally:
        stop.set()
        thread.join(5)
    assert heartbeats == [], "the server sends an EOL only when it has sent nothing else"


def test_silent_peer_is_closed_after_twice_the_interval(server_factory, raw_client):
    srv = server_factory("--heartbeat-ms", "200")
    # Client promises one every 200 ms: the server expects max(200, 200) and closes after 400.
    client, _ = raw_client(srv, headers={"heart-beat": "200,0"})
    elapsed = time_until_closed(client, 5)
    assert 0.35 <= elapsed <= 2.0, elapsed
    assert srv.alive()


def test_server_waits_for_the_clients_longer_interval(server_factory, raw_client):
    srv = server_factory("--heartbeat-ms", "200")
    # Client promises one every 1000 ms: the server expects max(1000, 200), closes after 2000.
    client, _ = raw_client(srv, headers={"heart-beat": "1000,0"})
    start = time.monotonic()
    time.sleep(1.2)
    assert client.is_open(), "closed before twice the client's interval"
    client.read_until_closed(timeout=5)
    elapsed = time.monotonic() - start
    assert 1.7 <= elapsed <= 4.0, elapsed


def test_heartbeating_peer_stays_connected(server_factory, raw_client):
    srv = server_factory("--heartbeat-ms", "200")
    client, _ = raw_client(srv, headers={"heart-beat": "200,0"})
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        client.heartbeat()
        time.sleep(0.1)
    assert client.is_open()
    client.request("SUBSCRIBE", {"destination": "/queue/alive", "id": "1"})
    # A client that offered no heart-beat is never timed out.
    quiet, _ = raw_client(srv, headers={"heart-beat": "0,0"})
    time.sleep(1.0)
    assert quiet.is_open()
    quiet.request("SUBSCRIBE", {"destination": "/queue/alive", "id": "1"})


def test_stomp_py_heartbeats_keep_connection_alive(server_factory, stomp_client):
    srv = server_factory("--heartbeat-ms", "200")
    client = stomp_client(srv, heartbeats=(100, 0))
    assert client.listener.connected.headers["heart-beat"] == "200,200"
    time.sleep(1.5)
    assert not client.listener.disconnected
    queue = f"/queue/{unique('hb')}"
    client.subscribe(queue)
    client.send(queue, "still here")
    assert client.wait_messages(1)[0].body == "still here"
