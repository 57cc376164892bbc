"""Logins that tell nobody who exists and starve nobody (issue 20, items 6 and 7), on a
real server: a wrong password and an unknown user take the same time over STOMP and
over the management port, and a crowd of bad logins leaves an operator's requests and a
canary client's traffic unhurt."""

from __future__ import annotations

import socket
import statistics
import threading
import time

import pytest

from tests.serverproc import free_port
from tests.support.admin import admin_request
from tests.support.canary import WORST_S, Canary
from tests.support.waiting import wait_until

CONFIG = """
[auth]
allow_anonymous = true
failed_login_delay_max_ms = 0

[auth.users.alice]
password = "right"
roles = ["app"]

[auth.users.ops]
password = "ops-password"
roles = ["admin"]
"""


def stomp_login_time(srv, login: str, passcode: str) -> float:
    with socket.create_connection(srv.address, timeout=5) as sock:
        started = time.perf_counter()
        sock.sendall(b"CONNECT\naccept-version:1.2\nhost:x\nlogin:%s\npasscode:%s\n\n\x00"
                     % (login.encode(), passcode.encode()))
        answer = sock.recv(4096)
        took = time.perf_counter() - started
    assert answer.startswith(b"ERROR") and b"authentication failed" in answer, answer
    return took


def up(admin: str, credentials: tuple[str, str]) -> bool:
    """The management port answers (it opens a moment after the STOMP port)."""
    try:
        return admin_request(admin, "/metrics", credentials=credentials)[0] == 200
    except OSError:
        return False


@pytest.mark.machine
def test_a_wrong_password_takes_as_long_as_an_unknown_user(server_factory) -> None:
    admin = f"127.0.0.1:{free_port()}"
    srv = server_factory("--admin", admin, config_text=CONFIG)
    wrong, unknown = [], []
    for i in range(8):  # alternated, so that the machine's noise falls on both
        wrong.append(stomp_login_time(srv, "alice", f"guess{i}"))
        unknown.append(stomp_login_time(srv, f"nobody{i}", f"guess{i}"))
    ratio = statistics.median(unknown) / statistics.median(wrong)
    assert 0.5 < ratio < 2, f"STOMP: unknown {unknown}, wrong {wrong}"
    wrong, unknown = [], []
    wait_until(lambda: up(admin, ("ops", "ops-password")), "the management port")
    for i in range(8):
        for login, times in (("alice", wrong), (f"nobody{i}", unknown)):
            started = time.perf_counter()
            code, _, _ = admin_request(admin, "/status", credentials=(login, f"guess{i}"))
            times.append(time.perf_counter() - started)
            assert code == 401
    ratio = statistics.median(unknown) / statistics.median(wrong)
    assert 0.5 < ratio < 2, f"HTTP: unknown {unknown}, wrong {wrong}"


@pytest.mark.machine
def test_a_crowd_of_bad_logins_starves_no_one(server_factory) -> None:
    admin = f"127.0.0.1:{free_port()}"
    srv = server_factory("--admin", admin, config_text=CONFIG)
    operator = ("ops", "ops-password")
    wait_until(lambda: up(admin, operator), "the management port")
    stop = threading.Event()

    def guess_over_http() -> None:
        while not stop.is_set():
            admin_request(admin, "/status", credentials=("mallory", "guess"), timeout=30)

    def guess_over_stomp() -> None:
        while not stop.is_set():
            try:
                stomp_login_time(srv, "mallory", "guess")
            except (OSError, AssertionError):
                pass  # refused as busy, or closed: the crowd does not care

    crowd = [threading.Thread(target=guess_over_http, daemon=True) for _ in range(60)]
    crowd += [threading.Thread(target=guess_over_stomp, daemon=True) for _ in range(40)]
    slowest = 0.0
    with Canary(srv) as canary:
        for thread in crowd:
            thread.start()
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            started = time.perf_counter()
            code, _, _ = admin_request(admin, "/metrics", credentials=operator)
            slowest = max(slowest, time.perf_counter() - started)
            assert code == 200
            time.sleep(0.1)
        stop.set()
    for thread in crowd:
        thread.join(30)
    assert slowest < 0.5, f"the operator's GET /metrics took {slowest:.2f} s"
    assert canary.lost == [] and canary.worst < WORST_S, canary.worst
