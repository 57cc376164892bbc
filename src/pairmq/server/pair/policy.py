"""What the server asks of its HA policy, and the null policy of a server without a pair.

The server and its roles talk to the pair through this small interface only; a server
with `[ha] policy = "none"` gets `NoPair`, which always serves and confirms what is on the
local disk, so no code path has to ask whether a pair exists.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from pairmq.ha.states import State
from pairmq.server.config import ServerConfig
from pairmq.server.tls import TlsContexts
from pairmq.store.store import Store


class PairPolicy(Protocol):
    """The pair as the rest of the server sees it."""

    @property
    def state(self) -> State: ...

    def active_address(self, tls: bool = False) -> str | None:
        """The STOMP address (with `tls`, its TLS listener's) of the pair's serving server
        when this one does not serve."""

    def handing_over_to(self, tls: bool = False) -> str | None:
        """While this server hands its clients over to its peer (failback, failover on
        shutdown): the peer's STOMP address (with `tls`, its TLS listener's). CONNECTs are
        refused meanwhile, naming it, so that a client moves once, not twice."""

    def topology(self, own: str, tls: bool = False) -> str | None:
        """The CONNECTED frame's `topology` header (with `tls`, `topology-tls`, `own` being
        this server's TLS listener): this server first, then its peer."""

    def confirmable(self, local: int, current: int) -> int:
        """Up to which journal sequence receipts may go out, given the local disk's."""

    def on_append(self, seq: int, record: bytes) -> None:
        """A record the serving journal appended (the replication stream)."""

    def mirror_synced(self, seq: int) -> None:
        """A mirrored (backup) journal reached the disk up to seq."""

    def journal_stalled(self, waited: float | None) -> None:
        """The journal's disk has not completed a write for `waited` seconds
        ([store] stall_timeout_ms), or (None) completes writes again."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def status(self) -> dict[str, Any] | None:
        """The pair's part of GET /status, or None without a pair."""

    def force(self) -> str | None:
        """`pairmq activate`: None when the order is taken, else why it is refused."""


class NoPair:
    """The null policy: one server, always serving, confirming what its disk holds."""

    def __init__(self, open_for_serving: Any) -> None:
        self._open_for_serving = open_for_serving  # async () -> None, from the server

    @property
    def state(self) -> State:
        return State.STANDALONE

    def active_address(self, tls: bool = False) -> str | None:
        return None

    def handing_over_to(self, tls: bool = False) -> str | None:
        return None

    def topology(self, own: str, tls: bool = False) -> str | None:
        return None

    def confirmable(self, local: int, current: int) -> int:
        return local

    def on_append(self, seq: int, record: bytes) -> None:
        pass

    def mirror_synced(self, seq: int) -> None:
        raise RuntimeError("a server without a pair never mirrors a journal")

    def journal_stalled(self, waited: float | None) -> None:
        pass  # nobody to hand over to: clients wait for the disk (the writer logs it)

    async def start(self) -> None:
        await self._open_for_serving()

    async def stop(self) -> None:
        pass

    def status(self) -> dict[str, Any] | None:
        return None

    def force(self) -> str | None:
        return "not part of a pair"


class PairHost(Protocol):
    """What a pair policy's driver asks of the server it runs in."""

    config: ServerConfig
    tls: TlsContexts | None  # [tls]: the HA channel's, with [ha] tls

    @property
    def store(self) -> Store:
        """The journal of the server's current role (replaced at every role change)."""

    @property
    def client_address(self) -> str: ...

    @property
    def tls_address(self) -> str:
        """The STOMP TLS listener's address ("" without one)."""

    @property
    def confirmed_seq(self) -> int: ...

    async def become_active(self, epoch: int | None) -> None: ...

    def become_passive(self, why: str) -> None: ...

    def stop_serving(self, why: str) -> None: ...

    async def read_back(self, why: str) -> None: ...

    def watch_mirror(self) -> None: ...

    async def synced(self, seq: int) -> None: ...

    def update_confirmed(self) -> None: ...

    def persist(self) -> None: ...

    def close_clients(self, message: str, active: str | None) -> None: ...

    def state_changed(self, old: State, new: State, why: str) -> None: ...

    def throttle(self, paused: bool) -> None:
        """Stop (or resume) reading clients' frames: the backup is too far behind."""


class SharedStoreHost(Protocol):
    """What the shared-store policy's driver asks of the server it runs in."""

    config: ServerConfig
    tls: TlsContexts | None  # [tls]: the HA channel's, with [ha] tls

    @property
    def store(self) -> Store: ...

    @property
    def client_address(self) -> str: ...

    @property
    def tls_address(self) -> str:
        """The STOMP TLS listener's address ("" without one)."""

    @property
    def confirmed_seq(self) -> int: ...

    async def take_over_journal(self, guard: Callable[[], bool]) -> int:
        """Replay the shared journal, serve it with writes fenced by `guard`, journal a new
        epoch; returns it."""

    @property
    def read_ahead_seq(self) -> int:
        """The last record of the shared journal read ahead (0: none)."""

    async def read_ahead(self, limit_bytes: int) -> int:
        """Read about `limit_bytes` more of the shared journal ahead of a takeover; returns
        the bytes read."""

    async def stand_by(self, why: str, drain_timeout: float) -> None: ...

    def update_confirmed(self) -> None: ...

    def close_clients(self, message: str, active: str | None) -> None: ...

    def state_changed(self, old: State, new: State, why: str) -> None: ...
