"""Permissions per destination (core/permissions.py): Artemis' wildcards, the most specific
rule deciding alone, and what each frame needs."""

from __future__ import annotations

import pytest

from pairmq.core.permissions import (
    Exists,
    Permission,
    Rule,
    SecurityRules,
    needed,
    rule_pattern_problem,
)

P = Permission

# Artemis' wildcard documentation's examples, and edges of ours
MATCHES = [
    ("news.europe.#", "news.europe", True),
    ("news.europe.#", "news.europe.sport", True),
    ("news.europe.#", "news.europe.politics.regional", True),
    ("news.europe.#", "news.usa", False),
    ("news.europe.#", "news.europeans", False),
    ("news.*", "news.europe", True),
    ("news.*", "news.europe.sport", False),
    ("news.*", "news", False),
    ("news.*.sport", "news.europe.sport", True),
    ("news.*.sport", "news.usa.sport", True),
    ("news.*.sport", "news.europe.politics", False),
    ("#", "anything.at.all", True),
    ("#.sport", "sport", True),
    ("#.sport", "news.europe.sport", True),
    ("orders", "orders", True),
    ("orders", "orders.eu", False),
]


def rules(*patterns: tuple[str, dict[P, set[str]]]) -> SecurityRules:
    return SecurityRules(Rule(p, {k: frozenset(v) for k, v in g.items()}) for p, g in patterns)


@pytest.mark.parametrize(("pattern", "name", "matches"), MATCHES)
def test_wildcards_match_as_artemis_documents(pattern, name, matches) -> None:
    found = rules((pattern, {P.SEND: {"r"}})).rule_for(name)
    assert (found is not None) == matches


def test_the_most_specific_rule_decides_alone() -> None:
    r = rules(("#", {P.SEND: {"everyone"}, P.CONSUME: {"everyone"}}),
              ("orders.#", {P.SEND: {"producers"}}),
              ("orders.*", {P.SEND: {"eu-producers"}}),
              ("orders.eu", {P.SEND: {"eu-desk"}}))
    assert r.allows({"eu-desk"}, P.SEND, "/queue/orders.eu")
    assert not r.allows({"producers"}, P.SEND, "/queue/orders.eu")  # not a union
    assert r.allows({"eu-producers"}, P.SEND, "/topic/orders.us")
    assert r.allows({"producers"}, P.SEND, "/queue/orders.us.west")
    # a narrow rule takes away what a wide one gave: orders.* grants no consume
    assert not r.allows({"everyone"}, P.CONSUME, "/queue/orders.us")
    assert r.allows({"everyone"}, P.CONSUME, "/queue/billing")
    # rules exist but none is about it: nobody
    assert not rules(("orders.#", {P.SEND: {"x"}})).allows({"x"}, P.SEND, "/queue/other")
    # a connection's own temporary queues are not named by rules
    assert rules().allows((), P.SEND, "/reply-queue/abc")


def test_what_each_frame_needs() -> None:
    none = Exists()
    assert needed("SEND", {"destination": "/queue/a"}, none) == [(P.SEND, "/queue/a")]
    assert needed("SUBSCRIBE", {"destination": "/queue/a", "id": "1"}, none) == [
        (P.CONSUME, "/queue/a")]
    assert needed("SUBSCRIBE", {"destination": "/topic/t", "id": "1"}, none) == [
        (P.CONSUME, "/topic/t"), (P.CREATE_NON_DURABLE_QUEUE, "/topic/t")]
    durable = {"destination": "/topic/t", "id": "1", "activemq.subscriptionName": "d"}
    assert needed("SUBSCRIBE", durable, none) == [
        (P.CONSUME, "/topic/t"), (P.CREATE_DURABLE_QUEUE, "/topic/t")]
    # it exists on that topic: consuming from it again creates nothing
    assert needed("SUBSCRIBE", durable, Exists("/topic/t")) == [(P.CONSUME, "/topic/t")]
    assert needed("SUBSCRIBE", {"destination": "/temp-queue/x", "id": "1"}, none) == [
        (P.CREATE_NON_DURABLE_QUEUE, "/temp-queue/x")]
    assert needed("UNSUBSCRIBE", {"id": "1", "durable": "true"}, Exists("/topic/t")) == [
        (P.DELETE_DURABLE_QUEUE, "/topic/t")]
    assert needed("UNSUBSCRIBE", {"id": "1"}, none) == []
    assert needed("ACK", {"id": "x"}, none) == []


def test_a_refusal_names_the_user_the_permission_and_the_destination() -> None:
    r = rules(("orders.#", {P.SEND: {"producers"}}))
    refusal = r.refusal("bob", {"consumers"}, [(P.SEND, "/queue/orders.eu")])
    assert str(refusal) == ("permission denied: user 'bob' lacks permission send on "
                            "/queue/orders.eu (granted to roles: producers)")
    assert r.refusal("ann", {"producers"}, [(P.SEND, "/queue/orders.eu")]) is None


@pytest.mark.parametrize("pattern", ["", "/queue/orders", "orders..eu", ".orders"])
def test_bad_patterns_are_named(pattern) -> None:
    assert rule_pattern_problem(pattern) is not None
