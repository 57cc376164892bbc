"""What a real pair reports of itself in GET /metrics and GET /status: each server's
state, the epoch, the backup's lag, the witness, the lease, and the failovers counted
when the active is killed (docs/operations.md, "Metrics")."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from tests.ha.pair import Pair
from tests.support.admin import admin_request, metric_samples, sample_value
from tests.support.database import DATABASE_ONLY
from tests.support.waiting import wait_until


def states(samples) -> dict[str, float]:
    return {dict(key)["state"]: value for key, value in samples["pairmq_ha_state"].items()}


def test_each_server_reports_the_pair_and_a_kill_counts_one_failover(pair: Pair) -> None:
    active, passive = pair.admin_address("primary"), pair.admin_address("backup")
    client = pair.connect("primary")
    for i in range(200):
        client.send("/queue/lagging", f"m{i}".encode(), headers={"persistent": "true"})

    seen = metric_samples(active)
    assert [s for s, v in states(seen).items() if v == 1] == ["ACTIVE"]
    assert sample_value(seen, "pairmq_witness_reachable") == 1
    assert sample_value(seen, "pairmq_lease_remaining_seconds") > 0
    epoch = sample_value(seen, "pairmq_ha_epoch")
    assert epoch >= 1
    # every send was receipted, so the backup holds them: no lag once its acks are in
    seen = wait_until(lambda: (s := metric_samples(active)) and
                      sample_value(s, "pairmq_replication_lag_records") == 0 and s, "no lag", 5)
    assert sample_value(seen, "pairmq_replication_lag_bytes") == 0
    assert sample_value(seen, "pairmq_replication_lag_seconds") == 0
    lag = pair.status("primary")["ha"]["backup_lag"]
    assert lag == {"records": 0, "bytes": 0, "seconds": 0.0}

    backup = metric_samples(passive)
    assert [s for s, v in states(backup).items() if v == 1] == ["PASSIVE"]
    assert sample_value(backup, "pairmq_failovers_total") == 0
    assert "pairmq_replication_lag_records" not in backup  # only the active counts it
    # A PASSIVE backup needs nothing of the witness, yet must say whether it reaches it
    # (PairmqWitnessUnreachable fired for every backup an activation interval after it
    # started): still reachable two activation intervals on.
    time.sleep(2 * pair.activation_ms / 1000)
    assert sample_value(metric_samples(passive), "pairmq_witness_reachable") == 1

    pair.kill("primary")
    pair.wait_active(name="backup")
    after = wait_until(lambda: (s := metric_samples(passive)) and
                       states(s)["STANDALONE"] == 1 and s, "the backup serving", 10)
    assert sample_value(after, "pairmq_failovers_total") == 1
    assert sample_value(after, "pairmq_ha_epoch") > epoch
    assert "pairmq_replication_lag_records" not in after  # no backup attached


DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "pairmq.json"
ALERTS = Path(__file__).parents[2] / "deploy" / "prometheus" / "pairmq-alerts.yml"
METRIC = re.compile(r"\bpairmq_[a-z0-9_]+\b")


ETCD_ONLY = {"pairmq_arbiter_members", "pairmq_arbiter_members_reachable"}


def test_a_pair_on_etcd_reports_its_arbiter_and_a_member_lost(pair_factory,
                                                             etcd_cluster) -> None:
    pair = pair_factory(etcd=etcd_cluster.url)
    pair.start(parallel=True)
    pair.wait_formed()
    active = pair.admin_address("primary")
    seen = wait_until(lambda: (s := metric_samples(active)) and
                      sample_value(s, "pairmq_arbiter_members_reachable") == 3 and s,
                      "every etcd member seen", 10)
    assert seen["pairmq_arbiter_info"] == {(("kind", "etcd"),): 1}
    assert sample_value(seen, "pairmq_arbiter_reachable") == 1
    assert sample_value(seen, "pairmq_arbiter_lease_held") == 1
    assert sample_value(seen, "pairmq_arbiter_lease_remaining_seconds") > 0
    assert sample_value(seen, "pairmq_arbiter_members") == 3
    assert sum(seen["pairmq_arbiter_member_leader"].values()) == 1
    assert set(seen) >= ETCD_ONLY
    backup = metric_samples(pair.admin_address("backup"))
    assert sample_value(backup, "pairmq_arbiter_lease_held") == 0
    etcd_cluster.kill(etcd_cluster.wait_leader())
    wait_until(lambda: sample_value(metric_samples(active),
                                    "pairmq_arbiter_members_reachable") == 2,
               "the killed member counted out", 15)
    after = wait_until(lambda: (s := metric_samples(active)) and
                       sample_value(s, "pairmq_arbiter_reachable") == 1 and s,
                       "the two members left answering, once they elected a leader", 15)
    assert states(after)["ACTIVE"] == 1  # no failover meanwhile


def test_the_dashboard_and_alerts_use_only_what_the_pair_exports(pair: Pair) -> None:
    """Every series an expression of deploy/grafana/pairmq.json or of the alert rules
    names is one a running pair exports (a renamed metric would leave a panel silently
    empty, an alert silently silent)."""
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in panels)
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    assert exprs and all(t.get("refId") for p in panels for t in p["targets"])
    used = {name for expr in exprs for name in METRIC.findall(expr)}
    rules = ALERTS.read_text()
    alert_exprs = re.findall(r"^\s+expr: (.+)$", rules, re.MULTILINE)
    assert len(alert_exprs) == rules.count("- alert: ") >= 10
    used |= {name for expr in alert_exprs for name in METRIC.findall(expr)}
    used -= ETCD_ONLY  # exported by a pair on etcd: the test below
    used -= DATABASE_ONLY  # exported by a server with [store] url: test_database_pair.py

    client = pair.connect("primary")  # a destination, so that its series exist
    client.send("/queue/dashboard", b"x", headers={"persistent": "true"})
    exported = set(metric_samples(pair.admin_address("primary"))) | \
        set(metric_samples(pair.admin_address("backup")))
    assert used - exported == set(), f"the dashboard uses series nobody exports: " \
                                     f"{sorted(used - exported)}"
    assert len(used) >= 25, sorted(used)


def test_the_operator_api_gives_one_view_of_the_pair_from_either_server(pair: Pair) -> None:
    """GET /api/pair on either server names both, their states and epochs; the passive
    refuses an operator's change naming the active server; a failover shows up as a
    change with its reason."""
    views = {name: admin_request(pair.admin_address(name), "/api/pair")[2]
             for name in ("primary", "backup")}
    for name, view in views.items():
        states = {s["name"]: s["state"] for s in view["servers"]}
        assert states == {"primary": "ACTIVE", "backup": "PASSIVE"}, (name, view)
        assert [s["name"] for s in view["servers"] if s["this"]] == [name]
        assert view["witness"]["reachable"] is True
    backup_row = next(s for s in views["primary"]["servers"] if s["name"] == "backup")
    assert backup_row["lag"] is not None and backup_row["lag"]["records"] >= 0
    # the backup counts its own lag from the active's heartbeats: records and seconds
    client = pair.connect("primary")
    client.send("/queue/seen", b"x", headers={"persistent": "true"})
    own = wait_until(lambda: next(s for s in admin_request(
        pair.admin_address("backup"), "/api/pair")[2]["servers"] if s["this"])["lag"],
        "the backup's own lag", 5)
    assert own["bytes"] is None and own["records"] >= 0 and own["seconds"] >= 0
    wait_until(lambda: next(s for s in admin_request(pair.admin_address("backup"), "/api/pair")
                          [2]["servers"] if s["this"])["lag"]["records"] == 0,
               "the backup caught up", 5)

    code, _, body = admin_request(pair.admin_address("backup"), "/api/purge",
                                  method="POST", data={"destination": "/queue/x"})
    assert code == 409 and pair.stomp_address("primary") in body["error"], body

    pair.kill("primary")
    pair.wait_active(name="backup")
    after = wait_until(lambda: (v := admin_request(pair.admin_address("backup"),
                                                   "/api/pair")[2])["failovers"] == 1 and v,
                       "the failover counted", 10)
    last = after["changes"][-1]
    assert (last["old"], last["new"]) == ("PASSIVE", "STANDALONE") and last["why"], last
