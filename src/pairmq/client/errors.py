"""What the client raises. Every error is a `ClientError`; those a failover causes are a
`FailoverError`, and carry what the application needs to decide what to do next."""

from __future__ import annotations

from pairmq.client.outcomes import Outcome
from pairmq.protocol import Frame


class ClientError(Exception):
    """Anything the pairmq client raises."""


class ConfigurationError(ClientError, ValueError):
    """A bad URL or option; the message names it."""


class ConnectionFailed(ClientError, ConnectionError):
    """No server of the URL accepted a connection (each one's answer is in the message)."""


class ServerError(ClientError):
    """The server answered an operation with ERROR: `frame` holds its headers and body."""

    def __init__(self, frame: Frame, what: str = "") -> None:
        self.frame = frame
        message = frame.headers.get("message", "ERROR")
        detail = frame.body.decode(errors="replace").strip()
        text = f"{what}: {message}" if what else message
        super().__init__(f"{text} ({detail})" if detail and detail != message else text)


class ClientClosed(ClientError):
    """The client was closed, or gave up reconnecting: nothing more can be done with it."""


class CallTimeout(ClientError, TimeoutError):
    """The server did not answer within `call_timeout` while connected."""


class OutboxFull(ClientError):
    """The durable connection's outbox holds its maximum (`outbox_full_policy = "fail"`)."""


class FailoverError(ClientError):
    """A call could not be carried across a failover as if nothing happened.

    `outcome` says what became of the operation: ROLLED_BACK (it did not happen) or
    UNKNOWN (it may or may not have happened; see the subclass for how to settle it)."""

    def __init__(self, message: str, outcome: Outcome) -> None:
        super().__init__(message)
        self.outcome = outcome


class TransactionRolledBack(FailoverError):
    """The transaction was open when the connection failed: the server dropped it, so
    nothing sent or acknowledged in it took effect. Messages received in it come again,
    with `redelivered` set; do the work again in a new transaction."""


class TransactionOutcomeUnknown(FailoverError):
    """The connection failed while COMMIT was on its way: it may have been applied. Every
    persistent message sent in the transaction carries a dup-id, so doing the transaction
    again (same messages, same dup-ids) is harmless: the server keeps one copy of each."""


class AckFailed(FailoverError):
    """The message was received on a connection that has failed since, and the server the
    client is connected to now has put it back in its queue: it will be delivered again
    (`redelivered` set), to this consumer or another. The acknowledgement was not applied."""
