"""`pairmq up` (the quick start's `make up`): a local pair and witness, with a local CA,
TLS beside plaintext for clients and mutual TLS on the HA channel (issue 19)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

import pairmq.client
from pairmq.cli.up import SERVERS, STOMP_TLS, WITNESS
from tests.support.localup import in_use, up_ports
from tests.support.waiting import wait_until

PORTS = [int(address.rpartition(":")[2]) for _n, _r, stomp, admin, listen, _p in SERVERS
         for address in (stomp, admin, listen)] + \
    [int(a.rpartition(":")[2]) for a in (*STOMP_TLS.values(), WITNESS)]


def _pairmq_up_serves_tls_beside_plaintext_with_its_own_ca(tmp_path: Path) -> None:
    busy = [p for p in PORTS if in_use(p)]
    if busy:
        pytest.skip(f"pairmq up's fixed ports are in use here: {busy}")
    root = tmp_path / "local"
    up = subprocess.Popen([sys.executable, "-m", "pairmq", "up", "--dir", str(root)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ca = root / "tls" / "ca.pem"
        wait_until(lambda: all(in_use(int(a.rpartition(":")[2]))
                               for a in STOMP_TLS.values()),
                   "the TLS listeners", 30)
        login, password, _secret = (root / "credentials").read_text().split()
        url = (f"failover:(stomp+ssl://{STOMP_TLS['primary']},"
               f"stomp+ssl://{STOMP_TLS['backup']})?trustStorePath={ca}")
        with pairmq.client.connect(url, login=login, passcode=password,
                                   initial_connect_attempts=-1, call_timeout=30000
                                   ) as client:
            client.send("/queue/up-tls", b"over tls")
        plain = f"{SERVERS[0][2]},{SERVERS[1][2]}"
        with pairmq.client.connect(plain, login=login, passcode=password) as client:
            sub = client.subscribe("/queue/up-tls", ack="client-individual")
            message = sub.receive(10)
            assert message is not None and message.body == b"over tls"
            client.ack(message)
        logs = root / "logs"
        wait_until(lambda: "backup is synchronized" in (logs / "primary.log").read_text()
                   or "Backup backup is synchronized" in (logs / "primary.log").read_text(),
                   "the pair formed over mutual TLS", 30)
        assert "(mutual TLS)" in (logs / "witness.log").read_text()
    finally:
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=30)
    assert f"stomp+ssl://{STOMP_TLS['primary']}" in out and str(ca) in out, out


def test_pairmq_up_serves_tls_beside_plaintext_with_its_own_ca(tmp_path: Path) -> None:
    with up_ports():  # the other test of `pairmq up` waits: the same fixed ports
        _pairmq_up_serves_tls_beside_plaintext_with_its_own_ca(tmp_path)
