"""Brute force and audit on a real server (issue 19): 100 wrong passwords from one address
are slowed, one turn per delay however many connections they use, while another address
logs in at once; the `pairmq.audit` log records logins, refusals and denials."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

from tests.support.waiting import wait_until

MAX_DELAY_MS = 50  # the server's cap, small for the test: 100 attempts >= 99 x 50 ms


def connect(srv, login: str, passcode: str, source: str = "127.0.0.1") -> str:
    """CONNECT from `source` (another loopback address is another client address) and
    return the first frame's command."""
    with socket.create_connection((srv.host, srv.port), timeout=30,
                                  source_address=(source, 0)) as sock:
        sock.sendall(f"CONNECT\naccept-version:1.2\nhost:x\nlogin:{login}\n"
                     f"passcode:{passcode}\n\n\x00".encode())
        data = b""
        while b"\x00" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        return data.split(b"\n", 1)[0].decode()


def test_a_guesser_is_slowed_and_others_are_not(server_factory) -> None:
    srv = server_factory("--user", "alice:right", "--failed-login-delay-max-ms",
                         str(MAX_DELAY_MS), anonymous=False)
    attempts = 100
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = pool.map(lambda _: connect(srv, "alice", "wrong"), range(attempts))
        others = []
        time.sleep(0.5)  # in the middle of the guessing: another address logs in at once
        while len(others) < 5:
            t = time.monotonic()
            assert connect(srv, "alice", "right", source="127.0.0.2") == "CONNECTED"
            others.append(time.monotonic() - t)
        answers = list(answers)
    took = time.monotonic() - started
    assert answers == ["ERROR"] * attempts
    # the first waits nothing, each later one at least MAX_DELAY_MS after the previous
    assert took >= (attempts - 1) * MAX_DELAY_MS / 1000 * 0.95, took
    assert max(others) < 1.0, others  # not slowed (a login here takes milliseconds)
    # the guesser's address, once it logs in right, is forgotten
    wait_until(lambda: connect(srv, "alice", "right") == "CONNECTED", "a good login")
    assert connect(srv, "alice", "wrong") == "ERROR"
    logs = srv.logs()
    assert "pairmq.audit: login refused: 'alice' from 127.0.0.1:" in logs
    assert "pairmq.audit: login: 'alice' from 127.0.0.2:" in logs


def test_the_audit_log_records_permission_denials(server_factory) -> None:
    srv = server_factory("--user", "bob:pw", config_text='[security."#"]\nsend = ["x"]\n',
                         anonymous=False)
    with socket.create_connection((srv.host, srv.port), timeout=10) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.2\nhost:x\nlogin:bob\npasscode:pw\n\n\x00"
                     b"SEND\ndestination:/queue/q\n\nbody\x00")
        while sock.recv(4096):
            pass
    wait_until(lambda: "pairmq.audit: permission denied: user 'bob' lacks permission send "
                       "on /queue/q" in srv.logs(),
               "the audit line")
