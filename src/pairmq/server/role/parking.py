"""Sessions that outlive a broken connection for a while (the client asked, with the CONNECT
header `connection-ttl`): the server keeps them *parked*, and a client that reconnects to
the same server within that time resumes its session where it was (docs/clients.md,
"Resuming a session").

One `Parking` per role: a session never outlives the role (broker) it was opened in, so a
role that retires closes every session parked in it. A resume must present the session's
token and the key the server gave it in CONNECTED, with the same login; anything else gets
a fresh session, as if no resume had been asked.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from pairmq.core import Broker, CoreError
from pairmq.server.clock import now_ms
from pairmq.server.role.confirmations import Ticket

log = logging.getLogger("pairmq.connection")


class Resumable(Protocol):
    """A live connection whose session may be parked (what Parking asks of it)."""

    def drop(self, why: str) -> None: ...


@dataclass(frozen=True)
class SessionRequest:
    """What a CONNECT asks of its session's life: keep it `ttl_ms` after the connection
    breaks; resume parked session `token` (with its `key`), having received deliveries up
    to ack id `last_ack`."""

    ttl_ms: int = 0
    token: str | None = None
    key: str = ""
    last_ack: int = 0

    @classmethod
    def from_headers(cls, headers: dict[str, str]) -> SessionRequest:
        ttl = _number(headers, "connection-ttl")
        last_ack = _number(headers, "resume-last-ack")
        token = headers.get("resume-session")
        return cls(ttl, token or None, headers.get("resume-key", ""), last_ack)


def _number(headers: dict[str, str], name: str) -> int:
    value = headers.get(name, "0")
    if not (value.isascii() and value.isdigit()) or len(value) > 15:
        raise CoreError(f"{name} must be a non-negative integer, got {value[:40]!r}")
    return int(value)


@dataclass
class Parked:
    """A session kept for its client; `frames` counts the frames of it the server applied."""

    conn_id: int
    token: str
    key: str
    login: str | None
    client_id: str | None
    frames: int
    last_ticket: Ticket | None
    expires: float = 0.0
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)



class Parking:
    def __init__(self, broker: Broker, flush: Callable[[], None]) -> None:
        self._broker = broker
        self._flush = flush  # the role's: persist and write what closing a session changed
        self._parked: dict[str, Parked] = {}  # session token -> parked session
        self._live: dict[str, tuple[str, str | None, Resumable]] = {}  # token -> key, login, conn

    @staticmethod
    def new_key() -> str:
        return secrets.token_hex(16)

    def __len__(self) -> int:
        return len(self._parked)

    def serving(self, token: str, key: str, login: str | None, conn: Resumable) -> None:
        """A connection whose session may be parked later (its key may change each time)."""
        self._live[token] = (key, login, conn)

    def gone(self, token: str) -> None:
        self._live.pop(token, None)

    def park(self, parked: Parked, ttl_ms: int) -> None:
        self._live.pop(parked.token, None)
        self._broker.park_session(parked.conn_id)
        loop = asyncio.get_running_loop()
        parked.expires = loop.time() + ttl_ms / 1000
        parked.timer = loop.call_later(ttl_ms / 1000, self._expire, parked.token)
        self._parked[parked.token] = parked
        log.debug("Session %s (connection %d) parked for %d ms", parked.token, parked.conn_id,
                  ttl_ms)

    def claim(self, token: str, key: str, login: str | None) -> Parked | None:
        """The parked session a resuming client names, taken out of the parking (None: no
        such session, or the key or login do not match). A session whose old connection
        is still open (the server has not noticed it broke) is parked first."""
        live = self._live.get(token)
        if live is not None and secrets.compare_digest(live[0], key) and live[1] == login:
            live[2].drop("its client resumed the session on a new connection")
        parked = self._parked.get(token)
        if parked is None or parked.login != login or not secrets.compare_digest(parked.key,
                                                                                  key):
            return None
        del self._parked[token]
        if parked.timer is not None:
            parked.timer.cancel()
        return parked

    def release_client_id(self, client_id: str, login: str | None) -> None:
        """A new connection (same login) takes a client-id a parked session holds: that
        session ends now, as ActiveMQ's link stealing ends a dead connection's."""
        for parked in list(self._parked.values()):
            if parked.client_id == client_id and parked.login == login:
                log.info("Session %s (client-id %r) ended: a new connection takes its "
                         "client-id", parked.token, client_id)
                self._close(parked)

    def _expire(self, token: str) -> None:
        parked = self._parked.get(token)
        if parked is not None:
            log.info("Session %s (connection %d) closed: its client did not come back within "
                     "its connection TTL", token, parked.conn_id)
            self._close(parked)

    def _close(self, parked: Parked) -> None:
        self._parked.pop(parked.token, None)
        if parked.timer is not None:
            parked.timer.cancel()
        self._broker.close_session(parked.conn_id, now_ms())
        self._flush()

    def close_all(self) -> None:
        """The role retires: its parked sessions end with it (nothing is flushed: a retired
        role journals nothing, and its broker is not the next role's to change)."""
        for parked in self._parked.values():
            if parked.timer is not None:
                parked.timer.cancel()
        self._parked.clear()
        self._live.clear()
