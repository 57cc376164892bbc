"""Users and rules changed at run time are journal records (core/accounts.py): a restart, a
compaction that rewrites their segment, and the records' bytes round-trip keep them,
removals too."""

from __future__ import annotations

import asyncio

from pairmq.core.accounts import Accounts
from pairmq.core.permissions import Permission, Rule, SecurityRules
from pairmq.store.records import (
    decode_entries,
    encode_rule,
    encode_unrule,
    encode_unuser,
    encode_user,
)
from pairmq.store.segments import list_segments
from tests.store.test_journal import NOW, PERSISTENT, close, open_broker, persist, run, synced


def test_user_records_round_trip() -> None:
    payload = encode_user("ann", "scrypt$abc", ("producers", "ops")) + encode_unuser("bob")
    assert decode_entries(payload) == [(14, "ann", "scrypt$abc", ("producers", "ops")),
                                       (15, "bob")]


def test_rule_records_round_trip() -> None:
    grants = (("send", ("producers",)), ("consume", ("a", "b")))
    payload = encode_rule("orders.#", grants) + encode_unrule("#")
    assert decode_entries(payload) == [(16, "orders.#", grants), (17, "#")]


def test_rules_lie_over_the_configuration() -> None:
    accounts = Accounts()
    assert accounts.rules_over(None) is None  # none anywhere: everything allowed
    filed = SecurityRules([Rule("orders.#", {Permission.SEND: frozenset({"p"})}),
                           Rule("#", {Permission.SEND: frozenset({"ops"})})])
    accounts.set_rule("orders.eu", (("send", ("eu",)),))
    accounts.remove_rule("#")
    rules = accounts.rules_over(filed)
    assert rules is not None and [r.pattern for r in rules.rules] == ["orders.eu", "orders.#"]
    assert rules.allows({"eu"}, Permission.SEND, "/queue/orders.eu")
    assert not rules.allows({"ops"}, Permission.SEND, "/queue/billing")  # "#" removed
    assert accounts.rules_over(filed) is rules  # kept until the next change


def test_accounts_lie_over_the_configuration() -> None:
    accounts = Accounts()
    configured = {"file-only": "F", "changed": "old", "removed": "R"}
    accounts.set_user("changed", "new-hash", ("a",))
    accounts.set_user("added", "h", ())
    accounts.remove_user("removed")
    effective = accounts.over(configured)
    assert set(effective) == {"file-only", "changed", "added"}
    assert effective["changed"].password == "new-hash"
    assert effective["file-only"] == "F"


def test_users_survive_a_restart_and_a_compaction_of_their_segment(tmp_path) -> None:
    async def first():
        broker, store = await open_broker(tmp_path, segment_bytes=64 * 1024)
        broker.set_user("ann", "scrypt$1", ("producers",))
        broker.set_user("bob", "scrypt$2", ("consumers",))
        broker.remove_user("bob")
        broker.set_user("ann", "scrypt$3", ("producers", "ops"))  # passwd and a new role
        broker.set_rule("orders.#", (("send", ("producers",)),))
        broker.remove_rule("#")
        persist(broker, store)
        broker.open_session(1, "1.2")
        broker.subscribe(1, "s", "/queue/work", NOW, ack="client-individual")
        for i in range(3000):  # enough traffic for the first segments to be compacted
            broker.send(1, "/queue/work", PERSISTENT, b"x" * 500, NOW)
            persist(broker, store)
            for d in broker.take_outbox().get(1, []):
                broker.ack(1, d.ack_id, NOW)
            persist(broker, store)
            if i % 100 == 0:
                await synced(store)
                await asyncio.sleep(0)
        for _ in range(20):
            await synced(store)
            await asyncio.sleep(0.01)
        await close(store)

    run(first())
    (first_id, _), *_ = list_segments(tmp_path)
    assert first_id > 1, "the segment holding the user records was rewritten away"

    async def second():
        broker, store = await open_broker(tmp_path)
        users = broker.accounts.users
        assert users["ann"] is not None and users["ann"].password == "scrypt$3"
        assert users["ann"].roles == ("producers", "ops")
        assert users["bob"] is None  # the removal is remembered
        assert broker.accounts.rules == {"orders.#": (("send", ("producers",)),), "#": None}
        await close(store)

    run(second())
