"""client/topology.py: an ERROR's `scaled-down-to` moves the client to the member named."""

from __future__ import annotations

from pairmq.client.topology import Servers


def test_a_redirect_to_a_known_member_makes_it_current() -> None:
    servers = Servers((), ((("a", 1),), (("b", 2), ("b2", 3))), start=0)
    assert servers.redirect("failover:(stomp://b:2,stomp://b2:3)") == 1
    assert servers.member == 1 and servers.order()[0] == ("b", 2)


def test_a_redirect_to_a_member_not_in_the_url_adds_it() -> None:
    servers = Servers((("a", 1),))
    assert servers.redirect("stomp://c:4") == 1
    assert servers.known == [("c", 4)]


def test_an_unreadable_redirect_changes_nothing() -> None:
    servers = Servers((("a", 1),))
    assert servers.redirect("nonsense") is None
    assert servers.member == 0
