"""The durable connection's outbox on its own: durable, ordered, bounded, one process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pairmq.client import ClientError, OutboxFull
from pairmq.client.outbox import Outbox


def test_stored_messages_come_back_in_order_after_a_reopen(tmp_path):
    path = tmp_path / "out.db"
    box = Outbox(path, 100, 1 << 20)
    seqs = [box.append("/queue/q", {"dup-id": f"d{i}"}, b"%d" % i) for i in range(5)]
    box.remove(seqs[:2])
    box.close()
    again = Outbox(path, 100, 1 << 20)
    stored = again.stored()
    assert [s.body for s in stored] == [b"2", b"3", b"4"]
    assert [s.headers["dup-id"] for s in stored] == ["d2", "d3", "d4"]
    assert again.stats()["depth"] == 3 and again.stats()["forwarded"] == 0
    again.close()


def test_a_message_is_on_disk_when_append_returns(tmp_path):
    """A child process stores a message and is killed at once: the message is there."""
    path = tmp_path / "out.db"
    code = ("import os, signal; from pairmq.client.outbox import Outbox; "
            f"b = Outbox({str(path)!r}, 10, 1000); b.append('/queue/q', {{}}, b'kept'); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    subprocess.run([sys.executable, "-c", code], check=False)
    box = Outbox(path, 10, 1000)
    assert [s.body for s in box.stored()] == [b"kept"]
    box.close()


def test_full_by_count_and_by_bytes(tmp_path):
    box = Outbox(tmp_path / "out.db", 2, 10_000)
    box.append("/queue/q", {}, b"a")
    box.append("/queue/q", {}, b"b")
    with pytest.raises(OutboxFull, match="holds 2 messages"):
        box.append("/queue/q", {}, b"c")
    box.close()
    small = Outbox(tmp_path / "small.db", 100, 100)
    small.append("/queue/q", {}, b"x" * 60)
    with pytest.raises(OutboxFull, match="bytes"):
        small.append("/queue/q", {}, b"x" * 60)
    small.close()


def test_block_policy_waits_for_room(tmp_path):
    box = Outbox(tmp_path / "out.db", 1, 10_000, full_policy="block")
    first = box.append("/queue/q", {}, b"a")
    with pytest.raises(OutboxFull):
        box.append("/queue/q", {}, b"b", timeout=0.2)
    import threading

    threading.Timer(0.2, box.remove, [[first]]).start()
    box.append("/queue/q", {}, b"b", timeout=5)
    assert [s.body for s in box.stored()] == [b"b"]
    box.close()


def test_one_process_per_outbox(tmp_path):
    path = tmp_path / "out.db"
    box = Outbox(path, 10, 1000)
    code = f"from pairmq.client.outbox import Outbox; Outbox({str(path)!r}, 10, 1000)"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert child.returncode != 0
    assert "is in use by pid" in child.stderr
    box.close()
    Outbox(path, 10, 1000).close()  # free again


def test_a_file_that_is_not_an_outbox_is_refused_clearly(tmp_path):
    path = tmp_path / "junk.db"
    path.write_bytes(b"not a database at all" * 100)
    with pytest.raises(ClientError, match=r"junk\.db"):
        Outbox(path, 10, 1000)
