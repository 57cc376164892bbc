"""A shared-store pair on one PostgreSQL database ([store] url): the journal and the lease
in the database, real server processes, real SIGKILL and SIGSTOP (docs/database.md)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.ha.pair import Pair
from tests.ha.under_load import UnderLoad, queue_depth
from tests.support.admin import metric, metric_samples
from tests.support.cli import run_pairmq
from tests.support.database import DATABASE_ONLY, ReceiptedProducer, drain_bodies, journal_rows

LEASE_MS = 1000


@pytest.fixture
def db_pair(pair_factory, postgres_db: str) -> Pair:
    pair = pair_factory(policy="shared-store", database=postgres_db, lease_ms=LEASE_MS)
    pair.start()  # the primary first: it takes the lease
    pair.wait_formed(20)
    return pair


def schema(pair: Pair) -> str:
    return pair.group.replace("-", "_")


def test_kill_9_of_the_active_under_load_the_backup_takes_the_lease_and_serves_everything(
        db_pair: Pair) -> None:
    with UnderLoad(db_pair) as run:
        run.load.wait_receipts(300, 20)
        db_pair.kill("primary")
        killed = time.monotonic()
        db_pair.wait_active(15, "backup")
        takeover = time.monotonic() - killed
        run.load.wait_receipts(300, 20)
        run.drain()
    assert takeover < LEASE_MS / 1000 + 5
    logs = db_pair.logs("backup")
    assert "Database lease taken" in logs
    # it kept a local copy of the journal read ahead: the takeover read only the tail
    assert "Journal read ahead from the database" in logs
    assert "Local server switched to STANDALONE" in logs
    assert queue_depth(db_pair, "backup") == 0
    status = db_pair.status("backup")
    assert status is not None
    assert status["journal"]["database"]["lease"] == "held"
    assert status["ha"]["shared"]["schema"] == f"pairmq_{schema(db_pair)}"
    shown = run_pairmq("status", "--admin", db_pair.admin_address("backup"))
    assert shown.returncode == 0, shown.stderr
    assert "Database: postgresql://pairmq:***@" in shown.stdout
    assert "pairmq-test-secret" not in shown.stdout
    assert "held (epoch 2)" in shown.stdout and "copying" in shown.stdout
    exported = metric_samples(db_pair.admin_address("backup"))
    assert set(exported) >= DATABASE_ONLY  # what the alert rules name
    assert metric(db_pair.admin_address("backup"), "pairmq_database_up") == 1
    # the primary, restarted, fails back through the lease (the backup releases it)
    db_pair.restart("primary")
    db_pair.wait_formed(30, active="primary")
    assert queue_depth(db_pair, "primary") == 0


def test_the_active_paused_past_its_lease_writes_no_row_and_confirms_nothing(
        db_pair: Pair, postgres_db: str) -> None:
    primary = db_pair.servers["primary"]
    assert primary is not None
    old = ReceiptedProducer(db_pair.client_address("primary"), "/queue/q", tag="old").start()
    old.wait_receipts(100)
    os.kill(primary.proc.pid, signal.SIGSTOP)
    try:
        paused_at = len(old.sent)
        db_pair.wait_active(LEASE_MS / 1000 + 15, "backup")
        new = ReceiptedProducer(db_pair.client_address("backup"), "/queue/q", tag="new")
        new.start().wait_receipts(100)
        new.stop()
        rows_then = journal_rows(postgres_db, schema(db_pair))
        confirmed_before = set(old.receipted)
    finally:
        os.kill(primary.proc.pid, signal.SIGCONT)
    # resumed: its proof has run out and the lease is the backup's; it serves no more
    db_pair.wait_state("primary", ("WAITING", "PASSIVE", "STARTING"), 15)
    old.stop(settle=2)
    late = old.receipted - confirmed_before
    assert not late, f"the paused active confirmed {len(late)} messages after its lease"
    # (the primary, back, may take its place again: allow_failback; either serves it all)
    active = db_pair.servers[db_pair.wait_active(20)]
    assert active is not None
    bodies = drain_bodies(active, "/queue/q")
    assert len(bodies) == len(set(bodies))
    assert (old.receipted | new.receipted) <= set(bodies)
    written_late = [b for b in bodies if b.startswith("old-") and
                    int(b.split("-")[1]) >= paused_at]
    assert not written_late, f"the paused active wrote {written_late[:5]}"
    assert rows_then <= journal_rows(postgres_db, schema(db_pair))
