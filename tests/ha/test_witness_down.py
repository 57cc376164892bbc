"""The pair without its witness: two servers that see each other elect the active one and
serve; an active server that loses only the witness keeps serving while its backup is in
sync; a witness that comes back is adopted without a failover. A server alone, without the
witness, still never activates on its own. Every witness here is a real process, killed
with SIGKILL."""

from __future__ import annotations

import json
import time

import pytest

from tests.ha.clients import Load, consumed_exactly_once, drain, send_some
from tests.ha.pair import SERVING, Pair
from tests.support.scenarios import assert_not_serving_for, both_down_with_newest
from tests.support.waiting import wait_until

QUEUE = "/queue/witness-down"


def _witness_dead_before_the_pair(pair: Pair) -> None:
    pair.start_witness()
    pair.kill_witness()


def _receipts_flow(pair: Pair, name: str, prefix: str, count: int = 5) -> list[str]:
    """Persistent SENDs, each waiting for its RECEIPT (send_some fails on a timeout)."""
    return send_some(pair.client_address(name), QUEUE, prefix, count)


def test_a_fresh_pair_without_its_witness_elects_the_primary(pair_factory) -> None:
    pair = pair_factory()
    _witness_dead_before_the_pair(pair)
    pair.start(witness=False, parallel=True)
    pair.wait_formed(20)
    assert "activating without the witness" in pair.logs("primary")
    sent = _receipts_flow(pair, "primary", "fresh")
    got = drain(pair.client_address("primary"), QUEUE)
    assert sorted(got) == sorted(sent) and set(got.values()) == {1}


def test_a_server_alone_without_the_witness_does_not_activate(pair_factory) -> None:
    pair = pair_factory()
    _witness_dead_before_the_pair(pair)
    pair.start(["primary"], witness=False)
    pair.wait_state("primary", "WAITING", 10)
    assert_not_serving_for(pair, "primary", 1.5)


@pytest.mark.parametrize("witness_memory", ["kept", "lost"])
def test_the_active_keeps_serving_without_the_witness_and_adopts_it_again(
        pair_factory, witness_memory: str) -> None:
    pair = pair_factory()
    pair.start(parallel=True)
    pair.wait_formed()
    epoch = pair.status("primary")["ha"]["epoch"]
    pair.kill_witness()
    # several activation intervals (0.4 s each) without the witness: still serving, still
    # confirming (the in-sync backup's promise), and no failover
    deadline = time.monotonic() + 2.0
    sent: list[str] = []
    while time.monotonic() < deadline:
        sent += _receipts_flow(pair, "primary", f"nowitness{len(sent)}", 2)
        assert pair.state("primary") == "ACTIVE" and pair.state("backup") == "PASSIVE"
    assert not pair.status("primary")["ha"]["witness"]["lease_valid"]
    if witness_memory == "lost":
        pair.witness_state.unlink()
    pair.start_witness()

    def lease_back() -> bool:
        st = pair.status("primary")
        return bool(st and st["ha"]["witness"]["lease_valid"])

    wait_until(lease_back, "the active server's lease from the restarted witness", 10)
    assert pair.state("primary") == "ACTIVE" and pair.state("backup") == "PASSIVE"
    if witness_memory == "lost":  # a witness without memory adopts the running active
        assert "knows this server as active again" in pair.logs("primary")
    assert pair.status("primary")["ha"]["epoch"] >= epoch
    # the witness learnt the pair: the backup may take over once the active dies
    pair.kill("primary")
    pair.wait_state("backup", SERVING, 10)
    more = _receipts_flow(pair, "backup", "after")
    got = drain(pair.client_address("backup"), QUEUE)
    assert sorted(got) == sorted(sent + more) and set(got.values()) == {1}


@pytest.mark.parametrize("newest", ["primary", "backup"])
def test_both_restarted_without_the_witness_elect_the_newest_journal(pair_factory,
                                                                     newest: str) -> None:
    pair = pair_factory(flags=["--no-allow-failback"])  # who serves shows who was elected
    pair.start(parallel=True)
    pair.wait_formed()
    old, new = both_down_with_newest(pair, newest, QUEUE)
    pair.kill_witness()
    pair.start(witness=False, parallel=True)
    pair.wait_formed(20, active=newest)
    got = drain(pair.client_address(newest), QUEUE)
    assert sorted(got) == sorted(old + new), got
    assert set(got.values()) == {1}


def test_equal_journals_after_a_clean_stop_elect_the_primary(pair_factory) -> None:
    pair = pair_factory()
    pair.start(parallel=True)
    pair.wait_formed()
    sent = _receipts_flow(pair, "primary", "equal", 10)
    pair.stop("backup")
    pair.stop("primary")
    pair.kill_witness()
    pair.start(witness=False, parallel=True)
    pair.wait_formed(20)
    got = drain(pair.client_address("primary"), QUEUE)
    assert sorted(got) == sorted(sent) and set(got.values()) == {1}


def test_a_witness_that_granted_a_higher_epoch_adopts_the_active_at_a_new_epoch(
        pair_factory) -> None:
    """The witness comes back remembering an epoch above the active's, last granted to the
    server that is now the active's in-sync backup (a grant that was never used). The
    active journals a new epoch while a producer keeps sending, and the witness adopts it:
    no failover, nothing receipted lost or doubled, and a later failover works."""
    pair = pair_factory()
    pair.start(parallel=True)
    pair.wait_formed()
    pair.kill_witness()
    backup_identity = pair.status("backup")["ha"]["identity"]
    pair.witness_state.write_text(json.dumps(
        {"holder": backup_identity, "epoch": 50, "standby": None, "last_ms": 0}))
    addresses = pair.client_addresses()
    load = Load(addresses, QUEUE, prefix="adopt", window=8).start()
    try:
        time.sleep(0.5)
        pair.start_witness()  # receipts in flight while the active adopts it
        wait_until(lambda: (pair.status("primary") or {}).get("ha", {}).get("epoch") == 51,
                   "the active journaling epoch 51", 10)
        wait_until(lambda: pair.status("primary")["ha"]["witness"]["lease_valid"],
                   "the lease from the witness", 10)
        time.sleep(0.5)
    finally:
        load.stop_event.set()
    receipted = load.stop()  # raises what the producer met
    assert pair.state("primary") == "ACTIVE" and pair.state("backup") == "PASSIVE"
    assert "knows this server as active again (epoch 51" in pair.logs("primary")
    pair.kill("primary")  # the witness now knows the pair: the backup takes over above 51
    pair.wait_state("backup", SERVING, 10)
    assert pair.status("backup")["ha"]["epoch"] > 51
    consumed_exactly_once(addresses, QUEUE, receipted)
