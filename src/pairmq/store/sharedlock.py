"""The shared store's lock: who may write the journal in a directory both servers mount.

The active server holds an exclusive POSIX record lock (`fcntl.lockf`, i.e. F_SETLK) on
`live.lock` in the shared directory for as long as it writes, and keeps a *holder record*
in that file: a random token, its name and pid, and a wall-clock timestamp it rewrites
(and fsyncs) at every verification. A lock alone is not enough on a network file system:
an NFS server that lost the client's lease hands the lock to someone else without telling
the old holder, and an operator may delete the file. So the holder re-verifies, as Artemis
does since its NFS split-brain report:

- the file at the path is still the file it locked (`st_dev`, `st_ino` of `stat(path)`
  equal to those of `fstat(fd)`): not removed, not replaced;
- the holder record there is still its own (a new holder overwrites it first thing);
- its timestamp write reached the disk (a hung or failed mount cannot prove anything).

The I/O is here (`SharedLock`, to be called off the event loop: NFS calls can block); the
decision is `verify`, a pure function of what was observed and when the observation
started. A proof is valid for `validity` seconds from that start, shortened by the drift
margin (the same rule as the witness's lease, ha/lease.py).

POSIX record locks belong to the process: closing *any* descriptor of the file in the
holding process drops the lock. This module therefore never opens the lock file a second
time while it holds it (the holder record is read through the held descriptor).
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

LOCK_NAME = "live.lock"
JOURNAL_NAME = "journal"
DRIFT = 0.05  # as ha/lease.py: clocks may run this much apart over one validity period
RECORD_BYTES = 512  # the holder record is rewritten in place, padded to this size


def lock_path(shared_dir: Path, file_name: str = LOCK_NAME) -> Path:
    return Path(shared_dir) / file_name


def is_shared_store(directory: Path) -> bool:
    """A directory that a shared-store pair uses (a server without that policy refuses it)."""
    return lock_path(directory).exists()


@dataclass(frozen=True)
class Observation:
    """What one verification saw: identities, the holder record's token, a write error."""

    path_identity: tuple[int, int] | None  # (st_dev, st_ino) at the path; None: no file
    held_identity: tuple[int, int]  # (st_dev, st_ino) of the descriptor we locked
    token: str | None  # the holder record's token now (None: unreadable)
    write_error: str | None = None  # the timestamp could not be written and fsynced


@dataclass(frozen=True)
class Proof:
    """Until when (monotonic seconds) the holder may write and confirm; why, if it may not."""

    until: float
    reason: str = ""

    def valid(self, now: float) -> bool:
        return now < self.until


NO_PROOF = Proof(0.0, "the lock is not held")


def verify(seen: Observation, token: str, started: float, validity: float) -> Proof:
    """The holder's verdict on one observation that started at `started` (monotonic).

    Counting from the start, not the end, of the observation keeps the proof inside the
    time the lock was certainly ours: a new holder overwrites the record before it does
    anything, so an observation that still read our record started before that."""
    if seen.path_identity is None:
        return Proof(0.0, "the lock file was removed")
    if seen.path_identity != seen.held_identity:
        return Proof(0.0, "the lock file was replaced by another file")
    if seen.token != token:
        return Proof(0.0, "another server wrote its holder record into the lock file")
    if seen.write_error is not None:
        return Proof(0.0, f"cannot write the lock file: {seen.write_error}")
    return fresh_proof(started, validity)


def fresh_proof(started: float, validity: float) -> Proof:
    """The proof a lock acquisition that started at `started` gives (our record is there)."""
    return Proof(started + validity * (1 - DRIFT))


def wait_out(acquired: float, validity: float) -> float:
    """When a new holder may start writing: every proof the previous holder may still hold
    started before `acquired` (our record was on disk then), so it ends before this."""
    return acquired + validity * (1 + DRIFT)


class SharedLock:
    """The lock file of one shared directory, as one server sees it (blocking calls). Also
    each server's own data directory lock (`file_name="lock"`): one process per directory,
    and the refusal names the holder."""

    def __init__(self, shared_dir: Path, name: str, file_name: str = LOCK_NAME) -> None:
        self.path = lock_path(shared_dir, file_name)
        self.name = name
        self.token = ""
        self._fd: int | None = None
        self._identity: tuple[int, int] | None = None
        # The calls run in executor threads, a verification alongside a release: one at a
        # time, so a descriptor is never used after it was closed (or reused).
        self._mutex = threading.Lock()

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock without waiting; on success write our holder record (fsynced)."""
        with self._mutex:
            return self._try_acquire()

    def _try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        try:
            st = os.fstat(fd)
            self.token = secrets.token_hex(8)
            self._write_record(fd)
        except OSError:
            os.close(fd)  # closing drops the lock
            raise
        self._fd = fd
        self._identity = (st.st_dev, st.st_ino)
        return True

    def observe(self) -> Observation | None:
        """Stat the path, read the record through our descriptor, rewrite the timestamp
        (None when the lock is not held)."""
        with self._mutex:
            return self._observe()

    def _observe(self) -> Observation | None:
        fd, identity = self._fd, self._identity
        if fd is None or identity is None:
            return None
        try:
            st = os.stat(self.path)
            path_identity: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            path_identity = None
        token = _token_of(os.pread(fd, RECORD_BYTES, 0))
        error = None
        if path_identity == identity and token == self.token:
            try:
                self._write_record(fd)
            except OSError as e:
                error = e.strerror or str(e)
        return Observation(path_identity, identity, token, error)

    def release(self) -> None:
        """Unlock and close (a no-op when not held)."""
        with self._mutex:
            self._release()

    def _release(self) -> None:
        fd, self._fd, self._identity = self._fd, None, None
        if fd is None:
            return
        try:
            fcntl.lockf(fd, fcntl.LOCK_UN)
        except OSError:
            pass  # a lock the file system already took back
        os.close(fd)

    def holder(self) -> str:
        """Who the record names (for logs; only while we do not hold the lock, since
        opening and closing the file would drop a lock we hold)."""
        if self._fd is not None:
            return self.name
        try:
            with open(self.path, "rb") as f:
                record = json.loads(f.read(RECORD_BYTES).rstrip(b"\0 \n") or b"{}")
        except (OSError, ValueError):
            return "?"
        age = time.time() - float(record.get("ts", 0))
        return f"{record.get('name', '?')} (pid {record.get('pid', '?')}, record " \
               f"renewed {age:.1f} s ago)"

    def _write_record(self, fd: int) -> None:
        record = json.dumps({"token": self.token, "name": self.name, "pid": os.getpid(),
                             "ts": time.time()}).encode()
        os.pwrite(fd, record.ljust(RECORD_BYTES, b" "), 0)
        os.fsync(fd)


def _token_of(data: bytes) -> str | None:
    try:
        record = json.loads(data.rstrip(b"\0 \n") or b"{}")
    except ValueError:
        return None
    token = record.get("token") if isinstance(record, dict) else None
    return token if isinstance(token, str) else None
