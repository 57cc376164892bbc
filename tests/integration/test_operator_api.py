"""The operator's JSON API on a real server (docs/operations.md): what the console and the
`pairmq` commands call. stomp.py clients do the messaging; every action's effect is
checked through them, not only through the API's answer."""

from __future__ import annotations

import time

from tests.support.admin import admin_request, api, managed_server
from tests.support.waiting import wait_until

P = {"persistent": "true"}


def row(admin: str, destination: str) -> dict:
    rows = api(admin, "/api/destinations")["destinations"]
    return next(r for r in rows if r["name"] == destination)


def test_destinations_show_depth_consumers_age_and_rates(server_factory, stomp_client) -> None:
    srv, admin = managed_server(server_factory)
    producer = stomp_client(srv)
    for i in range(10):
        producer.send("/queue/listed", f"m{i}", **P)
    first = row(admin, "/queue/listed")
    assert first["messages"] == 10 and first["consumers"] == 0 and first["kind"] == "queue"
    assert first["first_message_age_s"] is not None and first["first_message_age_s"] >= 0
    time.sleep(0.6)
    for i in range(10, 20):
        producer.send("/queue/listed", f"m{i}", **P)
    second = row(admin, "/queue/listed")
    assert second["enqueued"] == 20
    assert second["rate_in"] is not None and second["rate_in"] > 0
    assert second["rate_out"] == 0


def test_browse_shows_the_first_messages_and_takes_none(server_factory, stomp_client) -> None:
    srv, admin = managed_server(server_factory)
    producer = stomp_client(srv)
    for i in range(5):
        producer.send("/queue/browsed", f"body-{i}", kind="order", **P)
    seen = api(admin, "/api/messages?destination=/queue/browsed&limit=3")["messages"]
    assert [m["body"] for m in seen] == ["body-0", "body-1", "body-2"]
    assert seen[0]["headers"]["kind"] == "order" and seen[0]["persistent"] is True
    consumer = stomp_client(srv)
    consumer.subscribe("/queue/browsed", id="c")
    assert [m.body for m in consumer.wait_messages(5)] == [f"body-{i}" for i in range(5)]


def test_purge_empties_a_queue_but_not_what_a_consumer_holds(server_factory,
                                                             stomp_client) -> None:
    srv, admin = managed_server(server_factory)
    producer = stomp_client(srv)
    for i in range(6):
        producer.send("/queue/purged", f"m{i}", **P)
    holder = stomp_client(srv)
    holder.subscribe("/queue/purged", id="h", ack="client-individual",
                     headers={"prefetch-count": "2"})
    held = holder.wait_messages(2)
    done = api(admin, "/api/purge", {"destination": "/queue/purged"})
    assert (done["count"], done["paged_left"]) == (4, 0)
    assert row(admin, "/queue/purged")["messages"] == 0
    holder.ack(held[0])
    holder.unsubscribe("h")  # held[1] goes back: it is still there for the next consumer
    late = stomp_client(srv)
    late.subscribe("/queue/purged", id="l")
    assert [m.body for m in late.wait_messages(1)] == [held[1].body]
    time.sleep(0.3)
    assert len(late.messages) == 1, "purged messages came back"


def test_a_paging_queue_is_purged_past_its_memory(server_factory, stomp_client) -> None:
    srv, admin = managed_server(server_factory, "--max-size-bytes", str(32 * 1024))
    producer = stomp_client(srv)
    for i in range(400):
        producer.send("/queue/paged", f"{i:04d}" + "x" * 1000, **P)
    assert row(admin, "/queue/paged")["paged_messages"] > 0
    done = api(admin, "/api/purge", {"destination": "/queue/paged"})
    assert (done["count"], done["paged_left"]) == (400, 0)
    after = row(admin, "/queue/paged")
    assert (after["messages"], after["paged_messages"]) == (0, 0)


def test_a_dead_letter_queue_is_retried_to_where_its_messages_came_from(
        server_factory, stomp_client) -> None:
    srv, admin = managed_server(server_factory, "--max-delivery-attempts", "1")
    producer = stomp_client(srv)
    producer.send("/queue/work", "job-1", **P)
    worker = stomp_client(srv)
    worker.subscribe("/queue/work", id="w", ack="client-individual")
    worker.nack(worker.wait_messages(1)[0])
    wait_until(lambda: row(admin, "/queue/DLQ.work")["messages"] == 1, "dead letter")
    worker.unsubscribe("w")
    done = api(admin, "/api/move", {"source": "/queue/DLQ.work", "target": None, "limit": 0})
    assert done["count"] == 1
    again = stomp_client(srv)
    again.subscribe("/queue/work", id="a")
    [retried] = again.wait_messages(1)
    assert retried.body == "job-1" and "dead-letter-reason" not in retried.headers
    assert row(admin, "/queue/DLQ.work")["messages"] == 0


def test_connections_are_listed_and_one_is_closed_with_a_reason(server_factory,
                                                                 stomp_client) -> None:
    srv, admin = managed_server(server_factory, "--user", "alice:secret-a")
    alice = stomp_client(srv, login="alice", passcode="secret-a")
    other = stomp_client(srv)
    rows = api(admin, "/api/connections")["connections"]
    mine = [r for r in rows if r["user"] == "alice"]
    assert len(mine) == 1 and mine[0]["protocol"] == "stomp" and mine[0]["version"] == "1.2"
    assert mine[0]["state"] == "connected"
    done = api(admin, f"/api/connections/{mine[0]['id']}/close", {})
    assert done == {"closed": mine[0]["id"]}
    error = alice.wait_error()
    assert "closed by an operator" in error.headers["message"]
    other.send("/queue/still", "fine")  # everyone else is served on
    code, _, body = admin_request(admin, "/api/connections/999999/close", method="POST",
                                  data={})
    assert code == 404 and "no connection 999999" in body["error"]


def test_bad_requests_name_the_problem(server_factory) -> None:
    _srv, admin = managed_server(server_factory)
    code, _, body = admin_request(admin, "/api/purge", method="POST",
                                  data={"destination": "/topic/news"})
    assert code == 400 and "no queue /topic/news" in body["error"]
    code, _, body = admin_request(admin, "/api/move", method="POST",
                                  data={"source": "/queue/a", "limit": -1})
    assert code == 400 and "limit" in body["error"]
