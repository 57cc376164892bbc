"""How long a call waits for the server: the rules the blocking and asyncio clients share.

A blocking call waits `call_timeout` for its answer while connected; the clock stops while
a failover is under way and starts again once it is over, but a failover that lasts longer
than `call_failover_timeout` makes the call raise FailoverError instead of hanging (the
client keeps reconnecting, and the operation may still complete). A wait the application
gave its own timeout (`result.wait(5)`) waits that long, failover or not.
"""

from __future__ import annotations

from pairmq.client.engine import Engine
from pairmq.client.errors import CallTimeout, FailoverError
from pairmq.client.link import Link
from pairmq.client.options import ClientOptions
from pairmq.client.outcomes import Outcome
from pairmq.client.results import Op

POLL = 0.25  # longest single wait, so the rules are checked while nothing happens


class Waiting:
    def __init__(self, options: ClientOptions, timeout: float | None, what: str,
                 now: float) -> None:
        self.limit = options.call_timeout / 1000 if timeout is None else timeout
        self.failover_limit = options.call_failover_timeout / 1000
        self.explicit = timeout is not None
        self.deadline = now + self.limit
        self.what = what

    def next_wait(self, engine: Engine, now: float) -> float | None:
        """Seconds to wait for progress; None when an explicit timeout ran out. Raises
        FailoverError, CallTimeout, or why the client is closed."""
        failing = engine.failing_since()
        if failing is not None and not self.explicit:
            if self.failover_limit >= 0 and now - failing > self.failover_limit:
                raise FailoverError(
                    f"{self.what}: a failover has lasted {now - failing:.1f} s "
                    f"(call_failover_timeout {self.failover_limit * 1000:.0f} ms); the client "
                    "keeps trying, and the outcome may still come", Outcome.UNKNOWN)
            self.deadline = max(self.deadline, now + self.limit)
            return POLL
        if engine.link in (Link.CLOSED, Link.FAILED):
            raise engine.closed_error()
        if now >= self.deadline:
            if self.explicit:
                return None
            raise CallTimeout(f"{self.what}: no answer from the server within "
                              f"{self.limit * 1000:.0f} ms")
        return min(self.deadline - now, POLL)


def outcome_of(op: Op, raise_on_failure: bool = True) -> Outcome:
    """An operation's final outcome, raising its error when it failed, was rolled back or
    ended unknown (the error says which)."""
    if raise_on_failure and op.error is not None and op.outcome in (
            Outcome.FAILED, Outcome.UNKNOWN, Outcome.ROLLED_BACK):
        raise op.error
    return op.outcome
