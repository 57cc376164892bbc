"""Servers that keep their journal in PostgreSQL ([store] url), and a stomp.py producer
whose receipts a test compares with what the database let survive."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import stomp

from pairmq.store.records import RECORD_HEADER, frame_record
from pairmq.store.segments import list_segments, read_records, segment_header, segment_name
from tests.serverproc import ServerProcess
from tests.support.requirements import require
from tests.support.waiting import wait_until

LEASE_MS = 1500  # short, so that takeovers in tests come quickly
# the series only a server with [store] url exports, which the alert rules name
DATABASE_ONLY = {"pairmq_database_up"}
FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")


def shifted_clock(offset: str) -> dict[str, str]:
    """The environment of a process whose clocks read `offset` ("+1h", "-1h") off the
    machine's, through Debian's libfaketime (`make test-deps` installs it): skipped where
    it is missing, failed in CI, where it must be there."""
    require(None if FAKETIME_LIB.exists() else
            f"{FAKETIME_LIB} is missing: make test-deps installs libfaketime")
    return {"LD_PRELOAD": str(FAKETIME_LIB), "FAKETIME": offset,
            "FAKETIME_NO_CACHE": "1"}


def database_flags(url: str, group: str = "dbpair", lease_ms: int = LEASE_MS) -> tuple[str, ...]:
    """The flags of a server whose journal is in the database at `url`, in the schema of
    `group` (two servers with one group share the journal and its lease)."""
    return ("--url", url, "--group", group, "--lease-timeout-ms", str(lease_ms))


def wipe_local_copy(server: ServerProcess) -> None:
    """Remove a stopped server's local copy of the journal: its next start reads the
    database alone."""
    shutil.rmtree(server.data_dir / "journal", ignore_errors=True)


def forge_record_after(journal: Path, seq: int) -> None:
    """Append to a stopped server's local journal, as record seq + 1, a copy of its record
    seq (a valid record the database does not hold at that number), in a segment of its
    own after the others."""
    segments = list_segments(journal)
    last_id = segments[-1][0]
    found = [r for i, p in segments for r in read_records(p, i, seq, seq)]
    assert found, f"record {seq} is not in {journal}"
    _, _, _, epoch, kind = RECORD_HEADER.unpack_from(found[0])
    payload = found[0][RECORD_HEADER.size:]
    path = journal / segment_name(last_id + 1)
    path.write_bytes(segment_header(last_id + 1) + frame_record(seq + 1, epoch, payload, kind))


def rows(url: str, query: str) -> list[tuple[Any, ...]]:
    """What `query` returns ([] for a statement that returns no rows)."""
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(query)
        return cursor.fetchall() if cursor.description is not None else []


def journal_rows(url: str, group: str = "dbpair") -> int:
    return int(rows(url, f"SELECT count(*) FROM pairmq_{group}.journal")[0][0])


class ReceiptedProducer:
    """stomp.py sending `{tag}-{k}` (k = 0, 1, ...) persistent, each with a receipt, from a
    thread, until stopped or its connection breaks; `receipted` holds the bodies the server
    confirmed, `sent` every body that may have been written: each is added before its
    write, so that `len(sent)` read at any instant bounds what the server can have received
    by then (a pause's tests count on it)."""

    def __init__(self, address: tuple[str, int], destination: str, tag: str = "p",
                 pause_every: int = 20, pad: int = 0) -> None:
        self.destination = destination
        self.tag = tag
        self.pad = pad  # bytes of "." after each body (drain_bodies takes them off)
        self.pause_every = pause_every
        self.sent: list[str] = []
        self.receipted: set[str] = set()
        self.errors: list[str] = []
        self._stop = threading.Event()
        self.conn = stomp.Connection([address], heartbeats=(0, 0))
        producer = self

        class Listener(stomp.ConnectionListener):
            def on_receipt(self, frame: Any) -> None:
                receipt = frame.headers["receipt-id"]
                if receipt.startswith(f"{tag}-"):  # not the DISCONNECT's
                    producer.receipted.add(receipt)

            def on_error(self, frame: Any) -> None:
                producer.errors.append(frame.headers.get("message", ""))

        self.conn.set_listener("receipts", Listener())
        self.conn.connect(wait=True)
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"send {tag}")

    def start(self) -> ReceiptedProducer:
        self._thread.start()
        return self

    def _run(self) -> None:
        k = 0
        try:
            while not self._stop.is_set():
                text = f"{self.tag}-{k}"
                self.sent.append(text)
                self.conn.send(self.destination, text + "." * self.pad,
                               headers={"persistent": "true", "receipt": text})
                k += 1
                if k % self.pause_every == 0:
                    time.sleep(0.005)
        except Exception:
            return

    def wait_receipts(self, count: int, timeout: float = 20.0) -> None:
        wait_until(lambda: len(self.receipted) >= count, f"{count} receipts of {self.tag}",
                   timeout)

    def stop(self, settle: float = 5.0) -> None:
        """Stop sending; wait (up to `settle`) for the receipts still due."""
        self._stop.set()
        self._thread.join(10)
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline and len(self.receipted) < len(self.sent):
            time.sleep(0.02)
        try:
            self.conn.disconnect()
        except Exception:
            pass


def drain_bodies(server: ServerProcess, destination: str, idle: float = 1.5,
                 timeout: float = 60.0) -> list[str]:
    """Every message of `destination`, in the order they came (stomp.py, ack auto), without
    the trailing dots a ReceiptedProducer pads bodies with."""
    bodies: list[str] = []
    last = [time.monotonic()]

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame: Any) -> None:
            bodies.append(frame.body.rstrip("."))  # a ReceiptedProducer's padding off
            last[0] = time.monotonic()

    conn = stomp.Connection([server.address], heartbeats=(0, 0))
    conn.set_listener("drain", Listener())
    conn.connect(wait=True)
    conn.subscribe(destination, id="drain", ack="auto")
    deadline = time.monotonic() + timeout
    while time.monotonic() - last[0] < idle and time.monotonic() < deadline:
        time.sleep(0.05)
    conn.disconnect()
    return bodies


def assert_once_in_order(bodies: list[str], receipted: set[str], sent: list[str],
                         tags: Callable[[str], str] = lambda body: body.split("-")[0]) -> None:
    """Every receipted body consumed, none twice, none never sent, in order per producer."""
    assert len(bodies) == len(set(bodies)), "a message was consumed twice"
    missing = receipted - set(bodies)
    assert not missing, f"{len(missing)} receipted messages lost, e.g. {sorted(missing)[:5]}"
    unknown = set(bodies) - set(sent)
    assert not unknown, f"messages nobody sent: {sorted(unknown)[:5]}"
    last: dict[str, int] = {}
    for body in bodies:
        tag, k = tags(body), int(body.rsplit("-", 1)[1])
        assert k > last.get(tag, -1), f"{body} came after {tag}-{last[tag]}"
        last[tag] = k
