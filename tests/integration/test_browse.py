"""A queue browser on a real server, as ActiveMQ's STOMP users open one (SUBSCRIBE with
`browser:true`; docs/stomp.md "Browsing a queue"): stomp.py and pairmq's own client see
the first messages waiting, in order, then a MESSAGE with `browser:end`, and every message
stays for the consumers, including those of a paging queue that live only on disk."""

from __future__ import annotations

import pairmq.client
from pairmq.client.plain import BlockingConnection
from pairmq.protocol import Frame

KiB = 1024


def drain(srv, destination: str, header: str | None = None) -> list[str]:
    """What a consumer then takes: bodies, or the values of `header`."""
    with pairmq.client.connect(f"{srv.host}:{srv.port}") as client:
        sub = client.subscribe(destination, ack="client-individual")
        got = []
        while (message := sub.receive(1.0)) is not None:
            client.ack(message)
            got.append(message.body.decode() if header is None else message.headers[header])
        return got


def test_stomp_py_browses_without_taking(server, stomp_client) -> None:
    producer = stomp_client(server)
    for i in range(5):
        producer.send("/queue/browsed", f"m{i}", persistent="true", kind="order")
    browser = stomp_client(server)
    browser.subscribe("/queue/browsed", id="b", headers={"browser": "true"})
    frames = browser.wait_messages(6)
    assert [f.body for f in frames[:5]] == [f"m{i}" for i in range(5)]
    assert all(f.headers["kind"] == "order" and "ack" not in f.headers
               for f in frames[:5])
    end = frames[5]
    assert end.headers["browser"] == "end" and end.headers["subscription"] == "b"
    assert end.headers["destination"] == "/queue/browsed" and end.body == ""
    browser.subscribe("/queue/browsed", id="b", headers={"browser": "true"})  # id free again
    assert len(browser.wait_messages(12)) == 12
    assert drain(server, "/queue/browsed") == [f"m{i}" for i in range(5)]


def test_an_empty_or_unknown_queue_shows_only_the_end(server, stomp_client) -> None:
    browser = stomp_client(server)
    browser.subscribe("/queue/nothing.here", id="b", headers={"browser": "true"})
    [end] = browser.wait_messages(1)
    assert end.headers["browser"] == "end"


def test_a_topic_cannot_be_browsed(server, stomp_client) -> None:
    client = stomp_client(server)
    client.conn.subscribe("/topic/news", "b", headers={"browser": "true"})
    error = client.wait_error()
    assert "only a /queue/ destination can be browsed" in error.headers["message"]


def test_a_paging_queue_is_browsed_past_its_memory_to_the_limit(server_factory) -> None:
    srv = server_factory("--max-size-bytes", str(64 * KiB), "--max-browse-messages", "150")
    with pairmq.client.connect(f"{srv.host}:{srv.port}") as client:
        client.send_batch("/queue/paged", [(b"x" * KiB, {"n": str(i)}) for i in range(400)])
    conn = BlockingConnection(srv.host, srv.port)
    try:
        frames = conn.request(Frame("SUBSCRIBE", {"destination": "/queue/paged", "id": "b",
                                                  "browser": "true"}))
    finally:
        conn.close()
    assert frames[-1].headers.get("browser") == "end"
    assert [f.headers["n"] for f in frames[:-1]] == [str(i) for i in range(150)], \
        "the first 150, most of them only on disk"
    assert "Destination /queue/paged is full" in srv.logs()  # it pages
    assert drain(srv, "/queue/paged", "n") == [str(i) for i in range(400)]
