"""The server process: listener, roles, timers, and the pair policy that decides roles."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pairmq.core import Broker
from pairmq.core.permissions import unchecked_roles
from pairmq.core.replay import Replay
from pairmq.core.scale_down import ScaleDownPhase
from pairmq.ha.states import State
from pairmq.server.clock import now_ms
from pairmq.server.config import ServerConfig, User
from pairmq.server.guards import Guards
from pairmq.server.guards.auth import ADMIN_ROLE, MONITOR_ROLE
from pairmq.server.guards.connection_limits import ConnectionCount
from pairmq.server.guards.failed_logins import LoginThrottle
from pairmq.server.guards.passwords import PasswordCheck
from pairmq.server.guards.turn_budget import TurnBudget
from pairmq.server.loop_lag import LoopWatch
from pairmq.server.pair.choose import backup_linked, pair_policy
from pairmq.server.role.leaving import Gate, Leaving
from pairmq.server.role.role import Role, RoleKind
from pairmq.server.stomp.connection import TURN_BUDGET_S, StompConnection
from pairmq.server.tls import TlsContexts, TlsError
from pairmq.store.gcpause import (
    FULL_EVERY_S,
    SteppedCollector,
    gc_paused,
    report_slow_collections,
)
from pairmq.store.reading import JournalCorrupt
from pairmq.store.recovery import RecoveryReport
from pairmq.store.sharedlock import JOURNAL_NAME, SharedLock, is_shared_store
from pairmq.store.stall import Disk
from pairmq.store.store import Store

if TYPE_CHECKING:  # loaded only where their feature is on (below): a start imports less
    from aiohttp.web import AppRunner

    from pairmq.server.cluster.node import ClusterNode
    from pairmq.server.pair.database import DatabaseJournal
    from pairmq.server.stomp.websocket import WebSocketListener

DRAIN_TIMEOUT_S = 10.0


class StartupError(Exception):
    """The server cannot start; the message says why and what to do."""


log = logging.getLogger("pairmq.server")
DATA_LOCK_NAME = "lock"  # in data_dir: one server process per data directory
SLOW_GC_S = 0.2  # a collection longer than this is logged: leases run meanwhile

EXPIRY_SWEEP_S = 1.0
CHANGES_KEPT = 20  # HA state changes /status lists


class PairmqServer:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self._data_lock: SharedLock | None = None  # this process's, on its data_dir
        self._conn_seq = 0
        self._generation = 0
        self._server: asyncio.Server | None = None
        self._tls_server: asyncio.Server | None = None  # [server] stomp_tls
        self.websocket: WebSocketListener | None = None  # [server] stomp_ws
        # [tls]: every TLS context of this server, reloaded by SIGHUP or POST /reload
        self.tls = TlsContexts(config.tls_files, config.tls_purposes) if config.tls_used \
            else None
        self._sweeper: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop = asyncio.get_event_loop()
        self.port = config.stomp_port
        self._admin: AppRunner | None = None
        self.watch: LoopWatch | None = None  # the event loop's lag (server/loop_lag.py)
        self.disk_usage_percent: float | None = None  # the data directory's, last sampled
        # the last changes of this server's HA state, with their reasons (the console's)
        self.changes: deque[dict[str, object]] = deque(maxlen=CHANGES_KEPT)
        self.failovers = 0  # times this server took over from its peer since it started
        self._collector: asyncio.TimerHandle | None = None  # store/gcpause.py
        self._steps = SteppedCollector()
        self.turn = TurnBudget(TURN_BUDGET_S)  # frames of every connection, per loop turn
        self.logins = LoginThrottle(config.failed_login_delay_max_ms / 1000)
        # the configuration's plain passwords are hashed in its thread (passwords.py)
        self.passwords = PasswordCheck(config.users)
        self.guards = Guards(self.turn, self.logins, ConnectionCount(
            config.max_connections, config.max_connections_per_address), self.passwords)
        self._ahead: Store | None = None  # shared store: the journal read ahead of a takeover
        # [store] url: the journal is kept in PostgreSQL (server/pair/database.py); a server
        # alone stops when another takes its lease, a pair's driver steps down by itself
        self.database: DatabaseJournal | None = None
        if config.url:
            from pairmq.server.pair.database import DatabaseJournal

            self.database = DatabaseJournal(
                config, self, self.lease_lost if config.policy == "none" else log.warning)
        self.pair = pair_policy(self, self.database, self._serve_alone)
        # [cluster]: bridges to the other members while this server serves (docs/cluster.md)
        self.cluster: ClusterNode | None = None
        if config.cluster_name:
            from pairmq.server.cluster.node import ClusterNode

            self.cluster = ClusterNode(config, lambda: self.role, self._member_url,
                                       self.next_conn_id, self._backup_linked)
        self.role = self._new_role(RoleKind.STANDBY, self._new_broker(), self._new_store())
        self.finished = asyncio.Event()  # the server stops by itself (a backup scaled down)

    def _new_broker(self) -> Broker:
        boot = format(time.time_ns() // 1000, "x")
        return Broker(self.config.core_settings(), id_prefix=f"ID:{self.config.name}-{boot}-")

    @property
    def _shared(self) -> bool:
        """The journal lives in [ha] shared_dir and is this server's only under its lock."""
        return self.config.policy == "shared-store"

    def _journal_dir(self) -> Path:
        """With [store] url, the local copy of the database's journal (server alone or not)."""
        home = self.config.shared_dir if self._shared and not self.config.url \
            else self.config.data_dir
        return Path(home) / JOURNAL_NAME

    def _new_store(self) -> Store:
        return Store(self._journal_dir(), self.config.store_settings())

    def _new_role(self, kind: RoleKind, broker: Broker, store: Store) -> Role:
        self._generation += 1
        return Role(self._generation, kind, broker, store, self.pair, self.client_address,
                    self.tls_address or None,
                    self.cluster.connected_headers if self.cluster is not None else None)

    def _member_url(self) -> str:
        from pairmq.server.cluster.node import member_url

        return member_url(self.pair.topology(self.client_address), self.client_address)

    def _backup_linked(self) -> bool:
        """A colocated live: its backup's HA channel is up."""
        return self.config.policy in ("replication", "colocated") and backup_linked(self.pair)

    def _switch_role(self, role: Role, why: str) -> None:
        """Make `role` the one new connections join; close every connection of the old one."""
        old, self.role = self.role, role
        active = self.client_address if role.kind is RoleKind.SERVING \
            else self.pair.active_address()
        old.retire(f"this server changed role ({why}): reconnect", active)
        log.debug("Role %d (%s) replaces role %d (%s): %s", role.generation, role.kind,
                  old.generation, old.kind, why)
        if self.cluster is not None:
            if role.kind is RoleKind.SERVING:
                self.cluster.serve()
                if self._scales_down_as_backup():
                    role.leave(Leaving(Gate.PRODUCERS_REFUSED,
                                       "this server is a backup that scales down: its "
                                       "messages go to another member; reconnect in a "
                                       "moment"))
                    self.loop.create_task(self._scale_down_as_backup())
            elif self.cluster.serving:
                self.loop.create_task(self.cluster.stop())

    def _scales_down_as_backup(self) -> bool:
        """A backup with scale_down never serves: when its live is gone it moves what the
        pair held to another member, sends the clients there, and stops (Artemis' scale-down
        of a backup)."""
        c = self.config
        return c.scale_down and c.policy != "none" and c.role == "backup" \
            and self.cluster is not None and self.cluster.scaling is None

    async def _scale_down_as_backup(self) -> None:
        assert self.cluster is not None
        machine = await self.cluster.scale_down(serving=False)
        if machine.phase is ScaleDownPhase.DONE:
            self.finished.set()
        else:  # what could not move is served here rather than not at all
            log.warning("This backup serves its live's clients itself: its scale-down did "
                        "not finish (%s)", machine.reason)

    # ------------------------------------------------------------ what the pair and admin read

    @property
    def store(self) -> Store:
        return self.role.store

    @property
    def broker(self) -> Broker:
        return self.role.broker

    @property
    def confirmed_seq(self) -> int:
        return self.role.confirmed_seq

    @property
    def serving(self) -> bool:
        return self.pair.state.serving

    @property
    def client_address(self) -> str:
        return f"{self.config.stomp_host}:{self.port}"

    @property
    def users(self) -> Mapping[str, User]:
        """The users in force: the file's, with those changed at run time (journal
        records of the current role's broker, core/accounts.py) over them."""
        return self.role.broker.accounts.over(self.config.users)

    @property
    def tls_address(self) -> str:
        """The STOMP TLS listener's address, its real port ("" without one)."""
        host, _, port = self.config.stomp_tls.rpartition(":")
        if self._tls_server is not None:
            port = str(self._tls_server.sockets[0].getsockname()[1])
        return f"{host}:{port}" if host and port != "0" else ""

    @property
    def active_address(self) -> str | None:
        """Where clients should go when this server does not serve."""
        return self.pair.active_address()

    def next_conn_id(self) -> int:
        self._conn_seq += 1
        return self._conn_seq

    def _accept(self) -> StompConnection:
        """A new client connection belongs to the role current when it is accepted."""
        return StompConnection(self.config, self.role, self.next_conn_id(), self.loop,
                               self.guards)

    # ------------------------------------------------------------ lifecycle

    def _lock_data_dir(self) -> None:
        data_dir = Path(self.config.data_dir)
        if not self._shared and is_shared_store(data_dir):
            raise StartupError(f"data directory {data_dir} is the shared store of a "
                               "shared-store pair: only a server with [ha] policy = "
                               "\"shared-store\" and shared_dir pointing there may use it")
        lock = SharedLock(data_dir, self.config.name, file_name=DATA_LOCK_NAME)
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            acquired = lock.try_acquire()
        except OSError as e:
            raise StartupError(f"data directory {data_dir} cannot be written: "
                               f"{e.strerror or e}") from None
        if not acquired:
            raise StartupError(f"data directory {data_dir} is in use by another pairmq server: "
                               f"{lock.holder()}")
        self._data_lock = lock

    def _restore(self, broker: Broker, store: Store,
                 recovered: tuple[Replay, RecoveryReport] | None = None) -> None:
        replay, report = recovered or store.recover(
            self.config.core_settings().dup_cache_size_for)
        broker.restore(replay)
        store.account(broker)  # here, so that it runs in the thread with the rest
        log.info("%s (epoch %d, last seq %d)", report.describe(), store.epoch,
                 store.appended_seq)

    def _restore_to_follow(self, broker: Broker, store: Store) -> None:
        """`_restore`, then the index a follower looks entries up by (80 ms for 200,000
        messages in memory: in the thread too)."""
        self._restore(broker, store)
        broker.start_following()

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.watch = LoopWatch(self.loop)
        self.watch.start()
        self._lock_data_dir()
        report_slow_collections(SLOW_GC_S, lambda generation, took: log.warning(
            "A garbage collection (generation %s) paused the server for %.2f s", generation,
            took))
        if self.database is not None and not self._shared:  # the local copy of its journal
            from pairmq.server.pair.database import StartupRefused

            try:
                await self.database.take(self._journal_dir())
            except StartupRefused as e:
                raise StartupError(str(e)) from None
        if not self._shared:  # a shared journal is read once its lock is held
            with gc_paused(freeze=True):
                # In a thread, as a takeover does: the loop has nothing to serve yet, but
                # its watchdog goes on timing turns, and a long one means something then.
                await self.loop.run_in_executor(None, self._restore, self.role.broker,
                                                self.role.store)
        listening = []
        if self.config.stomp:
            self._server = await self._listen(self.config.stomp, None)
            listening.append(f"STOMP on {self._bound(self._server)}")
        if self.config.stomp_tls:
            assert self.tls is not None
            self._tls_server = await self._listen(self.config.stomp_tls,
                                                  self.tls.listener("stomp"))
            listening.append(f"STOMP over TLS on {self._bound(self._tls_server)}")
        if self.config.stomp_ws:
            tls = self.tls.listener("stomp") if self.tls and self.config.stomp_ws_tls else None
            from pairmq.server.stomp.websocket import WebSocketListener

            self.websocket = WebSocketListener(self.config, self._accept, tls)
            await self.websocket.start(self.config.stomp_ws)
            listening.append(f"STOMP over WebSocket on {self.websocket.url}")
        clients = self._server or self._tls_server
        assert clients is not None
        self.port = clients.sockets[0].getsockname()[1]
        # Without a pair this serves at once (nothing awaited: no client is accepted before).
        await self.pair.start()
        self._sample_disk()  # at once: /metrics has it from the start
        self._sweeper = self.loop.call_later(EXPIRY_SWEEP_S, self._sweep)
        self._collector = self.loop.call_later(FULL_EVERY_S, self._collect)
        rules = self.role.broker.accounts.rules_over(self.config.security)
        if rules is None:
            log.warning("No [security] rules: every client that logs in may send to, "
                        "consume from, create and delete any destination (docs/security.md)")
        users = {name: user.roles for name, user in self.users.items()}
        for role, holders in unchecked_roles(users, rules, (ADMIN_ROLE, MONITOR_ROLE)).items():
            log.warning("Role %r (of %s) is granted nothing and checked nowhere: it is not "
                        "admin or monitor and no [security] rule names it. A typo?", role,
                        ", ".join(repr(name) for name in holders))
        if not self.config.users and not self.config.allow_anonymous:
            log.warning("No users are configured and anonymous access is off: nobody can "
                        "connect. Add [auth.users] or set allow_anonymous = true.")
        log.info("pairmq server %s ready: %s", self.config.name, ", ".join(listening))
        if self.config.admin:
            # aiohttp and the console take ~0.5 s to import: in a thread, so that clients
            # already connecting are served meanwhile instead of waiting for the console
            start_admin = await self.loop.run_in_executor(None, _admin_starter)
            self._admin = await start_admin(self, self.config.admin)

    async def _listen(self, address: str, tls: ssl.SSLContext | None) -> asyncio.Server:
        host, _, port = address.rpartition(":")
        return await self.loop.create_server(self._accept, host, int(port), ssl=tls,
                                             reuse_address=True, backlog=1024)

    @staticmethod
    def _bound(server: asyncio.Server) -> str:
        host, port = server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    def reload_tls(self) -> str:
        """Read [tls]'s files again (SIGHUP, POST /reload): new connections use them.
        Returns what happened; a file that cannot be used keeps the running ones."""
        if self.tls is None:
            return "nothing to reload: this server uses no TLS"
        try:
            self.tls.reload()
        except TlsError as e:
            log.error("TLS reload refused, the running certificates stay: %s", e)
            raise
        files = self.tls.files
        log.info("TLS certificates reloaded (cert %s, ca %s): new connections use them",
                 files.cert, files.ca or "none")
        return "reloaded"

    async def _serve_alone(self) -> None:
        """No pair: serve the recovered journal (no epoch change)."""
        await self.become_active(None)

    async def stop(self) -> None:
        cluster = self.cluster
        if cluster is not None and self.config.scale_down and cluster.serving \
                and cluster.scaling is None and self.role.kind is RoleKind.SERVING:
            # a live (or standalone member) stopped with scale_down: its messages, producer
            # sequences and clients go to another member first (docs/cluster.md)
            await cluster.scale_down(serving=True)
        if self.cluster is not None:  # what bridges hold unacknowledged goes back at once
            await self.cluster.close()  # (and the backups this member hosts stop)
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.watch is not None:
            self.watch.stop()
        if self._collector is not None:
            self._collector.cancel()
        await self.pair.stop()
        if self._admin is not None:
            await self._admin.cleanup()
        for listener in (self._server, self._tls_server):
            if listener is not None:
                listener.close()
        self.passwords.close()
        role = self.role
        if role.kind is RoleKind.SERVING:
            role.persist()
        role.retire("this server is stopping", self.pair.active_address())
        for listener in (self._server, self._tls_server):
            if listener is not None:
                await listener.wait_closed()
        if self.websocket is not None:
            await self.websocket.close()  # its clients were told why, as the others were
        try:
            await asyncio.wait_for(role.synced(role.store.appended_seq), DRAIN_TIMEOUT_S)
        except TimeoutError:
            log.error("Journal did not reach the disk within %.0f s of stopping: records "
                      "not yet confirmed to clients may be lost", DRAIN_TIMEOUT_S)
        if self.database is not None:
            await self.database.close(DRAIN_TIMEOUT_S)
        role.store.close()
        if self._data_lock is not None:
            self._data_lock.release()
        log.info("pairmq server %s stopped", self.config.name)

    # ------------------------------------------------------------ what the pair calls

    async def synced(self, seq: int) -> None:
        """Wait until the current role's journal has everything up to seq on disk."""
        await self.role.synced(seq)

    def update_confirmed(self) -> None:
        self.role.update_confirmed()

    def persist(self) -> None:
        role = self.role
        if role.kind is RoleKind.SERVING:
            role.persist()

    async def become_active(self, epoch: int | None) -> None:
        """Serve from this server's journal, with a new epoch when one is given. A new role:
        every connection accepted before is closed (it may reconnect at once). A backup's
        broker already holds what its journal holds (it followed the records as they came):
        taking over only waits for the records in flight to reach the disk."""
        role = self.role
        if role.kind is RoleKind.SERVING:
            # Never stepped down (no standby role since): the same journal goes on serving.
            if epoch is not None:
                role.store.begin_epoch(epoch)
            return
        broker, store = role.broker, role.store
        if store.mirror:
            await role.synced(store.appended_seq)
            store.serve_mirrored()
            log.info("Taking over at seq %d: the broker followed the journal, nothing to "
                     "replay", store.appended_seq)
        serving = self._new_role(RoleKind.SERVING, broker, store)
        serving.open_for_serving(self.loop)
        if epoch is not None:
            store.begin_epoch(epoch)
        self._switch_role(serving, "activating")

    @property
    def read_ahead_seq(self) -> int:
        return self._ahead.read_ahead_seq if self._ahead is not None else 0

    async def read_ahead(self, limit_bytes: int) -> int:
        """Shared store, neither replaying nor serving: read about `limit_bytes` more of the
        shared journal (in a thread) into the store `take_over_journal` will serve; returns
        the bytes read."""
        pulled = 0
        if self.database is not None:  # the local copy first brought forward from it
            try:
                pulled, anew = await self.database.pull(self._journal_dir(), limit_bytes)
            except Exception as e:
                log.debug("Reading the database's journal ahead failed: %s", e)
                return 0
            if anew:
                self._ahead = None
        if self._ahead is None:
            self._ahead = self._new_store()
        try:
            read = await self.loop.run_in_executor(
                None, self._ahead.read_ahead, self.config.core_settings().dup_cache_size_for,
                limit_bytes)
            return max(read, pulled)
        except (OSError, JournalCorrupt) as e:
            self._ahead = None  # a takeover reads it all, and reports what is wrong
            log.warning("Reading the shared journal ahead failed: %s", e)
        except Exception:
            self._ahead = None
            log.exception("Reading the shared journal ahead failed")
        return 0

    async def take_over_journal(self, guard: Callable[[], bool]) -> int:
        """Shared store, lock held: replay the shared journal (in a thread, heartbeats and
        lock verifications go on), serve it with writes fenced by `guard`, and journal a new
        epoch one above its newest. Returns that epoch."""
        role = self.role
        role.store.close()
        if self.database is not None and not await self.database.catch_up():
            self._ahead = None  # no copy read ahead: made anew from the database
            await self.database.restore_into(self._journal_dir())
        store, self._ahead = self._ahead or self._new_store(), None
        with gc_paused(freeze=True):
            recovered = await self.loop.run_in_executor(None, store.recover,
                                                        self.config.core_settings().dup_cache_size_for)
            broker = self._new_broker()
            # In the thread too: a million messages take seconds to restore, and meanwhile
            # the loop verifies the lock and answers heartbeats (nothing else sees `broker`).
            await self.loop.run_in_executor(None, self._restore, broker, store, recovered)
        if self.database is not None:  # before the first record is appended
            self.database.start_copy()
        serving = self._new_role(RoleKind.SERVING, broker, store)
        serving.open_for_serving(self.loop)
        store.fence(guard)
        epoch = store.epoch + 1
        store.begin_epoch(epoch)
        self._switch_role(serving, "activating")
        return epoch

    async def stand_by(self, why: str, drain_timeout: float) -> None:
        """Shared store: stop serving and close the journal without reading it again (the
        other server will own it). With a drain timeout, what was written first reaches
        the disk (never past the timeout: a fenced writer writes nothing)."""
        old = self.role
        if old.kind is RoleKind.SERVING:
            old.persist()
        old.retire(f"this server is no longer active: {why}", self.pair.active_address())
        if drain_timeout > 0 and old.kind is RoleKind.SERVING:
            try:
                await asyncio.wait_for(old.synced(old.store.appended_seq), drain_timeout)
            except TimeoutError:
                log.warning("Journal not on disk within %.1f s of stopping to serve: records "
                            "not confirmed to clients may be lost", drain_timeout)
        await old.store.close_off_loop(self.loop)
        if self.database is not None:  # what the drain wrote reaches the database too
            await self.database.stop_copy(drain_timeout)
            self.database.forget_local_copy()
        self._switch_role(self._new_role(RoleKind.STANDBY, self._new_broker(),
                                         self._new_store()), why)

    def become_passive(self, why: str) -> None:
        """A standby role whose journal mirrors the peer's, and whose broker follows it. A
        standby role's broker was never touched by a client (it holds what its journal
        holds) and goes on. (A serving role steps down instead: `stop_serving`.)"""
        old = self.role
        if old.kind is RoleKind.SERVING:
            raise RuntimeError("a serving role steps down with stop_serving and read_back")
        old.retire(f"this server is no longer active: {why}", self.pair.active_address())
        self._standby(old.broker, old.store, why)

    def stop_serving(self, why: str) -> None:
        """Step down, first half: close every client at once (nothing is confirmed from now
        on). The retired role stays current, refusing clients, until `read_back`."""
        self.role.retire(f"this server is no longer active: {why}", self.pair.active_address())

    async def read_back(self, why: str) -> None:
        """Step down, second half: the serving broker had sessions, so the journal, closed
        once its last records are written, is read back into a new broker; in a thread, as
        a start does (seconds for millions of waiting messages: the pair's heartbeats and
        the witness go on meanwhile). Then a standby role that can mirror the peer."""
        old = self.role
        disk = old.store.stall_view()
        if disk is not None and disk.disk is Disk.STALLED:
            log.info("Waiting for the journal's write in flight to complete before reading "
                     "the journal back (%.1f s so far)", disk.in_flight_s)
        await old.store.close_off_loop(self.loop)  # a stalled disk: the loop goes on
        store, broker = self._new_store(), self._new_broker()
        started = time.monotonic()
        with gc_paused(freeze=True):
            await self.loop.run_in_executor(None, self._restore_to_follow, broker, store)
        log.info("Journal read back in %.2f s after stepping down", time.monotonic() - started)
        self._standby(broker, store, why)

    def _standby(self, broker: Broker, store: Store, why: str) -> None:
        if not store.mirror:
            store.open_mirror(self.loop, broker)
        standby = self._new_role(RoleKind.STANDBY, broker, store)
        standby.watch_mirror()
        self._switch_role(standby, why)

    def lease_lost(self, why: str) -> None:
        """[store] url: another server took the database lease. Serving ends now and the
        server stops (a lease is taken only from a server that stopped renewing it)."""
        self.stop_serving(why)
        self.finished.set()

    def throttle(self, paused: bool) -> None:
        """Stop (or go on) reading from clients: the pair's replication is behind."""
        self.role.throttle(paused)

    def watch_mirror(self) -> None:
        self.role.watch_mirror()

    def close_clients(self, message: str, active: str | None) -> None:
        self.role.close_clients(message, active)

    def state_changed(self, old: State, new: State, why: str) -> None:
        self.changes.append({"at": time.time(), "old": old.value, "new": new.value,
                             "why": why})
        if old is State.PASSIVE and new.serving:
            self.failovers += 1
        if old.serving and not new.serving:
            self.role.close_clients(f"this server switched to {new.value}",
                                    self.pair.active_address())
        self.role.update_confirmed()

    def _collect(self) -> None:
        started = time.perf_counter()
        self._collector = self.loop.call_later(
            self._steps.step(time.monotonic(), time.thread_time()), self._collect)
        # The step's time is this turn's too: frames read later in it wait for the next.
        self.turn.start(started)

    def _sweep(self) -> None:
        self._sample_disk()
        self.role.sweep(now_ms())
        self._sweeper = self.loop.call_later(EXPIRY_SWEEP_S, self._sweep)

    def _sample_disk(self) -> None:
        """The data directory's disk usage, as `df` shows it, for the max_disk_usage guard
        (core decides; sampled at every sweep, not per message). A backup samples it
        too, for its operator (/metrics): its journal fills its disk as well."""
        where = self._journal_dir().parent
        try:
            stats = os.statvfs(where)
        except OSError as e:
            log.debug("Cannot sample the disk usage of %s: %s", where, e)
            return
        used = stats.f_blocks - stats.f_bfree
        if used + stats.f_bavail <= 0:
            return
        self.disk_usage_percent = 100.0 * used / (used + stats.f_bavail)
        if self.role.kind is RoleKind.SERVING:
            self.role.disk_usage(self.disk_usage_percent)


def _admin_starter() -> Callable[..., Awaitable[AppRunner]]:
    """The management port's starter, imported (aiohttp with it) where this is called."""
    from pairmq.server.manage.admin import start_admin

    return start_admin
