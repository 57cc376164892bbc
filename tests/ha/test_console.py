"""The web console (docs/operations.md, "The console") in a real headless Chromium:
the page a browser gets from the management port, logged in with HTTP basic auth, polling
the operator's JSON API. Real servers, a real pair and a real SIGKILL; stomp.py clients
produce and consume, and every action's effect is checked through the API and a consumer,
not only through what the page says.

The pair test saves a screenshot of the console in its tmp_path; with
PAIRMQ_CONSOLE_SCREENSHOT=PATH set (e.g. docs/console.png) it is also copied there, which is
how docs/console.png is made.
"""

from __future__ import annotations

import http.server
import os
import shutil
import threading
from pathlib import Path

import pytest

from tests.ha.pair import Pair
from tests.integration.clients import Client
from tests.serverproc import free_port
from tests.support.admin import admin_request, api, managed_server
from tests.support.browser import Browser
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

P = {"persistent": "true"}
WATCHER = ("watcher", "watch-pw")  # role monitor: reads only
ALICE = ("alice", "alice-pw")  # a STOMP user
USERS = f"""
[auth.users.{WATCHER[0]}]
password = "{WATCHER[1]}"
roles = ["monitor"]

[auth.users.{ALICE[0]}]
password = "{ALICE[1]}"
roles = ["app"]
"""


def depth(admin: str, destination: str) -> int:
    rows = api(admin, "/api/destinations")["destinations"]
    return next(r["messages"] for r in rows if r["name"] == destination)


def server_row(name: str, field: str) -> str:
    return f'#servers tr[data-server="{name}"] [data-field="{field}"]'


def destination_row(name: str, field: str = "") -> str:
    row = f'#destinations tr[data-destination="{name}"]'
    return f'{row} [data-field="{field}"]' if field else row


def started(server_factory, *flags: str, config_text: str | None = None) -> tuple[object, str]:
    """A standalone server with a management port (the test admin, and USERS)."""
    return managed_server(server_factory, *flags, config_text=config_text or USERS)


def empty_for(consumer: Client, queue: str) -> None:
    """`queue` holds nothing: a consumer subscribed to it gets the marker sent after it
    subscribed, and nothing before it."""
    consumer.subscribe(queue, id="check")
    consumer.send(queue, "marker", **P)
    [first] = consumer.wait_messages(1)
    assert first.body == "marker", f"{queue} still held {first.body!r}"


def test_the_console_shows_the_pair_and_follows_a_failover(pair: Pair, stomp_client,
                                                           browser: Browser,
                                                           tmp_path: Path) -> None:
    primary, backup = pair.admin_address("primary"), pair.admin_address("backup")
    producer = stomp_client(pair.servers["primary"])
    for i in range(12):
        producer.send("/queue/orders", f"order-{i}", **P)
    for i in range(5):
        producer.send("/queue/invoices", f"invoice-{i}", **P)
    for i in range(20):
        producer.send("/stream/events", f"event-{i}", **P)
    producer.send("/stream/events", "", **{"x-stream-group": "billing",
                                           "x-stream-commit-offset": "15"}, **P)
    consumer = stomp_client(pair.servers["primary"])
    consumer.subscribe("/queue/invoices", id="c", ack="client-individual",
                       headers={"prefetch-count": "2"})
    consumer.wait_messages(2)

    browser.open_console(primary)
    assert browser.attribute("#served-by", "data-server") == "primary"
    browser.wait_exact(server_row("primary", "state"), "ACTIVE")
    browser.wait_exact(server_row("backup", "state"), "PASSIVE")
    assert "(this page)" in browser.text(server_row("primary", "name"))
    browser.wait_text(server_row("primary", "disk"), "ok (longest write")
    assert browser.text(server_row("backup", "disk")) == "-"  # not known of the peer
    browser.wait_exact(destination_row("/queue/orders", "messages"), "12")
    browser.wait_exact(destination_row("/queue/invoices", "unacknowledged"), "2")
    assert browser.text(destination_row("/queue/invoices", "consumers")) == "1"
    browser.wait_exact('#streams tr[data-stream="/stream/events"] [data-field="next_offset"]',
                       "20")
    assert "billing @ 15" in browser.text(
        '#streams tr[data-stream="/stream/events"] [data-field="groups"]')
    browser.wait_text("#witness [data-field='reachable']", "yes")
    for i in range(12, 20):  # traffic between two looks at the counters: a rate in
        producer.send("/queue/orders", f"order-{i}", **P)
    browser.wait_exact(destination_row("/queue/orders", "messages"), "20")
    browser.wait(lambda: browser.text(destination_row("/queue/orders", "rate_in"))
                 not in ("", "-", "0.0"), "a rate in on /queue/orders")
    shot = browser.screenshot(tmp_path / "console.png", down_to="#streams-section")
    assert 10_000 < shot.stat().st_size < 400_000
    if os.environ.get("PAIRMQ_CONSOLE_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["PAIRMQ_CONSOLE_SCREENSHOT"])

    # the backup's console, as it sees the pair; then the primary dies under it
    browser.open_console(backup)
    assert browser.attribute("#served-by", "data-server") == "backup"
    browser.wait_exact(server_row("backup", "state"), "PASSIVE")
    browser.wait_exact(server_row("primary", "state"), "ACTIVE")
    assert "(this page)" in browser.text(server_row("backup", "name"))
    # a backup refuses to be forced while its active server lives: the API's words shown
    browser.click("#force-activation")
    assert "Force backup" in browser.accept_confirm()
    browser.wait_text("#notice-text", "forcing is for a WAITING server")
    assert browser.attribute("#notice", "data-kind") == "error"
    assert browser.text("#failovers") == "0"
    browser.mark()
    backup_tab = browser.driver.current_window_handle
    browser.driver.switch_to.new_window("tab")  # and the primary's, in another tab
    browser.open_console(primary)
    browser.wait_exact(server_row("primary", "state"), "ACTIVE")

    pair.kill("primary")
    browser.wait(lambda: browser.attribute("#poll-status", "data-ok") == "false",
                 "the primary's console saying it lost its server")
    assert "Cannot reach the server" in browser.text("#poll-status")
    assert browser.text(server_row("primary", "state")) == "ACTIVE", "the last word is kept"
    browser.driver.close()
    browser.driver.switch_to.window(backup_tab)

    def backup_serving() -> str | None:
        state = browser.text(server_row("backup", "state"))
        return state if state in ("STANDALONE", "ACTIVE") else None

    shown = browser.wait(backup_serving, "the backup serving")
    browser.wait_exact("#failovers", "1")
    seen = api(backup, "/api/pair")
    assert seen["failovers"] == 1
    change = next(c for c in reversed(seen["changes"])
                  if c["old"] == "PASSIVE" and c["new"] in ("STANDALONE", "ACTIVE"))
    assert change["why"]
    newest = "#changes tbody tr:first-child"
    browser.wait_text(f'{newest} [data-field="why"]', change["why"])
    assert browser.text(f'{newest} [data-field="old"]') == "PASSIVE"
    assert browser.text(f'{newest} [data-field="new"]') == change["new"]
    peer_state = next(s["state"] for s in seen["servers"] if s["name"] == "primary")
    browser.wait_exact(server_row("primary", "state"), peer_state)
    browser.wait_text("#served-by", f"now {shown}")
    assert browser.marked(), "the page was reloaded"
    # what the primary had receipted is on the backup, and shown there
    browser.wait_exact(destination_row("/queue/orders", "messages"), "20")


def test_the_console_shows_the_etcd_arbiter_and_a_member_lost(pair_factory, etcd_cluster,
                                                              browser: Browser) -> None:
    pair = pair_factory(etcd=etcd_cluster.url)
    pair.start(parallel=True)
    pair.wait_formed()
    browser.open_console(pair.admin_address("primary"))
    browser.wait_exact("#witness [data-field='kind']", f"etcd (group {pair.group})")
    browser.wait_text("#witness [data-field='members']", "3 of 3, leader http://127.0.0.1:")
    browser.wait_text("#witness [data-field='reachable']", "yes")
    etcd_cluster.kill(etcd_cluster.wait_leader())
    browser.wait_text("#witness [data-field='members']", "2 of 3")
    assert pair.state("primary") == "ACTIVE"


def test_a_queue_is_browsed_then_purged(server_factory, stomp_client,
                                        browser: Browser) -> None:
    srv, admin = started(server_factory)
    producer = stomp_client(srv)
    for i in range(7):
        producer.send("/queue/purged", f"body-{i}", kind="order", **P)

    browser.open_console(admin)
    browser.wait_exact(destination_row("/queue/purged", "messages"), "7")
    browser.click(f'{destination_row("/queue/purged")} [data-action="browse"]')
    browser.wait(lambda: browser.attribute("#browse-results", "data-count") == "7",
                 "the browsed messages")
    first = browser.find("#browse-results article.message")
    assert "body-0" in first.find_element("css selector", "pre.body").text
    assert "kind" in first.text and "order" in first.text
    assert depth(admin, "/queue/purged") == 7, "browsing took messages"

    browser.click(f'{destination_row("/queue/purged")} [data-action="purge"]')
    question = browser.accept_confirm()
    assert "/queue/purged" in question and "7" in question
    browser.wait_text("#notice-text", "Purged /queue/purged: 7 messages deleted")
    browser.wait_exact(destination_row("/queue/purged", "messages"), "0")
    assert depth(admin, "/queue/purged") == 0
    empty_for(stomp_client(srv), "/queue/purged")


def test_a_monitor_sees_why_a_purge_is_refused(server_factory, stomp_client,
                                               browser: Browser) -> None:
    srv, admin = started(server_factory)
    producer = stomp_client(srv)
    for i in range(3):
        producer.send("/queue/kept", f"m{i}", **P)

    browser.open_console(admin, WATCHER)
    browser.wait_exact(destination_row("/queue/kept", "messages"), "3")
    browser.click(f'{destination_row("/queue/kept")} [data-action="purge"]')
    browser.accept_confirm()
    said = browser.wait_text("#notice-text", "Refused")
    assert "admin role" in said and "monitor" in said, said
    assert browser.attribute("#notice", "data-kind") == "error"
    assert depth(admin, "/queue/kept") == 3

    # the page itself is behind the login, as the API is
    code, headers, _ = admin_request(admin, "/", credentials=None)
    assert code == 401 and headers["WWW-Authenticate"] == 'Basic realm="pairmq"'
    code, headers, _ = admin_request(admin, "/console/console.js", credentials=WATCHER)
    assert code == 200 and "script-src 'self'" in headers["Content-Security-Policy"]
    assert admin_request(admin, "/console/other.js", credentials=WATCHER)[0] == 404


def test_a_dead_letter_is_retried_and_a_connection_closed(server_factory, stomp_client,
                                                          browser: Browser) -> None:
    srv, admin = started(server_factory, "--max-delivery-attempts", "1")
    producer = stomp_client(srv)
    producer.send("/queue/work", "job-1", **P)
    worker = stomp_client(srv, login=ALICE[0], passcode=ALICE[1])
    worker.subscribe("/queue/work", id="w", ack="client-individual")
    worker.nack(worker.wait_messages(1)[0])
    wait_until(lambda: depth(admin, "/queue/DLQ.work") == 1, "the dead letter")
    worker.unsubscribe("w")

    browser.open_console(admin)
    browser.wait_exact(destination_row("/queue/DLQ.work", "messages"), "1")
    browser.click(f'{destination_row("/queue/DLQ.work")} [data-action="move"]')
    assert browser.find("#move-source").get_attribute("value") == "/queue/DLQ.work"
    browser.click("#move-submit")
    assert "original destination" in browser.accept_confirm()
    browser.wait_text("#notice-text", "1 message moved")
    again = stomp_client(srv)
    again.subscribe("/queue/work", id="a")
    [retried] = again.wait_messages(1)
    assert retried.body == "job-1"
    browser.wait_exact(destination_row("/queue/DLQ.work", "messages"), "0")

    row = '#connections tr[data-user="alice"]'
    browser.wait_text(f'{row} [data-field="user"]', "alice")
    browser.click(f'{row} [data-action="close"]')
    assert "alice" in browser.accept_confirm()
    browser.wait_text("#notice-text", "closed")
    assert "closed by an operator" in worker.wait_error().headers["message"]
    browser.wait(lambda: not browser.driver.find_elements("css selector", row),
                 "alice's connection gone")


class _OtherSite(http.server.BaseHTTPRequestHandler):
    """Another site's page, which posts a form to the management port as soon as it
    loads (a text/plain form: no preflight, and its body reads as JSON)."""

    page = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *_args) -> None:
        pass


def test_another_site_cannot_act_with_the_operators_login(server_factory, stomp_client,
                                                          browser: Browser) -> None:
    srv, admin = started(server_factory)
    producer = stomp_client(srv)
    for i in range(3):
        producer.send("/queue/victim", f"m{i}", **P)
    browser.open_console(admin)  # the operator logged in, as the console makes them
    browser.wait_exact(destination_row("/queue/victim", "messages"), "3")

    field = '{"destination": "/queue/victim", "x": "'
    _OtherSite.page = (f'<form id="f" method="POST" enctype="text/plain" '
                       f'action="http://{admin}/api/purge"><input name=\'{field}\' '
                       f'value=\'"}}\'></form><script>document.getElementById("f").submit()'
                       f'</script>').encode()
    other = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _OtherSite)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        browser.driver.switch_to.new_window("tab")
        browser.driver.get(f"http://localhost:{other.server_port}/")  # another origin
        browser.wait(lambda: "localhost" not in browser.driver.current_url,
                     "the other site's form posted")
    finally:
        other.shutdown()
        other.server_close()
    assert depth(admin, "/queue/victim") == 3, "another site purged the queue"
