"""The pair on etcd (`[ha] witness = "etcd://..."`): a real 3-member etcd cluster on
loopback (tests/support/etcd.py), real server processes, real SIGKILL and SIGSTOP, of the
servers and of etcd's members. What users rely on: a failover whatever etcd's leader does,
serving on while the servers see each other without etcd, never a receipt from a server
that lost both its lease and its backup, and nobody needed when etcd comes back."""

from __future__ import annotations

import threading
import time

import stomp

from tests.ha.clients import drain, send_some
from tests.ha.pair import HOST, SERVING, Pair
from tests.ha.under_load import UnderLoad
from tests.support.certs import make_pki
from tests.support.cli import run_pairmq
from tests.support.etcd import EtcdCluster, EtcdTls, require_etcd
from tests.support.waiting import wait_until

QUEUE = "/queue/etcd"


def _arbiter(pair: Pair, name: str) -> dict:
    st = pair.status(name)
    assert st is not None
    return st["ha"]["witness"]


def test_a_pair_on_etcd_forms_and_says_so(pair_factory, etcd_cluster: EtcdCluster) -> None:
    pair = pair_factory(etcd=etcd_cluster.url)
    pair.start(parallel=True)
    pair.wait_formed()
    arbiter = _arbiter(pair, "primary")
    assert arbiter["kind"] == "etcd" and arbiter["reachable"] and arbiter["lease_valid"]
    assert arbiter["holder"] == "primary"
    assert arbiter["prefix"] == f"/pairmq/pairs/{pair.group}/"

    def all_members_seen() -> bool:
        members = _arbiter(pair, "primary")["members"]
        return len(members) == 3 and all(m["reachable"] for m in members) \
            and sum(m["leader"] for m in members) == 1

    wait_until(all_members_seen, "every etcd member reachable, one the leader", 10)
    assert "Local server switched to ACTIVE" in pair.logs("primary")


def test_kill_the_active_on_etcd_under_load(pair_factory, etcd_cluster: EtcdCluster) -> None:
    pair = pair_factory(etcd=etcd_cluster.url)
    pair.start(parallel=True)
    pair.wait_formed()
    with UnderLoad(pair) as run:
        run.load.wait_receipts(200, 20)
        pair.kill("primary")
        assert pair.wait_active(10, "backup") == "backup"
        run.load.wait_receipts(200, 20)
        run.drain()
    assert _arbiter(pair, "backup")["holder"] == "backup"


def test_kill_the_active_and_the_etcd_leader_at_once(pair_factory,
                                                    etcd_cluster: EtcdCluster) -> None:
    pair = pair_factory(etcd=etcd_cluster.url)
    pair.start(parallel=True)
    pair.wait_formed()
    with UnderLoad(pair) as run:
        run.load.wait_receipts(200, 20)
        leader = etcd_cluster.wait_leader()
        etcd_cluster.kill(leader)
        pair.kill("primary")
        assert pair.wait_active(15, "backup") == "backup"
        run.load.wait_receipts(200, 20)
        assert etcd_cluster.wait_leader() != leader
        run.drain()


def test_majority_lost_the_pair_serves_on_then_stops_confirming_and_recovers_by_itself(
        pair_factory, etcd_cluster: EtcdCluster) -> None:
    pair = pair_factory(etcd=etcd_cluster.url)
    pair.start(parallel=True)
    pair.wait_formed()
    sent = send_some(pair.client_address("primary"), QUEUE, "before", 5)
    etcd_cluster.kill(0)
    etcd_cluster.kill(1)
    # several activation intervals (0.4 s) without etcd: the servers see each other, the
    # in-sync backup's promise grounds the receipts
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        sent += send_some(pair.client_address("primary"), QUEUE, f"nomajority{len(sent)}", 2)
        assert pair.state("primary") == "ACTIVE" and pair.state("backup") == "PASSIVE"
    assert not _arbiter(pair, "primary")["lease_valid"]
    assert _arbiter(pair, "primary")["problem"]
    # now the backup dies too: no lease, no promise: the active stops confirming
    probe = _ReceiptProbe(pair, "primary")
    pair.kill("backup")
    lost_both = time.monotonic()
    st = pair.wait_state("primary", ("WAITING", "STARTING", "ORPHANED"), 5)
    assert time.monotonic() - lost_both < 2.0, st  # within its lease (0.4 s) and a check
    assert "not serving any more" in pair.logs("primary")
    probe.send("while-alone")
    assert probe.receipts_within(2.0) == [], "a receipt without lease or backup"
    # etcd back: the primary takes its lease again by itself, then the backup rejoins
    etcd_cluster.restart(0)
    etcd_cluster.restart(1)
    pair.wait_state("primary", SERVING, 20)
    pair.restart("backup")
    pair.wait_formed(20)
    receipted_late = probe.receipts_within(3.0)
    probe.close()
    sent += send_some(pair.client_address("primary"), QUEUE, "after", 5)
    got = drain(pair.client_address("primary"), QUEUE)
    assert set(sent) <= set(got) and all(got[m] == 1 for m in sent), got
    # the message sent while alone was confirmed later, or not at all; never lost if so
    if receipted_late:
        assert "while-alone" in got


def test_a_paused_active_confirms_nothing_after_its_successor_writes(
        pair_factory, etcd_cluster: EtcdCluster) -> None:
    pair = pair_factory(etcd=etcd_cluster.url, flags=["--no-allow-failback"])
    pair.start(parallel=True)
    pair.wait_formed()
    sent = send_some(pair.client_address("primary"), QUEUE, "before", 5)
    probe = _ReceiptProbe(pair, "primary")
    with pair.frozen("primary"):  # SIGSTOP, past its lease (0.4 s) many times
        leader = etcd_cluster.wait_leader()
        etcd_cluster.kill(leader)  # the etcd leader changes meanwhile
        pair.wait_active(15, "backup")
        successor = send_some(pair.client_address("backup"), QUEUE, "successor", 3)
        etcd_cluster.restart(leader)
        probe.send("after-thaw")  # buffered in the kernel, read when it runs again
    # SIGCONT: whatever the old active does now, it confirms nothing
    assert probe.receipts_within(3.0) == [], "the old active confirmed after its successor"
    probe.close()
    pair.wait_state("primary", "PASSIVE", 15)
    got = drain(pair.client_address("backup"), QUEUE)
    assert set(sent + successor) <= set(got), got
    assert all(count == 1 for count in got.values()), got


def test_a_stop_takes_under_5_seconds_whatever_etcd_does(pair_factory,
                                                        etcd_cluster: EtcdCluster) -> None:
    """Default heartbeat and activation: the longest etcd waits there are."""
    pair = pair_factory(etcd=etcd_cluster.url, heartbeat_ms=500, activation_ms=2000)
    pair.start(parallel=True)
    pair.wait_formed(20)
    etcd_cluster.pause(0)  # members that hang: every request to them runs into its timeout
    etcd_cluster.pause(1)
    etcd_cluster.pause(2)
    try:
        for name in ("backup", "primary"):
            started = time.monotonic()
            assert pair.stop(name, timeout=30) == 0
            assert time.monotonic() - started < 5.0, pair.describe()
    finally:
        for member in range(3):
            etcd_cluster.resume(member)


def test_etcd_unreachable_at_start_the_server_waits_then_serves_by_itself(
        pair_factory, etcd_cluster_unstarted: EtcdCluster) -> None:
    cluster = etcd_cluster_unstarted
    pair = pair_factory(etcd=cluster.url)
    pair.start(["primary"])
    st = pair.wait_state("primary", "WAITING", 10)
    arbiter = st["ha"]["witness"]
    assert arbiter["kind"] == "etcd" and not arbiter["reachable"]
    assert "Cannot reach a majority of etcd at" in (arbiter["problem"] or ""), arbiter
    assert "Cannot reach a majority of etcd" in pair.logs("primary")
    assert pair.alive("primary")
    cluster.start()
    pair.wait_state("primary", "STANDALONE", 15)


def test_keys_of_another_pair_under_the_prefix_are_refused_by_name(
        pair_factory, etcd_cluster: EtcdCluster) -> None:
    first = pair_factory(etcd=etcd_cluster.url, group="shared-name")
    first.start(["primary"])
    first.wait_state("primary", "STANDALONE", 10)
    second = pair_factory(etcd=etcd_cluster.url, group="shared-name")  # another secret
    second.start(["primary"])
    st = second.wait_state("primary", "WAITING", 10)
    problem = st["ha"]["witness"]["problem"] or ""
    assert "belongs to another pair with group 'shared-name'" in problem, problem
    assert "/pairmq/pairs/shared-name/lease" in problem
    assert "belongs to another pair" in second.logs("primary")
    assert first.state("primary") == "STANDALONE"  # the first pair is untouched


class _ReceiptProbe(stomp.ConnectionListener):
    """A stomp.py connection held to one server: persistent SENDs with receipts, and the
    receipts it got (what a third-party client would take as confirmed)."""

    def __init__(self, pair: Pair, name: str) -> None:
        self.receipts: list[str] = []
        self._got = threading.Event()
        self.conn = stomp.Connection12([(HOST, pair.stomp_port[name])], heartbeats=(0, 0),
                                       reconnect_attempts_max=1)
        self.conn.set_listener("probe", self)
        self.conn.connect(wait=True)

    def on_receipt(self, frame) -> None:
        self.receipts.append(frame.headers["receipt-id"])
        self._got.set()

    def send(self, body: str) -> None:
        """Sent, or refused (the server closed the connection: no receipt either)."""
        try:
            self.conn.send(QUEUE, body, headers={"persistent": "true", "dup-id": body},
                           receipt=body)
        except stomp.exception.StompException:
            pass

    def receipts_within(self, seconds: float) -> list[str]:
        time.sleep(seconds)
        return list(self.receipts)

    def close(self) -> None:
        try:
            self.conn.disconnect()
        except Exception:  # the server may be gone
            pass



def test_a_pair_on_etcd_over_mutual_tls(pair_factory, tmp_path) -> None:
    """`etcds://`: etcd requires client certificates; the servers show [ha] etcd_* ones
    (a certificate of another CA is refused, and that server waits)."""
    pki = make_pki(tmp_path / "pki")
    issued = pki.ca.issue("etcd")
    tls = EtcdTls(pki.ca_file, str(issued.cert), str(issued.key))
    require_etcd()
    with EtcdCluster(tmp_path / "etcd-tls", tls=tls) as cluster:
        assert cluster.url.startswith("etcds://")
        client = pki.ca.issue("pairmq")
        flags = ["--etcd-cert", str(client.cert), "--etcd-key", str(client.key),
                 "--etcd-ca", pki.ca_file]
        pair = pair_factory(etcd=cluster.url, flags=flags)
        pair.start(parallel=True)
        pair.wait_formed()
        assert _arbiter(pair, "primary")["kind"] == "etcd"
        assert cluster.get(f"/pairmq/pairs/{pair.group}/lease") is not None
        stranger = pki.foreign.issue("stranger")
        other = pair_factory(etcd=cluster.url, flags=[
            "--etcd-cert", str(stranger.cert), "--etcd-key", str(stranger.key),
            "--etcd-ca", pki.ca_file])
        other.start(["primary"])
        st = other.wait_state("primary", "WAITING", 10)
        assert not st["ha"]["witness"]["reachable"]
        assert "Cannot reach a majority of etcd" in (st["ha"]["witness"]["problem"] or "")


def test_pairmq_status_names_the_etcd_arbiter(pair_factory, etcd_cluster: EtcdCluster) -> None:
    pair = pair_factory(etcd=etcd_cluster.url)
    pair.start(parallel=True)
    pair.wait_formed()
    wait_until(lambda: all(m["reachable"] for m in _arbiter(pair, "primary")["members"]),
               "every member seen", 10)
    admins = (pair.admin_address("primary"), pair.admin_address("backup"))
    result = pair.cli("status", *admins, "--json")
    assert result.returncode == 0, result.stderr
    assert '"kind": "etcd"' in result.stdout
    table = run_pairmq("status", *admins, env={"COLUMNS": "250"})
    assert "etcd reachable, 3/3 members, leader 127.0.0.1:" in table.stdout, table.stdout
