"""The small ones of issue 20 (item 8), on real servers: a data directory that cannot be
written, a role nothing grants, connections refused before file descriptors run out, and
a recovery that counts the empty destinations it brought back."""

from __future__ import annotations

import pytest

import pairmq.client
from pairmq.client.plain import BlockingConnection, StompError
from tests.serverproc import free_port
from tests.support.cli import run, run_pairmq


def test_a_data_directory_that_cannot_be_written_is_one_line(tmp_path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    if run("chattr", "+i", str(data)).returncode != 0:
        pytest.skip("chattr +i (an immutable directory, even for root) is not available")
    try:
        refused = run_pairmq("server", "--data-dir", str(data), "--stomp",
                             f"127.0.0.1:{free_port()}")
    finally:
        assert run("chattr", "-i", str(data)).returncode == 0
    output = refused.stdout + refused.stderr
    assert refused.returncode == 3, output
    assert f"Cannot start: data directory {data} cannot be written: Operation not " \
           "permitted" in output
    assert "Traceback" not in output


def test_a_role_that_nothing_grants_is_named_at_start(server_factory) -> None:
    srv = server_factory(config_text="""
[auth.users.ann]
password = "a"
roles = ["admn", "producers"]

[security."#"]
send = ["producers"]
""")
    logs = srv.logs()
    assert "Role 'admn' (of 'ann') is granted nothing and checked nowhere" in logs
    assert "Role 'producers'" not in logs


def test_connections_are_refused_before_file_descriptors_run_out(server_factory) -> None:
    # 320 open files: 256 kept for the journal, the listeners and the pair, 64 for clients
    srv = server_factory("--segment-bytes", "65536", open_files=320)
    held = []
    try:
        refused = None
        for _ in range(80):
            try:
                held.append(BlockingConnection(srv.host, srv.port))
            except StompError as e:
                refused = str(e)
                break
        assert refused == ("too many connections: the server holds max_connections (64); "
                           "try again later"), refused
        assert len(held) == 64
        # new journal segments still open: descriptors were kept for them
        sender = held.pop()
        for i in range(200):
            sender.send("/queue/kept", b"k" * 1024, {"persistent": "true", "n": str(i)})
        sender.close()
    finally:
        for conn in held:
            conn.close()
    segments = list((srv.data_dir / "journal").glob("*"))
    assert len(segments) >= 3, segments
    with pairmq.client.connect(f"{srv.host}:{srv.port}") as client:
        sub = client.subscribe("/queue/kept", ack="client")
        got = [sub.receive(5) for _ in range(200)]
        assert [m.headers["n"] for m in got if m is not None] == [str(i) for i in range(200)]
    assert "Too many open files" not in srv.logs()


def test_a_recovery_counts_the_empty_destinations(server_factory) -> None:
    srv = server_factory(name="empties")
    conn = BlockingConnection(srv.host, srv.port)
    try:
        for i in range(1000):
            conn.subscribe(f"/queue/empty.{i}", f"s{i}")
    finally:
        conn.close()
    srv.kill()
    again = server_factory(name="empties", port=srv.port)
    assert "Recovered 0 messages in 0 queues (1000 destinations in all, the others empty)" \
        in again.logs()
