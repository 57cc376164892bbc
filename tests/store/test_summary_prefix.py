"""Prefix summaries (store/summary_builder.py): the segment being written gets a summary
every `partial_summary_bytes` it grows, covering every record up to one already on disk;
a start reads those bytes through it and the rest of the segment record by record, and
recovers exactly what a full replay (every summary deleted) recovers. The newest segment
cut at every record boundary before and after where its summary ends, or torn; a prefix
summary whose end is not a record boundary; a segment a later start writes on into; a
real process killed with SIGKILL while it writes prefix summaries; a backup reading the
journal ahead while they appear, are replaced and are half written; a backup's mirror
journal; the database copy's cuts. The summaries a builder hands over, encoded as the
segment grows, are the bytes `encode_summary` makes of the same items.

A real journal: a Store and its writer thread, 16 KiB segments, a prefix summary every
4 KiB (tests/support/summaries.py's mixed traffic: runs of new messages for a paging
queue with dup-ids, a producer's, a stream's; acknowledgements).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import threading
from pathlib import Path

import pytest

from pairmq.store import writer as writer_module
from pairmq.store.check import check_journal
from pairmq.store.database import resume
from pairmq.store.reading import JournalReading
from pairmq.store.record_decoding import decode_entries
from pairmq.store.records import RECORD_HEADER, SEGMENT_HEADER
from pairmq.store.segments import list_segments, scan_segment
from pairmq.store.store import Store
from pairmq.store.summary import (
    SegmentSummary,
    decode_summary,
    encode_summary,
    summary_path,
)
from pairmq.store.summary_builder import PendingSummary, SummaryBuilder, summarise_entries
from tests.support.stores import close, run
from tests.support.summaries import (
    a_backup_follows_more_traffic,
    begin_mixed,
    copied,
    covered,
    fresh,
    full_replay,
    mixed_traffic,
    open_store,
    record_starts,
    recovered,
    settings,
    started,
    started_from,
    summaries_of,
    summary_warnings,
)
from tests.support.summary_writer import killed

SEGMENT = 16 * 1024
PARTIAL = 4096


def newest(directory: Path) -> Path:
    return list_segments(directory)[-1][1]


def ends_with_records_after_its_summary(directory: Path) -> bool:
    """The newest segment has a prefix summary, records before its end and at least three
    after it."""
    path = newest(directory)
    if not path.with_suffix(".sum").exists():
        return False
    end, starts = covered(path), record_starts(path)
    return end in starts and len([at for at in starts if at > end]) >= 3


@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> Path:
    """Mixed traffic, closed while its newest segment holds records after its prefix
    summary (as a crash leaves it, or a clean stop)."""
    directory = tmp_path_factory.mktemp("prefix") / "journal"

    async def fill() -> None:
        broker, store = await open_store(directory, segment_bytes=SEGMENT,
                                         partial_summary_bytes=PARTIAL,
                                         summary_records_per_item=1)
        store.begin_epoch(1)
        begin_mixed(broker, store)
        await mixed_traffic(broker, store, 60)
        rounds = 60
        while not ends_with_records_after_its_summary(directory):
            await mixed_traffic(broker, store, 1, rounds)
            rounds += 1
            assert rounds < 200
        await close(store)

    run(fill())
    return directory


@pytest.fixture(scope="module")
def reference(journal, tmp_path_factory) -> dict:
    """What a full replay of `journal` recovers."""
    return full_replay(journal, tmp_path_factory.mktemp("full") / "journal")


def sealed_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for _, path in list_segments(directory)[:-1])


def covered_bytes(directory: Path) -> int:
    """The bytes the summaries there cover."""
    return sum(covered(path) for _, path in list_segments(directory)
               if path.with_suffix(".sum").exists())


def test_a_start_reads_the_newest_segment_through_its_prefix_summary(journal, reference,
                                                                    tmp_path, caplog):
    directory = fresh(journal, tmp_path / "j")
    path = newest(directory)
    end, size = covered(path), path.stat().st_size
    assert end < size
    segments = len(list_segments(directory))
    assert len(summaries_of(directory)) == segments, "every segment has a summary"
    snapshot, report, said = started(directory, caplog)
    assert snapshot == reference and said == {}
    assert report.summarised == segments, "the newest through its summary too"
    assert report.summarised_bytes == sealed_bytes(directory) + end
    assert report.journal_bytes == sealed_bytes(directory) + size
    described = report.describe()
    assert f"({segments} of the segments through their summaries)" in described
    assert (f"({report.summarised_bytes} of the {report.journal_bytes} journal bytes read "
            "through summaries)") in described
    assert covered(path) == end, "the start keeps it"
    check = check_journal(journal)
    assert check.summaries == [] and check.summaries_matching == segments


def test_the_newest_segment_cut_at_each_record_boundary_before_and_after_its_summary_end(
        journal, tmp_path, caplog):
    """A crash in the middle of the newest segment: cut at each record boundary, and
    inside records (a torn end the start cuts). Up to where its summary ends the summary
    is not used (it covers more than is there: said once, removed); from there on it is,
    without a word, and kept."""
    path = newest(journal)
    newest_id = int(path.name[8:16])
    end, boundaries = covered(path), record_starts(path)
    segments = len(list_segments(journal))
    before = [at for at in boundaries if at < end]
    after = [at for at in boundaries if at > end]
    assert len(before) >= 3 and len(after) >= 3
    torn = [before[1] + 5, end - 1, end + RECORD_HEADER.size - 2, after[1] + 3,
            boundaries[-1] - 1]
    for at in [*boundaries, *torn]:
        directory = fresh(journal, tmp_path / "j")
        os.truncate(directory / path.name, at)
        expected = full_replay(directory, tmp_path / "full")
        snapshot, report, said = started(directory, caplog)
        assert snapshot == expected, f"cut at {at}"
        summary = (directory / path.name).with_suffix(".sum")
        if at >= end:
            assert said == {}, f"cut at {at}: {said}"
            assert report.summarised == segments
            assert report.summarised_bytes == sealed_bytes(directory) + end
            assert summary.exists()
        else:
            assert list(said) == [newest_id], f"cut at {at}: {said}"
            assert f"does not match it (size {at} < the {end} it covers)" in said[newest_id][0]
            assert report.summarised == segments - 1
            assert not summary.exists()


def test_a_prefix_summary_whose_end_is_not_where_a_record_ends_is_not_used(
        journal, reference, tmp_path, caplog):
    """Its checksum holds, its items hold together, every item begins at a record of its
    first seq: but the last record it names ends elsewhere than it says."""
    def moved(by: int):
        def change(summary: SegmentSummary) -> None:
            summary.items[-1].end += by
            summary.size += by
        return change

    path = newest(journal)
    newest_id = int(path.name[8:16])
    for change in (moved(7), moved(-3), moved(RECORD_HEADER.size)):
        directory = fresh(journal, tmp_path / "j")
        summary = decode_summary(path.with_suffix(".sum").read_bytes())
        change(summary)
        (directory / path.with_suffix(".sum").name).write_bytes(encode_summary(summary))
        snapshot, report, said = started(directory, caplog)
        assert snapshot == reference
        assert list(said) == [newest_id] and "(the last record:" in said[newest_id][0], said
        assert report.summarised == len(list_segments(journal)) - 1


def test_a_segment_a_later_start_writes_on_into_keeps_its_prefix_summary(journal, tmp_path,
                                                                         caplog):
    """A start goes on writing into the newest segment (with room left: a larger
    segment_bytes; its builder did not see it from its first record: no new summary of
    it), then another one past where it is sealed; the summary there covers what it
    covered, and the starts after read that through it and the rest record by record."""
    directory = fresh(journal, tmp_path / "j")
    path = newest(directory)
    end, size = covered(path), path.stat().st_size

    async def write_on(rounds: int, first: int, segment_bytes: int) -> None:
        broker, store = await open_store(directory, segment_bytes=segment_bytes,
                                         partial_summary_bytes=PARTIAL,
                                         summary_records_per_item=1)
        begin_mixed(broker, store)
        await mixed_traffic(broker, store, rounds, first)
        await close(store)

    run(write_on(3, 5000, 4 * SEGMENT))  # room left in it
    assert path.stat().st_size > size and covered(path) == end
    expected = full_replay(directory, tmp_path / "full")
    snapshot, report, said = started(directory, caplog)
    assert snapshot == expected and said == {}
    assert report.summarised == len(summaries_of(directory))
    assert report.summarised_bytes == covered_bytes(directory)

    run(write_on(12, 6000, SEGMENT))  # it is sealed, the next ones begin
    assert newest(directory) != path and covered(path) == end
    assert len(list_segments(directory)) >= len(list_segments(journal)) + 2
    expected = full_replay(directory, tmp_path / "full")
    snapshot, report, said = started(directory, caplog)
    assert snapshot == expected and said == {}
    assert report.summarised == len(summaries_of(directory))
    assert report.summarised_bytes == covered_bytes(directory)


# ------------------------------------------------------------------ a real kill -9


def test_a_process_killed_while_it_writes_prefix_summaries_recovers_what_a_full_replay_does(
        tmp_path, caplog):
    """A process journaling through a real Store (4 KiB segments, a prefix summary every
    KiB), killed with SIGKILL half way through writing a prefix summary's `.tmp`, once it
    is whole but not renamed, once renamed, and a few milliseconds after one is renamed
    (wherever that lands); after each kill a start through the summaries recovers what a
    full replay does, through every summary there, and the next process goes on from
    that journal (writing on into the segment the last one left)."""
    directory = tmp_path / "journal"
    for run_index, (count, moment) in enumerate([(5, "half"), (4, "whole"), (6, "renamed"),
                                                 (7, None), (3, "renamed")]):
        segment_id = killed(directory, 100_000 * run_index, count, moment, partial=1024,
                            kind="prefix")
        tmp = directory / f"journal-{segment_id:08d}.sum.tmp"
        assert tmp.exists() == (moment in ("half", "whole"))
        left = {int(path.name[8:16]) for path in directory.glob("journal-*.sum.tmp")}
        held = summaries_of(directory)
        if moment == "renamed":
            summary = decode_summary(held[segment_id])
            assert summary.size <= (directory / f"journal-{segment_id:08d}.seg").stat().st_size
        snapshot, report, said = started(copied(directory, tmp_path / f"with{run_index}"),
                                         caplog)
        assert snapshot == full_replay(directory, tmp_path / f"full{run_index}")
        assert report.summarised == len(held), "every summary there is used"
        assert set(said) == left and all(len(s) == 1 for s in said.values()), said
        assert all("was being written when the server stopped" in s for (s,) in said.values())


# ------------------------------------------------------------------ reading ahead


def test_reading_ahead_while_prefix_summaries_appear_matches_a_full_replay(tmp_path,
                                                                          monkeypatch, caplog):
    """A shared-store backup reads the journal ahead while the active writes it: in short
    passes that fall behind (so that it meets segments whose prefix summaries are there
    already), some catching up to the end, some taken by the writer thread between a
    summary's `.tmp` and its rename, or just after it. Its final pass, once the active
    stopped, rebuilds what a full replay does, and nothing was said or changed before."""
    directory = tmp_path / "journal"
    backup = Store(directory, settings())
    lock = threading.Lock()
    passes = {"all": 0, "at a .tmp": 0, "prefix summaries used": 0}
    original_apply = JournalReading._apply_summary

    def apply_summary(self, summary, segment_id, path) -> None:
        if self.ahead and summary.size < path.stat().st_size:
            passes["prefix summaries used"] += 1
        original_apply(self, summary, segment_id, path)

    def read_ahead() -> None:
        """A few hundred bytes (the writer writes faster), every 16th pass to the end."""
        with lock:
            passes["all"] += 1
            backup.read_ahead(50, limit_bytes=256 if passes["all"] % 16 else 0)

    original_write = writer_module.write_summary_file

    def write_summary_file(directory: Path, segment_id: int,
                           summary: PendingSummary) -> None:
        path = summary_path(directory, segment_id)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_bytes(summary.data()[:50])
        passes["at a .tmp"] += 1
        read_ahead()  # a half-written `.tmp` beside the summary it replaces
        original_write(directory, segment_id, summary)
        read_ahead()

    monkeypatch.setattr(JournalReading, "_apply_summary", apply_summary)
    monkeypatch.setattr(writer_module, "write_summary_file", write_summary_file)

    async def go() -> tuple[dict, object]:
        broker, store = await open_store(directory, segment_bytes=SEGMENT,
                                         partial_summary_bytes=PARTIAL,
                                         summary_records_per_item=1)
        store.begin_epoch(1)
        begin_mixed(broker, store)
        for first in range(0, 80, 2):
            await mixed_traffic(broker, store, 2, first)
            read_ahead()
        await close(store)
        return await started_from(backup)  # (no other thread reads ahead now)

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pairmq.store"):
        snapshot, report = asyncio.run(go())
    assert summary_warnings(caplog) == {}
    assert passes["at a .tmp"] > 20 and passes["prefix summaries used"] >= 3, passes
    assert report.read_ahead > 0 and report.summarised >= passes["prefix summaries used"]
    monkeypatch.undo()
    assert snapshot == full_replay(directory, tmp_path / "full")


# ------------------------------------------------------------------ a backup's journal


def test_a_backup_writes_prefix_summaries_and_its_start_through_them_matches(tmp_path):
    directory = a_backup_follows_more_traffic(tmp_path, partial_summary_bytes=PARTIAL,
                                              summary_records_per_item=1)
    path = newest(directory)
    assert covered(path) <= path.stat().st_size, "a prefix summary of the newest"
    quick, report = recovered(directory)
    assert report.summarised == len(list_segments(directory))
    assert report.summarised_bytes == sealed_bytes(directory) + covered(path)
    assert quick == full_replay(directory, tmp_path / "full")


# ------------------------------------------------------------------ the encoding


def test_the_summaries_a_builder_hands_over_are_those_of_its_items_then(journal):
    """Fed every record of the journal (as a backup feeds it), with a prefix summary every
    1 KiB: each summary it hands over, joined once the builder went on (as the writer
    thread joins it later), holds the items the builder held when it handed it over,
    byte for byte as `encode_summary` encodes them; the sealed ones are the journal's."""
    handed: list[tuple[PendingSummary, SegmentSummary]] = []

    def seal(segment_id: int, summary: PendingSummary) -> None:
        decoded = decode_summary(summary.data()) if len(handed) % 3 == 0 else None
        then = SegmentSummary(segment_id, 0, 0, summary.size, 0,
                              copy.deepcopy(builder.items))
        handed.append((summary, then))
        if decoded is not None:  # some joined at once: the parts are kept for later ones
            assert decoded.items == then.items

    builder = SummaryBuilder(seal, partial_bytes=1024)
    for segment_id, path in list_segments(journal):
        def visit(seq: int, epoch: int, kind: int, payload: memoryview, offset: int,
                  segment_id: int = segment_id) -> None:
            summarise_entries(builder, decode_entries(payload, load_bodies=False), seq,
                              epoch, segment_id, offset, offset + len(payload))

        scan_segment(segment_id, path, visit)
    builder.seal()
    prefixes = [s for s, _ in handed if not s.sealed]
    assert len(prefixes) >= 3 * len(list_segments(journal))
    for summary, then in handed:
        data = summary.data()
        decoded = decode_summary(data)
        assert (decoded.segment_id, decoded.size) == (then.segment_id, then.size)
        assert decoded.items == then.items, f"segment {then.segment_id} at {then.size}"
        assert encode_summary(decoded) == data
    sealed = {s.segment_id: s.data() for s, _ in handed if s.sealed}
    assert len(sealed) == len(list_segments(journal))
    del sealed[list_segments(journal)[-1][0]]  # the journal has a prefix summary of that one
    assert sealed == {segment_id: data for segment_id, data in summaries_of(journal).items()
                      if segment_id in sealed}


# ------------------------------------------------------------------ the database's copy


def test_the_database_copys_cuts_keep_a_prefix_summary_only_if_it_covers_what_is_left(
        journal, tmp_path, caplog):
    """The local copy of a database's journal (store/database/resume.py) cuts a torn end
    and the records the database does not hold: the newest segment's summary stays when
    it covers no more than what is left, and goes (before the cut) otherwise."""
    path = newest(journal)
    end = covered(path)
    seqs: dict[int, int] = {}  # where each record begins -> its seq

    def visit(seq: int, epoch: int, kind: int, payload: memoryview, offset: int) -> None:
        seqs[offset - RECORD_HEADER.size] = seq

    scan_segment(int(path.name[8:16]), path, visit)
    after = min(seq for at, seq in seqs.items() if at >= end)
    before = max(seq for at, seq in seqs.items() if at < end)
    for cut, kept in ((None, True), (after + 1, True), (after, True), (before, False)):
        directory = fresh(journal, tmp_path / "j")
        segment = directory / path.name
        if cut is None:
            with open(segment, "ab") as f:
                f.write(b"\x00" * 100)  # a torn end
            local = resume.survey(directory)
            assert local is not None and segment.stat().st_size == path.stat().st_size
        else:
            resume.cut_from(directory, cut)
            assert segment.stat().st_size == next(at for at, seq in seqs.items()
                                                  if seq == cut)
        assert segment.with_suffix(".sum").exists() == kept, cut
        expected = full_replay(directory, tmp_path / "full")
        snapshot, report, said = started(directory, caplog)
        assert snapshot == expected and said == {}
        assert report.summarised == len(list_segments(directory)) - (not kept)


def test_prefix_summaries_only_for_a_segment_whose_records_come_in_runs():
    """Where consumers keep up, sends alternate with acknowledgements and nearly every
    record is an item of its own: a prefix summary would save a start little and cost the
    writer thread tens of ms each time, so none is written (the sealed one is). A segment
    of long runs of new messages gets them."""
    handed: list[tuple[int, PendingSummary]] = []
    builder = SummaryBuilder(lambda segment_id, s: handed.append((segment_id, s)),
                             partial_bytes=8192, records_per_item=16)
    at, seq, order = {1: SEGMENT_HEADER.size, 2: SEGMENT_HEADER.size}, 0, 0

    def record(segment_id: int, adds: bool) -> None:
        nonlocal seq, order
        seq += 1
        payload_at = at[segment_id] + RECORD_HEADER.size
        end = at[segment_id] = payload_at + 1000
        if adds:
            order += 1
            builder.adds(seq, 1, segment_id, payload_at, end,
                         [("/queue/q", ["/queue/q"], 10, 900, order, {})], [], [])
        else:
            builder.opaque(seq, 1, segment_id, payload_at, end)

    for _ in range(200):  # 400 KB: room for 48 prefix summaries
        record(1, True)
        record(1, False)
    for _ in range(400):  # the writer moved on (segment 1 sealed): runs of sends only
        record(2, True)
    builder.seal()
    prefixes = {segment_id: sum(1 for i, s in handed if i == segment_id and not s.sealed)
                for segment_id in (1, 2)}
    assert prefixes[1] == 0
    assert prefixes[2] >= 400 * 1000 // 8192 - 8  # all but the first few (items: 1 record)
    assert sorted(i for i, s in handed if s.sealed) == [1, 2]
