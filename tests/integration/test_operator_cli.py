"""The operator's commands against a real server (docs/operations.md, "The command line"):
`pairmq destinations`, `connections`, `browse`, `purge` and `move`, as tables and with
--json; their effect is checked through a stomp.py consumer."""

from __future__ import annotations

import json

from tests.support.admin import managed_server
from tests.support.cli import manage, run_pairmq

P = {"persistent": "true"}


def test_destinations_and_connections_as_tables_and_json(server_factory,
                                                         stomp_client) -> None:
    srv, admin = managed_server(server_factory)
    producer = stomp_client(srv)
    for i in range(3):
        producer.send("/queue/orders", f"o{i}", **P)
    consumer = stomp_client(srv)
    consumer.subscribe("/topic/news", id="n")

    table = manage(admin, "destinations").stdout
    row = next(line for line in table.splitlines() if "/queue/orders" in line)
    assert " 3 " in row and "open" in row, table
    assert "in/s" in table and "first msg age" in table
    rows = json.loads(manage(admin, "destinations", "--json").stdout)["destinations"]
    orders = next(r for r in rows if r["name"] == "/queue/orders")
    assert (orders["messages"], orders["consumers"]) == (3, 0)

    listed = json.loads(manage(admin, "connections", "--json").stdout)["connections"]
    assert len(listed) == 2 and {c["protocol"] for c in listed} == {"stomp"}
    assert "stomp" in manage(admin, "connections").stdout


def test_browse_purge_and_move(server_factory, stomp_client) -> None:
    srv, admin = managed_server(server_factory)
    producer = stomp_client(srv)
    for i in range(4):
        producer.send("/queue/src", f"body-{i}", **P)

    shown = manage(admin, "browse", "/queue/src", "-n", "2").stdout
    assert "body-0" in shown and "body-1" in shown and "body-2" not in shown
    moved = manage(admin, "move", "/queue/src", "--to", "/queue/dst", "-n", "3", "--yes")
    assert "3 messages moved to /queue/dst" in moved.stdout
    purged = manage(admin, "purge", "/queue/src", "--yes")
    assert "/queue/src: 1 messages purged" in purged.stdout

    consumer = stomp_client(srv)
    consumer.subscribe("/queue/dst", id="d")
    assert [m.body for m in consumer.wait_messages(3)] == ["body-0", "body-1", "body-2"]
    consumer.subscribe("/queue/src", id="s")
    refused = run_pairmq("purge", "/queue/unknown", "--yes", "--admin", admin)
    assert refused.returncode == 1 and "no queue /queue/unknown" in refused.stderr
    assert len(consumer.messages) == 3, "the purged message came back"


def test_a_purge_asks_first(server_factory, stomp_client) -> None:
    srv, admin = managed_server(server_factory)
    stomp_client(srv).send("/queue/kept", "k", **P)
    declined = run_pairmq("purge", "/queue/kept", "--admin", admin)  # no terminal: no
    assert declined.returncode == 1 and "Aborted" in declined.stderr
    rows = json.loads(manage(admin, "destinations", "--json").stdout)["destinations"]
    assert next(r for r in rows if r["name"] == "/queue/kept")["messages"] == 1
