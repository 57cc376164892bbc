"""Permissions per destination on a real server (issue 19, docs/security.md), with stomp.py
and pairmq's client: every permission the server checks, allowed and denied. A refused
frame stores nothing, gets an ERROR naming the user, the permission and the destination
with its receipt-id, and the connection closes."""

from __future__ import annotations

import pytest

import pairmq.client
from pairmq.client import ServerError
from pairmq.client.plain import BlockingConnection

CONFIG = """
[auth]
allow_anonymous = true

[auth.users.prod]
password = "p"
roles = ["producers"]

[auth.users.cons]
password = "c"
roles = ["consumers"]

[auth.users.ops]
password = "o"
roles = ["ops"]

[security."orders.#"]
send = ["producers"]
consume = ["consumers"]
browse = ["ops"]
createDurableQueue = ["consumers"]
deleteDurableQueue = ["ops"]
createNonDurableQueue = ["consumers", "producers"]
deleteNonDurableQueue = ["consumers", "producers"]

[security."orders.audit"]
consume = ["ops"]

[security."news.#"]
consume = ["consumers"]

[security."#"]
send = ["ops"]
consume = ["ops"]
createDurableQueue = ["ops"]
deleteDurableQueue = ["ops"]
createNonDurableQueue = ["ops", "consumers", "producers"]
"""

USERS = {"prod": "p", "cons": "c", "ops": "o"}


@pytest.fixture
def srv(server_factory):
    return server_factory(config_text=CONFIG)


def login(stomp_client, srv, user: str | None):
    if user is None:
        return stomp_client(srv)
    return stomp_client(srv, login=user, passcode=USERS[user])


def refused(client, what: str) -> str:
    error = client.listener.wait_for(lambda: client.listener.errors, what=what)[0]
    client.listener.wait_for(lambda: client.listener.disconnected, what="the close")
    return error.headers["message"]


def depth(srv, destination: str, user: str = "ops") -> int:
    """Messages waiting, as a consumer allowed there sees them (drained, acknowledged)."""
    with pairmq.client.connect(f"{srv.host}:{srv.port}", login=user,
                               passcode=USERS[user]) as client:
        sub = client.subscribe(destination, ack="client-individual")
        count = 0
        while (message := sub.receive(0.5)) is not None:
            client.ack(message)
            count += 1
        return count


@pytest.mark.parametrize(("user", "allowed"), [("prod", True), ("cons", False),
                                               ("ops", False), (None, False)])
def test_send(srv, stomp_client, user, allowed) -> None:
    client = login(stomp_client, srv, user)
    if allowed:
        client.send("/queue/orders.eu", "order")
        assert depth(srv, "/queue/orders.eu", "cons") == 1
        return
    client.conn.send("/queue/orders.eu", "order", headers={"receipt": "r-send"})
    message = refused(client, "the refusal")
    who = f"user '{user}'" if user else "an anonymous client"
    assert message == (f"permission denied: {who} lacks permission send on "
                       "/queue/orders.eu (granted to roles: producers)")
    error = client.listener.errors[0]
    assert error.headers.get("receipt-id") == "r-send"
    assert depth(srv, "/queue/orders.eu", "cons") == 0  # nothing stored


@pytest.mark.parametrize(("user", "allowed"), [("cons", True), ("prod", False),
                                               ("ops", False)])
def test_consume_from_a_queue(srv, stomp_client, user, allowed) -> None:
    login(stomp_client, srv, "prod").send("/queue/orders.us", "kept")
    client = login(stomp_client, srv, user)
    if allowed:
        client.subscribe("/queue/orders.us", ack="client-individual")
        assert client.wait_messages(1)[0].body == "kept"
        return
    client.conn.subscribe("/queue/orders.us", "s1", headers={"receipt": "r-sub"})
    assert "lacks permission consume on /queue/orders.us" in refused(client, "refusal")
    assert depth(srv, "/queue/orders.us", "cons") == 1  # still there for others


def test_the_most_specific_rule_takes_consume_away(srv, stomp_client) -> None:
    client = login(stomp_client, srv, "cons")
    client.conn.subscribe("/queue/orders.audit", "s1")
    assert "lacks permission consume on /queue/orders.audit (granted to roles: ops)" in \
        refused(client, "refusal")
    login(stomp_client, srv, "ops").subscribe("/queue/orders.audit")


def test_a_non_durable_topic_subscription_needs_create_non_durable_queue(srv, stomp_client
                                                                         ) -> None:
    login(stomp_client, srv, "cons").subscribe("/topic/orders.news")
    # ops may consume under "#" and create there, but orders.# gives it no consume
    client = login(stomp_client, srv, "ops")
    client.conn.subscribe("/topic/orders.news", "t1")
    assert "lacks permission consume" in refused(client, "refusal")
    # news.# lets consumers consume but create nothing: no subscription queue for them
    client = login(stomp_client, srv, "cons")
    client.conn.subscribe("/topic/news.eu", "t2")
    assert "lacks permission createNonDurableQueue on /topic/news.eu" in \
        refused(client, "refusal")
    durable = stomp_client(srv, login="cons", passcode="c", headers={"client-id": "n"})
    durable.conn.subscribe("/topic/news.eu", "d1", headers={"durable": "true"})
    assert "lacks permission createDurableQueue on /topic/news.eu" in \
        refused(durable, "refusal")


def test_durable_subscriptions_need_create_then_delete_durable_queue(srv, stomp_client
                                                                     ) -> None:
    durable = {"activemq.subscriptionName": "eu-feed"}
    cons = stomp_client(srv, login="cons", passcode="c", headers={"client-id": "app"})
    cons.subscribe("/topic/orders.feed", id="d1", headers=durable)
    cons.unsubscribe("d1")  # detach: the durable subscription stays
    cons.disconnect()
    login(stomp_client, srv, "prod").send("/topic/orders.feed", "while away")
    # deleting it needs deleteDurableQueue: consumers lack it
    again = stomp_client(srv, login="cons", passcode="c", headers={"client-id": "app"})
    again.conn.unsubscribe("d1", headers={**durable, "receipt": "r-del"})
    assert "lacks permission deleteDurableQueue on /topic/orders.feed" in \
        refused(again, "refusal")
    again.close()
    # it was not deleted: the message waits in it
    back = stomp_client(srv, login="cons", passcode="c", headers={"client-id": "app"})
    back.subscribe("/topic/orders.feed", id="d1", headers=durable)
    assert back.wait_messages(1)[0].body == "while away"
    # a producer may not create one
    prod = stomp_client(srv, login="prod", passcode="p", headers={"client-id": "p"})
    prod.conn.subscribe("/topic/orders.feed", "d2", headers={"durable": "true"})
    message = refused(prod, "refusal")
    assert "lacks permission consume" in message


def test_ops_deletes_a_durable_subscription(srv, stomp_client) -> None:
    durable = {"activemq.subscriptionName": "misc"}
    ops = stomp_client(srv, login="ops", passcode="o", headers={"client-id": "o"})
    ops.subscribe("/topic/misc", id="m1", headers=durable)
    ops.unsubscribe("m1", headers=durable)  # with the name: deleted (receipted, no ERROR)
    # gone: a message sent now waits in no subscription, and the same name subscribed again
    # is a new, empty one (a kept one would hand "while away" out before "after")
    ops.send("/topic/misc", "while away")
    ops.subscribe("/topic/misc", id="m2", headers=durable)
    assert ops.bodies_up_to_marker("/topic/misc") == ["after"]
    assert ops.listener.errors == []


def test_ending_a_non_durable_topic_subscription_needs_delete_non_durable_queue(
        srv, stomp_client) -> None:
    # consumers may delete their subscription queues under orders.#
    cons = login(stomp_client, srv, "cons")
    cons.subscribe("/topic/orders.news", id="t1")
    cons.unsubscribe("t1")
    # under "#", ops may create one but not delete it (as Artemis checks when a
    # subscription's queue goes with its UNSUBSCRIBE)
    ops = login(stomp_client, srv, "ops")
    ops.subscribe("/topic/misc.news", id="t2")
    ops.conn.unsubscribe("t2", headers={"receipt": "r-unsub"})
    assert "user 'ops' lacks permission deleteNonDurableQueue on /topic/misc.news " \
        "(granted to roles: none)" in refused(ops, "refusal")
    assert ops.listener.errors[0].headers.get("receipt-id") == "r-unsub"


@pytest.mark.parametrize(("user", "allowed"), [("ops", True), ("cons", False),
                                               ("prod", False)])
def test_browse_a_queue(srv, stomp_client, user, allowed) -> None:
    producer = login(stomp_client, srv, "prod")
    for i in range(3):
        producer.send("/queue/orders.browse", f"m{i}")
    client = login(stomp_client, srv, user)
    if allowed:
        client.subscribe("/queue/orders.browse", id="b1", headers={"browser": "true"})
        frames = client.wait_messages(4)
        assert [f.body for f in frames[:3]] == ["m0", "m1", "m2"]
        assert frames[3].headers.get("browser") == "end"
        assert depth(srv, "/queue/orders.browse", "cons") == 3  # all still there
        return
    client.conn.subscribe("/queue/orders.browse", "b1", headers={"browser": "true"})
    assert f"user '{user}' lacks permission browse on /queue/orders.browse (granted to " \
        "roles: ops)" in refused(client, "refusal")
    assert depth(srv, "/queue/orders.browse", "cons") == 3


def test_a_temporary_queue_needs_create_non_durable_queue(srv, stomp_client) -> None:
    login(stomp_client, srv, "prod").subscribe("/temp-queue/replies")
    anonymous = login(stomp_client, srv, None)
    anonymous.conn.subscribe("/temp-queue/replies", "t1")
    assert "an anonymous client lacks permission createNonDurableQueue" in \
        refused(anonymous, "refusal")


def test_a_batched_send_is_refused_as_a_whole(srv) -> None:
    with pairmq.client.connect(f"{srv.host}:{srv.port}", login="cons", passcode="c",
                               reconnect_attempts=0) as client, \
            pytest.raises(ServerError, match=r"lacks permission send on /queue/orders\.bulk"):
        client.send_batch("/queue/orders.bulk", [(b"a", {}), (b"b", {}), (b"c", {})])
    assert depth(srv, "/queue/orders.bulk", "cons") == 0
    with pairmq.client.connect(f"{srv.host}:{srv.port}", login="prod",
                               passcode="p") as client:
        client.send_batch("/queue/orders.bulk", [(b"a", {}), (b"b", {}), (b"c", {})])
    assert depth(srv, "/queue/orders.bulk", "cons") == 3


def test_streams_are_checked_by_name_too(srv) -> None:
    conn = BlockingConnection(srv.host, srv.port, login="cons", passcode="c")
    try:
        with pytest.raises(Exception, match=r"lacks permission send on /stream/orders\.log"):
            conn.send("/stream/orders.log", b"x")
    finally:
        conn.close()


def test_without_rules_the_server_warns_and_allows_everything(server_factory, stomp_client
                                                               ) -> None:
    srv = server_factory("--user", "anyone:x")
    stomp_client(srv, login="anyone", passcode="x").send("/queue/orders.eu", "fine")
    assert "No [security] rules" in srv.logs()
