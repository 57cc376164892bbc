"""A member's scale-down: one transition table, fed views and time, returning what to do
(docs/cluster.md, "Scale-down"). The driver (server/cluster/scale_down.py) looks, acts and
feeds it again; nothing here does I/O.

Why the phases come in this order:

- MOVING: every waiting message moves to the target member's store-and-forward queue
  here, which the target's bridge drains exactly once (core/cluster.py), while clients go
  on being served, until the backlog is small or stops shrinking (producers send as fast
  as it moves): most of a backlog moves while producers still send.
- CLOSING: producers are refused from here on (a SEND, BEGIN or COMMIT ends its
  connection with an ERROR and no receipt: nothing is taken, the client sends it again
  elsewhere); consumers go on. Once no SEND can come, what is left moves, and the producer
  tables stop changing.
- HANDING_OVER: the producer sequences and dup-ids go to the target, behind the messages
  (a store-and-forward queue of their own). Once the target confirmed all of it, a resend
  of anything this member took is recognised there.
- REDIRECTING: only now are clients sent to the target (an ERROR naming it). Had they
  moved earlier, a producer's new message could be consumed there before its older ones
  still moving (order per producer), and a resend before the tables came would be taken
  twice. Nothing new reaches consumers here since CLOSING (every waiting message moved), and
  the redirect waits up to `ack_grace_s` for them to acknowledge what they hold: an
  acknowledgement lost with its connection would have the message delivered again there.
  What they still hold comes back here as they leave, and moves last.
- DONE: nothing is left here: the server stops.

FAILED ends it at any phase with the reason: no member to take the messages within
`choose_s`, or no progress for `stall_s` (the target's disk is full, it went away). What
the target confirmed is its own; the driver takes back what was moved for it and not
taken, and everything else is still here, on this server's disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ScaleDownPhase(StrEnum):
    CHOOSING = "choosing"
    MOVING = "moving"
    CLOSING = "closing"
    HANDING_OVER = "handing_over"
    REDIRECTING = "redirecting"
    DONE = "done"
    FAILED = "failed"


class Tables(StrEnum):
    """The producer sequences and dup-ids, as far as this member knows."""

    NOT_SENT = "not_sent"
    QUEUED = "queued"  # in the target's store-and-forward queue here (or confirmed there)
    REFUSED = "refused"  # could not be queued here (a full journal): they did not go


class Act(StrEnum):
    MOVE = "move"  # move waiting messages to the target, as far as its window has room
    CLOSE_TO_PRODUCERS = "close_to_producers"
    HAND_OVER = "hand_over"  # queue the producer tables and dup-ids for the target
    REDIRECT = "redirect"  # send every client to the target
    FINISH = "finish"
    FAIL = "fail"


@dataclass(frozen=True)
class View:
    """What the driver sees at one moment."""

    now: float  # s, monotonic
    target: str | None  # the member chosen (None: none reachable yet)
    waiting: int  # messages in this member's own queues, not moved yet
    # in store-and-forward queues here (the target's, or another member's from before),
    # not confirmed there yet: held here or in flight
    moving: int
    unacked: int  # delivered to consumers here, not acknowledged yet
    clients: int  # client connections left (the other members' bridges not counted)
    committing: bool  # a COMMIT is being applied: its SENDs are not all taken yet
    tables: Tables = Tables.NOT_SENT


@dataclass(frozen=True)
class Limits:
    choose_s: float = 10.0  # no member to take the messages for this long: FAILED
    stall_s: float = 30.0  # nothing moved or confirmed for this long: FAILED
    close_below: int = 1000  # MOVING ends once the backlog here is this small ...
    moving_s: float = 5.0  # ... or has not shrunk for this long (producers keep up)
    ack_grace_s: float = 2.0  # consumers' deliveries still unacknowledged: how long to wait
    # DONE: new connections are still redirected this long before the server stops. A
    # producer refused a moment before the redirect is between two connections when it
    # goes out; it learns the target when it comes back, not from a closed port.
    redirect_linger_s: float = 2.0


class ScaleDown:
    def __init__(self, now: float, limits: Limits | None = None, serving: bool = True
                 ) -> None:
        """`serving`: clients are served when it starts (a live stopped), else (a backup
        whose live died) producers were never let in: MOVING and CLOSING are one."""
        self.limits = limits or Limits()
        self.phase = ScaleDownPhase.CHOOSING
        self.started = self.since = self.progressed = now
        self.serving = serving
        self.reason = ""
        self.target: str | None = None
        self.total: int | None = None  # messages to move, counted when moving starts
        self._last: tuple[int, int] | None = None
        self._lowest: tuple[int, float] | None = None  # MOVING: smallest backlog, and when

    def step(self, view: View) -> list[Act]:
        """The next actions; the phase changes as they say."""
        p, lim = self.phase, self.limits
        if p in (ScaleDownPhase.DONE, ScaleDownPhase.FAILED):
            return []
        if p is ScaleDownPhase.CHOOSING:
            if view.target is None:
                if view.now - self.started >= lim.choose_s:
                    return self._fail(view, f"no member of the cluster took the messages "
                                            f"within {lim.choose_s:.0f} s")
                return []
            self.target = view.target
            self.total = view.waiting
            self._enter(ScaleDownPhase.MOVING, view)
            p = self.phase
        if view.target != self.target:
            return self._fail(view, f"member {self.target} is no longer reachable")
        progress = (view.waiting, view.moving)
        if progress != self._last:
            self._last, self.progressed = progress, view.now
        elif view.now - self.progressed >= lim.stall_s and (view.waiting or view.moving):
            return self._fail(view, f"nothing moved to member {self.target} for "
                                    f"{lim.stall_s:.0f} s ({view.waiting} messages left here, "
                                    f"{view.moving} not confirmed there)")
        acts = [Act.MOVE]
        if p is ScaleDownPhase.MOVING:
            if self._lowest is None or view.waiting < self._lowest[0]:
                self._lowest = (view.waiting, view.now)
            if not self.serving or view.waiting <= lim.close_below \
                    or view.now - self._lowest[1] >= lim.moving_s:
                self._enter(ScaleDownPhase.CLOSING, view)
                acts.append(Act.CLOSE_TO_PRODUCERS)
        elif p is ScaleDownPhase.CLOSING:
            if not view.committing and not view.waiting:
                self._enter(ScaleDownPhase.HANDING_OVER, view)
                acts.append(Act.HAND_OVER)
        elif p is ScaleDownPhase.HANDING_OVER:
            if view.tables is Tables.REFUSED:  # clients must not go without them
                return self._fail(view, "the producer sequences and dup-ids could not be "
                                        "queued for the target (the log says why)")
            acked = not view.unacked or view.now - self.since >= lim.ack_grace_s
            if view.tables is Tables.QUEUED and not view.waiting and not view.moving \
                    and acked:
                self._enter(ScaleDownPhase.REDIRECTING, view)
                acts.append(Act.REDIRECT)
        elif p is ScaleDownPhase.REDIRECTING and not view.clients and not view.waiting \
                and not view.moving:
            self._enter(ScaleDownPhase.DONE, view)
            return [Act.FINISH]
        return acts

    def _enter(self, phase: ScaleDownPhase, view: View) -> None:
        self.phase, self.since = phase, view.now

    def _fail(self, view: View, reason: str) -> list[Act]:
        self.reason = reason
        self._enter(ScaleDownPhase.FAILED, view)
        return [Act.FAIL]

    def progress(self, view: View) -> float:
        """0..1: the share of the messages counted at the start that left."""
        if self.phase is ScaleDownPhase.DONE:
            return 1.0
        if not self.total:
            return 0.0
        left = view.waiting + view.moving
        return max(0.0, min(1.0, 1 - left / self.total))
