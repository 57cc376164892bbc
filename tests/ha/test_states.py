"""States of a fresh pair, what the logs say, and how clients are told where to go."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import stomp

from pairmq.client.plain import BlockingConnection, StompError
from tests.ha.pair import HOST, NAMES, Pair
from tests.support.waiting import wait_until


class Frames(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.connected: stomp.utils.Frame | None = None
        self.errors: list[stomp.utils.Frame] = []
        self.event = threading.Event()

    def on_connected(self, frame) -> None:
        self.connected = frame
        self.event.set()

    def on_error(self, frame) -> None:
        self.errors.append(frame)
        self.event.set()


def stomp_connect(pair: Pair, name: str) -> tuple[stomp.Connection12, Frames]:
    conn = stomp.Connection12([(HOST, pair.stomp_port[name])], heartbeats=(0, 0),
                              reconnect_attempts_max=1)
    frames = Frames()
    conn.set_listener("frames", frames)
    try:
        conn.connect(wait=False)
    except stomp.exception.ConnectFailedException:
        pass
    frames.event.wait(10)
    return conn, frames


def test_a_fresh_pair_is_active_and_passive(pair: Pair) -> None:
    primary = pair.status("primary")
    backup = pair.status("backup")
    assert primary is not None and backup is not None
    assert primary["state"] == "ACTIVE" and primary["ha"]["state"] == "ACTIVE"
    assert backup["state"] == "PASSIVE"
    assert primary["ha"]["synchronized-with-backup"] is True
    assert backup["ha"]["synchronized-with-live"] is True
    peer = primary["ha"]["peer"]
    assert {k: peer[k] for k in ("name", "state", "stomp", "epoch")} == {
        "name": "backup", "state": "PASSIVE", "stomp": pair.stomp_address("backup"),
        "epoch": primary["ha"]["epoch"]}
    assert peer["last_seq"] >= 1  # the backup's journal, from its heartbeats
    assert backup["ha"]["peer"]["name"] == "primary"
    assert backup["ha"]["peer"]["state"] == "ACTIVE"
    assert primary["ha"]["witness"]["holder"] == "primary"
    assert pair.active() == "primary"
    assert "Local server switched to ACTIVE" in pair.logs("primary")
    assert "Local server switched to PASSIVE" in pair.logs("backup")
    assert "New status of remote server = PASSIVE" in pair.logs("primary")


def test_an_idle_active_counts_a_restarted_backup_in_sync_and_it_can_take_over(
        pair: Pair) -> None:
    """The backup restarts already holding every record (nothing was sent meanwhile):
    its synchronisation copies nothing. The active still counts it in sync at once,
    without waiting for a message to carry an acknowledgement, so the pair is whole
    again: a kill of the active is taken over, as before the restart."""
    pair.kill("backup")
    pair.wait_state("primary", "STANDALONE", 10)
    pair.restart("backup")
    pair.wait_state("backup", "PASSIVE", 15)
    primary = pair.wait_state("primary", "ACTIVE", 10)
    assert primary["ha"]["synchronized-with-backup"] is True
    assert "Incremental synchronisation from primary" in pair.logs("backup")
    pair.kill("primary")
    pair.wait_state("backup", "STANDALONE", 15)


def test_logs_tell_the_remote_server_died(pair: Pair) -> None:
    pair.kill("backup")
    pair.wait_state("primary", "STANDALONE", 10)
    logs = pair.logs("primary")
    assert "Old status of remote server = PASSIVE" in logs
    assert "New status of remote server = DEAD" in logs
    assert logs.index("Old status of remote server = PASSIVE") < \
        logs.index("New status of remote server = DEAD")
    # STANDALONE is said from the moment the primary starts telling the witness; killed
    # before the witness heard it, the witness would still name the backup the in-sync
    # standby, and the backup would rightly take over (docs/ha.md)
    wait_until(lambda: (pair.status("primary") or {}).get("ha", {}).get("phase")
               == "standalone", "the witness to know the backup is out of sync", 10)
    pair.kill("primary")
    pair.restart("backup")
    # the backup alone, its journal no newer than the primary's: it does not serve
    st = pair.wait_state("backup", "WAITING", 10)
    assert st["ha"]["peer"]["state"] == "DEAD"


def test_the_backup_logs_the_active_died_and_switches_to_active(pair: Pair) -> None:
    pair.kill("primary")
    pair.wait_active(10, "backup")
    logs = pair.logs("backup")
    assert "Old status of remote server = ACTIVE" in logs
    assert "New status of remote server = DEAD" in logs
    assert "Local server switched to STANDALONE" in logs
    pair.restart("primary")
    pair.wait_state("primary", ("PASSIVE", "ACTIVE"), 15)
    assert "Local server switched to ACTIVE" in pair.logs("backup") + pair.logs("primary")


def test_passive_server_refuses_clients_naming_the_active(pair: Pair) -> None:
    with pytest.raises(StompError) as refused:
        BlockingConnection(HOST, pair.stomp_port["backup"], timeout=5)
    error = refused.value.frame
    assert error.headers.get("active-server") == pair.stomp_address("primary")
    assert "PASSIVE" in error.headers.get("message", "")
    # the same through stomp.py
    conn, frames = stomp_connect(pair, "backup")
    try:
        assert frames.connected is None
        assert frames.errors, "no ERROR frame from the passive server"
        assert frames.errors[0].headers.get("active-server") == pair.stomp_address("primary")
    finally:
        if conn.is_connected():
            conn.disconnect()
    # on the wire: unescaped, as CONNECTED is (stompjs unescapes only after CONNECTED)
    with socket.create_connection((HOST, pair.stomp_port["backup"]), timeout=5) as raw:
        raw.sendall(b"CONNECT\naccept-version:1.2\nhost:pair\n\n\x00")
        answer = b""
        while b"\x00" not in answer and (chunk := raw.recv(4096)):
            answer += chunk
    assert f"\nactive-server:{pair.stomp_address('primary')}\n".encode() in answer, answer
    assert b"\\c" not in answer, answer


def test_connected_of_the_active_carries_the_topology(pair: Pair) -> None:
    conn, frames = stomp_connect(pair, "primary")
    try:
        assert frames.connected is not None, frames.errors
        topology = frames.connected.headers.get("topology", "")
        assert topology.split(",") == [pair.stomp_address("primary"),
                                       pair.stomp_address("backup")]
    finally:
        conn.disconnect()
    blocking = pair.connect("primary")
    assert set(blocking.server_headers["topology"].split(",")) == {
        pair.stomp_address("primary"), pair.stomp_address("backup")}


def test_after_failover_the_new_active_is_named_by_the_restarted_server(pair: Pair) -> None:
    pair.kill("primary")
    pair.wait_active(10, "backup")
    pair.restart("primary", "--no-allow-failback")
    pair.wait_state("primary", "PASSIVE", 15)
    with pytest.raises(StompError) as refused:
        BlockingConnection(HOST, pair.stomp_port["primary"], timeout=5)
    assert refused.value.frame.headers.get("active-server") == pair.stomp_address("backup")
    topology = pair.connect("backup").server_headers["topology"].split(",")
    assert topology == [pair.stomp_address("backup"), pair.stomp_address("primary")]


def test_wrong_secret_is_refused_and_the_pair_does_not_form(pair_factory) -> None:
    pair = pair_factory(secret_for={"backup": "not-the-secret"})
    pair.start()
    pair.wait_state("primary", "STANDALONE", 10)
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        primary, backup = pair.status("primary"), pair.status("backup")
        assert primary is not None and primary["state"] == "STANDALONE", primary
        assert primary["ha"]["synchronized-with-backup"] is False
        assert backup is not None and backup["state"] not in ("PASSIVE", "SYNCING", "ACTIVE",
                                                               "STANDALONE"), backup
        time.sleep(0.2)
    wait_until(lambda: "Refused HA connection" in pair.logs("primary"),
               "the primary logs the refused HA connection", 5)
    backup_logs = pair.logs("backup")
    assert "refused" in backup_logs.lower(), backup_logs[-2000:]
    assert "New status of remote server" not in pair.logs("primary")
    # the witness does not accept the backup either
    assert "Refused connection" in pair.witness_logs()


def test_two_servers_with_the_same_role_are_refused_with_a_clear_error(pair_factory) -> None:
    """Each role opens its own epoch numbers (docs/ha.md, Epochs), so two primaries never
    form a pair: the HA channel is refused with a message naming the setting. (Only the
    backup connects, so two backups are what reaches the check; two primaries wait.)"""
    pair = pair_factory(roles={"primary": "backup", "backup": "backup"})
    pair.start()
    wanted = 'role = "backup"'
    wait_until(lambda: wanted in pair.logs("primary") and wanted in pair.logs("backup"),
               "both servers log the role mismatch", 10)
    for name in NAMES:
        assert "one must be the primary, the other the backup" in pair.logs(name)
        assert "New status of remote server" not in pair.logs(name)
        status = pair.status(name)
        assert status is not None and status["state"] not in ("PASSIVE", "SYNCING"), status


def test_pairmq_status_prints_both_servers(pair: Pair) -> None:
    admins = (pair.admin_address("primary"), pair.admin_address("backup"))
    result = pair.cli("status", *admins)
    assert result.returncode == 0, result.stderr
    primary, backup = (next(line for line in result.stdout.splitlines()
                            if f" {name} " in line and address in line)
                       for name, address in zip(("primary", "backup"), admins, strict=True))
    assert "ACTIVE" in primary and "backup PASSIVE" in primary, result.stdout
    assert "0 records, 0 B" in primary  # the backup's lag, as the active counts it
    assert "PASSIVE" in backup and "primary ACTIVE" in backup, result.stdout
    scripted = pair.cli("status", *admins, "--json")
    infos = _json_objects(scripted.stdout)
    assert [(i["name"], i["state"]) for i in infos] == [("primary", "ACTIVE"),
                                                        ("backup", "PASSIVE")]
    assert infos[0]["ha"]["synchronized-with-backup"] is True
    assert infos[1]["ha"]["synchronized-with-live"] is True
    pair.kill("backup")
    pair.wait_state("primary", "STANDALONE", 10)
    result = pair.cli("status", *admins)
    assert result.returncode == 0, result.stderr
    assert "STANDALONE" in result.stdout and "backup DEAD" in result.stdout
    assert "unreachable" in result.stdout and admins[1] in result.stdout


def _json_objects(text: str) -> list[dict]:
    """The JSON objects `--json` prints one after the other."""
    decoder, objects, at = json.JSONDecoder(), [], 0
    while (at := text.find("{", at)) != -1:
        value, at = decoder.raw_decode(text, at)
        objects.append(value)
    return objects
