"""Management HTTP: /status (JSON), /metrics (Prometheus), POST /activate (operator)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:
    from pairmq.server.app import PairmqServer

log = logging.getLogger("pairmq.admin")


def server_status(server: PairmqServer) -> dict[str, Any]:
    store = server.store
    status: dict[str, Any] = {
        "name": server.config.name,
        "stomp": server.client_address,
        "state": server.ha.state.value if server.ha else "STANDALONE",
        "policy": server.config.policy,
        "connections": len(server.connections),
        "journal": {"appended_seq": store.appended_seq, "synced_seq": store.synced_seq,
                    "confirmed_seq": server.confirmed_seq, "epoch": store.epoch,
                    "full": store.full},
        "destinations": {name: {"messages": sum(q.count for q in a.queues), "bytes": a.size,
                                "consumers": sum(len(q.consumers) for q in a.queues)}
                         for name, a in server.broker.addresses.items()},
    }
    if server.ha is not None:
        status["ha"] = server.ha.status()
    return status


class _Collector:
    def __init__(self, server: PairmqServer) -> None:
        self.server = server

    def collect(self):
        server = self.server
        stats = server.broker.stats
        for name in ("received", "delivered", "acknowledged", "expired", "dead_lettered",
                     "duplicates"):
            counter = CounterMetricFamily(f"pairmq_messages_{name}", f"messages {name}")
            counter.add_metric([], stats.get(name, 0))
            yield counter
        gauge = GaugeMetricFamily("pairmq_connections", "open client connections")
        gauge.add_metric([], len(server.connections))
        yield gauge
        depth = GaugeMetricFamily("pairmq_destination_messages", "messages held",
                                  labels=["destination"])
        for name, address in server.broker.addresses.items():
            depth.add_metric([name], sum(q.count for q in address.queues))
        yield depth
        serving = GaugeMetricFamily("pairmq_serving", "1 when this server serves clients")
        serving.add_metric([], 1 if server.serving else 0)
        yield serving


async def start_admin(server: PairmqServer, address: str) -> web.AppRunner:
    registry = CollectorRegistry()
    registry.register(_Collector(server))

    async def status(_request: web.Request) -> web.Response:
        return web.json_response(server_status(server))

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry),
                            headers={"Content-Type": "text/plain; version=0.0.4"})

    async def activate(_request: web.Request) -> web.Response:
        if server.ha is None:
            return web.json_response({"error": "not part of a pair"}, status=400)
        if server.serving:
            return web.json_response({"state": server.ha.state.value})
        log.warning("An operator forced this server to activate")
        server.ha.force()
        return web.json_response({"state": server.ha.state.value, "forced": True})

    app = web.Application()
    app.add_routes([web.get("/status", status), web.get("/metrics", metrics),
                    web.post("/activate", activate)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, _, port = address.rpartition(":")
    await web.TCPSite(runner, host, int(port)).start()
    log.info("Management HTTP on http://%s/status and /metrics", address)
    return runner
