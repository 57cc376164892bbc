"""Both servers down: the one with the newest journal serves when they are back, in either
start order; a server alone with an older journal waits until an operator forces it."""

from __future__ import annotations

import json

import pytest

from pairmq.client.plain import BlockingConnection, StompError
from tests.ha.clients import drain
from tests.ha.pair import HOST, Pair
from tests.netproxy import NetProxy
from tests.support.scenarios import QUEUE, assert_not_serving_for, both_down_with_newest


@pytest.mark.parametrize(("newest", "first"), [
    ("primary", "older-first"), ("backup", "newest-first"),
    # CI time: the other two orders in make test-long
    pytest.param("primary", "newest-first", marks=pytest.mark.long),
    pytest.param("backup", "older-first", marks=pytest.mark.long)])
def test_the_newest_journal_wins_whatever_the_start_order(pair_factory, newest: str,
                                                          first: str) -> None:
    # without failback, so that who serves shows who had the newest journal
    pair = pair_factory(flags=["--no-allow-failback"])
    pair.start(parallel=True)
    pair.wait_formed()
    old, new = both_down_with_newest(pair, newest)
    older = pair.other(newest)
    if first == "older-first":
        pair.start_server(older)
        pair.wait_state(older, "WAITING", 10)
        assert_not_serving_for(pair, older, 1.5)
        pair.start_server(newest)
    else:
        pair.start_server(newest)
        pair.wait_state(newest, "STANDALONE", 10)
        pair.start_server(older)
    pair.wait_formed(20, active=newest)
    got = drain(pair.client_address(newest), QUEUE)
    assert sorted(got) == sorted(old + new), got
    assert set(got.values()) == {1}


@pytest.mark.parametrize("older", ["primary", pytest.param("backup", marks=pytest.mark.long)])
def test_alone_with_an_older_journal_waits_until_forced(pair: Pair, older: str) -> None:
    newest = pair.other(older)
    old, _new = both_down_with_newest(pair, newest)
    pair.start_server(older)
    st = pair.wait_state(older, "WAITING", 10)
    assert st["ha"]["peer"]["state"] == "DEAD"
    assert_not_serving_for(pair, older, 2.0)
    with pytest.raises(StompError) as refused:
        BlockingConnection(HOST, pair.stomp_port[older], timeout=5)
    assert "WAITING" in refused.value.frame.headers.get("message", "")
    assert "active-server" not in refused.value.frame.headers

    unconfirmed = pair.cli("activate", pair.admin_address(older))  # no --yes, no terminal
    assert unconfirmed.returncode != 0
    assert pair.state(older) == "WAITING"

    result = pair.activate(older)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["forced"] is True, result.stdout  # JSON, as --json
    pair.wait_state(older, "STANDALONE", 10)
    assert "An operator forced this server to activate" in pair.logs(older)
    # it serves what it has: the messages from before the split, not the newer ones
    got = drain(pair.client_address(older), QUEUE)
    assert sorted(got) == sorted(old), got


def test_a_forced_activation_outlives_an_unreachable_witness(pair: Pair) -> None:
    """`pairmq activate` said while the witness cannot be reached (or while the server is
    itself asking the witness) is not forgotten: the server activates once the witness
    grants it, and not before (the witness still guards against split brain)."""
    old, _new = both_down_with_newest(pair, "backup")
    proxy = NetProxy(pair.witness_address(), name="primary->witness",
                     log_path=pair.workdir / "proxy.log").start()
    try:
        pair.witness_address_for["primary"] = proxy.address
        pair.start_server("primary")
        pair.wait_state("primary", "WAITING", 10)
        proxy.cut()
        result = pair.activate("primary")
        assert result.returncode == 0, result.stderr
        assert "forced" in result.stdout
        assert_not_serving_for(pair, "primary", 2.0)
        proxy.heal()
        pair.wait_state("primary", "STANDALONE", 10)
        got = drain(pair.client_address("primary"), QUEUE)
        assert sorted(got) == sorted(old), got  # the operator chose the older journal
    finally:
        pair.close()  # before the proxy: without its witness the server would step down
        proxy.stop()
