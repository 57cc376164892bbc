"""The web console of a cluster member (docs/cluster.md), in a real headless Chromium
(tests/support/browser.py): the Cluster card, this member first, then the member at the far
end of each bridge, refreshed as messages are forwarded and as a member goes away. A server
that is no cluster member shows no card. A colocated member's backups are shown from a
management port made up here (the real page, made-up answers)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest

from pairmq.client import connect
from pairmq.core.cluster import sf_queue
from pairmq.server.manage.console import FILES, HEADERS
from tests.support.admin import api, managed_server
from tests.support.browser import Browser
from tests.support.cluster import StandaloneCluster
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

QUEUE = "/queue/console-forwarded"


def member_row(name: str, field: str) -> str:
    return f'#cluster-members tr[data-member="{name}"] [data-field="{field}"]'


def fact(field: str) -> str:
    return f'#cluster [data-field="{field}"]'


def test_the_console_shows_the_cluster_and_follows_a_member_lost(tmp_path: Path,
                                                                 browser: Browser) -> None:
    cluster = StandaloneCluster(tmp_path, 2)
    try:
        cluster.start()
        admin = f"127.0.0.1:{cluster.admin_ports[0]}"
        browser.open_console(admin)
        browser.wait(lambda: browser.find("#cluster-card").is_displayed(), "the Cluster card")
        browser.wait_exact(fact("name"), "c1")
        assert browser.text(fact("member")) == "m0"
        assert browser.text(fact("url")) == cluster.url(0)
        assert browser.text(fact("load_balancing")).startswith("on_demand")
        assert "(1 other)" in browser.text(fact("discovery"))

        # this member first, then member 1 at the far end of the bridge, forwarding
        assert browser.attribute("#cluster-members tbody tr:first-child", "data-this") == \
            "true"
        assert browser.text(member_row("m0", "member")) == "m0 (this member)"
        assert browser.text(member_row("m0", "state")) == "serving"
        browser.wait_exact(member_row("m1", "state"), "forwarding")
        assert browser.attribute(member_row("m1", "state"), "data-state") == "forwarding"
        assert browser.text(member_row("m1", "member")) == "m1"
        assert browser.text(member_row("m1", "url")) == cluster.url(1)
        assert browser.text(member_row("m1", "server")) == f"127.0.0.1:{cluster.ports[1]}"
        assert browser.text(member_row("m1", "problem")) == "-"
        # green: the colour the console gives a serving server
        assert browser.driver.execute_script(
            "return getComputedStyle(arguments[0], '::before').backgroundColor;",
            browser.find(member_row("m1", "state"))) == "rgb(46, 158, 91)"

        # messages sent to member 1, consumed on member 0: the counts follow
        consumer = connect(cluster.url(0))
        sub = consumer.subscribe(QUEUE)
        wait_until(lambda: sf_queue("m0", QUEUE) in cluster.status(0)["cluster"]["bridges"][0]
                   ["subscriptions"], "member 0's bridge subscribed on member 1", 10)
        producer = connect(cluster.url(1))
        for k in range(5):
            producer.send(QUEUE, f"m{k}")
        for _ in range(5):
            assert sub.receive(10) is not None
        producer.close()
        consumer.close()
        browser.wait_exact(member_row("m1", "forwarded"), "5")
        browser.wait_exact(member_row("m0", "forwarded"), "5")
        browser.wait_exact(fact("forwarded"), "5 messages")
        assert browser.attribute("#poll-status", "data-ok") == "true"

        # member 1 goes away: its row says so, member 0's page goes on refreshing
        browser.mark()
        server = cluster.servers[1]
        assert server is not None
        server.stop()
        browser.wait_text(member_row("m1", "problem"), "no server reachable")
        assert browser.attribute(member_row("m1", "problem"), "data-problem") == "true"
        assert browser.marked(), "the page was reloaded"
        assert browser.attribute("#poll-status", "data-ok") == "true"
    finally:
        cluster.stop()


def test_the_console_of_a_server_without_a_cluster_shows_no_cluster_card(
        server_factory, browser: Browser) -> None:
    _server, admin = managed_server(server_factory)
    assert "cluster" not in api(admin, "/status")
    browser.open_console(admin)
    browser.wait_exact('#servers tr[data-this="true"] [data-field="state"]', "STANDALONE")
    assert browser.attribute("#poll-status", "data-ok") == "true", browser.text("#poll-status")
    assert not browser.find("#cluster-card").is_displayed()


# ------------------------------------------------------------------ made up
# The console's own files, and answers of the operator's API made up here: a colocated
# member's view of its backups, changed between two looks.


@contextmanager
def _made_up_console(cluster: dict[str, Any]) -> Iterator[str]:
    """HOST:PORT of a port serving the console, whose /api/pair carries `cluster` (changed
    in place by the test: each answer is made when asked)."""
    folder = files("pairmq.server.manage") / "console_assets"
    pages = {"/": "index.html", **{f"/console/{name}": name for name in FILES}}

    def answer(path: str) -> tuple[bytes, str] | None:
        if path in pages:
            name = pages[path]
            return (folder / name).read_bytes(), FILES[name]
        data = {"/api/pair": {"servers": [{"name": "m0-live", "this": True,
                                           "state": "ACTIVE", "stomp": "127.0.0.1:6000"}],
                              "witness": None, "policy": "none", "failovers": 0,
                              "changes": [], "cluster": cluster},
                "/api/destinations": {"destinations": [], "streams": {}, "total": 0,
                                      "shown": 0},
                "/api/connections": {"connections": []}}.get(path)
        return None if data is None else (json.dumps(data).encode(), "application/json")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = answer(self.path)
            if found is None:
                self.send_error(404)
                return
            body, kind = found
            self.send_response(200)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            for name, value in HEADERS.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def hosted_row(live: str, field: str) -> str:
    return f'#colocated-hosted tr[data-live="{live}"] [data-field="{field}"]'


def test_the_console_shows_a_colocated_members_backups(browser: Browser) -> None:
    backup = {"phase": "backed_up", "member": "m1", "tries": 1, "problem": None}
    hosted = [{"live": "m2", "name": "m2-backup", "stomp": "127.0.0.1:61713",
               "ha": "127.0.0.1:7100", "admin": "", "pid": 4321, "state": "running",
               "restarts": 2, "data_dir": "data/m0/backups/m2"}]
    cluster: dict[str, Any] = {
        "name": "c1", "member": "m0", "url": "stomp://127.0.0.1:6000", "serving": True,
        "discovery": {"kind": "static", "members": ["stomp://127.0.0.1:6002"]},
        "load_balancing": "on_demand", "forwarded": 0, "waiting": 0, "bridges": [],
        "colocated": {"request_backup": True, "max_backups": 1, "backup": backup,
                      "hosted": hosted}}
    with _made_up_console(cluster) as admin:
        browser.open_console(admin)
        browser.wait(lambda: browser.find("#colocated").is_displayed(), "the colocated part")
        assert browser.attribute("#poll-status", "data-ok") == "true", \
            browser.text("#poll-status")
        assert browser.text("#colocated-backup") == \
            "Backup of this live: backed_up on member m1"
        assert browser.attribute('#colocated-backup [data-field="phase"]', "data-state") == \
            "backed_up"
        assert browser.text(hosted_row("m2", "live")) == "m2"
        assert browser.text(hosted_row("m2", "stomp")) == "127.0.0.1:61713"
        assert browser.text(hosted_row("m2", "ha")) == "127.0.0.1:7100"
        assert browser.text(hosted_row("m2", "pid")) == "4321"
        assert browser.text(hosted_row("m2", "state")) == "running"
        assert browser.text(hosted_row("m2", "restarts")) == "2"
        assert "1 of at most 1" in browser.text("#colocated-hosted caption")
        assert not browser.find("#no-hosted").is_displayed()

        # its backup's member went away and no other has room; the hosted backup stopped
        backup.update(phase="given_up", member=None, tries=3,
                      problem="no member has room for a backup (3 tries)")
        cluster["colocated"]["hosted"] = []
        browser.wait_exact("#colocated-backup", "Backup of this live: given_up: no member "
                                                "has room for a backup (3 tries)")
        assert browser.attribute('#colocated-backup [data-field="problem"]',
                                 "data-problem") == "true"
        assert not browser.find("#colocated-hosted").is_displayed()
        assert browser.find("#no-hosted").is_displayed()

        # no longer a colocated member: the part is hidden, the card stays
        cluster["colocated"] = None
        browser.wait(lambda: not browser.find("#colocated").is_displayed(),
                     "no colocated part")
        assert browser.find("#cluster-card").is_displayed()
