"""What became of an operation: a value of its own, so that the errors (client/errors.py),
which carry one, and the operations (client/results.py), which end with one, both build
on it without importing each other."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    """What became of an operation, as far as the client knows."""

    PENDING = "pending"  # written (or waiting to be), no answer yet
    STORED = "stored"  # in the durable connection's outbox, to be forwarded
    SENT = "sent"  # a non-persistent message, written: nothing confirms it
    CONFIRMED = "confirmed"  # the server confirmed it (on disk, and on the backup in a pair)
    ROLLED_BACK = "rolled-back"  # it did not happen (its transaction was lost or aborted)
    UNKNOWN = "unknown"  # it may have happened or not (a COMMIT the failover cut off)
    FAILED = "failed"  # the server refused it: `error` says why


FINAL = frozenset({Outcome.SENT, Outcome.CONFIRMED, Outcome.ROLLED_BACK, Outcome.UNKNOWN,
                   Outcome.FAILED})
