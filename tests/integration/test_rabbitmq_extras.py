"""What users of RabbitMQ's STOMP plugin type without thinking (issue 23), against a real
server with stomp.py, headers written as RabbitMQ's documentation writes them:
`requeue:false` on NACK, `reply-to:/temp-queue/NAME` without a SUBSCRIBE, and the queue
arguments (`x-max-length`, `x-message-ttl`, `x-dead-letter-exchange`, ...) of the SUBSCRIBE
that makes a queue (docs/stomp.md)."""

from __future__ import annotations

import time

from tests.integration.clients import Client
from tests.integration.rawstomp import unique, unique_queue
from tests.support.servers import restart, shared_server

# One server for the tests that need no fresh one (each names its own queues).
server = shared_server("rabbitmq-extras")


def nack(client: Client, message, transaction: str | None = None, **headers: str) -> None:
    """NACK with extra headers (requeue), waiting for its receipt."""
    rid = unique("nack")
    client.conn.nack(message.headers["ack"], transaction=transaction, receipt=rid, **headers)
    client.wait_receipt(rid)


def drain(server, stomp_client, destination: str, expected: int) -> list:
    """The messages waiting in `destination` (a new consumer takes them all and leaves);
    checks that no more come."""
    consumer = stomp_client(server)
    sub = consumer.subscribe(destination)
    got = consumer.wait_messages(expected) if expected else []
    time.sleep(0.2)
    consumer.unsubscribe(sub)
    assert len(consumer.messages) == expected, consumer.bodies()
    return got


# -- NACK requeue:false --------------------------------------------------------------------------


def test_nack_requeue_false_dead_letters_and_requeue_true_redelivers(server, stomp_client):
    name, queue = unique_queue()
    producer = stomp_client(server)
    for body in ("rejected", "retried", "plain"):
        producer.send(queue, body, persistent="true")
    consumer = stomp_client(server)
    consumer.subscribe(queue, ack="client-individual")
    rejected, retried, plain = consumer.wait_messages(3)
    nack(consumer, rejected, requeue="false")
    nack(consumer, retried, requeue="true")
    nack(consumer, plain)
    again = consumer.wait_messages(5)[3:]
    assert sorted(m.body for m in again) == ["plain", "retried"]
    assert all(m.headers["redelivered"] == "true" for m in again)
    for m in again:
        consumer.ack(m)
    (dead,) = drain(server, stomp_client, f"/queue/DLQ.{name}", 1)
    assert dead.body == "rejected"
    assert dead.headers["dead-letter-reason"] == "rejected"
    assert dead.headers["original-destination"] == queue


def test_nack_requeue_false_in_a_transaction_takes_effect_at_commit(server, stomp_client):
    name, queue = unique_queue()
    stomp_client(server).send(queue, "job")
    consumer = stomp_client(server)
    consumer.subscribe(queue, ack="client-individual")
    (first,) = consumer.wait_messages(1)
    consumer.begin("t1")
    nack(consumer, first, transaction="t1", requeue="false")
    consumer.abort("t1")  # nothing happened: the message comes back
    second = consumer.wait_messages(2)[1]
    assert second.body == "job" and second.headers["redelivered"] == "true"
    consumer.begin("t2")
    nack(consumer, second, transaction="t2", requeue="false")
    drain(server, stomp_client, f"/queue/DLQ.{name}", 0)  # not before the COMMIT
    consumer.commit("t2")
    (dead,) = drain(server, stomp_client, f"/queue/DLQ.{name}", 1)
    assert dead.headers["dead-letter-reason"] == "rejected"


def test_a_bad_requeue_value_gets_an_error(server, stomp_client):
    _, queue = unique_queue()
    stomp_client(server).send(queue, "x")
    consumer = stomp_client(server)
    consumer.subscribe(queue, ack="client-individual")
    (message,) = consumer.wait_messages(1)
    consumer.conn.nack(message.headers["ack"], requeue="maybe")
    assert "requeue" in consumer.wait_error().headers["message"]
    assert "maybe" in consumer.errors[0].headers["message"]


# -- reply-to:/temp-queue/NAME subscribes its sender -----------------------------------------


def serve(server, stomp_client) -> tuple[Client, str]:
    """A responder: consumes a request queue and answers each request to its reply-to."""
    _, requests = unique_queue()
    responder = stomp_client(server)

    class Answer:
        def on_message(self, frame):
            reply_to = frame.headers.get("reply-to")
            if reply_to:
                responder.conn.send(reply_to, f"re: {frame.body}")

    responder.conn.set_listener("answer", Answer())
    responder.subscribe(requests)
    return responder, requests


def test_reply_to_a_temp_queue_subscribes_the_sender(server, stomp_client):
    _, requests = serve(server, stomp_client)
    requester = stomp_client(server)  # never SUBSCRIBEs
    requester.send(requests, "what time is it?", **{"reply-to": "/temp-queue/foo"})
    (reply,) = requester.wait_messages(1)
    assert reply.body == "re: what time is it?"
    assert reply.headers["subscription"] == "/temp-queue/foo"
    assert reply.headers["destination"].startswith("/reply-queue/")
    requester.send(requests, "again", **{"reply-to": "/temp-queue/foo"})  # one subscription
    requester.wait_body("re: again")
    time.sleep(0.2)
    assert requester.bodies() == ["re: what time is it?", "re: again"]


def test_an_explicit_temp_queue_subscription_is_kept_or_takes_over(server, stomp_client):
    _, requests = serve(server, stomp_client)
    before = stomp_client(server)  # subscribed first: that subscription gets the replies
    before.subscribe("/temp-queue/mine", id="explicit")
    before.send(requests, "one", **{"reply-to": "/temp-queue/mine"})
    assert before.wait_body("re: one").headers["subscription"] == "explicit"
    after = stomp_client(server)  # subscribed after the reply-to: the new one takes over
    after.send(requests, "two", **{"reply-to": "/temp-queue/mine"})
    assert after.wait_body("re: two").headers["subscription"] == "/temp-queue/mine"
    after.subscribe("/temp-queue/mine", id="late")
    for body in ("three", "four", "five"):  # two subscriptions would share them
        after.send(requests, body, **{"reply-to": "/temp-queue/mine"})
    after.wait_messages(4)
    time.sleep(0.2)
    assert [(m.body, m.headers["subscription"]) for m in after.messages] == [
        ("re: two", "/temp-queue/mine"), ("re: three", "late"), ("re: four", "late"),
        ("re: five", "late")]
    before.send(requests, "six", **{"reply-to": "/temp-queue/mine"})
    before.wait_body("re: six")
    assert [m.headers["subscription"] for m in before.messages] == ["explicit"] * 2


# -- queue arguments on the SUBSCRIBE that makes a queue ---------------------------------------


def make_queue(client: Client, queue: str, **headers: str) -> None:
    """SUBSCRIBE (which makes the queue with these x- headers), then UNSUBSCRIBE: the queue
    stays, with nobody taking what is sent to it."""
    sub = client.subscribe(queue, headers=headers)
    client.unsubscribe(sub)


def test_x_max_length_drops_the_head_to_the_dead_letter_queue(server, stomp_client):
    name, queue = unique_queue()
    _, dead = unique_queue()
    client = stomp_client(server)
    make_queue(client, queue, **{"x-max-length": "2", "x-dead-letter-exchange": "",
                                 "x-dead-letter-routing-key": dead[len("/queue/"):]})
    for i in range(5):
        client.send(queue, f"m{i}", persistent="true")
    assert [m.body for m in drain(server, stomp_client, queue, 2)] == ["m3", "m4"]
    dropped = drain(server, stomp_client, dead, 3)
    assert [m.body for m in dropped] == ["m0", "m1", "m2"]
    assert {m.headers["dead-letter-reason"] for m in dropped} == {"maxlen"}
    drain(server, stomp_client, f"/queue/DLQ.{name}", 0)  # the named one replaces it


def test_x_message_ttl_expires_what_waits_too_long(server, stomp_client):
    name, queue = unique_queue()
    client = stomp_client(server)
    make_queue(client, queue, **{"x-message-ttl": "300"})
    client.send(queue, "stale")
    time.sleep(0.5)
    client.send(queue, "fresh")
    assert [m.body for m in drain(server, stomp_client, queue, 1)] == ["fresh"]
    (expired,) = drain(server, stomp_client, f"/queue/DLQ.{name}", 1)
    assert expired.body == "stale" and expired.headers["dead-letter-reason"] == "expired"


def test_x_max_length_bytes_with_reject_publish_refuses_the_send(server, stomp_client):
    _, queue = unique_queue()
    client = stomp_client(server)
    make_queue(client, queue, **{"x-max-length-bytes": "1000", "x-overflow": "reject-publish"})
    client.send(queue, "a" * 600)
    client.send(queue, "b" * 600)  # taken: the queue is past its limit now
    client.conn.send(queue, "c" * 600, headers={"receipt": "refused"})
    error = client.wait_error()
    assert "full" in error.headers["message"] and "1000" in error.headers["message"]
    assert error.headers.get("receipt-id") == "refused"


def test_an_existing_queue_keeps_its_settings(server, stomp_client):
    _, queue = unique_queue()
    client = stomp_client(server)
    make_queue(client, queue)  # made without arguments
    make_queue(client, queue, **{"x-max-length": "1"})
    for body in ("first", "second", "third"):
        client.send(queue, body)
    assert len(drain(server, stomp_client, queue, 3)) == 3


BAD_ARGUMENTS = [
    ("x-max-length", "ten"), ("x-message-ttl", "-5"), ("x-max-length-bytes", "0"),
    ("x-overflow", "drop-tail"), ("x-overflow", "reject-publish-dlx"),
    ("x-dead-letter-exchange", "dlx"), ("x-dead-letter-routing-key", "orphan"),
    ("x-queue-type", "stream"), ("x-max-priority", "300")]


def test_a_bad_or_unsupported_queue_argument_gets_an_error(server, stomp_client):
    for header, value in BAD_ARGUMENTS:  # one server for all (each ERROR closes its client)
        _, queue = unique_queue()
        client = stomp_client(server)
        client.conn.subscribe(queue, "s", headers={header: value, "receipt": "sub"})
        error = client.wait_error()
        said = error.headers["message"]
        assert header in said and value in said, (header, value, said)
        assert error.headers.get("receipt-id") == "sub"


def test_queue_arguments_and_a_requeue_false_dead_letter_survive_a_restart(
        server_factory, stomp_client):
    srv = server_factory()
    name, rejected = unique_queue()
    _, queue = unique_queue()
    _, dead = unique_queue()
    make_queue(stomp_client(srv), queue, **{"x-max-length": "1", "x-dead-letter-exchange": "",
                                            "x-dead-letter-routing-key": dead[len("/queue/"):]})
    stomp_client(srv).send(rejected, "doomed", persistent="true")
    consumer = stomp_client(srv)
    consumer.subscribe(rejected, ack="client-individual")
    nack(consumer, consumer.wait_messages(1)[0], requeue="false")
    srv = restart(srv)
    drain(srv, stomp_client, rejected, 0)
    assert drain(srv, stomp_client, f"/queue/DLQ.{name}", 1)[0].body == "doomed"
    client = stomp_client(srv)  # the queue's settings came back from the journal
    for body in ("a", "b", "c"):
        client.send(queue, body, persistent="true")
    assert [m.body for m in drain(srv, stomp_client, queue, 1)] == ["c"]
    assert [m.body for m in drain(srv, stomp_client, dead, 2)] == ["a", "b"]


def test_queue_arguments_survive_a_failover(pair, stomp_client):
    _, queue = unique_queue()
    _, dead = unique_queue()
    make_queue(stomp_client(pair.servers["primary"]), queue,
               **{"x-max-length": "1", "x-dead-letter-exchange": "",
                  "x-dead-letter-routing-key": dead[len("/queue/"):]})
    pair.kill("primary")
    pair.wait_active(15, "backup")
    backup = pair.servers["backup"]
    client = stomp_client(backup)
    for body in ("a", "b", "c"):
        client.send(queue, body, persistent="true")
    assert [m.body for m in drain(backup, stomp_client, queue, 1)] == ["c"]
    assert [m.body for m in drain(backup, stomp_client, dead, 2)] == ["a", "b"]
