"""Outcomes the client cannot know by itself, made real: the answer to a COMMIT lost with
the connection (a proxy passes the COMMIT up and loses its RECEIPT), and an ack made while
the client reconnects."""

from __future__ import annotations

import time

import pytest

from pairmq.client import AckFailed, Outcome, TransactionOutcomeUnknown


def test_a_commit_whose_answer_was_lost_has_an_unknown_outcome_and_redoing_it_is_harmless(
        server, proxy, client_factory):
    client = client_factory(f"failover:(stomp://{proxy.address})", connection_ttl=0)
    client.begin()
    first = client.send("/queue/unknown", b"a", headers={"dup-id": "order-1"})
    client.send("/queue/unknown", b"b", headers={"dup-id": "order-2"})
    proxy.arm("down")  # the COMMIT reaches the server, its RECEIPT is lost
    proxy_drop_soon(proxy)  # then the connection breaks
    with pytest.raises(TransactionOutcomeUnknown) as caught:
        client.commit()
    assert caught.value.outcome is Outcome.UNKNOWN
    assert first.outcome is Outcome.PENDING  # its transaction's fate is not known either
    with client.transaction():  # done again, same dup-ids: the server keeps one copy
        client.send("/queue/unknown", b"a", headers={"dup-id": "order-1"})
        client.send("/queue/unknown", b"b", headers={"dup-id": "order-2"})
    sub = client.subscribe("/queue/unknown")
    bodies = []
    while (message := sub.receive(1)) is not None:
        bodies.append(message.body)
        client.ack(message)
    assert bodies == [b"a", b"b"]


def proxy_drop_soon(proxy) -> None:
    """Drop the proxied connections 0.3 s from now (after the COMMIT went up)."""
    import threading

    threading.Timer(0.3, lambda: proxy.heal(drop=True)).start()


def test_an_ack_made_while_the_client_reconnects_waits_and_says_if_it_was_voided(
        server, proxy, client_factory):
    client = client_factory(f"failover:(stomp://{proxy.address})", connection_ttl=0)
    client.send("/queue/ack-late", b"x")
    sub = client.subscribe("/queue/ack-late")
    message = sub.receive(5)
    proxy.stop()  # the connection breaks; nothing answers for a while
    time.sleep(0.2)
    restart = NetProxyRestarter(proxy, after=0.5)
    restart.start()
    with pytest.raises(AckFailed):
        client.ack(message)  # waited for the reconnection: a fresh session voided it
    again = sub.receive(5)
    assert again.body == b"x" and again.redelivered
    client.ack(again)
    restart.join()


class NetProxyRestarter:
    """Start the proxy again, on the same port, after a delay (in a thread)."""

    def __init__(self, proxy, after: float) -> None:
        import threading

        self.proxy = proxy
        self.thread = threading.Timer(after, self._restart)

    def _restart(self) -> None:
        self.proxy.proc = None
        self.proxy.start()

    def start(self) -> None:
        self.thread.start()

    def join(self) -> None:
        self.thread.join(10)
