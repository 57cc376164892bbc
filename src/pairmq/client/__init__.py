"""pairmq's Python client: a STOMP connection to a pair that fails over by itself.

    import pairmq.client
    with pairmq.client.connect("failover:(stomp://h1:61613,stomp://h2:61614)",
                               login="app", passcode="secret") as client:
        client.send("/queue/orders", b"...")             # returns once confirmed
        sub = client.subscribe("/queue/orders")          # ack client-individual
        message = sub.receive(timeout=5)
        client.ack(message)

The blocking client is usable from threads; `connect_async` gives the asyncio one. Both
are drivers around one sans-IO engine (client/engine.py). docs/clients.md has the rest.
"""

from pairmq.client.aio import AsyncClient, AsyncSubscription, connect_async
from pairmq.client.blocking import Client, Subscription, connect
from pairmq.client.errors import (
    AckFailed,
    CallTimeout,
    ClientClosed,
    ClientError,
    ConfigurationError,
    ConnectionFailed,
    FailoverError,
    OutboxFull,
    ServerError,
    TransactionOutcomeUnknown,
    TransactionRolledBack,
)
from pairmq.client.options import OPTIONS, ClientOptions, parse_options
from pairmq.client.outcomes import Outcome
from pairmq.client.results import EventKind, FailoverEvent, Message, SendResult

__all__ = [
    "OPTIONS",
    "AckFailed",
    "AsyncClient",
    "AsyncSubscription",
    "CallTimeout",
    "Client",
    "ClientClosed",
    "ClientError",
    "ClientOptions",
    "ConfigurationError",
    "ConnectionFailed",
    "EventKind",
    "FailoverError",
    "FailoverEvent",
    "Message",
    "OutboxFull",
    "Outcome",
    "SendResult",
    "ServerError",
    "Subscription",
    "TransactionOutcomeUnknown",
    "TransactionRolledBack",
    "connect",
    "connect_async",
    "parse_options",
]
