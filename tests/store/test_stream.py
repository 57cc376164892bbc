"""What a backup accepts from the replication stream, and what a synchronisation sends."""

from __future__ import annotations

import pytest

from pairmq.ha.messages import SyncRequest
from pairmq.ha.syncplan import SyncPlan, plan_sync
from pairmq.store.records import frame_record
from pairmq.store.replication_frames import MirrorError, new_records


def chunk(*seqs: int, epoch: int = 1) -> bytes:
    return b"".join(frame_record(seq, epoch, b"payload %d" % seq) for seq in seqs)


def test_records_after_the_journal_end_are_taken_in_order() -> None:
    got = list(new_records(chunk(3, 4, 5), after=2))
    assert [(seq, epoch) for seq, epoch, _ in got] == [(3, 1), (4, 1), (5, 1)]
    assert got[0][2] == frame_record(3, 1, b"payload 3")  # the very bytes, to append


def test_records_already_held_are_skipped() -> None:
    assert [seq for seq, _, _ in new_records(chunk(1, 2, 3, 4), after=2)] == [3, 4]


def test_a_gap_is_refused_naming_it() -> None:
    with pytest.raises(MirrorError, match="replication gap: got 5 after 3"):
        list(new_records(chunk(5), after=3))


def test_a_damaged_record_is_refused_naming_it() -> None:
    data = bytearray(chunk(4, 5))
    data[-3] ^= 0xFF
    with pytest.raises(MirrorError, match="replicated record 5 is damaged"):
        list(new_records(bytes(data), after=3))


def test_a_chunk_cut_inside_a_header_is_refused() -> None:
    with pytest.raises(MirrorError, match="inside a record header"):
        list(new_records(chunk(4)[:5], after=3))


def test_sync_is_incremental_only_when_both_histories_agree() -> None:
    wire = SyncRequest.from_wire  # the backup's request as the channel carries it
    epochs = [(1, 1), (2, 50)]
    # The backup stopped at 40, written in epoch 1 on both sides: send 41 on.
    assert plan_sync(wire({"last_seq": 40, "epochs": [[1, 1]]}), 100, 1, epochs) == \
        SyncPlan("incremental", 41, 100)
    # Its record 60 was written in an epoch we never had (it served alone): replace it.
    assert plan_sync(wire({"last_seq": 60, "epochs": [[1, 1], [3, 55]]}), 100, 1, epochs) == \
        SyncPlan("full", 1, 100)
    # We no longer hold what follows its end (compacted): a full copy from our oldest.
    assert plan_sync(wire({"last_seq": 40, "epochs": [[1, 1]]}), 100, 60, epochs) == \
        SyncPlan("full", 60, 100)
    # An empty backup.
    assert plan_sync(wire({"last_seq": 0, "epochs": []}), 100, 1, epochs) == \
        SyncPlan("full", 1, 100)
