"""Users and rules changed at run time are journal records (core/accounts.py): a restart, a
compaction that rewrites their segment, and the records' bytes round-trip keep them,
removals too."""

from __future__ import annotations

from pairmq.core.accounts import Accounts
from pairmq.core.permissions import Permission, Rule, SecurityRules
from pairmq.store.record_decoding import decode_entries
from pairmq.store.records import encode_rule, encode_unrule, encode_unuser, encode_user
from pairmq.store.segments import list_segments
from tests.support.stores import churn, close, open_broker, persist, run


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
        await churn(broker, store, 3000)  # its first segments compacted away
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
