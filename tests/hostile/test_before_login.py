"""What a client can hold before it logs in, and how long a frame may take (issue 20, item
1), on a real server with a canary client beside the attacker: a smaller frame limit
until CONNECTED, connections bounded overall and per address, a deadline for finishing a
frame, and unfinished frames counted in the server's memory."""

from __future__ import annotations

import socket
import time

import pytest

from pairmq.client.plain import BlockingConnection, StompError
from tests.serverproc import free_port
from tests.support.admin import admin_status, admin_user_flags, status_when_up
from tests.support.canary import WORST_S, Canary

MiB = 1024 * 1024
UNFINISHED_CONNECT = b"CONNECT\naccept-version:1.2\nhost:x\n\n"


def answer_of(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """All the server sends until it closes the socket (AssertionError if it does not)."""
    sock.settimeout(timeout)
    answer = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return answer
        if not chunk:
            return answer
        answer += chunk
    raise AssertionError(f"the server kept the connection open; it said {answer!r}")


@pytest.mark.machine
def test_an_unfinished_connect_cannot_hold_memory(server) -> None:
    before = server.rss()
    sockets = []
    with Canary(server) as canary:
        for _ in range(30):
            sock = socket.create_connection(server.address, timeout=5)
            sockets.append(sock)
            try:
                sock.sendall(UNFINISHED_CONNECT + b"x" * MiB)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused while we were still sending: the point
        answers = [answer_of(sock) for sock in sockets]
    for sock in sockets:
        sock.close()
    for answer in answers:
        assert b"frame too large: more than 8192 bytes before login" in answer, answer[:300]
    assert server.rss() - before < 40 * MiB, "30 MiB sent; next to nothing held"
    assert canary.lost == [] and canary.worst < WORST_S


def test_frames_may_be_large_once_connected(server) -> None:
    conn = BlockingConnection(server.host, server.port)
    try:
        conn.send("/queue/big", b"b" * (2 * MiB))
    finally:
        conn.close()


@pytest.mark.machine
def test_a_frame_trickled_in_is_closed_at_its_deadline(server_factory) -> None:
    srv = server_factory("--frame-timeout-ms", "1500")
    with Canary(srv) as canary, socket.create_connection(srv.address, timeout=5) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\x00")
        assert sock.recv(4096).startswith(b"CONNECTED")
        started = time.monotonic()
        sock.sendall(b"SEND\ndestination:/queue/slow\n\n")
        answer = b""
        sock.settimeout(0.3)
        while time.monotonic() - started < 10:
            try:
                sock.sendall(b"z")
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if not chunk:
                break
            answer += chunk
        took = time.monotonic() - started
    assert b"frame not completed within 1.5 s (frame_timeout_ms)" in answer, answer
    assert 1.4 < took < 4, took
    assert canary.lost == [] and canary.worst < WORST_S


def test_a_producer_streaming_frames_is_never_taken_for_a_slow_one(server_factory) -> None:
    srv = server_factory("--frame-timeout-ms", "500")
    conn = BlockingConnection(srv.host, srv.port)
    try:  # each write ends mid-frame: the next one completes it and starts another
        deadline = time.monotonic() + 2
        n = 0
        frame = b"SEND\ndestination:/queue/stream\n\n" + b"y" * 100 + b"\x00"
        while time.monotonic() < deadline:
            conn.sock.sendall(frame[50:] + frame[:50] if n else frame[:50])
            n += 1
            time.sleep(0.05)
        conn.sock.sendall(frame[50:])  # the last one's end
        conn.send("/queue/stream", b"last")  # still served after 2 s: receipted
    finally:
        conn.close()


def test_connections_are_bounded_overall_and_per_address(server_factory) -> None:
    srv = server_factory("--max-connections-per-address", "3")
    held = [BlockingConnection(srv.host, srv.port) for _ in range(3)]
    try:
        with socket.create_connection(srv.address, timeout=5) as sock:
            answer = answer_of(sock)
        assert b"too many connections from 127.0.0.1: max_connections_per_address (3)" \
            in answer, answer
        held.pop().close()
        time.sleep(0.2)
        held.append(BlockingConnection(srv.host, srv.port))  # room again
    finally:
        for conn in held:
            conn.close()
    srv = server_factory("--max-connections", "2")
    held = [BlockingConnection(srv.host, srv.port) for _ in range(2)]
    try:
        try:
            BlockingConnection(srv.host, srv.port)
            raise AssertionError("a third connection was let in")
        except StompError as e:
            assert "too many connections: the server holds max_connections (2)" in str(e)
    finally:
        for conn in held:
            conn.close()


def test_an_unfinished_frame_counts_in_the_servers_memory(server_factory) -> None:
    admin = f"127.0.0.1:{free_port()}"
    srv = server_factory("--admin", admin, *admin_user_flags())
    before = status_when_up(admin)["capacity"]["memory_bytes"]
    conn = BlockingConnection(srv.host, srv.port)
    try:
        conn.sock.sendall(b"SEND\ndestination:/queue/m\ncontent-length:%d\n\n" % (8 * MiB)
                          + b"m" * (4 * MiB))
        deadline = time.monotonic() + 5
        while True:
            status = admin_status(admin)
            assert status is not None
            held = status["capacity"]["memory_bytes"] - before
            if held >= 4 * MiB or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert 4 * MiB <= held < 5 * MiB, held
    finally:
        conn.sock.close()
    deadline = time.monotonic() + 5
    while (status := admin_status(admin)) is None or status["capacity"]["memory_bytes"] != before:
        assert time.monotonic() < deadline, f"still counted after the close: {status}"
        time.sleep(0.1)
