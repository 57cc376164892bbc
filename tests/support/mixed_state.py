"""A broker state with a bit of everything, built on a server through real connections, and
read back from the server that takes over: what a takeover must serve (tests/ha/
test_takeover.py, test_shared_store.py)."""

from __future__ import annotations

from tests.integration.rawstomp import RawStomp
from tests.integration.rawstomp import connect as raw_connect

BODY = 2048  # with --paging-bytes 20000, most bodies stay on disk only, on both servers
P = {"persistent": "true"}


def body(name: str) -> bytes:
    return (name.encode() + b":") * (BODY // (len(name) + 1))


def send(client: RawStomp, destination: str, name: str, **headers: str) -> None:
    client.request("SEND", {"destination": destination, "x-id": name, **P, **headers},
                   body(name))


def build_mixed_state(primary: tuple[str, int]
                      ) -> tuple[dict[str, set[str]], set[str], list[RawStomp]]:
    """Queues with acked, unacked and never delivered messages, priorities, a durable topic
    subscription (and a deleted one), a committed and an open transaction, a dup-id sent
    twice, a non-persistent message. Returns the x-ids each destination should hold, some
    delivered and not acknowledged, and the consumer and producer (their transactions are
    open at the kill; the consumer's window refilled after its acks)."""
    durable, _ = raw_connect(primary, headers={"client-id": "c"})
    durable.request("SUBSCRIBE", {"id": "s", "destination": "/topic/t",
                                  "activemq.subscriptionName": "keep", "ack": "client"})
    durable.request("SUBSCRIBE", {"id": "g", "destination": "/topic/t",
                                  "activemq.subscriptionName": "gone"})
    durable.request("UNSUBSCRIBE", {"id": "s"})  # both stay, without a consumer
    durable.request("UNSUBSCRIBE", {"id": "g"})
    producer, _ = raw_connect(primary)
    for i in range(30):
        send(producer, "/queue/a", f"a{i}", priority=str(i % 3 * 4))
    for i in range(8):
        send(producer, "/topic/t", f"t{i}")
    durable.request("UNSUBSCRIBE", {"id": "g", "activemq.subscriptionName": "gone"})
    durable.close()
    send(producer, "/queue/b", "once", **{"dup-id": "d-once"})
    send(producer, "/queue/b", "once", **{"dup-id": "d-once"})
    producer.request("SEND", {"destination": "/queue/b", "x-id": "volatile"}, b"not kept")

    consumer, _ = raw_connect(primary)
    consumer.send_frame("SUBSCRIBE", {"id": "c", "destination": "/queue/a",
                                      "ack": "client-individual", "prefetch-count": "10"})
    got = [consumer.read_message() for _ in range(10)]
    ids = [m.headers["x-id"] for m in got]
    for m in got[:4]:
        consumer.request("ACK", {"id": m.headers["ack"]})
    consumer.request("BEGIN", {"transaction": "done"})
    producer.request("BEGIN", {"transaction": "done"})
    for i in range(3):
        producer.send_frame("SEND", {"destination": "/queue/b", "x-id": f"b{i}", **P,
                                     "transaction": "done"}, body(f"b{i}"))
    consumer.send_frame("ACK", {"id": got[4].headers["ack"], "transaction": "done"})
    consumer.request("COMMIT", {"transaction": "done"})
    producer.request("COMMIT", {"transaction": "done"})
    producer.request("BEGIN", {"transaction": "open"})
    producer.request("SEND", {"destination": "/queue/b", "x-id": "never", **P,
                              "transaction": "open"}, body("never"))
    consumer.request("BEGIN", {"transaction": "open"})
    consumer.request("ACK", {"id": got[5].headers["ack"], "transaction": "open"})
    # got[5:] stay delivered and unacknowledged (got[5]'s ack is in the open transaction)
    return {"/queue/a": {f"a{i}" for i in range(30)} - set(ids[:5]),
            "/queue/b": {"once", "b0", "b1", "b2"},
            "durable:keep": {f"t{i}" for i in range(8)}}, set(ids[5:]), [consumer, producer]


def read_all(server: tuple[str, int]) -> list[tuple[str, str, str, bytes, int]]:
    """Everything each destination holds, in delivery order, unacknowledged (it goes back
    when the connection closes): (destination, x-id, message-id, body, delivery-count)."""
    client, _ = raw_connect(server, headers={"client-id": "c"})
    client.request("SUBSCRIBE", {"id": "a", "destination": "/queue/a", "ack": "client",
                                 "prefetch-count": "1000"})
    client.request("SUBSCRIBE", {"id": "b", "destination": "/queue/b", "ack": "client",
                                 "prefetch-count": "1000"})
    client.request("SUBSCRIBE", {"id": "s", "destination": "/topic/t", "ack": "client",
                                 "activemq.subscriptionName": "keep",
                                 "prefetch-count": "1000"})
    where = {"a": "/queue/a", "b": "/queue/b", "s": "durable:keep"}
    out = []
    while True:
        try:
            m = client.read_message(timeout=1.5)
        except TimeoutError:
            break
        out.append((where[m.headers["subscription"]], m.headers["x-id"],
                    m.headers["message-id"], m.body, int(m.headers["delivery-count"])))
    client.close()
    return sorted(out, key=lambda r: r[0])  # by destination, each in delivery order


def assert_served_as_built(served: list[tuple[str, str, str, bytes, int]],
                           expected: dict[str, set[str]], unacked: set[str]) -> None:
    """`served` (read_all) is what build_mixed_state left: each destination holds what it
    should, nothing twice, every body intact, and only /queue/a's delivered messages come
    again: the unacknowledged ones and those the acks made room for, 11 in all."""
    by_destination = {d: {x for dd, x, *_ in served if dd == d} for d in expected}
    assert by_destination == expected
    assert len(served) == sum(len(v) for v in expected.values())  # nothing twice
    for destination, x_id, _, got, count in served:
        assert got == body(x_id), (destination, x_id)
        assert count == 1 or destination == "/queue/a", (destination, x_id, count)
    redelivered = {x for _, x, _, _, count in served if count == 2}
    # got[5:] (one acked in the open transaction), and six more the acks made room for
    assert unacked <= redelivered and len(redelivered) == 11, redelivered
