"""What a member of a cluster wants from the others: pure decisions over its broker's state.

A bridge *pulls*. The bridge of member B to member A is a consumer on A: it subscribes to
A's queue Q while B has consumers of Q, receives A's messages, hands each to B's own broker
with a dup-id (A's message-id, which A's journal keeps through A's failovers), and
acknowledges it on A only once B confirmed it. A is therefore never the one that decides
where its messages go: its broker serves the bridge as it serves any consumer (round robin,
prefetch windows), and a message leaves A only towards a member that has a consumer for it
at that moment. Loops are ruled out by two rules, whatever any member believes about the
others' consumers:

- load balancing takes only messages no bridge carried yet (`pairmq_hops` unset: the
  selector `LOAD_BALANCED`);
- a message that was carried once moves again only by *redistribution*: off a queue that
  has had no consumer of its own for `redistribution_delay_ms` (the queue's member says so in
  its status), towards a member that has one.

So a carried message moves again only after every consumer of its queue on its member went
away: each move follows a consumer that really moved, never a count that is wrong.

Everything here reads broker state and returns values; the bridges (server/cluster/) act.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from pairmq.core.broker.state import BrokerState

# A bridge logs in with this client-id prefix and its member's name: its subscriptions are
# not consumers of the member it pulls from (they do not count as interest there).
BRIDGE_CLIENT_ID = "pairmq-bridge."
HOPS = "pairmq_hops"  # bridges a message crossed (a selector reads it: no dash)
ORIGIN = "pairmq_origin"  # the member that first took it
LOAD_BALANCED = f"{HOPS} IS NULL"  # what load balancing takes: messages never carried
STATUS_TOPIC = "/topic/pairmq.cluster"  # where each member says who it is, every tick
CLUSTERED = ("/queue/", "/topic/")  # streams, temporary and reply queues stay local


class LoadBalancing(StrEnum):
    """Artemis' message-load-balancing, read for a pulling bridge (docs/cluster.md)."""

    OFF = "off"  # nothing moves between members
    STRICT = "strict"  # bridges take a queue's messages whether or not their member consumes
    ON_DEMAND = "on_demand"  # bridges take a queue's messages while their member consumes
    OFF_WITH_REDISTRIBUTION = "off_with_redistribution"  # only redistribution moves messages


@dataclass(frozen=True)
class Interest:
    """What one member's own clients consume (bridges' subscriptions left out)."""

    consumers: Mapping[str, int]  # queue -> consumers of its own clients (0 included)
    topics: frozenset[str]  # topics with a subscriber of its own, live or durable
    idle: Mapping[str, int]  # queue with messages and none of its own consumers -> count
    waiting: int  # messages waiting in all its queues


@dataclass(frozen=True)
class Want:
    """One subscription a bridge keeps on the member it pulls from."""

    destination: str
    selector: str | None  # None: every message
    durable: bool  # a topic's: kept by that member while this one is away


def is_bridge(client_id: str | None) -> bool:
    return client_id is not None and client_id.startswith(BRIDGE_CLIENT_ID)


def _own(consumer_client_ids: list[str | None]) -> int:
    return sum(1 for c in consumer_client_ids if not is_bridge(c))


def interest_of(state: BrokerState) -> Interest:
    """The member's interest as its broker holds it now: O(queues + subscriptions)."""
    consumers: dict[str, int] = {}
    idle: dict[str, int] = {}
    waiting = 0
    for name, q in state.queues.items():
        if not name.startswith("/queue/") or q.deleted:
            continue
        own = _own([sub.session.client_id for sub in q.consumers])
        consumers[name] = own
        waiting += q.count
        if q.count and not own:
            idle[name] = q.count
    topics = set()
    for name, address in state.addresses.items():
        if address.kind != "topic" or name == STATUS_TOPIC:
            continue
        for q in address.queues:
            waiting += q.count
            key = q.durable_key
            if (key is not None and not is_bridge(key)) or \
                    _own([sub.session.client_id for sub in q.consumers]):
                topics.add(name)
    return Interest(consumers, frozenset(topics), idle, waiting)


@dataclass
class IdleClock:
    """Since when each queue of this member has been idle (messages, no own consumer), as
    its status reports it: a queue idle long enough may be redistributed."""

    since: dict[str, int] = field(default_factory=dict)

    def update(self, interest: Interest, now: int) -> dict[str, int]:
        """Queue -> ms it has been idle, for the queues idle now."""
        since = {q: self.since.get(q, now) for q in interest.idle}
        self.since = since
        return {q: now - t for q, t in since.items()}


def wanted(mode: LoadBalancing, local: Interest, remote_idle: Mapping[str, int],
           delay_ms: int) -> dict[str, Want]:
    """The subscriptions a bridge should hold on one other member, by destination.

    `remote_idle`: that member's queues idle for how long (ms), from its latest status."""
    if mode is LoadBalancing.OFF:
        return {}
    want: dict[str, Want] = {}
    for queue, own in local.consumers.items():
        redistribute = delay_ms >= 0 and remote_idle.get(queue, -1) >= delay_ms
        if mode is LoadBalancing.OFF_WITH_REDISTRIBUTION:
            take = own > 0 and redistribute
            selector = None
        else:
            take = own > 0 or mode is LoadBalancing.STRICT
            selector = None if redistribute and own > 0 else LOAD_BALANCED
        if take:
            want[queue] = Want(queue, selector, False)
    if mode in (LoadBalancing.ON_DEMAND, LoadBalancing.STRICT):
        for topic in local.topics:
            want[topic] = Want(topic, LOAD_BALANCED, True)
    return want


# Headers of a MESSAGE that belong to its delivery, not to the message: a bridge leaves them
# out when it hands the message on.
DELIVERY_HEADERS = frozenset({"message-id", "subscription", "ack", "destination",
                              "redelivered", "delivery-count", "content-length", "receipt",
                              "transaction", "dup-id"})
PRODUCER_DUP_ID = "pairmq_dup_id"  # a carried message's producer's dup-id, kept for readers


def carried(headers: Mapping[str, str], from_member: str) -> dict[str, str]:
    """The headers a bridge sends a message on with: its own, one hop more, its origin, and
    the dup-id `cluster:MESSAGE-ID` of the member it comes from, which that member's
    journal keeps with the message: the same when it delivers the message again (after a
    failover), another when the message comes back later from elsewhere (redistributed:
    a producer's own dup-id would then make the member it left drop it as a duplicate).
    The producer's dup-id, if it gave one, goes on as `pairmq_dup_id`."""
    out = {k: v for k, v in headers.items() if k not in DELIVERY_HEADERS}
    hops = headers.get(HOPS, "0")
    out[HOPS] = str(int(hops) + 1 if hops.isdigit() else 1)
    out.setdefault(ORIGIN, from_member)
    producer = headers.get("dup-id")
    if producer is not None and HOPS not in headers:
        out[PRODUCER_DUP_ID] = producer
    out["dup-id"] = f"cluster:{headers['message-id']}"
    return out
