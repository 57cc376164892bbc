"""The pair over TLS (issue 19): the HA channel and the witness with mutual TLS, clients on
stomp+ssl:// through a kill -9 failover, and a peer or a witness whose certificate another
CA signed never joins."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import pairmq.client
from tests.ha.pair import HOST, NAMES, Pair
from tests.serverproc import free_port
from tests.support.certs import Pki, make_pki
from tests.support.waiting import wait_until

POLICIES = ["replication", "shared-store"]


def tls_pair(pair_factory, pki: Pki, policy: str = "replication",
             certs: dict[str, Pki | None] | None = None, witness_pki: Pki | None = None
             ) -> tuple[Pair, dict[str, int]]:
    """A pair with [ha] tls and a STOMP TLS listener on each server; `certs` gives a
    server certificates of another CA (a Pki whose `server` it shows)."""
    tls_ports = {name: free_port() for name in NAMES}
    flags_for = {}
    for name in NAMES:
        own = (certs or {}).get(name)
        issued = own.server if own is not None else pki.ca.issue(name)
        flags_for[name] = ["--ha-tls", "--stomp-tls", f"{HOST}:{tls_ports[name]}",
                           *pki.server_flags(issued)]
    witness = witness_pki or pki
    witness_cert = witness.ca.issue("witness") if witness_pki is None else witness.server
    pair = pair_factory(policy=policy, flags_for=flags_for, witness_flags=[
        "--tls-cert", str(witness_cert.cert), "--tls-key", str(witness_cert.key),
        "--tls-ca", pki.ca_file])
    return pair, tls_ports


@pytest.mark.parametrize("policy", POLICIES)
def test_a_tls_pair_fails_over_and_the_client_loses_nothing(pair_factory, pki, policy
                                                             ) -> None:
    pair, ports = tls_pair(pair_factory, pki, policy)
    pair.start(parallel=True)
    pair.wait_formed()
    url = (f"failover:(stomp+ssl://{HOST}:{ports['primary']},stomp+ssl://{HOST}:"
           f"{ports['backup']})?trustStorePath={pki.ca_file}&verifyHost=true")
    sent: list[str] = []
    killed = threading.Event()
    with pairmq.client.connect(url, send_window=16) as producer:
        for i in range(400):
            if i == 150:
                threading.Thread(target=lambda: (pair.kill("primary"), killed.set()),
                                 daemon=True).start()
            producer.send("/queue/tls-failover", f"m{i}".encode(), persistent=True)
            sent.append(f"m{i}")
        assert killed.wait(10)
        assert producer.server == f"{HOST}:{ports['backup']}"
    pair.wait_active(10, "backup")
    got: list[str] = []
    with pairmq.client.connect(url) as consumer:
        sub = consumer.subscribe("/queue/tls-failover", ack="client-individual")
        while len(got) < len(sent):
            message = sub.receive(10)
            assert message is not None, f"{len(got)} of {len(sent)} received"
            got.append(message.body.decode())
            consumer.ack(message)
        assert sub.receive(0.5) is None
    assert got == sent  # one producer: in order, once each
    if policy == "replication":
        assert "(mutual TLS)" in pair.witness_logs()


def test_a_backup_with_a_certificate_of_another_ca_never_joins(pair_factory, pki) -> None:
    foreign = make_pki(Path(pki.ca.directory).parent / "other", "another CA")
    pair, _ports = tls_pair(pair_factory, pki, certs={"backup": foreign})
    pair.start(parallel=True)
    pair.wait_active(15, "primary")
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert pair.state("backup") != "PASSIVE", pair.describe()
        time.sleep(0.2)
    wait_until(lambda: "TLS handshake failed" in pair.logs("primary"),
               "the primary's refusal", 10)
    refusals = [line for line in pair.logs("primary").splitlines()
                if "Refused HA connection from" in line]
    assert refusals and "TLS handshake failed" in refusals[0], refusals
    assert len(refusals) < 5, "a peer retrying every heartbeat is told once a minute"
    assert "refused: TLS: the other side closed the connection" in pair.logs("backup")
    # the witness refuses it too
    assert "Refused connection from" in pair.witness_logs()
    assert "TLS handshake failed: certificate verify failed" in pair.witness_logs() or \
        "TLS handshake failed" in pair.witness_logs()


def test_a_witness_with_a_certificate_of_another_ca_is_not_trusted(pair_factory, pki
                                                                    ) -> None:
    """The servers refuse it: it grants no lease. (They then elect an active between
    themselves, as with any unreachable witness: docs/ha.md.)"""
    foreign = make_pki(Path(pki.ca.directory).parent / "other", "another CA")
    pair, _ports = tls_pair(pair_factory, pki, witness_pki=foreign)
    pair.start(parallel=True)
    for name in NAMES:
        wait_until(lambda n=name: "refused: TLS handshake failed" in pair.logs(n),
                   f"{name}'s refusal of the witness", 15)
    assert "Witness at" in pair.logs("primary")
    assert "Refused connection from" in pair.witness_logs()
    assert "Lease:" not in pair.witness_logs(), "a lease granted by an untrusted witness"


def test_a_tls_client_given_one_server_learns_the_backups_tls_listener(pair_factory, pki
                                                                       ) -> None:
    """CONNECTED carries `topology-tls` (the pair's TLS listeners) beside `topology`: a
    client on TLS learns the backup's TLS address from it, never a plaintext one it could
    not use, and fails over to it."""
    pair, ports = tls_pair(pair_factory, pki)
    pair.start(parallel=True)
    pair.wait_formed()
    primary_tls = f"{HOST}:{ports['primary']}"
    backup_tls = f"{HOST}:{ports['backup']}"
    url = f"stomp+ssl://{primary_tls}?trustStorePath={pki.ca_file}"
    with pairmq.client.connect(f"failover:({url.split('?')[0]})?trustStorePath="
                               f"{pki.ca_file}") as client:
        client.send("/queue/learn", b"before")
        pair.kill("primary")
        client.send("/queue/learn", b"after")  # through the failover
        assert client.server == backup_tls
    logs = pair.logs("backup")
    assert "STOMP over TLS on" in logs
