"""The web console of a cluster member (docs/cluster.md), in a real headless Chromium
(tests/support/browser.py): the Cluster card, this member first, then the member at the far
end of each bridge, refreshed as messages are forwarded and as a member goes away. A server
that is no cluster member shows no card. A colocated member shows its backups."""

from __future__ import annotations

from pathlib import Path

import pytest

from pairmq.client import connect
from pairmq.core.cluster import sf_queue
from tests.support.admin import api, managed_server
from tests.support.browser import Browser
from tests.support.cluster import StandaloneCluster
from tests.support.colocated import ColocatedCluster
from tests.support.etcd import EtcdCluster
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


def hosted_row(live: str, field: str) -> str:
    return f'#colocated-hosted tr[data-live="{live}"] [data-field="{field}"]'


@pytest.mark.long  # CI time: the console's cluster view is tested in make test
def test_the_console_shows_a_colocated_members_backups_and_a_backup_lost(
        tmp_path: Path, browser: Browser, etcd_cluster: EtcdCluster) -> None:
    """Two colocated members (real processes, a real etcd): member 0's console shows where
    its live's backup runs and the backup it hosts for live 1; member 1 killed, it shows
    its live asking for another backup and why none is to be had."""
    members = ColocatedCluster(tmp_path, 2, etcd=etcd_cluster.url).start()
    try:
        members.wait_backed_up()
        browser.open_console(f"127.0.0.1:{members.admin[0]}")
        browser.wait(lambda: browser.find("#colocated").is_displayed(), "the colocated part")
        browser.wait_exact("#colocated-backup", "Backup of this live: backed_up on member m1")
        assert browser.attribute('#colocated-backup [data-field="phase"]', "data-state") == \
            "backed_up"
        assert browser.text(hosted_row("m1", "live")) == "m1"
        assert browser.text(hosted_row("m1", "stomp")) == \
            f"127.0.0.1:{members.backup_stomp(1)}"
        assert browser.text(hosted_row("m1", "state")) == "running"
        assert browser.text(hosted_row("m1", "restarts")) == "0"
        assert "1 of at most 1" in browser.text("#colocated-hosted caption")
        assert not browser.find("#no-hosted").is_displayed()

        # member 1's machine dies: live 0's backup with it; nobody else can host one
        members.kill_tree(1)
        browser.wait_exact("#colocated-backup",
                           "Backup of this live: asking: no other member reachable")
        assert browser.attribute('#colocated-backup [data-field="problem"]',
                                 "data-problem") == "warning"  # yellow: it keeps asking
        # the backup of live 1 hosted here now serves live 1, and is still listed
        assert browser.text(hosted_row("m1", "state")) == "running"
    finally:
        members.kill_all()
