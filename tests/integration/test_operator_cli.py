"""The operator's commands against a real server (docs/operations.md, "The command line"):
`pairmq destinations`, `connections`, `browse`, `purge` and `move`, as tables and with
--json; their effect is checked through a stomp.py consumer."""

from __future__ import annotations

import json

from tests.support.admin import managed_server, pairmq_cli

P = {"persistent": "true"}


def cli(admin: str, *args: str):
    result = pairmq_cli(*args, "--admin", admin)
    assert result.returncode == 0, result.stderr
    return result


def test_destinations_and_connections_as_tables_and_json(server_factory,
                                                         stomp_client) -> None:
    srv, admin = managed_server(server_factory)
    producer = stomp_client(srv)
    for i in range(3):
        producer.send("/queue/orders", f"o{i}", **P)
    consumer = stomp_client(srv)
    consumer.subscribe("/topic/news", id="n")

    table = cli(admin, "destinations").stdout
    row = next(line for line in table.splitlines() if "/queue/orders" in line)
    assert " 3 " in row and "open" in row, table
    assert "in/s" in table and "first msg age" in table
    rows = json.loads(cli(admin, "destinations", "--json").stdout)["destinations"]
    orders = next(r for r in rows if r["name"] == "/queue/orders")
    assert (orders["messages"], orders["consumers"]) == (3, 0)

    listed = json.loads(cli(admin, "connections", "--json").stdout)["connections"]
    assert len(listed) == 2 and {c["protocol"] for c in listed} == {"stomp"}
    assert "stomp" in cli(admin, "connections").stdout


def test_browse_purge_and_move(server_factory, stomp_client) -> None:
    srv, admin = managed_server(server_factory)
    producer = stomp_client(srv)
    for i in range(4):
        producer.send("/queue/src", f"body-{i}", **P)

    shown = cli(admin, "browse", "/queue/src", "-n", "2").stdout
    assert "body-0" in shown and "body-1" in shown and "body-2" not in shown
    moved = cli(admin, "move", "/queue/src", "--to", "/queue/dst", "-n", "3", "--yes")
    assert "3 messages moved to /queue/dst" in moved.stdout
    purged = cli(admin, "purge", "/queue/src", "--yes")
    assert "/queue/src: 1 messages purged" in purged.stdout

    consumer = stomp_client(srv)
    consumer.subscribe("/queue/dst", id="d")
    assert [m.body for m in consumer.wait_messages(3)] == ["body-0", "body-1", "body-2"]
    consumer.subscribe("/queue/src", id="s")
    refused = pairmq_cli("purge", "/queue/unknown", "--yes", "--admin", admin)
    assert refused.returncode == 1 and "no queue /queue/unknown" in refused.stderr
    assert len(consumer.messages) == 3, "the purged message came back"


def test_a_purge_asks_first(server_factory, stomp_client) -> None:
    srv, admin = managed_server(server_factory)
    stomp_client(srv).send("/queue/kept", "k", **P)
    declined = pairmq_cli("purge", "/queue/kept", "--admin", admin)  # no terminal: no
    assert declined.returncode == 1 and "Aborted" in declined.stderr
    rows = json.loads(cli(admin, "destinations", "--json").stdout)["destinations"]
    assert next(r for r in rows if r["name"] == "/queue/kept")["messages"] == 1
