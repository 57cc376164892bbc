"""Offline inspection and explicit repair of a journal (`pairmq journal check|repair`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pairmq.store.records import SEGMENT_HEADER, CorruptRecord, decode_entries
from pairmq.store.segments import SegmentScan, list_segments, scan_segment
from pairmq.store.summary import remove_summary


def journal_directory(path: Path) -> Path:
    """Accept a server's data directory or its journal directory."""
    return path / "journal" if (path / "journal").is_dir() else path


@dataclass
class CheckReport:
    directory: Path
    scans: list[SegmentScan]
    damage: SegmentScan | None  # the first segment with a problem
    torn_tail_only: bool  # the only problem is a torn end of the newest segment

    @property
    def ok(self) -> bool:
        return self.damage is None or self.torn_tail_only


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
    for segment_id, seg_path in found:
        problems: list[str] = []

        def visit(seq: int, epoch: int, kind: int, payload: memoryview, offset: int,
                  problems: list[str] = problems) -> None:
            if problems:
                return
            try:
                decode_entries(payload, load_bodies=False)
            except CorruptRecord as e:
                problems.append(f"record {seq} at offset {offset} does not decode: {e}")

        scan = scan_segment(segment_id, seg_path, visit, last_seq)
        if problems and scan.problem is None:
            scan.problem = problems[0]
        scans.append(scan)
        if scan.records:
            last_seq = scan.last_seq
        if scan.problem is not None and damage is None:
            damage = scan
        done += scan.size
        if progress is not None:
            progress(done, total)
    torn_only = (damage is not None and damage is scans[-1] and damage.at_tail)
    return CheckReport(directory, scans, damage, torn_only)


def repair_journal(path: Path) -> list[str]:
    """Cut the journal at its first damage; later segments are moved aside, not deleted."""
    report = check_journal(path)
    damage = report.damage
    if damage is None:
        return ["nothing to repair: every segment checks out"]
    actions = []
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
