"""The shared-store pair as real processes: one journal in one directory, a POSIX lock on it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from pairmq.client.plain import BlockingConnection, StompError
from pairmq.protocol import Frame, serialize
from pairmq.server.config import ConfigError, load_config
from pairmq.store.segments import list_segments
from tests.ha.clients import drain, send_some
from tests.ha.pair import Pair
from tests.ha.under_load import QUEUE, UnderLoad, queue_depth
from tests.serverproc import start_server
from tests.support.mixed_state import assert_served_as_built, build_mixed_state, read_all
from tests.support.waiting import wait_until


@pytest.fixture
def shared(pair_factory) -> Pair:
    p = pair_factory(policy="shared-store")
    p.start()  # the primary first: it takes the lock
    p.wait_formed()
    return p


def lock_file(pair: Pair) -> Path:
    return pair.shared_dir / "live.lock"


def test_kill_active_under_load_the_backup_takes_the_lock_and_serves_everything(
        shared: Pair) -> None:
    addrs = shared.client_addresses()
    with UnderLoad(shared) as run:
        run.load.wait_receipts(300, 20)
        shared.kill("primary")
        killed = time.monotonic()
        shared.wait_active(10, "backup")
        takeover = time.monotonic() - killed
        run.load.wait_receipts(300, 20)
        run.drain()
    assert run.load.producer.connected_to[-1] == addrs[1]
    assert takeover < 5.0
    assert queue_depth(shared, "backup") == 0
    logs = shared.logs("backup")
    assert "acquired the lock of the shared store" in logs
    assert "Local server switched to STANDALONE" in logs
    # the one journal holds it all: the primary, restarted, fails back without copying
    shared.restart("primary")
    shared.wait_formed(20, active="primary")
    assert queue_depth(shared, "primary") == 0


@pytest.mark.parametrize("failback", [True, False])
def test_start_order_does_not_matter(pair_factory, failback: bool) -> None:
    flags = [] if failback else ["--no-allow-failback"]
    pair = pair_factory(policy="shared-store", flags=flags)
    pair.start(order=("backup",))
    pair.wait_state("backup", "STANDALONE", 10)
    sent = send_some(pair.client_address("backup"), QUEUE, "early", 5)
    pair.start_server("primary")
    active = "primary" if failback else "backup"
    pair.wait_formed(20, active=active)
    got = drain(pair.client_address(active), QUEUE)
    assert sorted(got) == sorted(sent) and set(got.values()) == {1}


def test_lock_file_removed_under_the_active_it_stops_serving_at_once(shared: Pair) -> None:
    address = shared.client_address("primary")
    before = send_some(address, QUEUE, "before", 20)
    lock_file(shared).unlink()
    shared.wait_state("primary", ("WAITING", "PASSIVE"), 5)
    assert "cannot prove it holds the lock" in shared.logs("primary")
    # somebody takes the (new) lock file and serves the one journal, nothing lost; with
    # failback (the default) the pair settles with the primary active again
    shared.wait_formed(20, active="primary")
    assert lock_file(shared).exists()
    got = drain(shared.client_address("primary"), QUEUE)
    assert sorted(got) == sorted(before) and set(got.values()) == {1}


def test_a_paused_active_resumed_after_the_takeover_confirms_nothing(pair_factory) -> None:
    """SIGSTOP the active; its lock is taken from it (removing the lock file stands for an
    NFS server revoking a frozen client's lease); the backup serves; SIGCONT: a SEND that
    was waiting in the paused server's socket gets no RECEIPT."""
    shared = pair_factory(policy="shared-store", flags=["--no-allow-failback"])
    shared.start()
    shared.wait_formed()
    primary = shared.servers["primary"]
    assert primary is not None
    early = send_some(shared.client_address("primary"), QUEUE, "early", 10)
    conn = BlockingConnection(*shared.client_address("primary"), timeout=5.0)
    os.kill(primary.proc.pid, signal.SIGSTOP)
    try:
        lock_file(shared).unlink()
        shared.wait_state("backup", "STANDALONE", 15)
        later = send_some(shared.client_address("backup"), QUEUE, "later", 10)
        conn.sock.sendall(serialize(Frame("SEND", {
            "destination": QUEUE, "persistent": "true", "dup-id": "stale",
            "receipt": "r-stale"}, b"stale"), "1.2"))
    finally:
        os.kill(primary.proc.pid, signal.SIGCONT)
    frames: list[Frame] = []
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        try:
            frames.append(conn.read_frame(deadline - time.monotonic()))
        except StompError as e:  # the expected end: closed because it stopped serving
            frames.append(e.frame)
            break
        except (TimeoutError, OSError, ConnectionError):
            break
    assert not [f for f in frames if f.command == "RECEIPT"], frames
    wait_until(lambda: shared.state("primary") in ("WAITING", "PASSIVE"),
               "the resumed primary stepped down", 5)
    assert shared.serving() == ["backup"]
    got = drain(shared.client_address("backup"), QUEUE)
    assert set(early + later) <= set(got), shared.describe()
    assert all(got[d] == 1 for d in early + later)


def test_the_backup_reads_the_journal_ahead_and_replays_only_the_rest(pair_factory) -> None:
    """A PASSIVE backup reads the shared journal as the active writes and compacts it (small
    segments here, so compaction deletes some under it): when it takes over it goes on from
    that reading instead of replaying the whole journal, and it holds exactly what a full
    replay would (every receipted, unconsumed message, once)."""
    shared = pair_factory(policy="shared-store", flags=["--segment-bytes", "65536"])
    shared.start()
    shared.wait_formed()
    primary = shared.client_address("primary")
    consumed = send_some(primary, "/queue/churn", "churn", 400)  # fills and frees segments
    assert sorted(drain(primary, "/queue/churn")) == sorted(consumed)
    kept = send_some(primary, QUEUE, "kept", 300)
    wait_until(lambda: list_segments(shared.shared_dir / "journal")[0][0] > 1,
               "compaction deleting the first segment", 10)
    appended = shared.status("primary")["ha"]["appended_seq"]
    wait_until(lambda: shared.status("backup")["ha"]["shared"]["read_ahead_seq"] >= appended,
               "the backup reading the journal ahead up to the active's last record", 15)
    shared.kill("primary")
    shared.wait_active(15, "backup")
    recovered = [line for line in shared.logs("backup").splitlines() if "Recovered" in line]
    assert recovered and "of the records read ahead, before" in recovered[-1], recovered
    got = drain(shared.client_address("backup"), QUEUE)
    assert sorted(got) == sorted(kept) and set(got.values()) == {1}
    assert drain(shared.client_address("backup"), "/queue/churn") == {}


def test_after_a_kill_the_backup_serves_the_shared_journal_with_redeliveries_marked(
        pair_factory) -> None:
    """The state a takeover serves is the one journal's: queues with acked, unacked and
    never delivered messages, a durable subscription created at run time (and one deleted),
    committed and open transactions, a dup-id sent twice. Delivered, unacknowledged
    messages come again marked redelivered; acked ones and the open transaction's never."""
    shared = pair_factory(policy="shared-store", flags=["--paging-bytes", "20000"])
    shared.start()
    shared.wait_formed()
    expected, unacked, clients = build_mixed_state(shared.client_address("primary"))
    shared.kill("primary")
    shared.wait_active(15, "backup")
    for client in clients:
        client.close()
    served = read_all(shared.client_address("backup"))
    assert_served_as_built(served, expected, unacked)
    # and the frames say so: read_all's deliveries went back unacknowledged, so each comes
    # again with STOMP's redelivered header and its count one higher
    counts = {x: count for d, x, _, _, count in served if d == "/queue/a"}
    client = BlockingConnection(*shared.client_address("backup"), timeout=5.0)
    client.subscribe("/queue/a", sub_id="r", ack="client-individual")
    again = {}
    for _ in counts:
        frame = client.read_frame(5.0)
        again[frame.headers["x-id"]] = (frame.headers.get("redelivered"),
                                        int(frame.headers["delivery-count"]))
    client.close()
    assert again == {x: ("true", count + 1) for x, count in counts.items()}


def test_a_server_without_the_policy_refuses_the_shared_directory(shared: Pair,
                                                                  tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="is the shared store of a shared-store pair"):
        start_server(tmp_path / "intruder", "--data-dir", str(shared.shared_dir),
                     name="intruder")
    assert shared.state("primary") == "ACTIVE"


def test_shared_dir_is_checked_at_start(tmp_path: Path) -> None:
    base = {"policy": "shared-store", "listen": "127.0.0.1:1", "peer": "127.0.0.1:2",
            "secret": "s", "data_dir": str(tmp_path / "data")}
    with pytest.raises(ConfigError, match="shared_dir is required"):
        load_config(overrides=base)
    with pytest.raises(ConfigError, match=r"shared_dir .* is not a directory"):
        load_config(overrides={**base, "shared_dir": str(tmp_path / "nowhere")})
    with pytest.raises(ConfigError, match="witness is not used"):
        load_config(overrides={**base, "shared_dir": str(tmp_path), "witness": "127.0.0.1:3"})
    assert load_config(overrides={**base, "shared_dir": str(tmp_path)}).shared_dir == \
        str(tmp_path)
