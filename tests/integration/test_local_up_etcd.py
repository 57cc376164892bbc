"""`pairmq up --arbiter etcd` (`make up ARBITER=etcd`): the local pair on a local 3-member
etcd cluster instead of `pairmq witness`, and nothing of it left running after Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pairmq.client
from pairmq.cli.up import ETCD_GROUP, ETCD_MEMBERS, ETCD_WITNESS, SERVERS, STOMP_TLS
from tests.support.etcd import get_prefix, require_etcd
from tests.support.localup import in_use, up_ports
from tests.support.waiting import wait_until

ETCD_PORTS = [int(address.rpartition(":")[2]) for _name, client, peer in ETCD_MEMBERS
              for address in (client, peer)]
PORTS = [int(address.rpartition(":")[2]) for _n, _r, stomp, admin, listen, _p in SERVERS
         for address in (stomp, admin, listen)] + \
    [int(a.rpartition(":")[2]) for a in STOMP_TLS.values()] + ETCD_PORTS
PORTS_FREE_WAIT_S = 60.0  # a `pairmq up` of an earlier test may still be exiting


def _pairmq_up_on_etcd_serves_and_stops_etcd_with_it(tmp_path: Path) -> None:
    require_etcd()
    deadline = time.monotonic() + PORTS_FREE_WAIT_S
    while busy := [p for p in PORTS if in_use(p)]:
        if time.monotonic() > deadline:
            pytest.skip(f"pairmq up's fixed ports are in use here: {busy}")
        time.sleep(0.5)
    root = tmp_path / "local"
    up = subprocess.Popen([sys.executable, "-m", "pairmq", "up", "--dir", str(root),
                           "--arbiter", "etcd"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = ""
    try:
        wait_until(lambda: all(in_use(int(a.rpartition(":")[2]))
                               for a in STOMP_TLS.values()) or up.poll() is not None,
                   "the servers' listeners", 60)
        assert up.poll() is None, up.communicate()[0]
        config = (root / "primary.toml").read_text()
        assert f'witness = "{ETCD_WITNESS}"' in config and f'group = "{ETCD_GROUP}"' in config
        login, password, _secret = (root / "credentials").read_text().split()
        plain = f"{SERVERS[0][2]},{SERVERS[1][2]}"
        with pairmq.client.connect(plain, login=login, passcode=password,
                                   initial_connect_attempts=-1, call_timeout=30000
                                   ) as client:
            client.send("/queue/up-etcd", b"on etcd")
            sub = client.subscribe("/queue/up-etcd", ack="client-individual")
            message = sub.receive(10)
            assert message is not None and message.body == b"on etcd"
            client.ack(message)
        logs = root / "logs"
        wait_until(lambda: "backup is synchronized" in (logs / "primary.log").read_text(),
                   "the pair formed", 30)
        first_member = ETCD_MEMBERS[0][1]
        keys = get_prefix(first_member, f"/pairmq/pairs/{ETCD_GROUP}/")
        assert keys, f"no key under /pairmq/pairs/{ETCD_GROUP}/ in etcd"
        assert not (logs / "witness.log").exists()
    finally:
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=60)
    assert up.returncode == 0, out
    assert ETCD_WITNESS in out, out
    still_listening = [p for p in ETCD_PORTS if in_use(p)]
    assert not still_listening, f"etcd still listens on {still_listening} after Ctrl-C"
    assert all((root / "etcd" / name).is_dir() for name, _c, _p in ETCD_MEMBERS)


def test_pairmq_up_on_etcd_serves_and_stops_etcd_with_it(tmp_path: Path) -> None:
    with up_ports():  # the other test of `pairmq up` waits: the same fixed ports
        _pairmq_up_on_etcd_serves_and_stops_etcd_with_it(tmp_path)
