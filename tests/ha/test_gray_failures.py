"""Gray failures (issue 35): a disk that stops completing writes while its server is alive
and answers heartbeats. Each server's data directory is its own loop-mounted ext4, frozen
with `fsfreeze` (writes and fdatasync block until thawed); skipped, saying why, where
mounting is not permitted.

- the active's disk frozen: it hands over to its backup within [store] stall_timeout_ms,
  the backup serves every receipted message once; thawed, the old active rejoins as its
  backup;
- the backup's disk frozen: the active drops it from synchronous replication after the
  same timeout and goes on alone, then takes it back;
- a slow disk (frozen for less than the timeout, again and again): no step-down.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.ha.pair import NAMES, Pair
from tests.ha.under_load import UnderLoad
from tests.integration.clients import Client
from tests.support.admin import admin_request
from tests.support.disk import frozen, loop_filesystem
from tests.support.waiting import wait_until

STALL_MS = 1500
WINDOW = 16  # the load's sends in flight at most (tests/ha/clients.py's Load)

pytestmark = pytest.mark.machine  # time bounds around a 1.5 s timeout: run alone


@pytest.fixture
def pair_on_own_disks(pair_factory: Callable[..., Pair],
                      tmp_path: Path) -> Iterator[tuple[Pair, dict[str, Path]]]:
    """A formed pair whose data directories are each a loop-mounted ext4 of their own."""
    pair = pair_factory(flags=["--stall-timeout-ms", str(STALL_MS),
                               "--segment-bytes", str(8 << 20)])
    with ExitStack() as stack:
        mounts = {name: stack.enter_context(loop_filesystem(
            tmp_path / f"fs-{name}", pair.data_dir(name), size_mb=96)) for name in NAMES}
        stack.callback(pair.close)  # the servers end before their file systems go
        pair.start(parallel=True)
        pair.wait_formed()
        yield pair, mounts


def _disk(pair: Pair, name: str) -> dict[str, object]:
    st = pair.status(name)
    assert st is not None, f"{name} does not answer"
    disk = st["journal"]["disk"]
    assert isinstance(disk, dict)
    return disk


def test_the_backup_takes_over_when_the_actives_disk_freezes(
        pair_on_own_disks: tuple[Pair, dict[str, Path]]) -> None:
    pair, mounts = pair_on_own_disks
    third_party = Client(pair.client_address("primary"))  # stomp.py, on the active
    third_party.connect()
    with UnderLoad(pair) as run:
        run.load.wait_receipts(200, 20)
        with frozen(mounts["primary"]):
            froze = time.monotonic()
            # at most WINDOW receipts were in flight when the disk froze: one more is a
            # send confirmed by the backup
            run.load.wait_receipts(WINDOW + 1, STALL_MS / 1000 + 15)
            resumed = time.monotonic() - froze
            assert pair.wait_active(5, "backup") == "backup"
            # The frozen server is alive: it answers, says why, and serves nobody.
            disk = _disk(pair, "primary")
            assert disk["state"] == "stalled" and disk["stalls"] == 1, disk
            assert pair.status("primary")["state"] == "WAITING"
            code, _, seen = admin_request(pair.admin_address("primary"), "/api/pair")
            assert code == 200 and seen["servers"][0]["disk"]["state"] == "stalled"  # console
            metrics = admin_request(pair.admin_address("primary"), "/metrics")[2]
            assert "pairmq_journal_stalled 1.0" in metrics, metrics[-2000:]
            # the stomp.py client was told where the pair now serves
            errors = third_party.listener.wait_for(lambda: third_party.listener.errors,
                                                   10, "the ERROR of the hand-over")
            assert str(pair.stomp_port["backup"]) in str(errors[0].headers), errors[0].headers
            on_backup = Client(pair.client_address("backup"))
            on_backup.connect()
            on_backup.send("/queue/gray-third-party", "through stomp.py", persistent="true")
            on_backup.disconnect()
            run.load.wait_receipts(200, 20)
            time.sleep(2)  # a stall longer than the timeout: the old active stays down
            assert pair.status("primary")["state"] == "WAITING"
        # Thawed: the write in flight completes, the journal is read back, and the old
        # active follows the new one, then fails back to it (allow_failback, the default).
        pair.wait_formed(30)
        run.drain()
    third_party.close()
    reader = Client(pair.client_address("primary"))
    reader.connect()
    reader.subscribe("/queue/gray-third-party")
    reader.listener.wait_for(lambda: reader.messages, 10, "the stomp.py message")
    assert reader.bodies() == ["through stomp.py"]
    reader.disconnect()
    assert resumed < STALL_MS / 1000 + 5, f"receipts resumed {resumed:.2f} s after the freeze"
    logs = pair.logs("primary")
    assert "Journal write pending for" in logs
    assert "Handing over to backup: the journal's disk stopped completing writes" in logs
    assert "Journal writes complete again, after a stall of" in logs
    after = logs.split("Handing over to backup")[-1]
    assert "Local server switched to PASSIVE: synchronized with live server backup" in after


def test_the_active_goes_on_alone_when_its_backups_disk_freezes(
        pair_on_own_disks: tuple[Pair, dict[str, Path]]) -> None:
    pair, mounts = pair_on_own_disks
    with UnderLoad(pair) as run:
        run.load.wait_receipts(200, 20)
        with frozen(mounts["backup"]):
            froze = time.monotonic()
            st = pair.wait_state("primary", "STANDALONE", STALL_MS / 1000 + 10)
            dropped = time.monotonic() - froze
            assert st["ha"]["synchronized-with-backup"] is False
            run.load.wait_receipts(300, 20)  # confirmed alone meanwhile
            assert pair.status("primary")["state"] == "STANDALONE"
            wait_until(lambda: _disk(pair, "backup")["state"] == "stalled",
                       "the backup reports its stall", 10)
        pair.wait_formed(30)  # taken back once in sync
        run.load.wait_receipts(100, 20)
        run.drain()
    assert dropped < STALL_MS / 1000 + 5, f"the backup was dropped after {dropped:.2f} s"
    logs = pair.logs("primary")
    assert "Backup backup dropped from synchronous replication: no acknowledgement for" in logs
    assert "Local server switched to ACTIVE" in logs.split("dropped from synchronous")[-1]


def test_a_slow_disk_below_the_timeout_steps_nothing_down(
        pair_on_own_disks: tuple[Pair, dict[str, Path]]) -> None:
    """Writes delayed, not stopped: each disk frozen for a third of the timeout, again and
    again, under load. The pair stays as it was, and says no stall happened."""
    pair, mounts = pair_on_own_disks
    with UnderLoad(pair) as run:
        run.load.wait_receipts(200, 20)
        for round_ in range(6):
            with frozen(mounts[NAMES[round_ % 2]]):
                time.sleep(STALL_MS / 3000)
            time.sleep(0.2)
            run.load.wait_receipts(20, 20)
        run.drain()
    for name, state in (("primary", "ACTIVE"), ("backup", "PASSIVE")):
        assert pair.status(name)["state"] == state
        disk = _disk(pair, name)
        assert disk["stalls"] == 0, disk
        assert STALL_MS / 3000 <= float(disk["longest_write_s"]) < STALL_MS / 1000 or \
            name == "backup", disk  # the frozen active's write took the freeze's length
    assert run.load.producer.failures == []  # no failover, no reconnection
    for name in NAMES:
        logs = pair.logs(name)
        assert "stopped completing writes" not in logs and "Journal write pending" not in logs
        assert "dropped from synchronous replication" not in logs


def test_a_frozen_shared_store_lets_the_lock_lapse_and_both_wait_for_it(
        pair_factory: Callable[..., Pair], tmp_path: Path) -> None:
    """Shared store: the journal and the lock's holder record are on one file system. Frozen,
    the live's journal write and its lock re-verification both stall: its proof lapses
    after the activation interval and it stops serving; the backup can take the lock but
    not write either. Thawed, one server serves the one journal, every receipted message
    there once."""
    pair = pair_factory(policy="shared-store", flags=["--stall-timeout-ms", str(STALL_MS),
                                                      "--segment-bytes", str(8 << 20)])
    with ExitStack() as stack:
        shared = stack.enter_context(loop_filesystem(tmp_path / "fs-shared", pair.shared_dir,
                                                     size_mb=96))
        stack.callback(pair.close)
        pair.start()  # the primary first: it takes the lock
        pair.wait_formed()
        with UnderLoad(pair) as run:
            run.load.wait_receipts(200, 20)
            with frozen(shared):
                froze = time.monotonic()
                pair.wait_state("primary", ("WAITING", "STARTING"), 10)
                lapsed = time.monotonic() - froze
                time.sleep(2)  # both wait for the file system
                assert pair.active() is None
            pair.wait_active(30)
            run.load.wait_receipts(200, 30)
            run.drain()
    assert lapsed < pair.activation_ms / 1000 + 2, f"the live stopped after {lapsed:.2f} s"
    assert "cannot prove it holds the lock any more" in pair.logs("primary")
