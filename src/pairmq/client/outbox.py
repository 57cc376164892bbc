"""The durable connection's outbox: persistent messages kept on the client's own disk until
a server confirmed them (store and forward, FioranoMQ's "durable connections").

A SQLite file in WAL mode with `synchronous = FULL`, so a message `append` returned is on
disk (an fsync of the WAL) and survives the client process being killed. Rows come back in
the order they were stored, each with the producer stamp it was given (client/sequences.py),
so forwarding after a crash sends exactly what may be missing and the server drops what it
already has.

One process at a time: a lock file next to the database (`PATH.lock`, with the holder's
pid) refuses a second client on the same outbox with a clear error.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pairmq.client.errors import ClientClosed, ClientError, OutboxFull

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    destination TEXT NOT NULL,
    headers TEXT NOT NULL,
    body BLOB NOT NULL,
    stored REAL NOT NULL
)
"""


@dataclass(frozen=True, slots=True)
class Stored:
    """A message read back from the outbox."""

    seq: int
    destination: str
    headers: dict[str, str]
    body: bytes
    stored: float  # time.time() when it was stored


class Outbox:
    def __init__(self, path: str | os.PathLike[str], max_messages: int, max_bytes: int,
                 full_policy: str = "fail") -> None:
        self.path = Path(path)
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.full_policy = full_policy
        self._lock_file = self._take_lock()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(_SCHEMA)
            depth, size = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(LENGTH(body) + LENGTH(headers)), 0) "
                "FROM outbox").fetchone()
        except sqlite3.DatabaseError as e:
            self._db.close()
            self._release_lock()
            raise ClientError(f"outbox {self.path}: {e}") from None
        self.depth = depth
        self.bytes = size
        self.forwarded = 0
        self._closed = False
        self._room = threading.Condition()

    def _take_lock(self) -> IO[str]:
        lock_path = self.path.with_name(self.path.name + ".lock")
        handle = open(lock_path, "a+")  # noqa: SIM115 - held for the outbox's life
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ClientError(f"outbox {self.path} is in use by {holder}: one client process "
                              "at a time may use an outbox") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        return handle

    def _release_lock(self) -> None:
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
        finally:
            self._lock_file.close()

    def _full(self, size: int) -> str | None:
        if self.depth >= self.max_messages:
            return f"it holds {self.depth} messages (outbox_max_messages)"
        if self.depth and self.bytes + size > self.max_bytes:
            return f"it holds {self.bytes} bytes (outbox_max_bytes {self.max_bytes})"
        return None

    def append(self, destination: str, headers: dict[str, str], body: bytes,
               timeout: float | None = None) -> int:
        """Store a message durably; returns its sequence number. OutboxFull when full
        (policy fail) or still full after `timeout` s (policy block)."""
        encoded = json.dumps(headers, separators=(",", ":"))
        size = len(body) + len(encoded.encode())
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._room:
            while (why := self._full(size)) is not None:
                if self._closed:
                    raise ClientClosed("the outbox was closed")
                remaining = None if deadline is None else deadline - time.monotonic()
                if self.full_policy == "fail" or (remaining is not None and remaining <= 0):
                    raise OutboxFull(f"the outbox {self.path} is full: {why}")
                self._room.wait(remaining)
            if self._closed:
                raise ClientClosed("the outbox was closed")
            cursor = self._db.execute(
                "INSERT INTO outbox (destination, headers, body, stored) VALUES (?, ?, ?, ?)",
                (destination, encoded, body, time.time()))
            self.depth += 1
            self.bytes += size
            seq = cursor.lastrowid
            assert seq is not None
            return seq

    def remove(self, seqs: list[int]) -> None:
        """Messages the server confirmed: gone from the outbox."""
        if not seqs:
            return
        with self._room:
            if self._closed:
                return
            removed = 0
            size = 0
            for start in range(0, len(seqs), 500):
                chunk = seqs[start:start + 500]
                marks = ",".join("?" * len(chunk))
                found = self._db.execute(
                    f"SELECT COUNT(*), COALESCE(SUM(LENGTH(body) + LENGTH(headers)), 0) "
                    f"FROM outbox WHERE seq IN ({marks})", chunk).fetchone()
                self._db.execute(f"DELETE FROM outbox WHERE seq IN ({marks})", chunk)
                removed += found[0]
                size += found[1]
            self.depth -= removed
            self.bytes -= size
            self.forwarded += removed
            self._room.notify_all()

    def restamp(self, rows: list[tuple[int, dict[str, str]]]) -> None:
        """Messages numbered again (client/sequences.py): their new headers, so that a
        restarted client resends them as the running one would."""
        with self._room:
            if self._closed:
                return
            for seq, headers in rows:
                encoded = json.dumps(headers, separators=(",", ":"))
                found = self._db.execute("SELECT LENGTH(headers) FROM outbox WHERE seq = ?",
                                         (seq,)).fetchone()
                if found is None:
                    continue
                self._db.execute("UPDATE outbox SET headers = ? WHERE seq = ?", (encoded, seq))
                self.bytes += len(encoded.encode()) - found[0]

    def update(self, forwarded: list[int], restamped: list[tuple[int, dict[str, str]]]
               ) -> None:
        """`restamp` then `remove`, in one call (the asyncio client's executor)."""
        if restamped:
            self.restamp(restamped)
        self.remove(forwarded)

    def stored(self) -> list[Stored]:
        """Everything still waiting, oldest first."""
        with self._room:
            rows = self._db.execute(
                "SELECT seq, destination, headers, body, stored FROM outbox ORDER BY seq"
            ).fetchall()
        return [Stored(seq, destination, json.loads(headers), bytes(body), stored)
                for seq, destination, headers, body, stored in rows]

    def _oldest_age(self) -> float:
        """Seconds the oldest waiting message has waited (0 when empty; lock held)."""
        row = self._db.execute("SELECT stored FROM outbox ORDER BY seq LIMIT 1").fetchone()
        return max(0.0, time.time() - row[0]) if row else 0.0

    def stats(self) -> dict[str, float]:
        """One consistent snapshot: depth, bytes, age of the oldest, forwarded so far."""
        with self._room:
            age = 0.0 if self._closed else self._oldest_age()
            return {"depth": self.depth, "bytes": self.bytes, "oldest_age_s": age,
                    "forwarded": self.forwarded}

    def close(self) -> None:
        with self._room:
            if self._closed:
                return
            self._closed = True
            self._room.notify_all()
            self._db.close()
        self._release_lock()
