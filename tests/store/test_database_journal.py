"""[store] url: the journal kept in a real PostgreSQL, against real server processes, a real
SIGKILL, SIGSTOP past the lease, and PostgreSQL restarted under load (docs/database.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
import stomp

from pairmq.client.plain import BlockingConnection
from pairmq.protocol import Frame, serialize
from tests.integration.rawstomp import connect
from tests.serverproc import ServerProcess, free_port
from tests.support.admin import admin_status, admin_user_flags, metric
from tests.support.cli import run
from tests.support.commits import Replies
from tests.support.database import (
    LEASE_MS,
    ReceiptedProducer,
    assert_once_in_order,
    database_flags,
    drain_bodies,
    forge_record_after,
    journal_rows,
    rows,
    shifted_clock,
    wipe_local_copy,
)
from tests.support.disk import small_disk
from tests.support.postgres import PostgresServer
from tests.support.servers import restart
from tests.support.streams import append, offsets, read, stream_info, subscribe
from tests.support.waiting import wait_until


@pytest.mark.parametrize("local_copy", ["kept", "wiped"])
def test_kill_9_mid_load_every_receipted_message_comes_back_once_and_in_order(
        server_factory, postgres_db: str, local_copy: str) -> None:
    server = server_factory(*database_flags(postgres_db))
    producers = [ReceiptedProducer(server.address, "/queue/orders", tag).start()
                 for tag in ("a", "b")]
    for producer in producers:
        producer.wait_receipts(300)
    server.kill()
    receipted = set().union(*(p.receipted for p in producers))
    sent = [body for p in producers for body in p.sent]
    if local_copy == "wiped":  # what comes back comes from the database alone
        wipe_local_copy(server)
    server = restart(server, *database_flags(postgres_db))
    restored = server.log_lines("Journal restored from the database")
    # kept: the local journal is the database's up to what it saw committed, compared
    # after that, cut past the database's last row; only the rest is read from it
    assert ("the local journal kept up to seq" in restored[-1]) == (local_copy == "kept")
    assert "pairmq-test-secret" not in server.logs(), "the password was logged"
    bodies = drain_bodies(server, "/queue/orders")
    assert_once_in_order(bodies, receipted, sent)
    assert len(receipted) >= 600


def test_a_local_journal_that_the_database_does_not_hold_is_cut_where_they_differ(
        server_factory, postgres_db: str) -> None:
    """A server's local journal ends with a record the database never committed, and
    another server numbered that record anew in the database: the first server, started
    again, keeps its journal up to there, cuts the rest and takes the database's rows."""
    first = server_factory(*database_flags(postgres_db), name="first")
    producer = ReceiptedProducer(first.address, "/queue/q", tag="first").start()
    producer.wait_receipts(200)
    producer.stop()
    first.stop()
    last = int(rows(postgres_db, "SELECT max(seq) FROM pairmq_dbpair.journal")[0][0])
    second = server_factory(*database_flags(postgres_db), name="second")
    other = ReceiptedProducer(second.address, "/queue/q", tag="second").start()
    other.wait_receipts(200)
    other.stop()
    second.stop()
    # the record the database holds at last + 1 is the second server's; the first's local
    # journal gets another one there (a group it wrote, never committed, before it died)
    forge_record_after(first.data_dir / "journal", last)
    first = first.start_again(*database_flags(postgres_db))
    restored = first.log_lines("Journal restored from the database")[-1]
    assert f"the local journal kept up to seq {last} (1 of its records compared)" in restored
    bodies = drain_bodies(first, "/queue/q")
    assert_once_in_order(bodies, producer.receipted | other.receipted,
                         producer.sent + other.sent)


@pytest.mark.parametrize("mode", [pytest.param("fast", marks=pytest.mark.long), "immediate"])
def test_postgresql_restarted_mid_load_loses_nothing_and_the_server_carries_on(
        server_factory, tmp_path, mode: str) -> None:
    with PostgresServer() as pg:
        pg.start()
        url = pg.create_database("restarted")
        # block: a recovery longer than the lease holds the producer instead of refusing it
        server = server_factory(*database_flags(url), "--full-policy", "block")
        producer = ReceiptedProducer(server.address, "/queue/q").start()
        producer.wait_receipts(200)
        pg.restart(mode)
        before = len(producer.receipted)
        # receipts go on by themselves once the database is back
        producer.wait_receipts(before + 300, timeout=30)
        producer.stop()
        assert not producer.errors
        logs = server.logs()
        assert "The database does not take the journal" in logs or \
            "Database lease not renewed" in logs, "the outage was not said"
        assert "The database takes the journal again" in logs or \
            "Database lease renewed again" in logs
        # No false receipt: every receipted message is in the database, which a restart
        # from it (the local copy wiped) shows.
        server.kill()
        wipe_local_copy(server)
        server = restart(server, *database_flags(url))
        bodies = drain_bodies(server, "/queue/q")
        assert_once_in_order(bodies, producer.receipted, producer.sent)


@pytest.mark.parametrize("successor", ["writes first", "idle"])
def test_a_server_paused_past_its_lease_writes_no_row_and_confirms_nothing(
        server_factory, postgres_db: str, successor: str) -> None:
    """The paused server resumes with SENDs waiting in its socket. Its successor has
    written already ("writes first": the old server's rows would collide with its rows),
    or not yet ("idle": nothing but the fence stops the old server's rows)."""
    first = server_factory(*database_flags(postgres_db))
    producer = ReceiptedProducer(first.address, "/queue/q", tag="old").start()
    producer.wait_receipts(100)
    # the second server waits for the lease: it does not listen before it has it
    waiting = start_waiting(server_factory, postgres_db)
    wait_until(lambda: waiting.log_lines("Database lease held by"), "the second to wait")
    os.kill(first.proc.pid, signal.SIGSTOP)
    new = None
    try:
        paused_at = len(producer.sent)
        time.sleep(0.3)  # frames written now wait in the paused server's socket
        wait_until(lambda: waiting.log_lines("pairmq server", "ready"),
                   "the second server to take over", timeout=LEASE_MS / 1000 + 15)
        if successor == "writes first":
            new = ReceiptedProducer(waiting.address, "/queue/q", tag="new").start()
            new.wait_receipts(100)
            new.stop()
        receipts_before = set(producer.receipted)
    finally:
        os.kill(first.proc.pid, signal.SIGCONT)
    # resumed: it finds its lease gone, writes nothing and stops
    wait_until(lambda: first.proc.poll() is not None, "the paused server to stop", 20)
    producer.stop(settle=0)
    late = producer.receipted - receipts_before
    assert not late, f"the old server confirmed {len(late)} messages after losing its lease"
    assert first.log_lines("Database lease lost") or \
        first.log_lines("another server holds the lease now")
    # what the database holds, read by the successor from it alone
    assert waiting.stop() == 0
    wipe_local_copy(waiting)
    waiting = waiting.start_again(*database_flags(postgres_db))
    bodies = drain_bodies(waiting, "/queue/q")
    receipted = producer.receipted | (new.receipted if new else set())
    assert_once_in_order(bodies, receipted, producer.sent + (new.sent if new else []))
    written_late = [b for b in bodies if b.startswith("old-") and
                    int(b.split("-")[1]) >= paused_at]
    assert not written_late, f"the old server's messages sent while paused: {written_late[:5]}"


def start_waiting(server_factory, url: str) -> ServerProcess:
    """A second server on the same journal, not yet listening (it waits for the lease):
    started without waiting for its port."""
    return server_factory(*database_flags(url), wait_listening=False)


def test_a_newer_schema_and_a_wrong_password_are_refused_by_name(server_factory, tmp_path,
                                                                 postgres_db: str) -> None:
    server = server_factory(*database_flags(postgres_db))
    server.stop()
    rows(postgres_db, "UPDATE pairmq_dbpair.pairmq_schema SET version = 99")
    refused = start_refused(server_factory, *database_flags(postgres_db))
    assert "layout version 99, newer than this pairmq's" in refused
    wrong = postgres_db.replace("pairmq-test-secret", "wrong-password")
    refused = start_refused(server_factory, *database_flags(wrong))
    assert "password authentication failed" in refused
    assert "wrong-password" not in refused


def start_refused(server_factory, *flags: str) -> str:
    server = server_factory(*flags, wait_listening=False)
    wait_until(lambda: server.proc.poll() is not None, "the server to refuse to start", 20)
    assert server.proc.returncode == 3
    return server.logs()


def test_no_connection_left_for_the_server_is_said_and_it_starts_once_there_is(
        server_factory, postgres_server: PostgresServer, postgres_db: str) -> None:
    database = postgres_db.rsplit("/", 1)[1]
    postgres_server.sql(f"CREATE ROLE limited LOGIN PASSWORD 'limited-pw' CONNECTION LIMIT 0; "
                        f"GRANT CREATE ON DATABASE \"{database}\" TO limited")
    try:
        url = f"postgresql://limited:limited-pw@127.0.0.1:{postgres_server.port}/{database}"
        server = server_factory(*database_flags(url), wait_listening=False)
        wait_until(lambda: server.log_lines("cannot be reached", "too many connections"),
                   "the connection limit to be named")
        assert server.proc.poll() is None, "the server gave up"
        postgres_server.sql("ALTER ROLE limited CONNECTION LIMIT 10")
        wait_until(lambda: server.log_lines("pairmq server", "ready"), "the server to start")
        conn = stomp.Connection([server.address])
        conn.connect(wait=True)
        conn.send("/queue/q", "x", headers={"persistent": "true", "receipt": "r"})
        conn.disconnect()
        wait_until(lambda: journal_rows(url) >= 1, "the message's record in the database")
        server.stop()
    finally:
        postgres_server.sql("DROP OWNED BY limited CASCADE; DROP ROLE limited",
                            database=database)


@pytest.mark.parametrize("policy", ["fail", "block"])
def test_a_database_away_past_the_lease_refuses_or_holds_per_full_policy(
        server_factory, policy: str) -> None:
    admin = f"127.0.0.1:{free_port()}"
    with PostgresServer() as pg:
        pg.start()
        url = pg.create_database("away")
        server = server_factory(*database_flags(url), "--full-policy", policy,
                                "--admin", admin, *admin_user_flags())
        conn = BlockingConnection(*server.address)
        conn.request(Frame("SEND", {"destination": "/queue/q", "persistent": "true"}, b"0"))
        assert metric(admin, "pairmq_database_up") == 1
        pg.stop("fast")
        try:
            # within the lease a producer only waits; past it, full_policy decides
            sent = Replies(conn)
            conn.sock.sendall(serialize(Frame("SEND", {"destination": "/queue/q",
                                                       "persistent": "true",
                                                       "receipt": "away"}, b"1"), "1.2"))
            status = wait_until(lambda: (s := admin_status(admin)) and
                                s["journal"]["database"]["copy"] == "down" and s,
                                "the copy to say the database is away")
            assert status["journal"]["database"]["problem"]
            assert metric(admin, "pairmq_database_up") == 0
            wait_until(lambda: admin_status(admin)["journal"]["full"], "refusing new "
                       "messages", timeout=LEASE_MS / 1000 + 10)
            assert server.log_lines("The database does not take the journal")
            if policy == "fail":
                conn.sock.sendall(serialize(Frame(
                    "SEND", {"destination": "/queue/q", "persistent": "true",
                             "receipt": "refused"}, b"2"), "1.2"))
                wait_until(lambda: sent.error is not None, "an ERROR to the producer")
                assert sent.error is not None
                assert "the database does not take the journal" in \
                    sent.error.headers.get("message", "")
            assert "away" not in sent.receipts, "confirmed while the database was away"
        finally:
            pg.start()
        wait_until(lambda: not admin_status(admin)["journal"]["full"], "taking messages again",
                   timeout=20)
        if policy == "block":  # held, not lost: confirmed once the database is back
            assert sent.wait("away", 20) is not None
        bodies = drain_bodies(server, "/queue/q")
        assert bodies[:2] == ["0", "1"]


@pytest.mark.long  # CI time: the lease's fence is tested in make test
def test_clocks_an_hour_off_neither_take_over_early_nor_miss_a_takeover(
        server_factory, postgres_db: str) -> None:
    """The lease's expiry is on the database's clock only: a server whose clock is an hour
    ahead (or behind) waits for a live holder, and takes over from a dead one in time."""
    holder = server_factory(*database_flags(postgres_db))
    producer = ReceiptedProducer(holder.address, "/queue/q", tag="a").start()
    for offset in ("+1h", "-1h"):
        waiting = server_factory(*database_flags(postgres_db), env=shifted_clock(offset),
                                 wait_listening=False)
        wait_until(lambda w=waiting: w.log_lines("Database lease held by"),
                   f"the server at {offset} to wait for the lease")
        logged = datetime.strptime(waiting.logs()[:19], "%Y-%m-%d %H:%M:%S")
        shift = (logged - datetime.now()).total_seconds()
        assert abs(shift - int(f"{offset[0]}3600")) < 60, f"its clock is {shift:.0f} s off"
        # two lease lengths: the holder renews, the other waits, receipts go on
        before = len(producer.receipted)
        time.sleep(2 * LEASE_MS / 1000)
        assert not waiting.log_lines("pairmq server", "ready"), \
            f"the server at {offset} took over from a live holder"
        assert len(producer.receipted) > before + 50
        holder.kill()
        killed = time.monotonic()
        wait_until(lambda w=waiting: w.log_lines("pairmq server", "ready"),
                   f"the server at {offset} to take over", timeout=LEASE_MS / 1000 + 10)
        took = time.monotonic() - killed
        assert took < LEASE_MS / 1000 + 5, f"took over after {took:.1f} s"
        sent, receipted = producer.sent, producer.receipted
        bodies = drain_bodies(waiting, "/queue/q")
        assert set(receipted) <= set(bodies)
        assert set(bodies) <= set(sent)
        holder = waiting
        producer = ReceiptedProducer(holder.address, "/queue/q", tag=offset[0]).start()
    producer.stop()


def test_rows_of_consumed_messages_are_deleted_and_journal_check_reads_the_database(
        server_factory, postgres_db: str) -> None:
    server = server_factory(*database_flags(postgres_db), "--segment-bytes", "65536")
    conn = stomp.Connection([server.address], heartbeats=(0, 0))
    conn.connect(wait=True)
    for _ in range(3000):
        conn.send("/queue/churn", "x" * 1024, headers={"persistent": "true"})
    conn.disconnect(receipt="sent")
    wait_until(lambda: journal_bytes(postgres_db) >= 3000 * 1024, "the records in the database")
    written = journal_bytes(postgres_db)
    assert len(drain_bodies(server, "/queue/churn")) == 3000
    # the journal's emptied segments go, and their rows after them, in short batches
    wait_until(lambda: journal_bytes(postgres_db) < written / 3, "dead rows to be deleted",
               timeout=20)
    check = check_cli(postgres_db)
    assert check.returncode == 0, check.stdout + check.stderr
    report = json.loads(check.stdout)
    assert report["ok"] and report["rows"] == journal_rows(postgres_db)
    server.stop()
    # one byte of one record changed: the check names it
    rows(postgres_db, "UPDATE pairmq_dbpair.journal SET data = set_byte(data, 30, "
                      "(get_byte(data, 30) + 1) % 256) WHERE seq = "
                      "(SELECT max(seq) FROM pairmq_dbpair.journal)")
    check = check_cli(postgres_db)
    assert check.returncode == 1
    assert not json.loads(check.stdout)["ok"]


def check_cli(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pairmq", "journal", "check", "--url", url,
                           "--group", "dbpair", "--json"], capture_output=True, text=True,
                          timeout=60)


def journal_bytes(url: str) -> int:
    return int(rows(url, "SELECT coalesce(sum(length(data)), 0) FROM pairmq_dbpair.journal")
               [0][0])


def test_the_database_disk_full_is_named_and_the_server_carries_on_once_there_is_room(
        server_factory, tmp_path) -> None:
    space = Path(f"/tmp/pairmq-pgspace-{uuid.uuid4().hex[:8]}")  # the postgres user's reach
    with PostgresServer() as pg, small_disk(space, "8m"):
        pg.start()
        os.chown(space, *pg.owner_ids())
        pg.sql(f"CREATE TABLESPACE small LOCATION '{space}'")
        pg.sql("CREATE DATABASE full_disk TABLESPACE small")
        url = pg.url("full_disk")
        server = server_factory(*database_flags(url))
        producer = ReceiptedProducer(server.address, "/queue/q", pad=2000).start()
        wait_until(lambda: server.log_lines("The database does not take the journal",
                                            "No space left on device"),
                   "the full disk to be named", timeout=60)
        stuck = len(producer.receipted)
        time.sleep(LEASE_MS / 1000 + 1)  # past the lease: refused per full_policy (fail)
        assert producer.errors and "the database does not take the journal" in \
            producer.errors[0], producer.errors
        assert len(producer.receipted) <= stuck + 1, "confirmed what the database refused"
        producer.stop(settle=0)
        # another client is still served: non-persistent messages need no journal
        conn = stomp.Connection([server.address], heartbeats=(0, 0))
        conn.connect(wait=True)
        conn.send("/topic/t", "still here")
        conn.disconnect()
        assert server.alive()
        # room again: the records waiting go in, and the server takes messages again
        assert run("mount", "-o", "remount,size=64m", str(space)).returncode == 0
        status = wait_until(lambda: server.log_lines("The database takes the journal again"),
                            "the copy to resume", timeout=30)
        assert status
        again = ReceiptedProducer(server.address, "/queue/q", tag="again").start()
        again.wait_receipts(50)
        again.stop()
        server = restart(server, *database_flags(url))
        bodies = drain_bodies(server, "/queue/q")
        assert (producer.receipted | again.receipted) <= set(bodies)
        assert len(bodies) == len(set(bodies))


def test_a_stream_and_its_retention_come_back_from_the_database(
        server_factory, postgres_db: str) -> None:
    flags = (*database_flags(postgres_db), "--max-bytes", str(40 * 1200))
    server = server_factory(*flags)
    client, _ = connect(server.address)
    append(client, "/stream/events", [f"e{i}".ljust(1000, ".") for i in range(100)])
    first, next_offset = stream_info(client, "/stream/events")
    client.close()
    assert next_offset == 100 and 0 < first < 100 - 30  # retention removed the oldest
    # a clean stop (what retention removed is journaled after the receipts), then a start
    # from the database alone: the local copy is made anew
    server = restart(server, *flags, crash=False)
    assert server.log_lines("Journal restored from the database")
    client, _ = connect(server.address)
    assert stream_info(client, "/stream/events") == (first, next_offset)
    subscribe(client, "/stream/events", str(first))
    frames = read(client, next_offset - first)
    assert offsets(frames) == list(range(first, next_offset))
    assert [f.text.rstrip(".") for f in frames] == [f"e{i}" for i in range(first, next_offset)]
    append(client, "/stream/events", ["after"])
    assert stream_info(client, "/stream/events")[1] == next_offset + 1
    client.close()
