"""The operator's daily commands: `pairmq destinations`, `connections`, `browse`, `purge`,
`move` and `status` (a table of both servers; `--watch` follows a backup's sync with a
progress bar), through the management port's JSON API (server/manage/operator_api.py), as the
console does. Rich tables on a terminal; `--json` prints the API's answer for scripts.

Reads go to the pair's serving server (the first address whose server says it serves;
else the first that answers); changes go to the first server that takes them (a passive
one answers 409, and the next is tried).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any
from urllib.parse import urlencode

import click
from rich.console import Console, Group
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from pairmq.cli.admin import (
    AdminRefused,
    admin_call,
    admin_credentials,
    echo_json,
    json_option,
    pair_addresses,
    pair_call,
    pair_targets,
)

SERVING = ("ACTIVE", "STANDALONE")


def _read(admins: tuple[str, ...], user: str | None, password: str | None,
          path: str) -> dict[str, Any]:
    """GET `path` from the serving server of the pair."""
    addresses = pair_addresses(admins)
    credentials = admin_credentials(user, password, addresses)
    first: dict[str, Any] | None = None
    problems = []
    for address in addresses:
        try:
            state = admin_call(address, "/status", credentials).get("state")
            answer = admin_call(address, path, credentials)
        except AdminRefused as e:
            problems.append(str(e))
            continue
        except OSError as e:
            problems.append(f"{address}: unreachable ({e})")
            continue
        if state in SERVING:
            return answer
        first = first if first is not None else answer
    if first is not None:
        click.echo("no server of the pair serves now: this is what a server that does not "
                   "serve holds", err=True)
        return first
    for problem in problems:
        click.echo(problem, err=True)
    sys.exit(1)


def _console() -> Console:
    """Rich on a terminal; a wide one through a pipe, where Rich would assume 80 columns."""
    return Console() if sys.stdout.isatty() else Console(width=200)


def _print(data: Any, as_json: bool, table: Table | None) -> None:
    if as_json or table is None:
        echo_json(data)
    else:
        _console().print(table)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@click.command()
@pair_targets
@json_option
@click.option("--prefix", default="", help="only destinations whose name starts so")
@click.option("--limit", default=1000, show_default=True, help="destinations shown, by name")
def destinations(admins: tuple[str, ...], user: str | None, password: str | None,
                 as_json: bool, prefix: str, limit: int) -> None:
    """Destinations of the serving server: depth, paged, unacknowledged, consumers, rates."""
    query = urlencode({"prefix": prefix, "limit": limit})
    data = _read(admins, user, password, f"/api/destinations?{query}")
    if not as_json and any(r["rate_in"] is None for r in data["destinations"]):
        time.sleep(1.0)  # rates need a second look at the counters
        data = _read(admins, user, password, f"/api/destinations?{query}")
    table = Table(title=f"Destinations ({data['shown']} of {data['total']})")
    for column in ("destination", "messages", "paged", "unacked", "consumers", "in/s",
                   "out/s", "first msg age", "state"):
        table.add_column(column, justify="left" if column == "destination" else "right")
    for row in data["destinations"]:
        table.add_row(row["name"], f"{row['messages']:,}", f"{row['paged_messages']:,}",
                      f"{row['unacknowledged']:,}", str(row["consumers"]),
                      _rate(row["rate_in"]), _rate(row["rate_out"]),
                      _age(row["first_message_age_s"]), row["state"])
    for name, stream in data["streams"].items():
        groups = ", ".join(f"{g}@{o}" for g, o in stream["groups"].items()) or "-"
        table.add_row(name, f"{stream['messages']:,}", "-", "-", str(stream["readers"]),
                      "-", "-", f"offsets {stream['first_offset']}-{stream['next_offset']}",
                      f"groups {groups}")
    _print(data, as_json, table)


@click.command()
@pair_targets
@json_option
def connections(admins: tuple[str, ...], user: str | None, password: str | None,
                as_json: bool) -> None:
    """Client connections of the serving server."""
    data = _read(admins, user, password, "/api/connections")
    table = Table(title=f"Connections ({len(data['connections'])})")
    for column in ("id", "user", "address", "protocol", "STOMP", "state", "subscriptions",
                   "open for"):
        table.add_column(column)
    now = time.time()
    for row in data["connections"]:
        table.add_row(str(row["id"]), row["user"] or "(anonymous)", row["address"],
                      row["protocol"], row["version"] or "-", row["state"],
                      str(row["subscriptions"]), _age(now - row["opened"]))
    _print(data, as_json, table)


@click.command()
@pair_targets
@json_option
@click.option("-n", "--count", default=20, show_default=True, help="messages shown")
@click.option("--body-bytes", default=200, show_default=True, help="bytes of each body shown")
@click.argument("destination")
def browse(admins: tuple[str, ...], user: str | None, password: str | None, as_json: bool,
           count: int, body_bytes: int, destination: str) -> None:
    """The first messages waiting in a queue, left there."""
    query = urlencode({"destination": destination, "limit": count, "body_bytes": body_bytes})
    data = _read(admins, user, password, f"/api/messages?{query}")
    table = Table(title=f"{destination}: first {len(data['messages'])} waiting")
    for column in ("message-id", "priority", "bytes", "headers", "body"):
        table.add_column(column, overflow="fold")
    for m in data["messages"]:
        headers = ", ".join(f"{k}={v}" for k, v in m["headers"].items())
        table.add_row(m["message_id"], str(m["priority"]), f"{m['body_bytes']:,}", headers,
                      m["body"])
    _print(data, as_json, table)


@click.command()
@pair_targets
@json_option
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@click.argument("destination")
def purge(admins: tuple[str, ...], user: str | None, password: str | None, as_json: bool,
          yes: bool, destination: str) -> None:
    """Remove every message waiting in a queue (those a consumer holds stay)."""
    if not yes:
        click.confirm(f"Remove every message waiting in {destination}?", abort=True)
    data = pair_call(admins, user, password, "/api/purge", "POST",
                     {"destination": destination})
    if as_json:
        _print(data, True, None)
    else:
        click.echo(f"{destination}: {data['count']:,} messages purged"
                   + (f", {data['paged_left']:,} still paged" if data["paged_left"] else ""))


@click.command()
@pair_targets
@json_option
@click.option("--to", "target", default=None, metavar="QUEUE",
              help="the queue to move them to (default: each to its original-destination, "
                   "as a dead-letter queue's messages are retried)")
@click.option("-n", "--count", "limit", default=0, show_default=True,
              help="messages moved from the head (0: all)")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@click.argument("source")
def move(admins: tuple[str, ...], user: str | None, password: str | None, as_json: bool,
         target: str | None, limit: int, yes: bool, source: str) -> None:
    """Move a queue's waiting messages to another queue, or retry a dead-letter queue."""
    where = target or "their original destinations"
    if not yes:
        click.confirm(f"Move {limit or 'all'} messages of {source} to "
                      f"{where}?", abort=True)
    data = pair_call(admins, user, password, "/api/move", "POST",
                     {"source": source, "target": target, "limit": limit})
    if as_json:
        _print(data, True, None)
    else:
        click.echo(f"{source}: {data['count']:,} messages moved to {where}"
                   + (f"; stopped: {data['stopped']}" if data.get("stopped") else ""))


def _status_rows(admins: tuple[str, ...], credentials: tuple[str, str] | None
                 ) -> tuple[list[dict[str, Any]], list[str]]:
    """GET /status of each server (an unreachable one is a row saying so), and the
    refusals (a wrong login, a missing role)."""
    rows, problems = [], []
    for address in pair_addresses(admins):
        try:
            info = admin_call(address, "/status", credentials)
        except AdminRefused as e:
            problems.append(str(e))
            continue
        except OSError as e:
            rows.append({"address": address, "unreachable": str(e)})
            continue
        info["address"] = address
        rows.append(info)
    return rows, problems


def _status_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="The pair")
    for column in ("server", "management", "state", "epoch", "appended", "confirmed",
                   "peer", "backup lag", "lease", "arbiter"):
        table.add_column(column)
    for info in rows:
        if info.get("unreachable"):
            table.add_row("?", info["address"], "[red]unreachable[/red]", *["-"] * 7)
            table.add_row("", "", f"({info['unreachable']})", *[""] * 7)
            continue
        ha = info.get("ha") or {}
        journal = info["journal"]
        lag = ha.get("backup_lag")
        lag_text = "-" if lag is None else \
            f"{lag['records']:,} records, {lag['bytes']:,} B, {lag['seconds']:.1f} s"
        peer = ha.get("peer") or {}
        state = info["state"]
        colour = "green" if state in SERVING else "cyan" if state == "PASSIVE" else "yellow"
        table.add_row(info["name"], info["address"], f"[{colour}]{state}[/{colour}]",
                      str(journal["epoch"]), f"{journal['appended_seq']:,}",
                      f"{journal['confirmed_seq']:,}",
                      f"{peer.get('name') or '-'} {peer.get('state') or ''}".strip(),
                      lag_text, f"{ha.get('lease_remaining_ms', 0) / 1000:.1f} s"
                      if ha else "-", _arbiter_text(ha.get("witness")))
    return table


def _database_view(rows: list[dict[str, Any]]) -> Group | None:
    """[store] url: each server's lease and copy of the journal in the database (the
    servers' words escaped: never read as Rich markup). None when no server has one."""
    servers = [(info, info["journal"]["database"]) for info in rows
               if not info.get("unreachable") and info["journal"].get("database")]
    if not servers:
        return None
    table = Table(title="The journal in the database")
    for column in ("server", "lease", "copy", "committed", "waiting"):
        table.add_column(column, justify="right" if column in ("committed", "waiting")
                         else "left")
    for info, db in servers:
        lease = f"held (epoch {db['epoch']})" if db["lease"] == "held" else \
            f"waiting: held by {escape(db['held_by'] or '?')}" if db["lease"] == "waiting" \
            else escape(db["lease"])
        copy = db["copy"] if not db["problem"] else f"{db['copy']}: {db['problem']}"
        colour = "green" if db["copy"] == "copying" else "dim" if db["copy"] == "idle" \
            else "red"
        table.add_row(escape(info["name"]), lease, f"[{colour}]{escape(copy)}[/{colour}]",
                      f"{db['committed_seq']:,}", f"{db['waiting_records']:,} records")
    where = {db["url"] for _, db in servers}
    return Group(table, Text(f"Database: {', '.join(sorted(where))} "
                             f"(schema {servers[0][1]['schema']})"))


def _arbiter_text(arbiter: dict[str, Any] | None) -> str:
    """The arbiter's kind and health: `pairmq witness`, or etcd's members reachable."""
    if not arbiter or not arbiter.get("address"):
        return "-"
    reachable = "[green]reachable[/green]" if arbiter.get("reachable") \
        else "[red]unreachable[/red]"
    if arbiter.get("kind") != "etcd":
        return f"witness {reachable}"
    members = arbiter.get("members") or []
    up = sum(1 for m in members if m.get("reachable"))
    leader = arbiter.get("leader")
    text = f"etcd {reachable}, {up}/{len(members)} members" + (
        f", leader {leader.rpartition('/')[2]}" if leader else ", no leader seen")
    problem = arbiter.get("problem")
    return text + (f"\n[yellow]{problem}[/yellow]" if problem else "")


def _cluster_view(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The /status of the server whose cluster view is worth showing: the one serving its
    member (the bridges run there), else the first server that has a cluster at all."""
    views = [info for info in rows if info.get("cluster")]
    return next((i for i in views if i["cluster"].get("serving")), views[0] if views else None)


BRIDGE_COLOURS = {"forwarding": "green", "connecting": "yellow", "identifying": "yellow",
                  "reconnecting": "yellow",
                  "refused": "red"}


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _cluster_table(info: dict[str, Any]) -> Table:
    """`info`'s cluster (its GET /status), one row per member: this one first (its server,
    what its bridges brought here in all), then the member at the far end of each bridge.
    The servers' words are escaped: never read as Rich markup."""
    cluster = info["cluster"]
    discovery = cluster.get("discovery") or {}
    table = Table(title=f"The cluster {escape(cluster['name'])}",
                  caption=f"load balancing {cluster.get('load_balancing') or '-'}, "
                          f"forwarded here {_rate(cluster.get('forwarded_per_second'))}/s, "
                          f"discovery {discovery.get('kind') or '-'}")
    for column in ("member", "url", "state", "server", "in flight", "forwarded", "waiting",
                   "problem"):
        table.add_column(column, justify="right" if column in (
            "in flight", "forwarded", "waiting") else "left",
            overflow="fold" if column in ("url", "problem") else "ellipsis")
    table.add_row(f"{escape(cluster['member'])} (this)", escape(cluster.get("url") or "-"),
                  "[green]serving[/green]" if cluster.get("serving") else "not serving",
                  escape(info.get("stomp") or "-"), "-",
                  _count(cluster.get("forwarded")), _count(cluster.get("waiting")),
                  f"[yellow]{escape(discovery['problem'])}[/yellow]" if discovery.get("problem")
                  else "-")
    for bridge in cluster.get("bridges") or []:
        state = bridge.get("state") or "-"
        colour = BRIDGE_COLOURS.get(state)
        problems = [bridge["problem"]] if bridge.get("problem") else []
        if bridge.get("settings_differ"):
            problems.append("settings differ: " + ", ".join(bridge["settings_differ"]))
        table.add_row(escape(bridge.get("member") or "?"), escape(bridge.get("url") or "-"),
                      f"[{colour}]{state}[/{colour}]" if colour else escape(state),
                      escape(bridge.get("server") or "-"), _count(bridge.get("in_flight")),
                      _count(bridge.get("forwarded")), _count(bridge.get("waiting")),
                      escape("\n".join(problems)) or "-")
    return table


def _scale_down_view(cluster: dict[str, Any]) -> Table | None:
    """A member scaling down (docs/cluster.md): its phase, target and a bar of what left."""
    sd = cluster.get("scale_down")
    if not sd:
        return None
    grid = Table.grid(padding=(0, 1))
    phase = sd.get("phase") or "-"
    colour = {"failed": "red", "done": "green"}.get(phase, "yellow")
    where = f" to member {escape(sd['target'])}" if sd.get("target") else ""
    left = f"{_count(sd.get('waiting'))} here, {_count(sd.get('moving'))} moving"
    grid.add_row(f"Scale-down{where}: [{colour}]{escape(phase)}[/{colour}]",
                 ProgressBar(total=1.0, completed=float(sd.get("progress") or 0.0), width=30),
                 f"{100 * float(sd.get('progress') or 0.0):.0f}% ({left})")
    if sd.get("reason"):
        grid.add_row(f"[red]{escape(sd['reason'])}[/red]")
    return grid


BACKUP_PHASE_COLOURS = {"backed_up": "green", "asking": "yellow", "starting": "yellow",
                        "given_up": "red", "not_wanted": "dim"}
HOSTED_COLOURS = {"running": "green", "starting": "yellow", "restarting": "yellow",
                  "stopped": "red"}


def _colocated_view(cluster: dict[str, Any]) -> Table | None:
    """A colocated member: where this live's own backup runs (or why it runs nowhere), then
    the backups it hosts for other lives, one child process each. None when the server is
    no colocated member. The servers' words are escaped: never read as Rich markup."""
    co = cluster.get("colocated")
    if not co:
        return None
    grid = Table.grid(padding=(0, 1))
    backup = co.get("backup") or {}
    phase = backup.get("phase") or "-"
    colour = BACKUP_PHASE_COLOURS.get(phase, "yellow")
    where = f" on member {escape(backup['member'])}" if backup.get("member") else ""
    tries = backup.get("tries") or 0
    asked = f" ({tries} tr{'y' if tries == 1 else 'ies'})" \
        if tries and phase in ("asking", "starting") else ""
    grid.add_row(f"Backup of this live: [{colour}]{escape(phase)}[/{colour}]{where}{asked}")
    if backup.get("problem"):
        tint = "red" if phase == "given_up" else "yellow"
        grid.add_row(f"[{tint}]{escape(backup['problem'])}[/{tint}]")
    hosted = co.get("hosted") or []
    room = co.get("max_backups")
    if not hosted:
        grid.add_row("No backup hosted here" + (f" (room for {room})" if room else
                                                 " (max_backups 0)" if room == 0 else ""))
        return grid
    table = Table(title="Backups hosted here",
                  caption=f"{len(hosted)} of at most {_count(room)}" if room is not None
                  else None)
    for column in ("live", "stomp", "ha", "pid", "state", "restarts"):
        table.add_column(column, justify="right" if column in ("pid", "restarts") else "left")
    for h in hosted:
        state = h.get("state") or "-"
        shade = HOSTED_COLOURS.get(state)
        table.add_row(escape(h.get("live") or "?"), escape(h.get("stomp") or "-"),
                      escape(h.get("ha") or "-"),
                      "-" if h.get("pid") is None else str(h["pid"]),
                      f"[{shade}]{state}[/{shade}]" if shade else escape(state),
                      _count(h.get("restarts")))
    grid.add_row(table)
    return grid


def _watch_sync(admins: tuple[str, ...], credentials: tuple[str, str] | None,
                interval: float) -> None:
    """A progress bar per server: its journal against the serving server's, until Ctrl-C."""
    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed:,.0f} / {task.total:,.0f} records"),
                  TimeRemainingColumn(), transient=False) as progress:
        tasks: dict[str, Any] = {}
        while True:
            rows, _problems = _status_rows(admins, credentials)
            live = [r for r in rows if r.get("state") in SERVING]
            target = live[0]["journal"]["appended_seq"] if live else None
            for info in rows:
                if info.get("unreachable"):
                    continue
                name = info["name"]
                have = info["journal"]["appended_seq"]
                total = max(target or have, have, 1)
                label = f"{name} {info['state']}"
                if name not in tasks:
                    tasks[name] = progress.add_task(label, total=total)
                progress.update(tasks[name], description=label, total=total, completed=have)
            time.sleep(interval)


@click.command()
@click.argument("admin", nargs=-1)
@json_option
@click.option("--watch", is_flag=True,
              help="follow each server's journal against the serving server's (a backup's "
                   "sync) with progress bars, until Ctrl-C")
@click.option("--interval", default=1.0, show_default=True, help="seconds between looks")
@pair_targets
def status(admin: tuple[str, ...], as_json: bool, watch: bool, interval: float,
           admins: tuple[str, ...], user: str | None, password: str | None) -> None:
    """Both servers of the pair as a table (by management address: arguments or --admin;
    default `pairmq up`'s)."""
    addresses = tuple(admin) + tuple(admins)
    credentials = admin_credentials(user, password, pair_addresses(addresses))
    if watch:
        try:
            _watch_sync(addresses, credentials, interval)
        except KeyboardInterrupt:
            return
    rows, problems = _status_rows(addresses, credentials)
    for problem in problems:
        click.echo(problem, err=True)
    if as_json:
        for info in rows:
            click.echo(json.dumps(info, indent=2))
    elif rows:
        console = _console()
        console.print(_status_table(rows))
        database = _database_view(rows)
        if database is not None:
            console.print(database)
        cluster = _cluster_view(rows)
        if cluster is not None:
            console.print(_cluster_table(cluster))
            shrinking = _scale_down_view(cluster["cluster"])
            if shrinking is not None:
                console.print(shrinking)
            colocated = _colocated_view(cluster["cluster"])
            if colocated is not None:
                console.print(colocated)
    if problems:
        sys.exit(1)


