"""What a member of a cluster wants from the others, and what it gives them: pure decisions
over its broker's state (docs/cluster.md).

A bridge *pulls*, through a store-and-forward queue on the member it pulls from. The bridge
of member B to member A subscribes, while B has consumers of queue Q, to A's queue
`pairmq.sf:B:Q`; A's feeder (server/cluster/feeder.py) moves into it, in A's own journal,
the messages of Q that A's own consumers left waiting and that `feedable` accepts. From
then on such a message is B's bridge's alone: whatever dies, A delivers it again only to
B's bridge, which hands it to B's broker with a dup-id made of A's message-id (journaled
with it), so B recognises it. The bridge acknowledges it on A only once B confirmed it.

Loops are ruled out by what a member gives away, whatever any member believes about the
others' consumers:

- load balancing gives only messages no bridge carried yet (`pairmq_hops` unset);
- a message that was carried once moves again only by *redistribution*: off a queue that
  has had no consumer of its own for `redistribution_delay_ms`, towards a member whose
  bridge asks for it, which it does only while that member has consumers.

So a carried message moves again only after every consumer of its queue on its member went
away: each move follows a consumer that really moved, never a count that is wrong.

Everything here reads broker state and returns values; the feeder and the bridges act.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from pairmq.core.broker.state import BrokerState
from pairmq.core.message import Entry
from pairmq.core.subscription import Subscription

# A bridge logs in with this client-id prefix and its member's name: its subscriptions are
# not consumers of the member it pulls from (they do not count as interest there).
BRIDGE_CLIENT_ID: Final = "pairmq-bridge."
HOPS: Final = "pairmq_hops"  # bridges a message crossed (a selector reads it: no dash)
ORIGIN: Final = "pairmq_origin"  # the member that first took it
LOAD_BALANCED: Final = f"{HOPS} IS NULL"  # a topic's bridge subscription: messages never carried
STATUS_TOPIC: Final = "/topic/pairmq.cluster"  # where each member says who it is, every tick
SF_PREFIX: Final = "/queue/pairmq.sf:"  # store-and-forward queues: pairmq.sf:MEMBER:QUEUE
# a scaling-down member's producer sequences and dup-ids (core/broker/handover.py): its
# store-and-forward queue is drained as any other, and the bridge adopts what comes
HANDOVER_QUEUE: Final = "/queue/pairmq.handover"
# ... and its durable subscriptions' messages, each naming its subscription and topic
DURABLES_QUEUE: Final = "/queue/pairmq.durables"
DURABLE_KEY: Final = "pairmq_durable"
DURABLE_TOPIC: Final = "pairmq_durable_topic"
CLUSTERED: Final = ("/queue/", "/topic/")  # streams, temporary and reply queues stay local


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
    waiting: int  # messages waiting in all its queues (store-and-forward ones included)


@dataclass(frozen=True)
class Want:
    """One subscription a bridge keeps on the member it pulls from."""

    destination: str  # there: a store-and-forward queue, or a topic
    selector: str | None  # None: every message
    durable: bool  # a topic's: kept by that member while this one is away
    deliver_to: str  # here: the queue or topic the messages are handed to
    # taken only while the queue here is shallower than the bridge's window; not so for
    # what a member scaling down hands over (it must all come, consumers here or not)
    bounded: bool = True


def sf_queue(member: str, queue: str) -> str:
    """The store-and-forward queue, on another member, of what `member` takes of `queue`."""
    return f"{SF_PREFIX}{member}:{queue[len('/queue/'):]}"


def sf_parts(name: str) -> tuple[str, str] | None:
    """(member, queue) of a store-and-forward queue's name; None for any other queue."""
    if not name.startswith(SF_PREFIX):
        return None
    member, sep, rest = name[len(SF_PREFIX):].partition(":")
    return (member, f"/queue/{rest}") if sep and member and rest else None


def is_bridge(client_id: str | None) -> bool:
    return client_id is not None and client_id.startswith(BRIDGE_CLIENT_ID)


def interest_of(state: BrokerState) -> Interest:
    """The member's interest as its broker holds it now: O(queues + subscriptions)."""
    consumers: dict[str, int] = {}
    waiting = 0
    for name, q in state.queues.items():
        if not name.startswith("/queue/") or q.deleted:
            continue
        waiting += q.count
        if not name.startswith(SF_PREFIX):
            consumers[name] = own_consumers(q.consumers)
    topics = set()
    for name, address in state.addresses.items():
        if address.kind != "topic" or name == STATUS_TOPIC:
            continue
        for q in address.queues:
            waiting += q.count
            key = q.durable_key
            if (key is not None and not is_bridge(key)) or own_consumers(q.consumers):
                topics.add(name)
    return Interest(consumers, frozenset(topics), waiting)


def own_consumers(subscriptions: list[Subscription]) -> int:
    """The consumers of a queue that are not other members' bridges."""
    return sum(1 for sub in subscriptions if not is_bridge(sub.session.client_id))


def wanted(mode: LoadBalancing, member: str, local: Interest) -> dict[str, Want]:
    """The subscriptions `member`'s bridge should hold on any other member, by the
    destination there: the store-and-forward queue of each queue it consumes (every queue
    with `strict`), and each topic it subscribes to. The other member decides what goes
    into a store-and-forward queue (`feedable`)."""
    if mode is LoadBalancing.OFF:
        return {}
    want: dict[str, Want] = {}
    for queue, own in local.consumers.items():
        if own > 0 or mode is LoadBalancing.STRICT:
            sf = sf_queue(member, queue)
            want[sf] = Want(sf, None, False, queue)
    if mode in (LoadBalancing.ON_DEMAND, LoadBalancing.STRICT):
        for topic in local.topics:
            want[topic] = Want(topic, LOAD_BALANCED, True, topic)
    return want


def fed_queues(wants: Mapping[str, Want]) -> list[str]:
    """The queues a member asks the others to feed (its status says so): those of its
    store-and-forward subscriptions."""
    return sorted(w.deliver_to for w in wants.values() if not w.durable)


def store_and_forward(state: BrokerState) -> dict[str, dict[str, int]]:
    """This member's store-and-forward queues that hold messages: member -> queue -> count
    (its status says so, and each of those members' bridges drains its own)."""
    found: dict[str, dict[str, int]] = {}
    for name, q in state.queues.items():
        parts = sf_parts(name)
        if parts is not None and q.count + sum(len(s.unacked) for s in q.consumers):
            found.setdefault(parts[0], {})[parts[1]] = q.count
    return found


def drains(member: str, held_there: Mapping[str, int], bounded: bool = True
           ) -> dict[str, Want]:
    """The store-and-forward queues another member holds for `member` (its status): each is
    emptied by `member`'s bridge whatever `member` consumes now, so that nothing the other
    member gave it waits there; what comes goes to `member`'s queue (and from there to where
    consumers are, by redistribution)."""
    return {sf_queue(member, q): Want(sf_queue(member, q), None, False, q, bounded)
            for q in held_there}


def feedable(mode: LoadBalancing, delay_ms: int, idle_ms: int | None
             ) -> Callable[[Entry], bool] | None:
    """Which waiting messages of a queue may go to another member's store-and-forward
    queue; None: none. `idle_ms`: how long the queue has had no consumer of its own
    (None: it has one now)."""
    redistribute = idle_ms is not None and delay_ms >= 0 and idle_ms >= delay_ms
    if mode is LoadBalancing.OFF:
        return None
    if redistribute:
        return _every
    if mode is LoadBalancing.OFF_WITH_REDISTRIBUTION:
        return None
    return _never_carried


def _every(entry: Entry) -> bool:
    return True


def _never_carried(entry: Entry) -> bool:
    return HOPS not in entry.message.headers


# Headers of a MESSAGE that belong to its delivery, not to the message: a bridge leaves them
# out when it hands the message on.
DELIVERY_HEADERS: Final = frozenset({"message-id", "subscription", "ack", "destination",
                                     "redelivered", "delivery-count", "content-length",
                                     "receipt", "transaction", "dup-id"})
PRODUCER_DUP_ID: Final = "pairmq_dup_id"  # a carried message's producer's dup-id, kept for readers


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
