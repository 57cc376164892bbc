"""GET /status: what a server says of itself, as JSON (the management port, the console's
API and `pairmq status` read it)."""

from __future__ import annotations

from typing import Any

from pairmq.core import Broker
from pairmq.core.queue import Address
from pairmq.server.manage.managed_server import ManagedServer
from pairmq.server.manage.metrics import server_shortages, unacknowledged


def server_status(server: ManagedServer) -> dict[str, Any]:
    """GET /status: the server, its journal and the pair, and every destination."""
    status = server_summary(server)
    store = server.store
    status["destinations"] = {
        name: destination_status(a, store.paged.by_destination.get(name, 0))
        for name, a in server.broker.addresses.items()}
    status["capacity"] = capacity_status(server)
    status["streams"] = server.broker.stream_status()  # name -> first/next offset, ...
    return status


def server_summary(server: ManagedServer) -> dict[str, Any]:
    """The server, its journal and the pair, without a walk over the destinations (what
    the console asks every 2 s: GET /api/pair)."""
    # The pair's view first: it checks the lease at this instant (a lease that ran out
    # ends serving now), and the state below is read after that, never before.
    pair = server.pair.status()
    store = server.store
    status: dict[str, Any] = {
        "name": server.config.name,
        "stomp": server.client_address,
        "state": server.pair.state.value,
        "policy": server.config.policy,
        "role_generation": server.role.generation,
        "connections": len(server.role.connections),
        "commits": server.broker.commit_status(),  # large COMMITs under way, in slices
        "journal": {"appended_seq": store.appended_seq, "synced_seq": store.synced_seq,
                    "confirmed_seq": server.confirmed_seq, "epoch": store.epoch,
                    "full": store.full},
    }
    disk = store.stall_view()
    if disk is not None:  # whether the journal's disk completes writes (issue 35)
        status["journal"]["disk"] = {
            "state": disk.disk.value, "write_in_flight_s": disk.in_flight_s,
            "longest_write_s": disk.longest_s, "stalls": disk.stalls,
            "stall_timeout_ms": server.config.stall_timeout_ms}
    if server.database is not None:  # [store] url: the lease, the copy (docs/database.md)
        status["journal"]["database"] = server.database.status()
    if server.cluster is not None:  # the members and this one's bridges (docs/cluster.md)
        status["cluster"] = server.cluster.status()
    if pair is not None:
        status["ha"] = pair
        status["ha"]["failovers"] = server.failovers
        status["ha"]["changes"] = list(server.changes)  # oldest first
    return status


def destination_status(address: Address, paged: int) -> dict[str, Any]:
    """One destination: what it holds, how much of it is paged out (bodies on disk only,
    and messages kept only in the journal: `paged_messages`), the rule in force."""
    log_bytes = Broker.paged_bytes(address)
    paged += log_bytes
    return {"messages": sum(q.count + Broker.paged_waiting(q) for q in address.queues),
            "paged_messages": sum(Broker.paged_waiting(q) for q in address.queues),
            "bytes": address.size,
            "memory_bytes": address.size - paged, "paged_bytes": paged,
            "consumers": sum(len(q.consumers) for q in address.queues),
            "unacknowledged": unacknowledged(address),
            "enqueued": address.enqueued, "dequeued": address.dequeued,
            "address_full_policy": address.policy.value, "max_size_bytes": address.limit,
            "state": address.state.value, "dropped": address.dropped}


def capacity_status(server: ManagedServer) -> dict[str, Any]:
    capacity = server.broker.capacity
    return {"memory_bytes": capacity.memory,
            "global_max_size_bytes": capacity.memory_limit,
            "disk_usage_percent": capacity.disk_usage, "max_disk_usage": capacity.max_disk_usage,
            "full": server_shortages(server), "full_policy": capacity.full_policy}
