"""The driver of a scale-down (core/scale_down.py decides): looks at the broker and the
bridges, acts as the machine says, and reports progress.

Messages move the way load balancing moves them (core/cluster.py): into the target's
store-and-forward queue here, drained exactly once by the target's bridge. The producer
tables follow in a store-and-forward queue of their own (`HANDOVER_QUEUE`), adopted by the
target's bridge (server/cluster/intake.py). Clients are refused and redirected through the
role (server/role/leaving.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from pairmq.core.cluster import (
    DURABLE_KEY,
    DURABLE_TOPIC,
    DURABLES_QUEUE,
    HANDOVER_QUEUE,
    is_bridge,
    sf_parts,
    sf_queue,
)
from pairmq.core.message import Entry
from pairmq.core.queue import Queue
from pairmq.core.scale_down import Act, Limits, ScaleDown, ScaleDownPhase, Tables, View
from pairmq.server.clock import now_ms
from pairmq.server.cluster.intake import Taken
from pairmq.server.role.leaving import Gate, Leaving
from pairmq.server.role.role import Role

log = logging.getLogger("pairmq.cluster")
STEP_S = 0.02  # how often the driver looks
REPORT_S = 1.0  # how often it logs its progress
SCAN_FACTOR = 4  # messages looked at per message that may move (as the feeder's)


@dataclass(frozen=True)
class Target:
    member: str
    url: str  # the URL clients are sent to (the one its bridge uses)
    # its bridge forwards now (a member is chosen only so); else it is reconnecting (a
    # failover of its pair, say): a target chosen before is waited for, up to the stall
    forwarding: bool = True


def _every(entry: Entry) -> bool:
    return True


class ScaleDownDriver:
    def __init__(self, role: Callable[[], Role], targets: Callable[[], list[Target]],
                 hand: Callable[[str, bytes, Taken], None], publish: Callable[[], None],
                 window: int, serving: bool, limits: Limits | None = None) -> None:
        """`targets()`: the members that may take the messages now, best first; `hand`:
        a message into a queue here (the bridges' intake); `publish`: tell the members how
        this one stands now (they drain what it holds for them)."""
        self._role = role
        self._targets = targets
        self._hand = hand
        self._publish = publish
        self._window = window
        self.machine = ScaleDown(time.monotonic(), limits, serving)
        self.target: Target | None = None
        self.view: View | None = None
        self.tables = Tables.NOT_SENT

    async def run(self) -> ScaleDown:
        m = self.machine
        reported = published = 0.0
        log.info("Scaling down: looking for a member to take this one's messages")
        while m.phase not in (ScaleDownPhase.DONE, ScaleDownPhase.FAILED):
            view = self.view = self._look()
            phase = m.phase
            for act in m.step(view):
                self._act(act)
            if m.phase is not phase:
                log.info("Scaling down to member %s: %s (%d messages here, %d moving)",
                         m.target, m.phase.value, view.waiting, view.moving)
            now = time.monotonic()
            if now - published >= 0.1:
                published = now
                self._publish()
            if now - reported >= REPORT_S and m.phase is not ScaleDownPhase.CHOOSING:
                reported = now
                log.info("Scaling down to member %s: %.0f%% (%d messages here, %d moving)",
                         m.target, 100 * m.progress(view), view.waiting, view.moving)
            await asyncio.sleep(STEP_S)
        if m.phase is ScaleDownPhase.DONE:  # the redirect stays for those reconnecting
            await asyncio.sleep(m.limits.redirect_linger_s)
        return m

    @property
    def active(self) -> bool:
        """Under way: the member takes nothing from the others, and feeds none but these."""
        return self.machine.phase not in (ScaleDownPhase.DONE, ScaleDownPhase.FAILED)

    def status(self) -> dict[str, object]:
        m, view = self.machine, self.view
        return {"phase": m.phase.value, "target": m.target, "reason": m.reason or None,
                "progress": round(m.progress(view), 3) if view is not None else 0.0,
                "waiting": view.waiting if view is not None else None,
                "moving": view.moving if view is not None else None}

    # ------------------------------------------------------------ looking

    def _look(self) -> View:
        role = self._role()
        broker = role.broker
        targets = self._targets()
        if self.target is None:
            self.target = next((t for t in targets if t.forwarding), None)
        target = self.target
        reachable = target is not None and any(t.member == target.member for t in targets)
        waiting = moving = unacked = 0
        for key, q in broker.durables.items():
            if is_bridge(key):  # a topic's messages another member's bridge takes from here
                moving += q.count + sum(len(s.unacked) for s in q.consumers)
            else:  # paged out (in the journal only) counts: it must move too
                waiting += q.count + broker.paged_waiting(q)
                unacked += sum(len(s.unacked) for s in q.consumers)
        for name, q in broker.queues.items():
            if not name.startswith("/queue/") or q.deleted:
                continue
            parts = sf_parts(name)
            if parts is None:
                waiting += q.count + broker.paged_waiting(q)
                unacked += sum(len(s.unacked) for s in q.consumers)
            else:  # the target's, and any other member's bridge's: none may stay here
                moving += q.count + sum(len(s.unacked) for s in q.consumers)
        return View(time.monotonic(), target.member if reachable and target else None,
                    waiting, moving, unacked, role.clients(), role.committing(),
                    self.tables)

    # ------------------------------------------------------------ acting

    def _act(self, act: Act) -> None:
        role = self._role()
        target = self.target
        m = self.machine
        if act is Act.MOVE and target is not None:
            self._move(role, target)
        elif act is Act.CLOSE_TO_PRODUCERS:
            role.leave(Leaving(Gate.PRODUCERS_REFUSED,
                               f"this server is scaling down to member {m.target}: nothing "
                               "more is taken here; reconnect in a moment"))
        elif act is Act.HAND_OVER and target is not None:
            state = role.broker.handover_state()
            body = json.dumps(state, separators=(",", ":")).encode()
            self.tables = Tables.QUEUED
            self._hand(sf_queue(target.member, HANDOVER_QUEUE), body, self._handed)
        elif act is Act.REDIRECT and target is not None:
            log.info("Scaling down: every message and producer sequence is on member %s: "
                     "sending clients there (%s)", target.member, target.url)
            role.leave(Leaving(Gate.REDIRECTING,
                               f"this server scaled down: its messages are on member "
                               f"{target.member}; connect to {target.url}", target.url))
        elif act is Act.FINISH:
            log.info("Scaled down to member %s: nothing is left here", m.target)
        elif act is Act.FAIL:
            back = self._take_back(role, target) if target is not None else 0
            log.error("Scale-down stopped: %s. What was not moved stays on this server's "
                      "disk (%d messages taken back from member %s's store-and-forward "
                      "queues)", m.reason, back, m.target)
            role.leave(None)

    def _move(self, role: Role, target: Target) -> None:
        broker = role.broker
        now = now_ms()
        moved = 0
        held = sum(q.count + sum(len(s.unacked) for s in q.consumers)
                   for name, q in broker.queues.items()
                   if (parts := sf_parts(name)) is not None and parts[0] == target.member)
        room = self._window - held
        for name in list(broker.queues):
            if room - moved <= 0:
                break
            q = broker.queues.get(name)
            if q is None or q.deleted or not name.startswith("/queue/") \
                    or sf_parts(name) is not None \
                    or not (q.count or broker.paged_waiting(q)):
                continue
            # only what no consumer here holds: what one holds comes back when it leaves
            left = room - moved
            moved += broker.feed(name, sf_queue(target.member, name), left, now, _every,
                                 SCAN_FACTOR * left)
        durables = sf_queue(target.member, DURABLES_QUEUE)
        for q in self._durables(role):
            if room - moved <= 0:
                break
            if (q.count or broker.paged_waiting(q)) and q.durable_key is not None:
                left = room - moved
                moved += broker.feed(f"durable:{q.durable_key}", durables, left, now, _every,
                                     SCAN_FACTOR * left,
                                     {DURABLE_KEY: q.durable_key, DURABLE_TOPIC: q.address.name})
        if moved:
            role.flush()

    @staticmethod
    def _take_back(role: Role, target: Target) -> int:
        """What was moved for `target` and not taken by it goes back to its queues (and
        durable subscriptions), served here again."""
        broker = role.broker
        back = 0
        for name in list(broker.queues):
            parts = sf_parts(name)
            if parts is None or parts[0] != target.member:
                continue
            if parts[1] == HANDOVER_QUEUE:  # the tables, not taken: this member keeps its own
                broker.purge(name)
            else:
                back += broker.take_back(name, parts[1], (DURABLE_KEY, DURABLE_TOPIC), now_ms())
        role.flush()
        return back

    @staticmethod
    def _durables(role: Role) -> list[Queue]:
        """This member's clients' durable subscriptions (not the other members' bridges')."""
        return [q for key, q in role.broker.durables.items() if not is_bridge(key)]

    def _handed(self, ok: bool, why: str) -> None:
        if not ok:
            self.tables = Tables.REFUSED
            log.error("Scaling down: the producer tables could not be queued: %s", why)
