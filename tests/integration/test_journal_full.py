"""A full journal: `--max-journal-bytes` with both policies, and a real full disk (ENOSPC).

full-policy fail: a persistent SEND (or the COMMIT of a transaction holding one) gets an
ERROR naming the full journal; the server keeps serving everything else, and every
message confirmed before is still there. full-policy block: the producer is held (no
RECEIPT, its later frames wait) until consumers drain and compaction frees segments,
then it proceeds. On a real full filesystem (a 2 MiB tmpfs; skipped where mounting is
not permitted) a failed write confirms nothing, and nothing confirmed is lost.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.integration.rawstomp import Frame, RawStomp, StompError, unique
from tests.serverproc import ServerProcess
from tests.support.disk import small_disk
from tests.support.servers import restart

SEGMENT = 65536
LIMIT = 200_000
BODY = b"x" * 4000
P = {"persistent": "true"}


def journal_bytes(srv: ServerProcess) -> int:
    """The segments' bytes; one that compaction deletes between the listing and its stat
    counts for nothing (it is gone)."""
    total = 0
    for path in (srv.data_dir / "journal").glob("journal-*.seg"):
        try:
            total += path.stat().st_size
        except FileNotFoundError:
            pass
    return total


def fill(srv: ServerProcess, producer: RawStomp, queue: str) -> int:
    """Persistent SENDs, each receipted (so on disk), until the journal files reach LIMIT:
    from then on the journal is full. Returns how many were sent (x-seq 0..n-1)."""
    sent = 0
    while journal_bytes(srv) < LIMIT:
        assert sent < 500, "the journal never reached its limit"
        producer.request("SEND", {"destination": queue, "x-seq": str(sent), **P}, BODY)
        sent += 1
    return sent


def answer(producer: RawStomp, queue: str, seq: int, wait: float) -> Frame | None:
    """One more persistent SEND with receipt r{seq}: its answer, or None if there is none
    within `wait` seconds."""
    producer.send_frame("SEND", {"destination": queue, "receipt": f"r{seq}",
                                 "x-seq": str(seq), **P}, BODY)
    try:
        return producer.read_frame(wait)
    except TimeoutError:
        return None


def fill_until_refused(producer: RawStomp, queue: str, body: bytes, limit: int = 500
                       ) -> tuple[int, Frame | None]:
    """For a real disk, whose room is unknown: persistent SENDs, one at a time, until one is
    not receipted within 3 s. Returns (receipted, the ERROR or None if none came)."""
    for i in range(limit):
        producer.send_frame("SEND", {"destination": queue, "receipt": f"r{i}",
                                     "x-seq": str(i), **P}, body)
        try:
            frame = producer.read_frame(3)
        except TimeoutError:
            return i, None
        if frame.command == "ERROR":
            return i, frame
        assert frame.command == "RECEIPT" and frame.headers["receipt-id"] == f"r{i}", frame
    raise AssertionError(f"{limit} persistent messages were all accepted: the disk never "
                         "filled up")


def drain(client: RawStomp, queue: str, count: int, ack: bool = True) -> list[int]:
    """Consume `count` messages (acknowledging each one, receipted), return their x-seq."""
    client.request("SUBSCRIBE", {"destination": queue, "id": "drain",
                                 "ack": "client-individual" if ack else "auto"})
    seqs = []
    for _ in range(count):
        frame = client.read_message(5)
        seqs.append(int(frame.headers["x-seq"]))
        if ack:
            client.request("ACK", {"id": frame.headers["ack"]})
    return seqs


# ----------------------------------------------------------------------------- fail


def test_fail_policy_refuses_persistent_sends_and_harms_nothing_confirmed(server_factory,
                                                                          raw_client):
    flags = ("--segment-bytes", str(SEGMENT), "--max-journal-bytes", str(LIMIT),
             "--full-policy", "fail")
    srv = server_factory(*flags)
    queue = f"/queue/{unique('full')}"
    late_tx, _ = raw_client(srv)  # a transaction opened before the journal fills up
    late_tx.request("BEGIN", {"transaction": "t"})
    late_tx.request("SEND", {"destination": queue, "transaction": "t", **P}, "in tx")
    producer, _ = raw_client(srv)
    accepted = fill(srv, producer, queue)
    error = answer(producer, queue, accepted, 5)
    assert error is not None and error.command == "ERROR", error
    assert "journal is full" in error.headers["message"], error
    assert "max_journal_bytes" in error.headers["message"] or str(LIMIT) in error.headers[
        "message"], error
    assert error.headers.get("receipt-id") == f"r{accepted}"
    assert accepted >= LIMIT // len(BODY) // 2, f"only {accepted} accepted before 'full'"
    assert journal_bytes(srv) < LIMIT + SEGMENT
    assert producer.read_until_closed(5) == [], "an ERROR is followed by a close"

    # Everyone else is still served; only new persistent messages are refused.
    other, _ = raw_client(srv)
    other.request("SUBSCRIBE", {"destination": f"{queue}-np", "id": "np"})
    other.request("SEND", {"destination": f"{queue}-np"}, "not persistent")
    assert other.read_message().body == b"not persistent"
    late_tx.send_frame("COMMIT", {"transaction": "t", "receipt": "c"})
    refused = late_tx.read_frame()
    assert refused.command == "ERROR" and "journal is full" in refused.headers["message"]
    assert refused.headers.get("receipt-id") == "c"
    third, _ = raw_client(srv)
    with pytest.raises(StompError, match="journal is full"):
        third.request("SEND", {"destination": f"/queue/{unique('else')}", **P}, "p")

    # Nothing confirmed was harmed, even across a crash while full.
    srv = restart(srv, *flags)
    consumer, _ = raw_client(srv)
    assert drain(consumer, queue, accepted) == list(range(accepted))
    consumer.assert_quiet()
    # Acknowledged and compacted away: there is room again.
    producer, _ = raw_client(srv)
    producer.request("SEND", {"destination": queue, "x-seq": "after", **P}, "after")
    assert consumer.read_message().body == b"after"
    assert journal_bytes(srv) < LIMIT


def test_full_journal_is_logged_when_it_changes_not_at_every_write(server_factory,
                                                                    raw_client):
    """Like a full destination (docs/stomp.md, Flow control): one warning when it fills,
    not one per journal write while it stays full (that would flood the logs, which often
    live on the very disk that is full)."""
    srv = server_factory("--segment-bytes", str(SEGMENT), "--max-journal-bytes", str(LIMIT))
    queue = f"/queue/{unique('log')}"
    producer, _ = raw_client(srv)
    accepted = fill(srv, producer, queue)
    assert answer(producer, queue, accepted, 5).command == "ERROR"
    consumer, _ = raw_client(srv)
    consumer.request("SUBSCRIBE", {"destination": queue, "id": "s",
                                   "ack": "client-individual", "prefetch-count": "10"})
    for _ in range(10):  # the journal stays full: these do not empty a whole segment
        frame = consumer.read_message()
        consumer.request("ACK", {"id": frame.headers["ack"]})
    warnings = re.findall(r"WARNING .*[Jj]ournal is full", srv.logs())
    assert 1 <= len(warnings) <= 2, (f"{len(warnings)} 'journal is full' warnings for one "
                                     f"full period:\n" + "\n".join(warnings))


# ----------------------------------------------------------------------------- block


def test_block_policy_holds_the_producer_until_consumers_make_room(server_factory, raw_client):
    srv = server_factory("--segment-bytes", str(SEGMENT), "--max-journal-bytes", str(LIMIT),
                         "--full-policy", "block")
    queue = f"/queue/{unique('block')}"
    producer, _ = raw_client(srv)
    held = fill(srv, producer, queue)
    frame = answer(producer, queue, held, 1.0)
    assert frame is None, f"block policy: the SEND is held, no answer; got {frame!r}"
    # Frames behind the held SEND wait too, whatever they are.
    for i in range(held + 1, held + 4):
        producer.send_frame("SEND", {"destination": queue, "receipt": f"r{i}",
                                     "x-seq": str(i), **P}, BODY)
    producer.send_frame("SEND", {"destination": queue, "receipt": "np", "x-seq": "np"}, "np")
    with pytest.raises(TimeoutError):
        producer.read_frame(1.0)
    assert "held until there is room" in srv.logs()

    # Other connections are served meanwhile (what journals nothing is never held).
    other, _ = raw_client(srv)
    other.request("SUBSCRIBE", {"destination": "/topic/side", "id": "t"})
    other.request("SEND", {"destination": "/topic/side"}, "side")
    assert other.read_message().body == b"side"

    consumer, _ = raw_client(srv)
    assert drain(consumer, queue, held) == list(range(held))
    # Compaction deletes the drained segments: the held producer resumes.
    for i in range(held, held + 4):
        assert producer.wait_receipt(f"r{i}", timeout=10).command == "RECEIPT"
    producer.wait_receipt("np", timeout=5)
    rest = [consumer.read_message(5) for _ in range(5)]
    assert [f.headers["x-seq"] for f in rest] == [*(str(i) for i in range(held, held + 4)),
                                                   "np"]
    assert "room again" in srv.logs()
    assert journal_bytes(srv) < LIMIT


# ----------------------------------------------------------------------------- a real full disk


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 2 MiB tmpfs mounted as the data directory of a server named "tiny", with a
    512 KiB ballast file an operator can delete to make room."""
    with small_disk(tmp_path / "data-tiny", "2m") as mountpoint:
        ballast = mountpoint / "ballast"
        ballast.write_bytes(b"\0" * 512 * 1024)
        yield mountpoint, ballast


def test_disk_full_refuses_persistent_sends_and_loses_nothing_confirmed(server_factory,
                                                                        raw_client, tiny_disk):
    mountpoint, ballast = tiny_disk
    started: list[ServerProcess] = []
    try:
        # the journal's own ENOSPC handling is under test, not the max_disk_usage guard
        srv = server_factory("--max-disk-usage", "100", name="tiny")
        started.append(srv)
        assert srv.data_dir == mountpoint
        queue = f"/queue/{unique('enospc')}"
        producer, _ = raw_client(srv)
        accepted, reply = fill_until_refused(producer, queue, body=b"y" * 16384, limit=200)
        assert reply is None, f"the SEND whose write failed is not confirmed, got {reply!r}"
        assert accepted > 10
        # The failed write stays unconfirmed; further persistent SENDs are refused.
        producer.send_frame("SEND", {"destination": queue, "receipt": "more", **P}, b"z")
        error = producer.read_frame(5)
        assert error.command == "ERROR", error
        assert "no space left" in error.headers["message"].lower(), error
        assert error.headers.get("receipt-id") == "more"
        logs = srv.logs()
        assert "ENOSPC" in logs or "No space left" in logs or "disk is full" in logs
        # The server is alive and serves what needs no disk.
        other, _ = raw_client(srv)
        other.send_frame("SUBSCRIBE", {"destination": "/topic/alive", "id": "t"})
        other.send_frame("SEND", {"destination": "/topic/alive"}, "alive")
        assert other.read_message().body == b"alive"

        # Crash while the disk is still full: recovery needs no room, loses nothing.
        srv = restart(srv)
        started.append(srv)
        consumer, _ = raw_client(srv)
        seqs = drain(consumer, queue, accepted, ack=False)
        assert seqs == list(range(accepted))
        try:  # the SEND that was being written when the disk filled may or may not be there
            extra = consumer.read_message(0.5)
            assert extra.headers["x-seq"] == str(accepted)
        except TimeoutError:
            pass

        # An operator makes room: persistent messages are accepted again.
        ballast.unlink()
        deadline = time.monotonic() + 10
        while True:  # the server retries the failed write every second
            late, _ = raw_client(srv)
            try:
                late.request("SEND", {"destination": queue, "x-seq": "late", **P}, "late")
                break
            except StompError as e:
                # the failed write, or the disk sampled still full (at start, then every
                # second): both name the problem
                assert "journal write failed" in str(e) or "disk usage of the data " \
                    "directory" in str(e), e
                assert time.monotonic() < deadline, "no room after the ballast was deleted"
                time.sleep(0.3)
        assert consumer.read_message(5).body == b"late"
    finally:
        ballast.unlink(missing_ok=True)
        for srv in started:
            srv.stop()  # before the filesystem is unmounted


def test_disk_full_with_block_policy_resumes_once_consumers_drain(server_factory, raw_client,
                                                                  tiny_disk):
    """The journal itself filled the disk. With full-policy block the producer is held;
    once a consumer has drained and acknowledged everything, compaction can delete the
    dead segments, there is room again, and the producer proceeds (no operator needed)."""
    _, ballast = tiny_disk
    ballast.unlink()  # the journal alone fills the disk
    srv = server_factory("--segment-bytes", str(SEGMENT), "--full-policy", "block",
                         "--max-disk-usage", "100", name="tiny")  # ENOSPC, not the guard
    try:
        queue = f"/queue/{unique('enospc')}"
        producer, _ = raw_client(srv)
        held, reply = fill_until_refused(producer, queue, body=b"y" * 16000, limit=400)
        assert reply is None, reply
        assert len(list((srv.data_dir / "journal").glob("journal-*.seg"))) > 3
        consumer, _ = raw_client(srv)
        consumer.request("SUBSCRIBE", {"destination": queue, "id": "s",
                                       "ack": "client-individual"})
        drained = []
        while True:
            try:
                frame = consumer.read_message(1.0)
            except TimeoutError:
                break
            drained.append(int(frame.headers["x-seq"]))
            consumer.send_frame("ACK", {"id": frame.headers["ack"]})
        assert drained[:held] == list(range(held))
        assert producer.wait_receipt(f"r{held}", timeout=10).command == "RECEIPT", \
            "still held after the consumer drained everything"
        producer.request("SEND", {"destination": queue, "x-seq": "after", **P}, "after")
    finally:
        srv.kill()  # a clean stop would wait for a journal that cannot be written
