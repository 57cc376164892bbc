"""An in-memory journal for the simulator: records with a sequence number and an epoch,
appended (in the process's memory) or fsynced (on disk), so a crash loses exactly what
was not fsynced. It offers what `ReplicationMachine` reads (ha/replication.py `Journal`)
and what the driver does to a store (append, begin an epoch, mirror, wipe)."""

from __future__ import annotations

from typing import NamedTuple


class Rec(NamedTuple):
    seq: int
    epoch: int
    msg: int  # > 0: a producer's message id; < 0: an epoch record (unique per beginning)


class JournalError(Exception):
    """The journal was asked for something a real store refuses (an invariant of its own)."""


class SimJournal:
    def __init__(self) -> None:
        self.records: list[Rec] = []
        self.first = 1  # the seq of records[0]
        self.synced_seq = 0
        self.epoch = 0
        self.epochs: list[tuple[int, int]] = []
        self.mirror = False
        self.version = 0  # bumped when records are dropped (crash, wipe): caches reset

    # ------------------------------------------------------------ what the machine reads

    @property
    def appended_seq(self) -> int:
        return self.first + len(self.records) - 1

    @property
    def oldest_seq(self) -> int:
        return self.first

    # ------------------------------------------------------------ reads

    def get(self, seq: int) -> Rec | None:
        i = seq - self.first
        return self.records[i] if 0 <= i < len(self.records) else None

    def span(self, first: int, upto: int) -> list[Rec] | None:
        """Records first..upto (None: some are not held any more)."""
        if first > upto:
            return []
        if first < self.first or upto > self.appended_seq:
            return None
        return self.records[first - self.first:upto - self.first + 1]

    # ------------------------------------------------------------ writes

    def append(self, msg: int) -> Rec:
        rec = Rec(self.appended_seq + 1, self.epoch, msg)
        self.records.append(rec)
        return rec

    def begin_epoch(self, epoch: int, marker: int) -> Rec:
        if epoch <= self.epoch:
            raise JournalError(f"epoch {epoch} begun over epoch {self.epoch}: epochs only grow")
        self.epoch = epoch
        rec = self.append(marker)
        self.epochs.append((epoch, rec.seq))
        return rec

    def append_mirrored(self, rec: Rec) -> None:
        if rec.seq != self.appended_seq + 1:
            raise JournalError(f"replication gap: got {rec.seq} after {self.appended_seq}")
        if rec.epoch != self.epoch:
            if rec.epoch < self.epoch:
                raise JournalError(f"mirrored record {rec.seq} has epoch {rec.epoch}, below "
                                   f"the journal's {self.epoch}")
            self.epochs.append((rec.epoch, rec.seq))
            self.epoch = rec.epoch
        self.records.append(rec)

    def fsynced(self, upto: int) -> None:
        self.synced_seq = max(self.synced_seq, min(upto, self.appended_seq))

    def sync_all(self) -> None:
        """A clean stop: everything appended reaches the disk."""
        self.synced_seq = self.appended_seq

    def crash(self) -> None:
        """The process dies: what was not fsynced is lost; the epoch history is re-read
        from the records (as recovery does)."""
        keep = max(0, self.synced_seq - self.first + 1)
        if keep < len(self.records):
            del self.records[keep:]
            self.version += 1
        self.epoch = 0
        self.epochs = []
        for rec in self.records:
            if rec.epoch != self.epoch:
                self.epochs.append((rec.epoch, rec.seq))
                self.epoch = rec.epoch
        self.mirror = False

    def wipe(self, first: int) -> None:
        """A full synchronisation replaces the journal, continuing from the active's first."""
        self.records = []
        self.first = first
        self.synced_seq = first - 1
        self.epoch = 0
        self.epochs = []
        self.version += 1
