"""TLS on the STOMP listener and the management port (issue 19): real servers, stomp.py and
pairmq's client over TLS, old protocols and wrong certificates refused by `openssl
s_client` and Python's ssl, and certificates reloaded without a restart."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import urllib.request

import pytest
import stomp

import pairmq.client
from pairmq.client import ConnectionFailed
from tests.integration.clients import Collector
from tests.serverproc import ServerProcess, free_port
from tests.support.admin import admin_request
from tests.support.certs import Pki, client_context
from tests.support.cli import run, run_pairmq
from tests.support.waiting import wait_until

HOST = "127.0.0.1"


def tls_server(server_factory, pki: Pki, *flags: str, client_auth: str = "none"
               ) -> tuple[ServerProcess, int]:
    """A server with a STOMP TLS listener beside the plaintext one; logins required."""
    port = free_port()
    srv = server_factory("--user", "alice:secret", "--stomp-tls", f"{HOST}:{port}",
                         *pki.server_flags(client_auth=client_auth), *flags, anonymous=False)
    # the helper waited for the plaintext listener; the TLS one opens just after it
    wait_until(lambda: "server s" in srv.logs() and " ready: " in srv.logs(), "ready")
    return srv, port


def handshake(port: int, context: ssl.SSLContext, host: str = HOST) -> ssl.SSLSocket:
    sock = socket.create_connection((HOST, port), timeout=5)
    return context.wrap_socket(sock, server_hostname=host)


def stomp_py(port: int, pki: Pki, **ssl_args) -> tuple[stomp.Connection12, Collector]:
    conn = stomp.Connection12([(HOST, port)], reconnect_attempts_max=1, timeout=5)
    conn.set_ssl(for_hosts=[(HOST, port)], ca_certs=pki.ca_file, **ssl_args)
    listener = Collector()
    conn.set_listener("collector", listener)
    return conn, listener


def test_stomp_py_sends_and_receives_over_tls_beside_plaintext(server_factory, pki) -> None:
    srv, port = tls_server(server_factory, pki)
    assert f"STOMP over TLS on {HOST}:{port}" in srv.logs()
    conn, listener = stomp_py(port, pki)
    conn.connect("alice", "secret", wait=True)
    try:
        conn.subscribe("/queue/tls", id="1", ack="auto")
        conn.send("/queue/tls", "over tls", receipt="r1")
        listener.wait_for(lambda: listener.messages, what="the message back over TLS")
        assert listener.messages[0].body == "over tls"
        # the RECEIPT follows the MESSAGE on the wire: stomp.py may not have read it yet
        listener.wait_for(lambda: "r1" in listener.receipts, what="its receipt")
    finally:
        conn.disconnect()
    # the plaintext listener serves the same queues (another one than stomp.py's, whose
    # auto-ack subscription may outlive its DISCONNECT by a moment)
    with pairmq.client.connect(f"stomp://{HOST}:{srv.port}", login="alice",
                               passcode="secret") as client:
        client.send("/queue/tls-plain", b"plain")
    with pairmq.client.connect(f"stomp+ssl://{HOST}:{port}", login="alice",
                               passcode="secret", trust_store_path=pki.ca_file) as client:
        sub = client.subscribe("/queue/tls-plain", ack="client-individual")
        got = sub.receive(10)
        assert got is not None and got.body == b"plain"
        client.ack(got)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # ssl.TLSVersion.TLSv1, on purpose
@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1])
def test_tls_1_0_and_1_1_are_refused(server_factory, pki, version) -> None:
    """The clients are made able to speak the old protocol (OpenSSL's security level 0),
    so the refusal is the server's: it ends the handshake (without an alert: the event
    loop's TLS closes the connection), and the same clients get TLS 1.2 and 1.3."""
    _srv, port = tls_server(server_factory, pki)
    def s_client(flag: str) -> str:
        done = run("openssl", "s_client", "-connect", f"{HOST}:{port}", flag, "-cipher",
                   "DEFAULT@SECLEVEL=0", "-CAfile", pki.ca_file, stdin="", timeout=20)
        return done.stdout + done.stderr

    out = s_client({ssl.TLSVersion.TLSv1: "-tls1", ssl.TLSVersion.TLSv1_1: "-tls1_1"}[version])
    assert "Cipher is (NONE)" in out, out
    out = s_client("-tls1_2")
    assert "Protocol  : TLSv1.2" in out and "Cipher is (NONE)" not in out, out
    old = client_context(pki.ca_file, version=version)
    old.set_ciphers("DEFAULT@SECLEVEL=0")
    with pytest.raises(OSError):  # ssl.SSLError (EOF in violation of protocol) is one
        handshake(port, old)
    # TLS 1.2 and 1.3 are served
    for good in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        with handshake(port, client_context(pki.ca_file, version=good)) as sock:
            assert sock.version() == {ssl.TLSVersion.TLSv1_2: "TLSv1.2",
                                      ssl.TLSVersion.TLSv1_3: "TLSv1.3"}[good]


def test_the_pairmq_client_refuses_a_server_from_another_ca_and_an_expired_one(
        server_factory, pki) -> None:
    _srv, port = tls_server(server_factory, pki)
    url = f"stomp+ssl://{HOST}:{port}"
    with pytest.raises(ConnectionFailed) as refused:
        pairmq.client.connect(url, login="alice", passcode="secret",
                              trust_store_path=str(pki.foreign.cert_path))
    assert "certificate" in str(refused.value), str(refused.value)
    expired = pki.ca.issue("expired-server", expired=True)
    port2 = free_port()
    server_factory("--user", "alice:secret", "--stomp-tls", f"{HOST}:{port2}",
                   *pki.server_flags(expired), anonymous=False)
    with pytest.raises(ConnectionFailed) as refused:
        pairmq.client.connect(f"stomp+ssl://{HOST}:{port2}", login="alice",
                              passcode="secret", trust_store_path=pki.ca_file)
    assert "expired" in str(refused.value), str(refused.value)


def test_client_certificates_required_from_the_ca(server_factory, pki) -> None:
    _srv, port = tls_server(server_factory, pki, client_auth="required")
    alice = pki.ca.issue("alice", client=True)
    with pairmq.client.connect(f"stomp+ssl://{HOST}:{port}", login="alice",
                               passcode="secret", trust_store_path=pki.ca_file,
                               key_store_path=str(alice.both)) as client:
        client.send("/queue/certs", b"with a certificate")
    # the certificate stands in for a login: its CN, alice, is a configured user
    with pairmq.client.connect(f"stomp+ssl://{HOST}:{port}", trust_store_path=pki.ca_file,
                               key_store_path=str(alice.both)) as client:
        client.send("/queue/certs", b"no password")
    wait_until(lambda: "logged in as 'alice' by its client certificate" in _srv.logs(),
               "the certificate login")
    # a certificate naming nobody configured is no login (anonymous access is off)
    bob = pki.ca.issue("bob", client=True)
    with pytest.raises(pairmq.client.ClientError, match="authentication failed"):
        pairmq.client.connect(f"stomp+ssl://{HOST}:{port}", trust_store_path=pki.ca_file,
                              key_store_path=str(bob.both), initial_connect_attempts=1)
    for name, issued in (("none", None), ("foreign", pki.foreign.issue("mallory",
                                                                       client=True))):
        context = client_context(pki.ca_file, issued)
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)), \
                handshake(port, context) as sock:
            # TLS 1.3: the server's refusal of the certificate arrives with the first read
            sock.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\x00")
            assert sock.recv(4096) == b"", name
            raise ConnectionError("closed")


def test_a_reload_reaches_new_connections(server_factory, pki, tmp_path) -> None:
    srv, port = tls_server(server_factory, pki)
    before = handshake(port, client_context(pki.ca_file))
    first = before.getpeercert()
    # a new CA and a new certificate in the same files, then SIGHUP
    renewed_ca = type(pki.ca)(tmp_path / "renewed", "renewed CA")
    renewed = renewed_ca.issue("server")
    shutil.copy(renewed.cert, pki.server.cert)
    shutil.copy(renewed.key, pki.server.key)
    shutil.copy(renewed_ca.cert_path, pki.ca.cert_path)
    srv.proc.send_signal(1)  # SIGHUP
    wait_until(lambda: "TLS certificates reloaded" in srv.logs(), "the reload")
    after = handshake(port, client_context(str(renewed_ca.cert_path)))
    assert after.getpeercert()["serialNumber"] != first["serialNumber"]
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(port, client_context(str(tmp_path / "pki" / "foreign" / "ca.pem")))
    # the connection made before goes on with what it negotiated
    before.sendall(b"CONNECT\naccept-version:1.2\nhost:x\nlogin:alice\npasscode:secret\n\n\x00")
    assert before.recv(4096).startswith(b"CONNECTED")
    before.close()
    after.close()


def test_a_reload_with_a_bad_file_keeps_the_running_certificates(server_factory, pki
                                                                  ) -> None:
    srv, port = tls_server(server_factory, pki)
    pki.server.key.write_text("not a key\n")
    srv.proc.send_signal(1)
    wait_until(lambda: "TLS reload refused" in srv.logs(), "the refusal")
    assert str(pki.server.key) in srv.logs()
    with handshake(port, client_context(pki.ca_file)) as sock:
        assert sock.version() is not None


def test_the_management_port_speaks_https(server_factory, pki) -> None:
    admin = f"{HOST}:{free_port()}"
    srv, _port = tls_server(server_factory, pki, "--admin", admin, "--admin-tls",
                            "--user", "ops:opspw")
    wait_until(lambda: "Management HTTP on https://" in srv.logs(), "HTTPS")
    context = client_context(pki.ca_file)
    request = urllib.request.Request(
        f"https://{admin}/status",
        headers={"Authorization": "Basic " + base64.b64encode(b"ops:opspw").decode()})
    with urllib.request.urlopen(request, context=context, timeout=5) as response:
        status = json.loads(response.read())
    assert status["name"] == srv.name
    with pytest.raises(OSError):  # plaintext HTTP gets no answer it can read
        admin_request(admin, "/status", credentials=("ops", "opspw"), timeout=3)
    env_ca = {"PAIRMQ_CA": pki.ca_file, "PAIRMQ_USER": "ops", "PAIRMQ_PASSWORD": "opspw"}
    done = run_pairmq("reload", f"https://{admin}", env=env_ca)
    assert done.returncode == 0, done.stderr
    assert "reloaded" in done.stdout
    wait_until(lambda: "TLS reload asked by user ops" in srv.logs(), "the reload")


def test_one_tls_client_sends_and_receives_at_once_without_garbling(server_factory, pki
                                                                     ) -> None:
    """The blocking client reads in its I/O thread while the caller writes: both go through
    one TLS connection (client/tls.py). 20,000 messages out and back, in order."""
    _srv, port = tls_server(server_factory, pki)
    count = 20_000
    with pairmq.client.connect(f"stomp+ssl://{HOST}:{port}", login="alice",
                               passcode="secret", trust_store_path=pki.ca_file,
                               send_window=64) as client:
        sub = client.subscribe("/queue/tls-both", ack="client-individual",
                               headers={"prefetch-count": "500"})
        got: list[bytes] = []

        def consume() -> None:
            while len(got) < count:
                message = sub.receive(20)
                if message is None:
                    return
                got.append(message.body)
                client.ack(message)

        reader = threading.Thread(target=consume)
        reader.start()
        for i in range(count):
            client.send_async("/queue/tls-both", b"%d:" % i + b"x" * (i % 3000))
        client.flush()
        reader.join(60)
    assert len(got) == count
    assert all(body.startswith(b"%d:" % i) and len(body) == len(b"%d:" % i) + i % 3000
               for i, body in enumerate(got))


def test_the_outbox_forwards_over_tls_once_the_server_is_up(server_factory, pki, tmp_path
                                                            ) -> None:
    """A durable connection (outbox) keeps sending while no server is reachable, then
    forwards over TLS: its TLS options pass through like the others."""
    port = free_port()
    flags = ["--user", "alice:secret", "--stomp-tls", f"{HOST}:{port}", *pki.server_flags()]
    url = f"failover:(stomp+ssl://{HOST}:{port})?trustStorePath={pki.ca_file}"
    with pairmq.client.connect(url, login="alice", passcode="secret",
                               outbox=str(tmp_path / "outbox.db"), retry_interval=50) as client:
        for i in range(10):
            client.send("/queue/tls-outbox", b"m%d" % i)  # into the outbox: no server yet
        assert client.stats()["outbox"]["depth"] == 10
        server_factory(*flags, anonymous=False)
        wait_until(lambda: client.stats()["outbox"]["depth"] == 0, "the outbox forwarded", 30)
    with pairmq.client.connect(url, login="alice", passcode="secret") as client:
        sub = client.subscribe("/queue/tls-outbox", ack="client-individual")
        got = []
        while (message := sub.receive(5)) is not None and len(got) < 10:
            got.append(message.body)
            client.ack(message)
    assert got == [b"m%d" % i for i in range(10)]


def test_a_server_with_tls_only(pki, tmp_path) -> None:
    """`stomp = ""` turns the plaintext listener off: clients reach it over TLS only."""
    port = free_port()
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 - the child's
    proc = subprocess.Popen([sys.executable, "-m", "pairmq", "server", "--name", "tlsonly",
                             "--data-dir", str(tmp_path / "data"), "--stomp", "",
                             "--stomp-tls", f"{HOST}:{port}", "--allow-anonymous",
                             *pki.server_flags()], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: b"ready: STOMP over TLS on" in (tmp_path / "server.log").read_bytes(),
                   "the TLS listener", 20)
        assert b"STOMP on " not in (tmp_path / "server.log").read_bytes()
        with pairmq.client.connect(f"stomp+ssl://{HOST}:{port}",
                                   trust_store_path=pki.ca_file) as client:
            client.send("/queue/tls-only", b"only over TLS")
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
