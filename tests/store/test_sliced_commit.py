"""A COMMIT applied in slices, on real journal files (core/broker/committing.py): stopped after
any slice, recovery holds none of it (not decided yet) or routes the rest (decided), so
the queue ends with all of it exactly once; compaction keeps what a run under way needs;
a backup following the records takes over a run where the active left it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pairmq.core import Broker
from pairmq.core.broker.committing import COMMIT_SLICE, STAGE_SLICE
from pairmq.store.segments import list_segments
from pairmq.store.settings import StoreSettings
from pairmq.store.store import Store
from tests.support.mirror import Backup
from tests.support.stores import NOW, PERSISTENT, close, open_broker, persist, synced

N = STAGE_SLICE + 2 * COMMIT_SLICE + 7  # two slices to stage, four to route
STEPS = 2 + 4


async def reopen(directory: Path, boot: int, **settings) -> tuple[Broker, Store]:
    """A restart to serve: message ids unique per boot, as the server makes them, and the
    COMMITs under way settled."""
    broker, store = await open_broker(directory, **settings)
    broker.id_prefix = f"ID:boot{boot}-"
    broker.settle_commits()  # as the serving role does when it opens
    persist(broker, store)  # (a TX_DROP for each undecided one)
    return broker, store


def begin(broker: Broker, n: int = N, body: bytes = b"x") -> None:
    broker.open_session(1, "1.2")
    broker.begin(1, "tx")
    for i in range(n):
        broker.send(1, "/queue/q", {**PERSISTENT, "n": str(i)}, body, NOW, "tx")
    broker.commit(1, "tx", NOW)


def numbers(broker: Broker) -> list[int]:
    q = broker.queues.get("/queue/q")
    return [int(e.message.headers["n"]) for e in q.entries()] if q else []


@pytest.mark.parametrize("stopped_after", range(STEPS + 1))
def test_stopped_after_any_slice_recovery_keeps_none_or_finishes_it(
        tmp_path: Path, stopped_after: int) -> None:
    async def main() -> None:
        broker, store = await reopen(tmp_path, 2)
        begin(broker)
        for _ in range(stopped_after):
            broker.step_commits(NOW, None)
            persist(broker, store)
        await close(store)

        broker, store = await reopen(tmp_path, 3)
        decided = stopped_after >= 2
        routed = max(0, stopped_after - 2) * COMMIT_SLICE
        assert numbers(broker) == list(range(min(routed, N))), "what was routed, only"
        assert bool(broker.commits.runs) == (decided and routed < N)
        while broker.commits.runs:
            broker.step_commits(NOW, None)
            persist(broker, store)
        await close(store)

        broker, store = await reopen(tmp_path, 4)
        assert numbers(broker) == (list(range(N)) if decided else []), \
            "all of it exactly once, in order, or none of it"
        assert not broker.commits.runs
        await close(store)
        replay, _ = Store(tmp_path, StoreSettings()).recover()
        assert not replay.commits.runs, "an undecided one was marked dropped when settled"

    asyncio.run(main())


def test_compaction_keeps_the_segment_a_run_began_in(tmp_path: Path) -> None:
    """Segments of 64 KiB, half-empty ones compacted: a run's TX_SEND entries outlive the
    traffic that would compact their segment away, until the run is done."""
    async def main() -> None:
        settings = {"segment_bytes": 64 * 1024, "compact_ratio": 0.9}
        broker, store = await reopen(tmp_path, 5, **settings)
        begin(broker, body=b"b" * 60)
        for _ in range(3):  # decided, one slice routed
            broker.step_commits(NOW, None)
            persist(broker, store)
        await synced(store)
        first = min(segment_id for segment_id, _ in list_segments(tmp_path))
        broker.open_session(2, "1.2")
        broker.subscribe(2, "s", "/queue/churn", NOW)
        for i in range(3000):  # churn: each acked at once (auto), its segments empty
            broker.send(2, "/queue/churn", PERSISTENT, b"c" * 200, NOW)
            persist(broker, store)
            broker.take_outbox()
            if i % 100 == 0:
                await synced(store)
                await asyncio.sleep(0.002)
        await synced(store)
        await asyncio.sleep(0.05)
        assert min(segment_id for segment_id, _ in list_segments(tmp_path)) == first, \
            "the segment of its first TX_SEND stays"
        await close(store)

        broker, store = await reopen(tmp_path, 6, **settings)
        while broker.commits.runs:
            broker.step_commits(NOW, None)
            persist(broker, store)
        assert numbers(broker) == list(range(N))
        for _ in range(20):  # done: compaction may take it now
            broker.send(2 if 2 in broker.sessions else broker.open_session(2, "1.2").id,
                        "/queue/churn2", PERSISTENT, b"c" * 200, NOW)
            persist(broker, store)
        await synced(store)
        await close(store)
        broker, store = await reopen(tmp_path, 7, **settings)
        assert numbers(broker) == list(range(N)) and not broker.commits.runs
        await close(store)

    asyncio.run(main())


@pytest.mark.parametrize("stopped_after", [1, 2, 4])
def test_a_backup_takes_over_a_run_where_the_active_left_it(tmp_path: Path,
                                                            stopped_after: int) -> None:
    async def main() -> None:
        broker, store = await reopen(tmp_path / "active", 8)
        backup = Backup(tmp_path / "backup", 1000)
        await backup.attach(store)
        begin(broker)
        for _ in range(stopped_after):
            broker.step_commits(NOW, None)
            persist(broker, store)
        await synced(store)
        await close(store)  # the active is gone; the backup takes over
        await synced(backup.store)
        backup.store.serve_mirrored()
        taken = backup.broker
        taken.settle_commits()
        decided = stopped_after >= 2
        assert bool(taken.commits.runs) == decided
        while taken.commits.runs:
            taken.step_commits(NOW, None)
            persist(taken, backup.store)
        await close(backup.store)
        # (read back without paging: the backup's settings page /queue/q past 60 KB)
        recovered, store = await reopen(tmp_path / "backup", 9)
        assert numbers(recovered) == (list(range(N)) if decided else [])
        await close(store)

    asyncio.run(main())


def test_a_backup_restarted_in_the_middle_of_a_commit_follows_the_rest_of_it(
        tmp_path: Path) -> None:
    """The backup stops while the active stages a COMMIT and comes back: its journal
    holds the first TX_SEND entries, the active sends the rest, and when the active dies
    after deciding, the backup finishes it (it must not take the run for abandoned when
    it restarts)."""
    async def main() -> None:
        broker, store = await reopen(tmp_path / "active", 10)
        backup = Backup(tmp_path / "backup", 1000)
        await backup.attach(store)
        begin(broker)
        broker.step_commits(NOW, None)  # staged in part
        persist(broker, store)
        await synced(store)
        await synced(backup.store)
        backup.stopped = True
        await close(backup.store)
        backup = Backup(tmp_path / "backup", 1000)  # restarted: restores a STAGING run
        assert [r.staged for r in backup.broker.commits.runs.values()] == [STAGE_SLICE]
        for _ in range(3):  # the rest staged, decided, one slice routed
            broker.step_commits(NOW, None)
            persist(broker, store)
        await backup.attach(store)
        await synced(store)
        await close(store)
        await synced(backup.store)
        backup.store.serve_mirrored()
        taken = backup.broker
        taken.settle_commits()
        while taken.commits.runs:
            taken.step_commits(NOW, None)
            persist(taken, backup.store)
        await close(backup.store)
        recovered, store = await reopen(tmp_path / "backup", 11)
        assert numbers(recovered) == list(range(N))
        await close(store)

    asyncio.run(main())


def test_the_segment_a_run_began_in_stays_until_its_last_record_is_on_disk(
        tmp_path: Path) -> None:
    """A run is done (out of the ledger) when its last slice is journaled, before that
    record is on disk: its first segment must not go meanwhile, or a crash then would
    leave the run's TX_END without all its TX_SEND entries (a part of the COMMIT)."""
    async def main() -> None:
        broker, store = await reopen(tmp_path, 12, segment_bytes=64 * 1024,
                                     compact_ratio=0.9)
        begin(broker, body=b"b" * 200)
        assert store.writer is not None
        first = min(store.writer.segments)
        while broker.commits.runs:
            await synced(store)  # everything before the last slice is on disk
            broker.step_commits(NOW, None)
            persist(broker, store)
        assert store.synced_seq < store.appended_seq, "the last slice is not on disk yet"
        store._maybe_compact()  # as any record reaching the disk meanwhile would
        assert first in store.writer.segments, "the run's first segment went too early"
        await synced(store)
        await close(store)
        broker, store = await reopen(tmp_path, 13)
        assert numbers(broker) == list(range(N))
        await close(store)

    asyncio.run(main())
