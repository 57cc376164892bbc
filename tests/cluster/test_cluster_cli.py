"""`pairmq status` of a cluster member (docs/cluster.md): after the pair's table, a table of
the cluster as the member's serving server sees it, one row per member. Real standalone
members and the real `pairmq` command; then the command against stand-in management ports
answering with views no live cluster gives on demand (a backup's view first, a refused
member, markup in a server's words)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pairmq.client import connect
from pairmq.core.cluster import sf_queue
from tests.support.admin import managed_server
from tests.support.cli import run_pairmq
from tests.support.cluster import StandaloneCluster
from tests.support.waiting import wait_until

QUEUE = "/queue/cli-forwarded"


def _row(table: str, start: str) -> str:
    """The line of `table` whose first cell starts with `start`."""
    found = [line for line in table.splitlines() if line.startswith(f"│ {start}")]
    assert len(found) == 1, table
    return found[0]


def test_pairmq_status_prints_the_cluster_of_a_member(tmp_path: Path) -> None:
    cluster = StandaloneCluster(tmp_path, 2)
    try:
        cluster.start()
        admin = f"127.0.0.1:{cluster.admin_ports[0]}"
        # messages sent to member 1, consumed on member 0: member 0's bridge brings them
        consumer = connect(cluster.url(0))
        sub = consumer.subscribe(QUEUE)
        wait_until(lambda: sf_queue("m0", QUEUE) in cluster.status(0)["cluster"]["bridges"][0]
                   ["subscriptions"], "member 0's bridge subscribed on member 1", 10)
        producer = connect(cluster.url(1))
        for k in range(7):
            producer.send(QUEUE, f"m{k}")
        for _ in range(7):
            assert sub.receive(10) is not None
        producer.close()
        consumer.close()
        wait_until(lambda: cluster.status(0)["cluster"]["forwarded"] == 7,
                   "member 0 counting 7 forwarded", 10)
        # member 1's status (every 500 ms) saying that nothing waits there any more
        wait_until(lambda: cluster.status(0)["cluster"]["bridges"][0]["waiting"] == 0,
                   "member 1's status after the transfer", 10)

        done = run_pairmq("status", "--admin", admin)
        assert done.returncode == 0, done.stderr
        out = done.stdout
        assert out.index("The pair") < out.index("The cluster c1"), out
        this = _row(out, "m0 (this)")
        assert cluster.url(0) in this and "serving" in this, this
        assert f"127.0.0.1:{cluster.ports[0]}" in this, this  # this member's server
        other = _row(out, "m1 ")
        cells = [c.strip() for c in other.strip("│").split("│")]
        assert cells == ["m1", cluster.url(1), "forwarding", f"127.0.0.1:{cluster.ports[1]}",
                         "0", "7", "0", "-"], other
        assert "load balancing on_demand" in out and "discovery static" in out, out

        # --json: each server's /status as it is, the cluster in it
        as_json = run_pairmq("status", "--admin", admin, "--json")
        assert as_json.returncode == 0, as_json.stderr
        assert json.loads(as_json.stdout)["cluster"]["bridges"][0]["member"] == "m1"

        # both members asked: one cluster table, of the first that serves its member
        both = run_pairmq("status", "--admin", admin,
                          "--admin", f"127.0.0.1:{cluster.admin_ports[1]}")
        assert both.returncode == 0, both.stderr
        assert both.stdout.count("The cluster c1") == 1, both.stdout
        _row(both.stdout, "m0 (this)")

        # member 1 gone: member 0's bridge says so, and the command still answers
        server = cluster.servers[1]
        assert server is not None
        server.stop()
        wait_until(lambda: cluster.status(0)["cluster"]["bridges"][0]["problem"],
                   "member 0's bridge naming the lost member", 15)
        gone = run_pairmq("status", "--admin", admin)
        assert gone.returncode == 0, gone.stderr
        assert "no server reachable" in gone.stdout or "unreachable" in gone.stdout, \
            gone.stdout
    finally:
        cluster.stop()


def test_pairmq_status_on_a_server_without_a_cluster_prints_no_cluster_table(
        server_factory) -> None:
    _server, admin = managed_server(server_factory)
    done = run_pairmq("status", "--admin", admin)
    assert done.returncode == 0, done.stderr
    assert "The pair" in done.stdout and "The cluster" not in done.stdout, done.stdout


# ------------------------------------------------------------------ views made up
# A management port that answers GET /status with a view made up here, for what a live
# cluster does not show on demand: a backup's view listed first, a refused member, a
# discovery problem, and servers' words that look like Rich markup.


def _bridge(**over: Any) -> dict[str, Any]:
    bridge = {"url": "stomp://127.0.0.1:2", "member": "m1", "state": "forwarding",
              "connected": True, "server": "127.0.0.1:2", "problem": None, "in_flight": 3,
              "forwarded": 4567, "subscriptions": ["/queue/x"], "waiting": 12,
              "role": "active", "settings_differ": []}
    return {**bridge, **over}


def _status(name: str, serving: bool, bridges: list[dict[str, Any]],
            **over: Any) -> dict[str, Any]:
    cluster = {"name": "c1", "member": "m0", "url": "failover:(stomp://h:1,stomp://h:3)",
               "serving": serving, "discovery": {"kind": "static", "members": []},
               "load_balancing": "strict", "redistribution_delay_ms": 1000,
               "waiting": 123 if serving else None, "forwarded": 4567 if serving else 0,
               "forwarded_per_second": 812.5, "bridges": bridges, **over}
    return {"name": name, "stomp": f"127.0.0.1:{6000 if serving else 6001}",
            "state": "ACTIVE" if serving else "PASSIVE",
            "journal": {"epoch": 2, "appended_seq": 10, "confirmed_seq": 10},
            "cluster": cluster}


@contextmanager
def _management_port(status: dict[str, Any]) -> Iterator[str]:
    """HOST:PORT of a management port answering GET /status with `status`."""
    body = json.dumps(status).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/status":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _table_lines(out: str, title: str) -> list[str]:
    """The rows of the table titled `title` in `out` (a row folded on two lines is two)."""
    after = out[out.index(title):]
    return [line for line in after.splitlines() if line.startswith("│")]


def test_the_serving_servers_view_is_printed_and_what_is_wrong_is_named() -> None:
    backup = _status("backup", False, [])
    primary = _status("primary", True, [
        _bridge(),
        _bridge(url="stomp://127.0.0.1:5", member=None, state="connecting", connected=False,
                server=None, problem="member stomp://127.0.0.1:5 unreachable: [Errno 111]",
                in_flight=0, forwarded=0, waiting=None),
        _bridge(url="stomp://127.0.0.1:7", member="[bold]m2[/bold]", state="refused",
                problem="belongs to cluster 'other'", settings_differ=["*", "orders.*"]),
    ], discovery={"kind": "etcd", "prefix": "/p/", "problem": "etcd [down]",
                  "registered": ["m0"]})
    with _management_port(backup) as first, _management_port(primary) as second:
        done = run_pairmq("status", "--admin", first, "--admin", second)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.count("The cluster c1") == 1, out
    lines = _table_lines(out, "The cluster c1")
    # the primary's view (it serves), though the backup was asked first; this member first
    assert lines[0].startswith("│ m0 (this)") and "serving" in lines[0], out
    assert "127.0.0.1:6000" in lines[0] and "failover:(stomp://h:1,stomp://h:3)" in lines[0]
    assert "123" in lines[0] and "4,567" in lines[0] and "etcd [down]" in lines[0], out
    assert lines[1].startswith("│ m1 ") and "forwarding" in lines[1], out
    assert "127.0.0.1:2" in lines[1] and "12" in lines[1], out
    assert lines[2].startswith("│ ? ") and "connecting" in lines[2], out  # not identified
    assert "[Errno 111]" in lines[2], out
    refused = "\n".join(lines[3:])
    assert "[bold]m2[/bold]" in refused and "refused" in refused, out  # words, not markup
    assert "settings differ: *, orders.*" in refused, out
    assert "load balancing strict, forwarded here 812.5/s, discovery etcd" in out, out


def test_a_backups_view_when_no_server_of_the_member_serves() -> None:
    with _management_port(_status("backup", False, [])) as only:
        done = run_pairmq("status", "--admin", only)
    assert done.returncode == 0, done.stderr
    lines = _table_lines(done.stdout, "The cluster c1")
    assert len(lines) == 1 and "not serving" in lines[0], done.stdout


def test_a_member_scaling_down_is_shown_with_its_progress_and_why_it_failed() -> None:
    moving = _status("primary", True, [_bridge()], scale_down={
        "phase": "moving", "target": "m1", "reason": None, "progress": 0.63,
        "waiting": 1234, "moving": 1000})
    with _management_port(moving) as only:
        done = run_pairmq("status", "--admin", only)
    assert done.returncode == 0, done.stderr
    assert "Scale-down to member m1: moving" in done.stdout, done.stdout
    assert "63% (1,234 here, 1,000 moving)" in done.stdout, done.stdout
    failed = _status("primary", True, [_bridge()], scale_down={
        "phase": "failed", "target": "m1", "reason": "nothing moved to member m1 for 30 s",
        "progress": 0.2, "waiting": 1234, "moving": 1000})
    with _management_port(failed) as only:
        done = run_pairmq("status", "--admin", only)
    assert "Scale-down to member m1: failed" in done.stdout, done.stdout
    assert "nothing moved to member m1 for 30 s" in done.stdout, done.stdout
    with _management_port(_status("primary", True, [_bridge()])) as only:
        done = run_pairmq("status", "--admin", only)
    assert "Scale-down" not in done.stdout, done.stdout


def _colocated(**backup: Any) -> dict[str, Any]:
    """GET /status' cluster "colocated" of member m0: its backup, one backup it hosts."""
    return {"request_backup": True, "max_backups": 1,
            "backup": {"phase": "backed_up", "member": "m1", "tries": 1, "problem": None,
                       **backup},
            "hosted": [{"live": "m2", "name": "m2-backup", "stomp": "127.0.0.1:61713",
                        "ha": "127.0.0.1:7100", "admin": "", "pid": 4321, "state": "running",
                        "restarts": 2, "data_dir": "data/m0/backups/m2"}]}


def test_a_colocated_members_backup_and_the_backups_it_hosts_are_shown() -> None:
    with _management_port(_status("primary", True, [_bridge()],
                                  colocated=_colocated())) as only:
        done = run_pairmq("status", "--admin", only)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Backup of this live: backed_up on member m1" in out, out
    lines = _table_lines(out, "Backups hosted here")
    assert len(lines) == 1, out
    row = lines[0].split("│")[1:-1]
    assert [c.strip() for c in row] == ["m2", "127.0.0.1:61713", "127.0.0.1:7100", "4321",
                                        "running", "2"], out
    assert "1 of at most 1" in out, out


def test_a_colocated_backup_given_up_says_why_and_no_field_prints_nothing() -> None:
    given_up = _colocated(phase="given_up", member=None, tries=3,
                          problem="no member has room for a backup [3 tries]")
    given_up["hosted"] = []
    with _management_port(_status("primary", True, [_bridge()],
                                  colocated=given_up)) as only:
        done = run_pairmq("status", "--admin", only)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    said = [line.rstrip() for line in out.splitlines() if line.startswith("Backup of")]
    assert said == ["Backup of this live: given_up"], out  # no member named
    assert "no member has room for a backup [3 tries]" in out, out  # words, not markup
    assert "No backup hosted here (room for 1)" in out and "Backups hosted here" not in out
    asking = _colocated(phase="asking", member="m[bold]3[/bold]", tries=2)
    with _management_port(_status("primary", True, [_bridge()], colocated=asking)) as only:
        done = run_pairmq("status", "--admin", only)
    assert "Backup of this live: asking on member m[bold]3[/bold] (2 tries)" in done.stdout
    for none in ({}, {"colocated": None}):
        with _management_port(_status("primary", True, [_bridge()], **none)) as only:
            done = run_pairmq("status", "--admin", only)
        assert done.returncode == 0, done.stderr
        assert "Backup of this live" not in done.stdout, done.stdout
        assert "hosted here" not in done.stdout, done.stdout
