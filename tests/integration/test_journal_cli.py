"""Damaged journals: a torn tail is cut at start (logged); damage in the middle stops the
server (exit 3, naming the segment and offset) until `pairmq journal repair` cuts it.

Every case starts from a real server killed with SIGKILL, then damages its files as a
crash, a bad disk or a stray write would; `pairmq journal check|repair` are run as the
commands they are.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import pytest

from pairmq.store.summary import decode_summary, encode_summary
from tests.integration.rawstomp import RawStomp, unique
from tests.serverproc import ServerProcess
from tests.support.cli import run, run_pairmq
from tests.support.servers import restart

P = {"persistent": "true"}
PAD = b"#" * 200


def body(i: int) -> bytes:
    return b"body-%03d-" % i + PAD


def segments(srv: ServerProcess) -> list[Path]:
    return sorted((srv.data_dir / "journal").glob("journal-*.seg"))


def fill(srv: ServerProcess, raw_client, queue: str, count: int) -> None:
    producer, _ = raw_client(srv)
    for i in range(count):
        producer.request("SEND", {"destination": queue, **P}, body(i))


def kill(srv: ServerProcess) -> None:
    srv.kill()
    assert srv.proc.returncode == -signal.SIGKILL


def start_refused(srv: ServerProcess) -> subprocess.CompletedProcess:
    """Run the server with the killed one's exact command line; it must refuse to start."""
    try:
        return run(*srv.args)
    except subprocess.TimeoutExpired:
        raise AssertionError("the server started on a journal damaged in the middle") from None


def consume_all(client: RawStomp, queue: str) -> list[bytes]:
    client.request("SUBSCRIBE", {"destination": queue, "id": "all"})
    return client.bodies_until_quiet(0.5)


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def killed_with_big_messages(server_factory, raw_client, flags: tuple[str, ...], tag: str):
    """A server with 64 KiB segments sent 180 persistent messages of 1 KiB (three segments
    and more), then killed: the server, its queue, the bodies in order."""
    srv = server_factory(*flags)
    queue = f"/queue/{unique(tag)}"
    producer, _ = raw_client(srv)
    big = [b"big-%03d-" % i + b"=" * 1000 for i in range(180)]
    for payload in big:
        producer.request("SEND", {"destination": queue, **P}, payload)
    kill(srv)
    return srv, queue, big


# ----------------------------------------------------------------------------- torn tails


@pytest.mark.parametrize("cut", [1, 9, 40])
def test_torn_tail_after_sigkill_is_cut_with_a_log_line(server_factory, raw_client, cut):
    srv = server_factory()
    queue = f"/queue/{unique('torn')}"
    fill(srv, raw_client, queue, 10)
    kill(srv)
    (segment,) = segments(srv)
    size = segment.stat().st_size
    last = segment.read_bytes().rfind(b"body-009-")
    assert last > 0 and size - last > cut  # the cut falls inside the last record
    torn_size = size - cut
    with open(segment, "r+b") as f:
        f.truncate(torn_size)  # the last write only partly reached the disk

    checked = run_pairmq("journal", "check", str(srv.data_dir))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "torn write at the end" in checked.stdout

    srv = restart(srv)
    logs = srv.logs()
    found = re.search(r"(journal-\d+\.seg) ended with a torn write.*dropped (\d+) bytes at "
                      r"offset (\d+)", logs)
    assert found, logs
    name, dropped, offset = found.group(1), int(found.group(2)), int(found.group(3))
    assert name == segment.name
    assert dropped > 0 and offset + dropped == torn_size
    assert offset < last, "the cut is at the start of the torn record"
    assert segment.stat().st_size == offset, "the cut is made on disk"

    client, _ = raw_client(srv)
    assert consume_all(client, queue) == [body(i) for i in range(9)]
    srv.stop()
    checked = run_pairmq("journal", "check", str(srv.data_dir))
    assert checked.returncode == 0 and "journal is intact" in checked.stdout, checked.stdout


def test_zero_filled_tail_is_a_torn_write(server_factory, raw_client):
    """After a crash some filesystems leave the end of a file that was being appended to
    filled with zeros (the size reached the disk, the data did not). Nothing valid follows
    the last good record: that is a torn tail, not corruption in the middle."""
    srv = server_factory()
    queue = f"/queue/{unique('zeros')}"
    fill(srv, raw_client, queue, 5)
    kill(srv)
    (segment,) = segments(srv)
    size = segment.stat().st_size
    with open(segment, "ab") as f:
        f.write(b"\0" * 4096)
    srv = restart(srv)
    assert re.search(r"torn write.*dropped 4096 bytes", srv.logs()), srv.logs()
    assert segment.stat().st_size == size
    client, _ = raw_client(srv)
    assert consume_all(client, queue) == [body(i) for i in range(5)]


# ----------------------------------------------------------------------------- corruption


def test_corruption_in_the_middle_refuses_to_start_until_repaired(server_factory, raw_client):
    srv = server_factory()
    queue = f"/queue/{unique('rot')}"
    fill(srv, raw_client, queue, 20)
    kill(srv)
    (segment,) = segments(srv)
    intact = run_pairmq("journal", "check", str(srv.data_dir))
    assert intact.returncode == 0 and "journal is intact" in intact.stdout, intact.stdout
    assert re.search(rf"{segment.name}: 2\d records", intact.stdout), intact.stdout
    size = segment.stat().st_size
    damaged_at = segment.read_bytes().find(body(10)) + 100  # inside message 10's body
    flip(segment, damaged_at)

    refused = start_refused(srv)
    output = refused.stdout + refused.stderr
    assert refused.returncode == 3, output
    found = re.search(rf"{re.escape(str(segment))} is damaged at offset (\d+)", output)
    assert found, output
    offset = int(found.group(1))
    data = segment.read_bytes()
    assert data.find(body(9)) < offset < damaged_at, "the damaged record starts at offset"
    assert "pairmq journal repair" in output
    assert segment.stat().st_size == size, "refusing to start changes nothing"

    for where in (srv.data_dir, srv.data_dir / "journal"):
        checked = run_pairmq("journal", "check", str(where))
        assert checked.returncode == 1, checked.stdout + checked.stderr
        assert f"{segment.name}: " in checked.stdout
        assert f"DAMAGED at offset {offset}" in checked.stdout, checked.stdout
        assert "damaged in the middle" in checked.stdout
    scripted = run_pairmq("journal", "check", str(srv.data_dir), "--json")
    report = json.loads(scripted.stdout)
    assert scripted.returncode == 1 and report["ok"] is False, scripted.stdout
    [seg] = report["segments"]
    assert (seg["file"], seg["valid_end"]) == (segment.name, offset) and seg["problem"]

    declined = run_pairmq("journal", "repair", str(srv.data_dir), stdin="n\n")
    assert declined.returncode != 0
    assert segment.stat().st_size == size, "repair without confirmation changes nothing"

    repaired = run_pairmq("journal", "repair", str(srv.data_dir), "--yes")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert f"cut {segment.name} at offset {offset}" in repaired.stdout, repaired.stdout
    assert segment.stat().st_size == offset
    checked = run_pairmq("journal", "check", str(srv.data_dir))
    assert checked.returncode == 0 and "journal is intact" in checked.stdout, checked.stdout

    srv = restart(srv)
    client, _ = raw_client(srv)
    assert consume_all(client, queue) == [body(i) for i in range(10)]


def test_damage_in_an_older_segment_keeps_what_precedes_it_and_moves_the_rest_aside(
        server_factory, raw_client):
    flags = ("--segment-bytes", "65536")
    srv, queue, big = killed_with_big_messages(server_factory, raw_client, flags, "older")
    found = segments(srv)
    assert len(found) >= 3, found
    second = found[1]
    data = second.read_bytes()
    victim = next(i for i, payload in enumerate(big) if payload[:8] in data)  # first in it
    victim += 5
    damaged_at = data.find(big[victim][:8]) + 500
    flip(second, damaged_at)

    refused = start_refused(srv)
    output = refused.stdout + refused.stderr
    assert refused.returncode == 3, output
    assert second.name in output and "offset" in output

    checked = run_pairmq("journal", "check", str(srv.data_dir))
    assert checked.returncode == 1
    lines = checked.stdout.splitlines()
    assert any(line.startswith(f"{found[0].name}:") and line.endswith(": ok")
               for line in lines), checked.stdout
    assert any(line.startswith(f"{second.name}:") and "DAMAGED" in line
               for line in lines), checked.stdout

    repaired = run_pairmq("journal", "repair", str(srv.data_dir), "--yes")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert f"cut {second.name}" in repaired.stdout
    aside = [p for p in (srv.data_dir / "journal").iterdir() if p.name.startswith("damaged-")]
    assert len(aside) == 1 and aside[0].is_dir(), "later segments are moved aside"
    moved = sorted(p.name for p in aside[0].iterdir())
    assert moved == [p.name for p in found[2:]], repaired.stdout
    for name in moved:
        assert f"moved {name}" in repaired.stdout

    srv = restart(srv, *flags)
    client, _ = raw_client(srv)
    assert consume_all(client, queue) == big[:victim]


# ----------------------------------------------------------------------------- summaries


def test_check_reports_summaries_that_do_not_match_and_repair_removes_them(server_factory,
                                                                          raw_client):
    """A segment summary (store/summary.py) is a cache: one whose checksum holds but whose
    entries are not its records', or a `.tmp` a crash left, is a problem of the summary
    (the journal is intact: exit 0); `pairmq journal repair` removes them, asking nothing
    (no message is lost)."""
    flags = ("--segment-bytes", "65536")
    srv, queue, big = killed_with_big_messages(server_factory, raw_client, flags, "summaries")
    journal = srv.data_dir / "journal"
    summaries = sorted(journal.glob("journal-*.sum"))
    assert len(summaries) >= 2, sorted(journal.iterdir())
    intact = run_pairmq("journal", "check", str(srv.data_dir))
    assert intact.returncode == 0, intact.stdout + intact.stderr
    assert f"segment summaries: {len(summaries)} match their segments\n" in intact.stdout

    lying, cut = summaries[:2]
    summary = decode_summary(lying.read_bytes())
    next(item for item in summary.items if len(item.offsets) > 1).offsets[1] += 8
    lying.write_bytes(encode_summary(summary))  # its checksum holds: only the check sees it
    leftover = cut.with_name(cut.name + ".tmp")
    leftover.write_bytes(cut.read_bytes()[:40])  # a kill -9 while the writer wrote it
    cut.unlink()

    checked = run_pairmq("journal", "check", str(srv.data_dir))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    lines = checked.stdout.splitlines()
    assert any(line.startswith(f"{lying.name}: the summary of segment ") and "entries' offsets"
               in line and line.endswith("SUMMARY NOT USED") for line in lines), checked.stdout
    assert any(line.startswith(f"{leftover.name}: ") and "was being written" in line
               for line in lines), checked.stdout
    assert f"{len(summaries) - 2} match their segments, 2 do not" in checked.stdout
    assert "journal is intact" in checked.stdout
    scripted = json.loads(run_pairmq("journal", "check", str(srv.data_dir), "--json").stdout)
    assert scripted["ok"] is True and scripted["summaries"]["matching"] == len(summaries) - 2
    assert sorted(p["file"] for p in scripted["summaries"]["problems"]) == sorted(
        [lying.name, leftover.name])

    repaired = run_pairmq("journal", "repair", str(srv.data_dir))  # no question: nothing lost
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert f"removed {lying.name}: " in repaired.stdout
    assert f"removed {leftover.name}: " in repaired.stdout
    assert not lying.exists() and not leftover.exists()
    again = run_pairmq("journal", "check", str(srv.data_dir))
    assert f"segment summaries: {len(summaries) - 2} match their segments\n" in again.stdout
    assert "nothing to repair" in run_pairmq("journal", "repair", str(srv.data_dir)).stdout

    srv = restart(srv, *flags)
    client, _ = raw_client(srv)
    assert consume_all(client, queue) == big
