"""The operator's JSON API on the management port: what the console and the `pairmq`
commands (destinations, connections, purge, browse, move) call (docs/operations.md,
"The operator's JSON API").

    GET  /api/pair                       this server and its peer as this server sees them,
                                         the witness, the last HA state changes
    GET  /api/destinations               depth, paged, unacknowledged, consumers, rates in
                                         and out, first message's age; the streams
    GET  /api/messages?destination=D&limit=N&body_bytes=B
                                         browse: the first N messages waiting, left there
    POST /api/purge    {"destination": D}
    POST /api/move     {"source": D, "target": T or null, "limit": N}   (null: retry, each
                                         to its original-destination)
    GET  /api/connections                user, address, protocol, version, subscriptions
    POST /api/connections/ID/close       the client gets an ERROR naming the operator

Reads need the admin or monitor role, changes admin (the management middleware). A change
is answered once its journal records are confirmed, as a client's RECEIPT is; a server
that does not serve refuses it (409) naming the active server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web

from pairmq.core import CoreError
from pairmq.core.broker.operations import Done
from pairmq.core.queue import Address
from pairmq.ha.states import State
from pairmq.server.manage.httpjson import json_object, problem
from pairmq.server.manage.managed_server import ManagedServer
from pairmq.server.manage.status import destination_status, server_summary

log = logging.getLogger("pairmq.admin")

CONFIRM_TIMEOUT_S = 10.0
OPERATION_DEADLINE_S = 30.0  # a purge or move of a paging queue goes on in windows this long
DEFAULT_LIMIT = 1000  # destinations listed per request (sorted by name; ?limit= to change)
MAX_BROWSE = 1000
RATE_MIN_S = 0.5  # rates need two looks at least this far apart
RATE_MAX_S = 120.0  # ... and not so far apart that they say nothing of now
NO_LAG = {"records": 0, "bytes": 0, "seconds": 0.0}


class Rates:
    """Messages in and out per second, from two looks at the destinations' counters: the
    server keeps the last look, so rates cost nothing between requests."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, int]] = {}
        self._at = 0.0

    def update(self, addresses: dict[str, Address], now: float
               ) -> dict[str, tuple[float, float]]:
        """name -> (in/s, out/s) since the previous look (empty when there is none fit to
        compare with); this look is kept for the next."""
        elapsed = now - self._at
        rates: dict[str, tuple[float, float]] = {}
        if RATE_MIN_S <= elapsed <= RATE_MAX_S:
            for name, address in addresses.items():
                before = self._seen.get(name)
                if before is not None:
                    rates[name] = (max(0, address.enqueued - before[0]) / elapsed,
                                   max(0, address.dequeued - before[1]) / elapsed)
        if elapsed >= RATE_MIN_S or not self._seen:
            self._seen = {name: (a.enqueued, a.dequeued) for name, a in addresses.items()}
            self._at = now
        return rates


def first_message_age_s(address: Address, now_ms: int) -> float | None:
    """Age of the message next in line among its queues (Artemis' first message age)."""
    stamps = []
    for q in address.queues:
        for entry in q.entries():
            stamp = entry.message.headers.get("timestamp")
            if stamp is not None and stamp.isdigit():
                stamps.append(int(stamp))
            break
    return max(0.0, (now_ms - min(stamps)) / 1000) if stamps else None


def operator_routes(server: ManagedServer) -> list[web.RouteDef]:
    rates = Rates()

    def not_serving() -> web.Response | None:
        if server.serving:
            return None
        active = server.active_address
        where = f": the active server is at {active}" if active else ""
        return problem(409, f"this server is {server.pair.state.value} and changes "
                            f"nothing{where}", active=active)

    async def pair(_request: web.Request) -> web.Response:
        status = server_summary(server)
        ha = status.get("ha") or {}
        journal = status["journal"]
        own = {"name": status["name"], "state": status["state"], "stomp": status["stomp"],
               "epoch": journal["epoch"], "confirmed_seq": journal["confirmed_seq"],
               "appended_seq": journal["appended_seq"], "this": True,
               "disk": journal.get("disk")}  # does its journal complete writes (issue 35)
        servers = [own]
        peer = ha.get("peer") or {}
        if peer.get("name"):
            servers.append({"name": peer["name"], "state": peer["state"],
                            "stomp": peer["stomp"], "epoch": peer["epoch"],
                            "appended_seq": peer.get("last_seq"), "this": False})
        # each server's lag behind the active: the active counts its backup's; a backup
        # knows only the records it lacks (from the active's heartbeats)
        serving = State(status["state"]).serving
        for server_view in servers:
            server_view["lag"] = None
        if serving:
            own["lag"] = NO_LAG
            if len(servers) > 1:
                servers[1]["lag"] = ha.get("backup_lag")
        elif len(servers) > 1 and State(peer["state"]).serving:
            servers[1]["lag"] = NO_LAG
            own["lag"] = ha.get("lag_behind_active")
        return web.json_response({"policy": status["policy"], "servers": servers,
                                  "witness": ha.get("witness"),
                                  "lease_remaining_ms": ha.get("lease_remaining_ms"),
                                  "failovers": ha.get("failovers", 0),
                                  "changes": ha.get("changes", []),
                                  "cluster": status.get("cluster")})

    async def destinations(request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", DEFAULT_LIMIT))
        except ValueError:
            return problem(400, "limit must be a whole number")
        prefix = request.query.get("prefix", "")
        broker = server.broker
        addresses = broker.addresses
        now = time.time()
        names = sorted(n for n in addresses if n.startswith(prefix))
        shown = {name: addresses[name] for name in names[:max(0, limit)]}
        per_second = rates.update(shown, now)  # only those shown: bounded by limit
        paged_by = server.store.paged.by_destination
        rows = []
        for name, address in shown.items():
            row = {"name": name, "kind": address.kind,
                   **destination_status(address, paged_by.get(name, 0)),
                   "first_message_age_s": first_message_age_s(address, int(now * 1000))}
            got = per_second.get(name)
            row["rate_in"], row["rate_out"] = got if got is not None else (None, None)
            rows.append(row)
        streams = {name: {**info, "groups": broker.stream_groups(name)}
                   for name, info in broker.stream_status().items()}
        return web.json_response({"destinations": rows, "total": len(names),
                                  "shown": len(rows), "streams": streams})

    async def messages(request: web.Request) -> web.Response:
        destination = request.query.get("destination", "")
        try:
            limit = min(MAX_BROWSE, int(request.query.get("limit", 20)))
            body_bytes = int(request.query.get("body_bytes", 1024))
        except ValueError:
            return problem(400, "limit and body_bytes must be whole numbers")
        try:
            seen = server.role.browse(destination, limit)
            bodies = server.role.read_bodies(seen)
        except CoreError as e:
            return problem(400, str(e))
        rows = [{"message_id": m.message_id, "headers": m.headers, "persistent": m.persistent,
                 "priority": m.priority, "body_bytes": len(body),
                 "body": bytes(body[:body_bytes]).decode("utf-8", errors="replace")}
                for m, body in zip(seen, bodies, strict=True)]
        return web.json_response({"destination": destination, "messages": rows})

    async def operate(request: web.Request, what: str, step: Any) -> web.Response:
        """Run `step(broker) -> Done` until nothing is left in the journal only (a paging
        queue's messages come back a window at a time) or the deadline."""
        refused = not_serving()
        if refused is not None:
            return refused
        total, left, stopped = 0, 0, None
        deadline = time.monotonic() + OPERATION_DEADLINE_S
        try:
            while True:
                done: Done = await server.role.operate(step, CONFIRM_TIMEOUT_S)
                total += done.count
                left, stopped = done.paged_left, done.stopped
                if not left or stopped or time.monotonic() > deadline or not server.serving:
                    break
                await asyncio.sleep(0)  # the store reads the next window back meanwhile
                if done.count == 0:
                    await asyncio.sleep(0.01)
        except CoreError as e:
            if not total:
                return problem(400, str(e))
            stopped = str(e)  # what was done before stays done: say so, and why it stopped
        except TimeoutError:
            return problem(503, f"{what}: not confirmed within {CONFIRM_TIMEOUT_S:.0f} s "
                                f"({total} done)")
        log.info("User %r (from %s): %s: %d messages%s%s", request["user"], request.remote,
                 what, total, f", {left} still paged" if left else "",
                 f", stopped: {stopped}" if stopped else "")
        return web.json_response({"done": what, "count": total, "paged_left": left,
                                  "stopped": stopped})

    async def purge(request: web.Request) -> web.Response:
        data = await json_object(request)
        destination = data.get("destination")
        if not isinstance(destination, str):
            return problem(400, "destination must be a string, e.g. /queue/orders")
        return await operate(request, f"purge {destination}",
                             lambda broker: broker.purge(destination))

    async def move(request: web.Request) -> web.Response:
        data = await json_object(request)
        source, target, limit = data.get("source"), data.get("target"), data.get("limit", 0)
        if not isinstance(source, str) or not (target is None or isinstance(target, str)) \
                or not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            return problem(400, "move takes source (a queue), target (a queue, or null to "
                                "retry each message to its original-destination) and limit "
                                "(a whole number; 0 = all)")
        budget = [limit or (1 << 62)]

        def step(broker: Any) -> Done:
            done: Done = broker.move(source, target, budget[0], int(time.time() * 1000))
            budget[0] -= done.count
            return done if budget[0] > 0 else Done(done.count, 0, done.stopped)

        where = target or "their original destinations"
        return await operate(request, f"move {source} to {where}", step)

    async def connections(_request: web.Request) -> web.Response:
        rows = [conn.describe() for conn in server.role.connections.values()]
        return web.json_response({"connections": sorted(rows, key=lambda r: r["id"])})

    async def close_connection(request: web.Request) -> web.Response:
        try:
            conn_id = int(request.match_info["id"])
        except ValueError:
            return problem(400, "a connection id is a whole number")
        conn = server.role.connections.get(conn_id)
        if conn is None or conn.closing:
            return problem(404, f"no connection {conn_id}")
        log.warning("Connection %d closed by an operator (user %r)", conn_id, request["user"])
        conn.fail(f"closed by an operator (user {request['user']})")
        return web.json_response({"closed": conn_id})

    return [web.get("/api/pair", pair), web.get("/api/destinations", destinations),
            web.get("/api/messages", messages), web.post("/api/purge", purge),
            web.post("/api/move", move), web.get("/api/connections", connections),
            web.post("/api/connections/{id}/close", close_connection)]
