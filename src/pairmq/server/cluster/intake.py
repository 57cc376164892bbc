"""What bridges bring, taken by this server's broker directly: the same `Broker.send` a
client's SEND reaches, its records journaled by the role and confirmed as a RECEIPT is
(on disk, and on the backup in a pair), without a loopback connection's serializing and
parsing of every message (benchmarks/cluster.py measured that at a third of a bridge's CPU).

Permissions are not checked here: a bridge is this server's own, and on the member it pulls
from it logged in as `[cluster] user`, whose rights that member checks.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from pairmq.core.admission import Admission
from pairmq.core.destinations import STREAM_PREFIX
from pairmq.core.errors import CoreError
from pairmq.server.clock import now_ms
from pairmq.server.role.role import FrameMark, Role

log = logging.getLogger("pairmq.cluster")

# what the bridge is told of one message: taken (confirmed, or dropped by a full
# destination's policy, as a client's SEND would be), or not taken now (held by a full
# destination or journal, or refused): it stays on its member and comes again
Taken = Callable[[bool, str], None]


class LocalIntake:
    def __init__(self, role: Role, conn_id: int) -> None:
        self._role = role
        self._conn_id = conn_id
        role.broker.open_session(conn_id, "1.2")
        self._flush: asyncio.Handle | None = None

    def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
        role = self._role
        if not role.broker.following and self._conn_id in role.broker.sessions:
            role.broker.close_session(self._conn_id, now_ms())

    def take(self, destination: str, headers: dict[str, str], body: bytes, persistent: bool,
             taken: Taken) -> None:
        """Hand one message to the broker; `taken` is called once it is confirmed (or
        known not taken). The journal group is written at the end of this loop turn, with
        whatever else the bridges brought in it."""
        role = self._role
        headers["destination"] = destination
        if persistent:
            headers["persistent"] = "true"
        journal_full = role.journal_full_reason() if persistent or \
            destination.startswith(STREAM_PREFIX) else None
        mark = role.frame_mark()
        try:
            outcome = role.broker.send(self._conn_id, destination, headers, body, now_ms(),
                                       None, journal_full)
        except Exception as e:  # a CoreError: a bad destination, a closed session
            taken(False, str(e))
            return
        if outcome.admission in (Admission.HELD, Admission.FAILED):
            taken(False, outcome.reason or outcome.admission.value)
            return
        ticket = role.ticket_since(mark)
        if ticket is None:
            taken(True, "")
        else:
            role.when_confirmed(ticket, lambda: taken(True, ""))
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_soon(self._flush_now)

    def take_durable(self, key: str, topic: str, headers: dict[str, str], body: bytes,
                     persistent: bool, taken: Taken) -> None:
        """A message of a scaling-down member's durable subscription `key` of `topic`
        (core/broker/handover.py `put_durable`), confirmed as a message would be."""
        role = self._role
        if persistent and (full := role.journal_full_reason()) is not None:
            taken(False, full)
            return
        mark = role.frame_mark()
        try:
            role.broker.put_durable(key, topic, headers, body, persistent, now_ms())
        except CoreError as e:
            taken(False, str(e))
            return
        self._confirm(mark, taken)

    def adopt(self, body: bytes, taken: Taken) -> None:
        """A scaling-down member's producer sequences and dup-ids (core/broker/handover.py),
        journaled and confirmed as a message would be."""
        role = self._role
        mark = role.frame_mark()
        try:
            state = json.loads(body)
            if not isinstance(state, dict):
                raise ValueError("not an object")
            changed = role.broker.adopt(state, now_ms())
        except (ValueError, CoreError) as e:
            # kept on the member that sent it (not acknowledged): its scale-down stalls and
            # says so, and nothing it took is taken twice here
            log.error("Cluster: a scale-down's producer tables cannot be adopted: %s", e)
            taken(False, str(e))
            return
        log.info("Cluster: adopted %d producer sequences and dup-ids of a member scaling "
                 "down", changed)
        self._confirm(mark, taken)

    def _confirm(self, mark: FrameMark, taken: Taken) -> None:
        """`taken` once what was journaled since `mark` is confirmed."""
        role = self._role
        ticket = role.ticket_since(mark)
        if ticket is None:
            taken(True, "")
        else:
            role.when_confirmed(ticket, lambda: taken(True, ""))
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush = None
        self._role.flush()

    def depth(self, queue: str) -> int:
        q = self._role.broker.queues.get(queue)
        return q.count if q is not None else 0
