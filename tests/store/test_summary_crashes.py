"""Segment summaries (store/summary.py) that a crash, a disk or an earlier journal left
wrong: each start recovers exactly what a full replay (every summary deleted) recovers,
logs one WARNING naming each segment whose summary it did not use (none for a segment
that simply has none) and removes that summary; `pairmq journal check` finds them and
`pairmq journal repair` removes them.

A real journal (a Store, its writer thread, 16 KiB segments of ~20 items each: runs of
new messages for a paging queue with dup-ids, a producer's, a stream's; consumers'
acknowledgements) is damaged in copies: summaries cut at every item boundary and
elsewhere, or left as a `.tmp`; segments cut at every record boundary under their
summaries; bytes flipped in each region of a summary; segments rewritten with the old
summary beside them; and a real process killed with SIGKILL while it writes them
(tests/support/summary_writer.py).
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

import pytest

from pairmq.store.check import check_journal, repair_journal
from pairmq.store.records import RECORD_HEADER, frame_record
from pairmq.store.segments import list_segments
from pairmq.store.store import Store
from pairmq.store.summary import (
    _HEAD,
    _ITEM,
    _RUN,
    ADDS,
    SegmentSummary,
    decode_summary,
    encode_summary,
    read_summary,
)
from tests.support.stores import close, run
from tests.support.summaries import (
    SAID,
    begin_mixed,
    copied,
    fresh,
    full_replay,
    item_offsets,
    mixed_journal,
    mixed_traffic,
    open_store,
    record_starts,
    recovered,
    sealed_with_summaries,
    settings,
    started,
    summaries_of,
)
from tests.support.summary_writer import killed


@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> Path:
    """80 rounds of mixed traffic: 18 segments, 17 of them sealed with a summary."""
    directory = tmp_path_factory.mktemp("summaries") / "journal"
    mixed_journal(directory, 80, segment_bytes=16 * 1024)
    assert len(sealed_with_summaries(directory)) >= 15
    return directory


@pytest.fixture(scope="module")
def reference(journal, tmp_path_factory) -> dict:
    """What a full replay of `journal` recovers."""
    return full_replay(journal, tmp_path_factory.mktemp("full") / "journal")


def reencoded(data: bytes, change) -> bytes:
    """A summary changed by `change(summary)`, with a checksum that holds."""
    summary = decode_summary(data)
    change(summary)
    return encode_summary(summary)


def test_an_intact_journal_starts_through_every_summary_and_says_nothing(journal, reference,
                                                                        tmp_path, caplog):
    snapshot, report, said = started(fresh(journal, tmp_path / "j"), caplog)
    assert snapshot == reference
    assert report.summarised == len(summaries_of(journal)) and said == {}
    check = check_journal(journal)
    assert check.summaries == [] and check.summaries_matching == report.summarised


# ------------------------------------------------------------------ summaries cut short


def test_no_prefix_of_a_summary_decodes(journal):
    """Every length short of the whole, of every summary: what a crash or a disk leaves."""
    for segment_id, data in summaries_of(journal).items():
        for length in range(len(data)):
            with pytest.raises((ValueError, struct.error)):
                decode_summary(data[:length])
        path = journal / f"journal-{segment_id:08d}.seg"
        assert read_summary(journal, segment_id, path).summary is not None


def test_a_summary_cut_short_or_left_as_tmp_is_not_used_and_said(journal, reference,
                                                                tmp_path, caplog):
    """Cut at every item boundary and at a spread of other offsets, as `.sum` (a disk
    that lost its end) and as a `.tmp` beside no summary (a kill -9 while writing it):
    each round cuts every summary, each at another point."""
    held = summaries_of(journal)
    points = {}
    for segment_id, data in held.items():
        spread = {0, 1, 4, _HEAD.size - 1, _HEAD.size, _HEAD.size + _ITEM.size,
                  len(data) // 3, len(data) // 2, len(data) - 5, len(data) - 1}
        points[segment_id] = sorted(set(item_offsets(decode_summary(data))) | spread)
    most = max(len(p) for p in points.values())
    assert most >= 20, "the summaries have many items"
    for round_ in range(2 * most):
        directory = fresh(journal, tmp_path / "j")
        for index, (segment_id, data) in enumerate(held.items()):
            length = points[segment_id][round_ % len(points[segment_id])]
            path = directory / f"journal-{segment_id:08d}.sum"
            if (index + round_ // most) % 2:
                path.unlink()
                path = path.with_name(path.name + ".tmp")
            path.write_bytes(data[:length])
        snapshot, report, said = started(directory, caplog)
        assert snapshot == reference, f"round {round_}"
        assert report.summarised == 0
        assert set(said) == set(held) and all(len(s) == 1 for s in said.values()), said
        assert not list(directory.glob("journal-*.sum*")), "a start removes them"


# ------------------------------------------------------------------ segments cut short


def test_a_segment_cut_at_any_record_boundary_under_its_summary(journal, tmp_path, caplog):
    """Each round cuts every sealed segment at another record boundary (its summary then
    describes more than is there): a start reads them record by record."""
    starts = {path: record_starts(path)[:-1] for path in sealed_with_summaries(journal)}
    for round_ in range(max(len(s) for s in starts.values())):
        directory = fresh(journal, tmp_path / "j")
        for path, at in starts.items():
            os.truncate(directory / path.name, at[round_ % len(at)])
        expected = full_replay(directory, tmp_path / "full")
        snapshot, report, said = started(directory, caplog)
        assert snapshot == expected, f"round {round_}"
        assert report.summarised == 0
        assert sorted(said) == [int(path.name[8:16]) for path in starts]
        assert all("does not match it (size" in s for (s,) in said.values()), said


def test_the_last_sealed_segment_cut_at_each_record_boundary_or_torn(journal, tmp_path,
                                                                    caplog):
    """The newest segment lost (a crash right after the writer sealed the one before):
    that one, cut at each record boundary and inside records (a torn tail the start
    cuts), with its summary beside it."""
    *_, last = sealed_with_summaries(journal)
    last_id = int(last.name[8:16])
    boundaries = record_starts(last)
    torn = [boundaries[3] + 1, boundaries[5] + RECORD_HEADER.size + 3, boundaries[-1] - 1]
    cuts = [*boundaries[:-1], *torn]
    for at in cuts:
        directory = fresh(journal, tmp_path / "j")
        for segment_id, path in list_segments(directory):
            if segment_id > last_id:
                path.unlink()
        os.truncate(directory / last.name, at)
        expected = full_replay(directory, tmp_path / "full")
        snapshot, report, said = started(directory, caplog)
        assert snapshot == expected, f"cut at {at}"
        assert report.summarised == len(sealed_with_summaries(journal)) - 1
        assert list(said) == [last_id] and "does not match it" in said[last_id][0]
        assert not (directory / last.name).with_suffix(".sum").exists()


# ------------------------------------------------------------------ corrupt summaries


def regions(data: bytes) -> dict[str, int]:
    """An offset in each region of an encoded summary with an ADDS item that has
    producers or dup-ids: head, an item's fixed part, its arrays, its producers and
    dup-ids, the checksum."""
    summary = decode_summary(data)
    offsets = item_offsets(summary)
    index = next(i for i, item in enumerate(summary.items)
                 if item.kind == ADDS and (item.producers or item.dups))
    item = summary.items[index]
    arrays = (offsets[index] + _ITEM.size + 4 + len(item.destination.encode()) + 4
              + sum(4 + len(key.encode()) for key in item.queue_keys) + _RUN.size)
    entries = len(item.orders) * (4 + 4 + 8 + 4 + (8 if item.stream_first >= 0 else 0))
    return {"head": 12, "item": offsets[index] + 1, "arrays": arrays + entries // 2,
            "producers and dup-ids": arrays + entries + 2, "checksum": len(data) - 2}


def test_a_summary_with_a_flipped_byte_in_any_region_is_not_used(journal, reference,
                                                                 tmp_path, caplog):
    """One flipped byte per summary, each region in turn: its checksum fails."""
    held = summaries_of(journal)
    names = list(regions(next(iter(held.values()))))
    for round_ in range(2):
        directory = fresh(journal, tmp_path / "j")
        flipped = {}
        for index, (segment_id, data) in enumerate(held.items()):
            name = names[(index + round_) % len(names)]
            damaged = bytearray(data)
            damaged[regions(data)[name]] ^= 0x40
            (directory / f"journal-{segment_id:08d}.sum").write_bytes(bytes(damaged))
            flipped[segment_id] = name
        assert set(flipped.values()) == set(names)
        snapshot, report, said = started(directory, caplog)
        assert snapshot == reference
        assert report.summarised == 0 and set(said) == set(held)
        assert all("does not decode (checksum mismatch)" in s for (s,) in said.values())


def test_a_summary_whose_checksum_holds_but_whose_head_or_items_lie_is_not_used(
        journal, reference, tmp_path, caplog):
    """Written wrong and checksummed (a bug, a summary of another content): the start
    compares the head and each item with the record headers."""
    def epoch(item_index: int):
        def change(summary: SegmentSummary) -> None:
            summary.items[item_index % len(summary.items)].epoch += 1
        return change

    def shift(summary: SegmentSummary) -> None:  # a boundary between two items moved
        summary.items[4].end += 7
        summary.items[5].start += 7

    def head(summary: SegmentSummary) -> None:
        summary.last_start += 1

    def records(summary: SegmentSummary) -> None:
        summary.items[3].records += 1

    changes = [epoch(5), epoch(-1), epoch(0), shift, head, records]
    held = summaries_of(journal)
    directory = fresh(journal, tmp_path / "j")
    for index, (segment_id, data) in enumerate(held.items()):
        (directory / f"journal-{segment_id:08d}.sum").write_bytes(
            reencoded(data, changes[index % len(changes)]))
    snapshot, report, said = started(directory, caplog)
    assert snapshot == reference
    assert report.summarised == 0 and set(said) == set(held)
    assert all("does not match it" in s or "does not hold together" in s
               for (s,) in said.values()), said


# ------------------------------------------------------------------ older summaries


def swapped(path: Path, first: int) -> None:
    """Records `first` and `first + 1` of a segment exchange their contents (each keeps
    its sequence number and epoch): the same size, the same first and last records,
    another boundary between those two."""
    data = bytearray(path.read_bytes())
    at = record_starts(path)
    one, two = bytes(data[at[first]:at[first + 1]]), bytes(data[at[first + 1]:at[first + 2]])
    assert len(one) != len(two)
    (_, _, seq_one, epoch, kind), (_, _, seq_two, _, _) = (RECORD_HEADER.unpack_from(r)
                                                          for r in (one, two))
    data[at[first]:at[first + 2]] = (frame_record(seq_one, epoch, two[RECORD_HEADER.size:],
                                                  kind)
                                     + frame_record(seq_two, epoch, one[RECORD_HEADER.size:],
                                                    kind))
    path.write_bytes(bytes(data))


def test_a_summary_of_an_earlier_content_of_its_segment_is_not_used(journal, tmp_path,
                                                                   caplog):
    """The same records in another order at an item's boundary (what a server alone,
    which keeps its epoch, could write again over a journal cut by hand): the size and
    the first and last records are the old ones; the header at an item's start is not."""
    directory = fresh(journal, tmp_path / "j")
    victims = sealed_with_summaries(directory)[2:-2:3]
    for path in victims:
        summary = decode_summary(path.with_suffix(".sum").read_bytes())
        at = record_starts(path)
        second = at.index(summary.items[2].start)  # a record that starts an item
        swapped(path, second - 1)
    expected = full_replay(directory, tmp_path / "full")
    snapshot, report, said = started(directory, caplog)
    assert snapshot == expected
    assert sorted(said) == sorted(int(p.name[8:16]) for p in victims)
    assert all("does not match it (item 2:" in s for (s,) in said.values()), said
    assert report.summarised == len(sealed_with_summaries(journal)) - len(victims)


@pytest.mark.parametrize("new_epoch", [True, False])
def test_a_segment_rewritten_after_a_cut_with_its_old_summary_left_beside_it(
        journal, tmp_path, caplog, new_epoch):
    """The journal cut in the middle of a sealed segment and the segments after it gone
    (a repair, a resync), the summaries kept aside; a server writes on from the cut (in
    a new epoch, as a pair's server, or in the same one, as a server alone) until that
    segment and the next are sealed again; then the old summaries come back beside the
    segments of the same ids (a copy restored by hand, an older pairmq's cut)."""
    directory = fresh(journal, tmp_path / "j")
    sealed = sealed_with_summaries(directory)
    victim = sealed[len(sealed) // 2]
    victim_id = int(victim.name[8:16])
    kept = {path.name: path.read_bytes() for path in directory.glob("journal-*.sum")
            if int(path.name[8:16]) >= victim_id}
    for name in kept:
        (directory / name).unlink()
    for segment_id, path in list_segments(directory):
        if segment_id > victim_id:
            path.unlink()
    os.truncate(victim, record_starts(victim)[7])

    async def rewrite() -> None:
        broker, store = await open_store(directory, segment_bytes=16 * 1024)
        if new_epoch:
            store.begin_epoch(2)
        begin_mixed(broker, store)
        await mixed_traffic(broker, store, 40, first=1000)
        await close(store)

    run(rewrite())
    assert list_segments(directory)[-1][0] > victim_id + 1
    for name, data in kept.items():
        if (directory / name).with_suffix(".seg").exists():
            (directory / name).write_bytes(data)  # the old one, over any new one
    expected = full_replay(directory, tmp_path / "full")
    snapshot, _, said = started(directory, caplog)
    assert snapshot == expected
    assert victim_id in said and "does not match it" in said[victim_id][0], said


def test_a_summary_whose_segment_is_gone_is_removed_before_a_segment_takes_its_id(
        journal, tmp_path, caplog):
    """A deletion cut short (by an older pairmq, which deleted the segment first) left
    the summaries of the newest segments: the next start removes them, so that the
    segments written again under those ids never meet them."""
    directory = fresh(journal, tmp_path / "j")
    newest = list_segments(directory)[-3:]
    for _, path in newest:
        path.unlink()
    orphans = [segment_id for segment_id, path in newest
               if path.with_suffix(".sum").exists()]
    assert len(orphans) == 2

    async def again() -> None:
        broker, store = await open_store(directory, segment_bytes=16 * 1024)
        begin_mixed(broker, store)
        await mixed_traffic(broker, store, 20, first=2000)
        await close(store)

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pairmq.store"):
        run(again())
    assert [m for m in caplog.messages if "has no segment any more" in m] == [
        f"The summary of journal segment {i} has no segment any more: removing it"
        for i in orphans]
    expected = full_replay(directory, tmp_path / "full")
    snapshot, _, said = started(directory, caplog)
    assert snapshot == expected and said == {}


def test_a_start_that_writes_on_into_a_summarised_segment_keeps_its_summary(
        journal, tmp_path, caplog):
    """The newest segment lost (`pairmq journal repair` moved it aside): the one before,
    summarised, is where the writer goes on, with room left (a larger segment_bytes, a
    record smaller than the one that sealed it); its summary covers a prefix of it now,
    which the next start reads through it, and the records after it one by one."""
    directory = fresh(journal, tmp_path / "j")
    list_segments(directory)[-1][1].unlink()
    last = sealed_with_summaries(directory)[-1]

    async def write_on() -> None:
        broker, store = await open_store(directory, segment_bytes=64 * 1024)
        begin_mixed(broker, store)
        await mixed_traffic(broker, store, 3, first=3000)
        await close(store)

    covered = decode_summary(last.with_suffix(".sum").read_bytes()).size
    run(write_on())
    assert list_segments(directory)[-1][1] == last, "it went on in that segment"
    assert decode_summary(last.with_suffix(".sum").read_bytes()).size == covered
    assert last.stat().st_size > covered
    expected = full_replay(directory, tmp_path / "full")
    snapshot, report, said = started(directory, caplog)
    assert snapshot == expected and said == {}
    assert report.summarised == len(sealed_with_summaries(journal))
    assert report.journal_bytes - report.summarised_bytes == last.stat().st_size - covered


# ------------------------------------------------------------------ a real kill -9


def test_a_process_killed_while_it_writes_summaries_recovers_what_a_full_replay_does(
        tmp_path, caplog):
    """A process journaling through a real Store (4 KiB segments), killed with SIGKILL
    half way through writing a summary's `.tmp`, once it is whole but not renamed, once
    renamed, and at a moment nobody chose; after each kill a start through the summaries
    recovers what a full replay does, and the next process goes on from that journal."""
    directory = tmp_path / "journal"
    for run_index, (count, moment) in enumerate([(12, "half"), (9, "whole"),
                                                 (10, "renamed"), (14, None)]):
        segment_id = killed(directory, 100_000 * run_index, count, moment)
        tmp = directory / f"journal-{segment_id:08d}.sum.tmp"
        assert tmp.exists() == (moment in ("half", "whole"))
        snapshot, report, said = started(copied(directory, tmp_path / f"with{run_index}"),
                                         caplog)
        assert snapshot == full_replay(directory, tmp_path / f"full{run_index}")
        assert report.summarised >= count - 1
        left = {int(path.name[8:16]) for path in directory.glob("journal-*.sum.tmp")}
        assert set(said) == left and all(len(s) == 1 for s in said.values()), said
        assert all("was being written when the server stopped" in s for (s,) in said.values())
        assert not list((tmp_path / f"with{run_index}").glob("*.tmp"))


# ------------------------------------------------------------------ reading ahead


def test_a_backup_reading_ahead_changes_nothing_and_its_start_says_it_once(journal,
                                                                          reference,
                                                                          tmp_path, caplog):
    directory = fresh(journal, tmp_path / "j")
    first, second = sealed_with_summaries(directory)[3:5]
    first.with_suffix(".sum").write_bytes(first.with_suffix(".sum").read_bytes()[:-1])
    tmp = second.with_name(second.with_suffix(".sum").name + ".tmp")
    tmp.write_bytes(b"half a summary")  # perhaps the active's writer, writing it now
    store = Store(directory, settings())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pairmq.store"):
        assert store.read_ahead(50) > 0
    assert not caplog.records and first.with_suffix(".sum").exists() and tmp.exists()
    _, report = store.recover(50)
    said: dict[int, list[str]] = {}
    for message in caplog.messages:
        if found := SAID.match(message):
            said.setdefault(int(found.group(1)), []).append(message)
    first_id, second_id = int(first.name[8:16]), int(second.name[8:16])
    assert sorted(said) == [first_id, second_id] and all(len(s) == 1 for s in said.values())
    assert not first.with_suffix(".sum").exists() and not tmp.exists()
    assert report.summarised == len(sealed_with_summaries(journal)) - 1
    store.close()
    assert recovered(directory)[0] == reference


# ------------------------------------------------------------------ check and repair


def test_check_compares_each_summary_with_its_records_and_repair_removes_those_that_lie(
        journal, reference, tmp_path, caplog):
    """Summaries whose checksum holds but whose entries are not their records' (a start
    does not read those records, and would use them), a damaged one, a `.tmp`, one
    without a segment: problems of the summaries, not of the journal."""
    directory = fresh(journal, tmp_path / "j")
    held = summaries_of(directory)
    ids = list(held)

    def adds(summary: SegmentSummary, with_what: str):
        """An ADDS item with that field set (two entries at least for orders)."""
        return next(i for i in summary.items if i.kind == ADDS
                    and len(getattr(i, with_what)) > (with_what == "orders"))

    def offset(summary: SegmentSummary) -> None:
        adds(summary, "orders").offsets[1] += 1

    def dup(summary: SegmentSummary) -> None:
        adds(summary, "dups").dups[0] += "x"

    def producer(summary: SegmentSummary) -> None:
        item = adds(summary, "producers")
        key = next(iter(item.producers))
        epoch, seq, seen = item.producers[key]
        item.producers[key] = (epoch, seq + 1, seen)

    def stamp(summary: SegmentSummary) -> None:
        adds(summary, "stamps").stamps[0] += 1

    lies = {ids[1]: (offset, "entries' offsets differ from its records' at entry 1"),
            ids[3]: (dup, "dup-ids differ"), ids[5]: (producer, "producers' sequences"),
            ids[7]: (stamp, "stream times differ")}
    for segment_id, (change, _) in lies.items():
        path = directory / f"journal-{segment_id:08d}.sum"
        path.write_bytes(reencoded(held[segment_id], change))
        assert read_summary(directory, segment_id, path.with_suffix(".seg")).summary, \
            "a start would use it"
    def epoch(summary: SegmentSummary) -> None:
        summary.items[-1].epoch = summary.items[0].epoch = 7

    (directory / f"journal-{ids[8]:08d}.sum").write_bytes(reencoded(held[ids[8]], epoch))
    (directory / f"journal-{ids[9]:08d}.sum").write_bytes(held[ids[9]][:-1])
    (directory / f"journal-{ids[10]:08d}.sum.tmp").write_bytes(held[ids[10]][:100])
    (directory / "journal-00000999.sum").write_bytes(held[ids[11]])

    report = check_journal(directory)
    assert report.ok and report.damage is None
    problems = {problem.path.name: problem.problem for problem in report.summaries}
    for segment_id, (_, said) in lies.items():
        assert said in problems.pop(f"journal-{segment_id:08d}.sum")
    assert "item 0 names seq" in problems.pop(f"journal-{ids[8]:08d}.sum")
    assert "does not decode" in problems.pop(f"journal-{ids[9]:08d}.sum")
    assert "was being written" in problems.pop(f"journal-{ids[10]:08d}.sum.tmp")
    assert problems == {"journal-00000999.sum": "has no segment any more"}
    assert report.summaries_matching == len(held) - 6

    actions = repair_journal(directory)
    assert len(actions) == 8 and all(a.startswith("removed journal-") for a in actions)
    assert len(summaries_of(directory)) == len(held) - 6
    assert not list(directory.glob("*.tmp")) and not (directory / "journal-00000999.sum").exists()
    again = check_journal(directory)
    assert again.summaries == [] and again.summaries_matching == len(held) - 6
    assert repair_journal(directory) == ["nothing to repair: every segment checks out"]
    snapshot, report, said = started(directory, caplog)
    assert snapshot == reference and said == {}
