"""Offline inspection and explicit repair of a journal (`pairmq journal check|repair`).

The check reads every record of every segment, and compares each segment summary with
the records it describes (store/summary_check.py). A summary that does not match is not
damage: a start reads its segment record by record (and removes it); so does a repair.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pairmq.store.record_decoding import decode_entries
from pairmq.store.records import RECORD_HEADER, SEGMENT_HEADER, CorruptRecord
from pairmq.store.segments import SegmentScan, list_segments, scan_segment
from pairmq.store.summary import (
    decode_summary,
    remove_summary,
    stray_summaries,
    summary_path,
)
from pairmq.store.summary_check import SummaryVerifier


def journal_directory(path: Path) -> Path:
    """Accept a server's data directory or its journal directory."""
    return path / "journal" if (path / "journal").is_dir() else path


@dataclass(frozen=True)
class SummaryProblem:
    """A summary file a start would not use (it would remove it)."""

    segment_id: int
    path: Path
    problem: str  # completes "the summary of segment N ..."

    def describe(self) -> str:
        return f"{self.path.name}: the summary of segment {self.segment_id} {self.problem}"


@dataclass
class CheckReport:
    directory: Path
    scans: list[SegmentScan]
    damage: SegmentScan | None  # the first segment with a problem
    torn_tail_only: bool  # the only problem is a torn end of the newest segment
    summaries: list[SummaryProblem] = field(default_factory=list)  # not journal damage
    summaries_matching: int = 0  # summaries that describe their segments

    @property
    def ok(self) -> bool:
        """The journal serves (summaries never make it otherwise: they are a cache)."""
        return self.damage is None or self.torn_tail_only


def describe_summaries(report: CheckReport) -> list[str]:
    """What `pairmq journal check` prints of the summaries (store/summary.py)."""
    lines = [f"{problem.describe()}: SUMMARY NOT USED" for problem in report.summaries]
    if report.summaries_matching or report.summaries:
        lines.append(f"segment summaries: {report.summaries_matching} match their segments"
                     + (f", {len(report.summaries)} do not: a start reads those segments "
                        "record by record and removes them (so does `pairmq journal "
                        "repair`); the journal itself is not damaged by them"
                        if report.summaries else ""))
    return lines


def summaries_as_json(report: CheckReport) -> dict[str, object]:
    """The same, for `pairmq journal check --json`."""
    return {"matching": report.summaries_matching,
            "problems": [{"file": problem.path.name, "segment": problem.segment_id,
                          "problem": problem.problem} for problem in report.summaries]}


def check_journal(path: Path, progress: Callable[[int, int], None] | None = None
                  ) -> CheckReport:
    """Scan every segment; `progress(bytes_done, bytes_in_all)` after each (a CLI's bar)."""
    directory = journal_directory(path)
    scans = []
    damage = None
    last_seq = 0
    found = list_segments(directory)
    total = sum(seg_path.stat().st_size for _, seg_path in found)
    done = 0
    summaries: list[SummaryProblem] = []
    matching = 0
    for segment_id, seg_path in found:
        problems: list[str] = []
        verifier, problem = _summary_of(directory, segment_id)

        def visit(seq: int, epoch: int, kind: int, payload: memoryview, offset: int,
                  problems: list[str] = problems, verifier: SummaryVerifier | None = verifier
                  ) -> None:
            if problems:
                return
            try:
                entries = decode_entries(payload, load_bodies=False)
            except CorruptRecord as e:
                problems.append(f"record {seq} at offset {offset} does not decode: {e}")
                return
            if verifier is not None:
                verifier.record(seq, epoch, offset - RECORD_HEADER.size,
                                offset + len(payload), entries)

        scan = scan_segment(segment_id, seg_path, visit, last_seq)
        if problems and scan.problem is None:
            scan.problem = problems[0]
        if verifier is not None:
            problem = verifier.mismatch(scan.size)
            matching += problem is None
        if problem is not None:
            summaries.append(SummaryProblem(segment_id, summary_path(directory, segment_id),
                                            problem))
        scans.append(scan)
        if scan.records:
            last_seq = scan.last_seq
        if scan.problem is not None and damage is None:
            damage = scan
        done += scan.size
        if progress is not None:
            progress(done, total)
    present = {segment_id for segment_id, _ in found}
    summaries += [SummaryProblem(segment_id, path, problem) for segment_id, path, problem
                  in stray_summaries(directory, present)]
    torn_only = (damage is not None and damage is scans[-1] and damage.at_tail)
    return CheckReport(directory, scans, damage, torn_only, summaries, matching)


def _summary_of(directory: Path, segment_id: int
                ) -> tuple[SummaryVerifier | None, str | None]:
    """A verifier for the segment's summary, or why there is none to verify (both None:
    the segment has no summary)."""
    try:
        data = summary_path(directory, segment_id).read_bytes()
    except FileNotFoundError:
        return None, None
    try:
        return SummaryVerifier(decode_summary(data), segment_id), None
    except (ValueError, struct.error, UnicodeDecodeError) as e:
        return None, f"does not decode ({e})"


def repair_journal(path: Path) -> list[str]:
    """Cut the journal at its first damage; later segments are moved aside, not deleted."""
    report = check_journal(path)
    actions = []
    for summary in report.summaries:  # a cache a start would not use
        summary.path.unlink(missing_ok=True)
        actions.append(f"removed {summary.describe()}")
    damage = report.damage
    if damage is None:
        return actions or ["nothing to repair: every segment checks out"]
    aside = report.directory / f"damaged-{time.strftime('%Y%m%d-%H%M%S')}"
    later = [s for s in report.scans if s.segment_id > damage.segment_id]
    for scan in [damage, *later]:  # their summaries no longer describe them
        remove_summary(report.directory, scan.segment_id)
    if later:
        aside.mkdir()
        for scan in later:
            os.replace(scan.path, aside / scan.path.name)
            actions.append(f"moved {scan.path.name} ({scan.size} bytes, {scan.records} records) "
                           f"to {aside}")
    if damage.valid_end <= SEGMENT_HEADER.size and damage.records == 0:
        aside.mkdir(exist_ok=True)
        os.replace(damage.path, aside / damage.path.name)
        actions.append(f"moved {damage.path.name} to {aside}: nothing in it was readable")
    else:
        cut = damage.size - damage.valid_end
        os.truncate(damage.path, damage.valid_end)
        actions.append(f"cut {damage.path.name} at offset {damage.valid_end} ({cut} bytes "
                       f"dropped: {damage.problem})")
    return actions
