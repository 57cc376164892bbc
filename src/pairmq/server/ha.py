"""The pair, replication policy: roles, HA channel, replication, witness lease, failover.

One `HaNode` per server. The rules it follows (docs/ha.md has the argument):

- A server confirms writes only while serving and while it holds the witness's
  lease, or its in-sync backup's promise not to take over (no witness configured:
  always, with a loud warning).
- With an in-sync backup and synchronous replication, a record is confirmed only
  once the backup has it (on its disk, with backup_ack = "fsync").
- Before confirming on its own after losing its backup, the active tells the
  witness it has no in-sync backup any more; only an in-sync backup may take over.
- A backup takes over only after its own promise to the active has run out and the
  witness granted it the lease with a higher epoch; every activation writes its
  epoch to the journal first.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pairmq.ha import channel as ch
from pairmq.ha.election import Standing, elected
from pairmq.ha.lease import LeaseView
from pairmq.ha.states import State
from pairmq.server.halink import Link, accept_link, open_link, split_address
from pairmq.store.records import CRC_PART, RECORD_HEADER
from pairmq.store.segments import read_records

if TYPE_CHECKING:
    from pairmq.server.app import PairmqServer

log = logging.getLogger("pairmq.ha")
trace = logging.getLogger("pairmq.ha.trace")  # deeper HA tracing, at DEBUG

RECORDS_CHUNK = 1024 * 1024


def epoch_at(epochs: list[tuple[int, int]] | list[list[int]], seq: int) -> int | None:
    """The epoch a history says record `seq` was written in (None: before its start)."""
    found = None
    for epoch, first in epochs:
        if first <= seq:
            found = epoch
        else:
            break
    return found


class HaNode:
    def __init__(self, server: PairmqServer) -> None:
        cfg = server.config
        self.server = server
        self.name: str = cfg.name
        # Name plus a random id kept in the data directory: the witness tells apart a stale or
        # foreign server that reuses the name (and secret) from the one it knows.
        self.identity = f"{cfg.name}#{_node_id(Path(cfg.data_dir))}"
        self.role: str = cfg.role
        self.secret: str = cfg.secret
        self.heartbeat = cfg.heartbeat_interval_ms / 1000
        self.activation_ms: int = cfg.activation_interval_ms
        self.activation = self.activation_ms / 1000
        self.sync_timeout = cfg.initial_replication_sync_timeout_ms / 1000
        self.witness_address: str = cfg.witness
        self.state = State.STARTING
        self.peer_state = State.DEAD
        self.link: Link | None = None
        self.peer: dict[str, Any] = {}
        self.witness: Link | None = None
        self._witness_lock = asyncio.Lock()
        self.witness_info: dict[str, Any] = {}
        self.witness_lease = LeaseView()
        self.peer_lease = LeaseView()  # active: the backup's promise not to take over
        self.promise_until = 0.0  # backup: I promised not to take over before this
        self.peer_echo = 0.0  # backup: the active's last heartbeat timestamp, to echo
        self.backup_in_sync = False  # active: the backup is attached and caught up
        self.standalone_pending = False  # active: waiting for the witness to drop the standby
        self.backup_acked = 0
        self.sync_done_seq: int | None = None
        self.live_buffer: list[bytes] | None = None
        self.outgoing: list[bytes] = []
        self._flush_scheduled = False
        self.sync_requested = False
        self.synchronized_with_live = False
        self.peer_clean_shutdown = False
        self.failback_requested = False
        self.handing_over = False
        self.deferring = False  # handed over to the peer: let it activate, do not compete
        self.handed_over = False
        self.taking_over = False  # the peer handed over to us: keep trying until we serve
        self.activating = False
        self.force_activation = False
        self._said: set[str] = set()
        self._tasks: list[asyncio.Task] = []
        self._listener: asyncio.AbstractServer | None = None
        self.stopping = False
        if not self.witness_address:
            log.warning("No witness is configured: if the network splits the pair, both "
                        "servers may serve at once (split brain). Configure [ha] witness.")

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        host, port = split_address(self.server.config.listen)
        self._listener = await asyncio.start_server(self._accept, host, port,
                                                    reuse_address=True)
        log.info("HA channel listening on %s:%d (%s, role %s)", host, port, self.name, self.role)
        if self.role == "backup":
            self._tasks.append(loop.create_task(self._connect_loop()))
        self._tasks.append(loop.create_task(self._tick_loop()))
        if self.witness_address:
            self._tasks.append(loop.create_task(self._lease_loop()))

    async def stop(self) -> None:
        self.stopping = True
        cfg = self.server.config
        link = self.link
        if self.state.serving and link is not None:
            if cfg.failover_on_shutdown and self.backup_in_sync:
                await self._hand_over("shutting down (failover_on_shutdown = true)")
            else:
                link.send_json(ch.FAILBACK, {"phase": "shutdown"})
                await self._drain(link)
        if self.state.serving and self.witness_address and not self.handed_over:
            await self._witness_request({"op": "release", "keep_standby": False})
        for task in self._tasks:
            task.cancel()
        if self._listener is not None:
            self._listener.close()
        if self.link is not None:
            self.link.close()
        if self.witness is not None:
            self.witness.close()

    def _spawn(self, coro, what: str) -> None:
        """Run a background step; its failure is logged, never lost."""
        task = asyncio.get_running_loop().create_task(coro)

        def done(t: asyncio.Task) -> None:
            if not t.cancelled() and t.exception() is not None:
                log.error("HA step %r failed", what, exc_info=t.exception())

        task.add_done_callback(done)
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(task)

    # ------------------------------------------------------------ states

    def set_state(self, state: State, why: str = "") -> None:
        if state == self.state:
            return
        old, self.state = self.state, state
        log.info("Local server switched to %s%s (was %s)", state.value,
                 f": {why}" if why else "", old.value)
        self.server.state_changed(old, state)

    def _set_peer_state(self, state: State) -> None:
        if state == self.peer_state:
            return
        log.info("Old status of remote server = %s", self.peer_state.value)
        log.info("New status of remote server = %s", state.value)
        self.peer_state = state

    def _say_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._said:
            self._said.add(key)
            log.info(message, *args)

    @property
    def store(self):  # the store is replaced on every role change
        return self.server.store

    def hello(self) -> dict[str, Any]:
        store = self.store
        return {"name": self.name, "identity": self.identity, "role": self.role,
                "state": self.state.value,
                "epoch": store.epoch, "last_seq": store.appended_seq,
                "epochs": store.epochs, "stomp": self.server.client_address,
                "oldest": store.oldest_seq, "ts": time.monotonic(),
                "echo": self.peer_echo, "in_sync": self.synchronized_with_live}

    # ------------------------------------------------------------ confirmations

    def confirmable(self, local: int, current: int) -> int:
        """Up to which sequence receipts may go out now."""
        if not self.state.serving or self.handing_over or self.standalone_pending:
            return current
        now = time.monotonic()
        if self.witness_address and not (self.witness_lease.valid(now)
                                         or (self.backup_in_sync and self.peer_lease.valid(now))):
            return current
        if self.backup_in_sync and self.server.config.replication_mode == "sync":
            return min(local, self.backup_acked)
        return local

    # ------------------------------------------------------------ links

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            link = await accept_link(reader, writer, self.secret, self.hello(), self.activation)
        except (ch.ChannelError, OSError, TimeoutError, asyncio.IncompleteReadError) as e:
            log.warning("Refused HA connection from %s: %s", writer.get_extra_info("peername"),
                        e)
            writer.close()
            return
        self._adopt(link)

    async def _connect_loop(self) -> None:
        host, port = split_address(self.server.config.peer)
        while not self.stopping:
            if self.link is None:
                try:
                    link = await open_link(host, port, self.secret, self.hello(),
                                           self.activation)
                except ch.ChannelError as e:
                    self._say_once("refused", "HA connection to %s:%d refused: %s", host, port, e)
                except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
                    trace.debug("HA connection to %s:%d failed: %s", host, port, e)
                else:
                    self._adopt(link)
            await asyncio.sleep(self.heartbeat)

    def _adopt(self, link: Link) -> None:
        if self.link is not None:
            self.link.close()
        self.link = link
        self._said.discard("refused")
        self.peer = dict(link.hello)
        self.peer_clean_shutdown = False
        self.sync_requested = False
        log.info("Connected to remote server %s over the HA channel (%s)", self.peer.get("name"),
                 link.peer)
        self._set_peer_state(State(self.peer.get("state", "STARTING")))
        self._spawn(self._read_loop(link), "read the HA channel")
        self._send_heartbeat()
        self.decide()

    async def _read_loop(self, link: Link) -> None:
        reason = "closed"
        try:
            while True:
                kind, payload = await link.recv(self.activation)
                self._handle(link, kind, payload)
        except TimeoutError:
            reason = f"no heartbeat for {self.activation_ms} ms"
        except (ConnectionError, OSError, asyncio.IncompleteReadError) as e:
            reason = str(e) or type(e).__name__
        except ch.ChannelError as e:
            reason = f"protocol error: {e}"
            log.warning("HA channel with %s: %s", self.peer.get("name"), e)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("HA channel handler failed")
            reason = "internal error"
        finally:
            link.close()
        self._lost(link, reason)

    def _lost(self, link: Link, reason: str) -> None:
        if self.link is not link:
            return
        self.link = None
        self.deferring = False
        self.taking_over = False
        log.info("Lost the HA channel to %s: %s", self.peer.get("name"), reason)
        self._set_peer_state(State.DEAD)
        self.live_buffer = None
        self.outgoing.clear()
        self.sync_done_seq = None
        # Still PASSIVE (eligible, per the witness) but no longer receiving: not in sync.
        self.synchronized_with_live = False
        if self.state.serving:
            if self.backup_in_sync:
                self._backup_lost()
        elif self.state == State.SYNCING:
            self.set_state(State.WAITING, "lost the active server before being in sync")
        self.decide()

    def _send_heartbeat(self) -> None:
        if self.link is not None:
            self.link.send_json(ch.HEARTBEAT, self.hello())

    # ------------------------------------------------------------ messages

    def _handle(self, link: Link, kind: int, payload: bytes) -> None:
        if kind == ch.RECORDS:
            self._mirror(link, payload)
            return
        message = ch.decode_json(payload)
        if kind == ch.HEARTBEAT:
            self._on_heartbeat(message)
        elif kind == ch.ACK:
            self._on_ack(int(message["seq"]))
        elif kind == ch.SYNC:
            if "request" in message:
                self._spawn(self._serve_sync(link, message), "synchronise the backup")
            else:
                self._on_sync(message)
        elif kind == ch.SYNC_DONE:
            self.sync_done_seq = int(message["seq"])
            self._check_in_sync()
        elif kind == ch.HORIZON:
            if self.store.mirror:
                self.store.drop_below(int(message["seq"]))
        elif kind == ch.FAILBACK:
            self._on_failback(link, message)
        else:
            raise ch.ChannelError(f"unexpected message {ch.NAMES.get(kind, kind)}")

    def _on_heartbeat(self, message: dict[str, Any]) -> None:
        self.peer.update(message)
        self._set_peer_state(State(message.get("state", "STARTING")))
        now = time.monotonic()
        peer_serving = self.peer_state.serving
        if peer_serving:
            self.deferring = False
        if not self.state.serving and peer_serving:
            self.peer_echo = float(message.get("ts", 0))
            if self.state == State.PASSIVE:
                # My promise: I will not take over for an activation interval from now.
                self.promise_until = max(self.promise_until, now + self.activation)
        if self.state.serving and message.get("in_sync") and self.backup_in_sync:
            echo = float(message.get("echo", 0))
            if echo:
                self.peer_lease.granted(echo, self.activation_ms)
        if self.state.serving and peer_serving:
            self._split_brain_seen()
        self.decide()

    # ------------------------------------------------------------ decisions

    def decide(self) -> None:
        """Take the next safe step for the current situation; called on every event and tick."""
        if self.stopping or self.activating or self.handing_over:
            return
        if self.state.serving:
            self.taking_over = False
            return
        link = self.link
        store = self.store
        if self.taking_over and not (link is not None and self.peer_state.serving):
            self._activate("the active server handed over", force=True)
            return
        if link is not None:
            if self.peer_state.serving:
                if self.force_activation:
                    self.force_activation = False
                    log.warning("Forced activation cancelled: %s is serving, this server "
                                "synchronises from it", self.peer.get("name"))
                if not self.sync_requested:
                    self._request_sync(link)
                elif (self.state == State.PASSIVE and self.role == "primary"
                      and self.server.config.allow_failback and not self.failback_requested
                      and self.peer.get("role") == "backup"):
                    self.failback_requested = True
                    log.info("In sync with %s: asking to fail back (allow_failback = true)",
                             self.peer.get("name"))
                    link.send_json(ch.FAILBACK, {"phase": "request"})
                return
            if self.deferring:
                return
            if self.peer_state in (State.STARTING, State.WAITING, State.DEAD):
                won = elected(Standing(store.epoch, store.appended_seq, self.role == "primary"),
                              Standing.of_peer(self.peer))
                if self.witness_address:
                    # The witness is the pair's memory: the server it last granted activates
                    # (even if a reply got lost); the journals decide only on a new witness,
                    # or when the witness cannot be reached (the two servers agree).
                    self._activate("the witness names this server", query_first=True,
                                   won=won)
                elif won:
                    self._activate("the peer's journal is older")
                elif self.state == State.STARTING:
                    self.set_state(State.WAITING, f"{self.peer.get('name')} holds the newer "
                                                  "journal and should become active")
            return
        if self.state == State.PASSIVE:
            if self.peer_clean_shutdown:
                self.set_state(State.WAITING, "the active server stopped cleanly and "
                               "failover_on_shutdown is off: not taking over")
                return
            if time.monotonic() >= self.promise_until:
                self._activate("the active server is gone")
            return
        if self.state in (State.STARTING, State.WAITING):
            self._activate_alone()

    def _activate_alone(self) -> None:
        """Started (or left) alone: serve only if this journal is certainly the newest."""
        store = self.store
        fresh = self.role == "primary" and store.epoch == 0 and store.appended_seq == 0
        if self.force_activation:
            self._activate("an operator forced it", force=True)
            return
        if not self.witness_address:
            if fresh:
                self._activate("new pair, primary, empty journal")
            else:
                self.set_state(State.WAITING, "without a witness, a server alone cannot know "
                               "whether its journal is the newest (`pairmq activate` forces it)")
            return
        self._activate("alone: the witness decides", query_first=True, fresh=fresh)

    def _activate(self, why: str, *, force: bool = False, query_first: bool = False,
                  fresh: bool = False, won: bool = False) -> None:
        self.activating = True
        self._spawn(self._activation(why, force=force, query_first=query_first, fresh=fresh,
                                     won=won), "activate")

    def _may_activate(self, info: dict[str, Any], fresh: bool, won: bool) -> bool:
        """What the witness remembers decides who may serve without a serving peer."""
        holder, standby = info.get("holder"), info.get("standby")
        witness_epoch = int(info.get("epoch", 0))
        if holder == self.identity:
            return True  # the last server granted: nobody confirmed anything after it
        if holder is None and witness_epoch == 0:
            return fresh or won  # a new witness: the newest journal (or the new primary)
        if self.link is not None:
            return False  # the holder is reachable: it activates, we synchronise from it
        return standby == self.identity and witness_epoch >= self.store.epoch

    async def _activation(self, why: str, *, force: bool, query_first: bool,
                          fresh: bool, won: bool = False) -> None:
        try:
            store = self.store
            # Above both our journal's epoch and any the witness granted (a grant may have
            # gone unused: a server that crashed right after it, or gave it back).
            epoch = max(store.epoch, int(self.witness_info.get("epoch") or 0)) + 1
            if self.witness_address:
                if query_first and not force:
                    info = await self._witness_request({"op": "query"})
                    if info is None:
                        if won and self._peer_agrees():
                            await self._activate_with_peer(why)
                            return
                        peer = self.peer.get("name") if self.link is not None else None
                        self.set_state(State.WAITING, "cannot reach the witness" + (
                            f"; {peer} holds the newer journal and activates" if peer
                            else " or the peer"))
                        return
                    if not self._may_activate(info, fresh, won):
                        if self.state in (State.STARTING, State.WAITING):
                            self.set_state(State.WAITING,
                                           f"the witness says {info.get('holder')} was last "
                                           f"active in epoch {info.get('epoch')}: waiting for "
                                           "it rather than serving older data")
                        return
                requested = time.monotonic()
                reply = await self._witness_request({"op": "activate", "epoch": epoch,
                                                     "ms": self.activation_ms, "force": force})
                if reply is None or not reply.get("granted"):
                    reason = reply.get("reason") if reply else "the witness is unreachable"
                    if self.force_activation:
                        self._say_once(f"forced:{reason}", "Forced activation not granted "
                                       "yet (%s): trying again", reason)
                    trace.debug("Activation refused: %s", reason)
                    if self.state == State.STARTING:
                        self.set_state(State.WAITING, f"not activating: {reason}")
                    return
                self.witness_lease.granted(requested, self.activation_ms)
                self.handed_over = False  # a new grant: this server's lease is live again
            else:
                log.warning("Activating without a witness: nothing prevents split brain")
            if self.link is not None and self.peer_state.serving:
                # The peer came back serving meanwhile: give the lease back, sync from it.
                self.witness_lease.revoke()
                if self.witness_address:
                    await self._witness_request({"op": "release", "epoch": epoch,
                                                 "keep_standby": True})
                return
            await self.server.become_active(epoch)
            if self.witness_address:
                # Recovery may have outlasted the lease: renew before serving. Nobody else can
                # have taken it meanwhile (after our activation there is no standby).
                requested = time.monotonic()
                reply = await self._witness_request({"op": "renew", "standby": None,
                                                     "epoch": epoch})
                if reply is None or not reply.get("granted"):
                    reason = reply.get("reason") if reply else "the witness is unreachable"
                    log.error("Lease not renewed after recovery (%s): not serving", reason)
                    self._step_down(f"lease lost while recovering: {reason}")
                    return
                self.witness_lease.granted(requested, self.activation_ms)
            self.backup_in_sync = False
            self.backup_acked = 0
            self.synchronized_with_live = False
            self.failback_requested = False
            self.handed_over = False
            self.set_state(State.STANDALONE, f"{why}; epoch {epoch}")
            self._send_heartbeat()
        finally:
            # An operator's force outlives attempts that fail (or ran when it came in): it
            # ends when this server serves, or when it sees its peer serving (decide).
            self.activating = False
            if self.state.serving:
                self.force_activation = False

    def _peer_agrees(self) -> bool:
        """The peer is connected and serves nothing: it compares the same journals and so
        stays a backup (docs/ha.md, electing without the witness)."""
        return self.link is not None and self.peer_state in (State.STARTING, State.WAITING)

    async def _activate_with_peer(self, why: str) -> None:
        """The witness cannot be reached, but the peer is connected and agrees that this
        server holds the newest journal: serve. Receipts still wait for the lease or for the
        in-sync backup's promise (confirmable), so nothing is confirmed until the peer has
        synchronised from this server; a server that cannot see its peer never gets here."""
        epoch = max(self.store.epoch, int(self.peer.get("epoch", 0)),
                    int(self.witness_info.get("epoch") or 0)) + 1
        log.warning("Witness at %s unreachable: %s agrees that this server holds the newest "
                    "journal, activating without the witness (receipts wait for %s to be in "
                    "sync)", self.witness_address, self.peer.get("name"), self.peer.get("name"))
        await self.server.become_active(epoch)
        if not self._peer_agrees():
            self._step_down(f"{self.peer.get('name')} left or took over while this server "
                            "activated without the witness")
            return
        self.backup_in_sync = False
        self.backup_acked = 0
        self.synchronized_with_live = False
        self.failback_requested = False
        self.handed_over = False
        self.set_state(State.STANDALONE, f"{why}: elected with {self.peer.get('name')} while "
                                         f"the witness is unreachable; epoch {epoch}")
        self._send_heartbeat()

    def _split_brain_seen(self) -> None:
        """Both serving (a partition healed, or no witness): the higher epoch stays."""
        mine = (self.store.epoch, self.role == "primary")
        theirs = (int(self.peer.get("epoch", 0)), self.peer.get("role") == "primary")
        if theirs > mine:
            log.error("Both servers are serving: %s has epoch %s, higher than mine (%d). "
                      "Stepping down", self.peer.get("name"), self.peer.get("epoch"),
                      self.store.epoch)
            self._step_down("a server with a higher epoch is active")

    def _step_down(self, why: str) -> None:
        self.backup_in_sync = False
        self.standalone_pending = False
        self.witness_lease.revoke()
        self.peer_lease.revoke()
        self.sync_requested = False
        self.synchronized_with_live = False
        self.server.become_passive(why)
        self.set_state(State.WAITING, why)
        self.decide()

    # ------------------------------------------------------------ backup side

    def _request_sync(self, link: Link) -> None:
        store = self.store
        if not store.mirror:
            self.server.become_passive("the peer is active")
            store = self.store
        self.sync_requested = True
        self.synchronized_with_live = False
        self.sync_done_seq = None
        self.set_state(State.SYNCING, f"copying {self.peer.get('name')}'s journal")
        link.send_json(ch.SYNC, {"request": True, "epoch": store.epoch,
                                 "last_seq": store.appended_seq, "epochs": store.epochs})

    def _on_sync(self, message: dict[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        if message["mode"] == "full":
            log.info("Full synchronisation from %s: replacing the local journal (from seq %d)",
                     self.peer.get("name"), message["from"])
            self.store.wipe(int(message["from"]), loop)
            self.server.watch_mirror()
        else:
            log.info("Incremental synchronisation from %s from seq %d", self.peer.get("name"),
                     message["from"])

    def _mirror(self, link: Link, payload: bytes) -> None:
        store = self.store
        if not store.mirror:
            raise ch.ChannelError("records arrived but this server is not a backup")
        view = memoryview(payload)
        pos = 0
        hsize = RECORD_HEADER.size
        while pos < len(view):
            length, crc, seq, epoch, kind = RECORD_HEADER.unpack_from(view, pos)
            end = pos + hsize + length
            body = view[pos + hsize:end]
            if len(body) != length or zlib.crc32(body, zlib.crc32(
                    CRC_PART.pack(seq, epoch, kind))) != crc:
                raise ch.ChannelError(f"replicated record {seq} is damaged")
            if seq > store.appended_seq:
                if seq != store.appended_seq + 1:
                    raise ch.ChannelError(f"replication gap: got {seq} after "
                                          f"{store.appended_seq}")
                store.append_mirrored(seq, epoch, bytes(view[pos:end]))
            pos = end
        if self.server.config.backup_ack == "write":
            link.send_json(ch.ACK, {"seq": store.appended_seq})
            self._check_in_sync()

    def mirror_synced(self, seq: int) -> None:
        """The backup's journal reached the disk up to seq: acknowledge it."""
        if self.link is not None and self.server.config.backup_ack == "fsync":
            self.link.send_json(ch.ACK, {"seq": seq})
        self._check_in_sync()

    def _check_in_sync(self) -> None:
        target = self.sync_done_seq
        if target is None or self.state != State.SYNCING:
            return
        store = self.store
        have = store.synced_seq if self.server.config.backup_ack == "fsync" \
            else store.appended_seq
        if have >= target:
            self.synchronized_with_live = True
            self.promise_until = time.monotonic() + self.activation
            self.set_state(State.PASSIVE, f"synchronized with live server "
                                          f"{self.peer.get('name')} at seq {target}")
            self._send_heartbeat()
            self.decide()

    # ------------------------------------------------------------ active side

    async def _serve_sync(self, link: Link, request: dict[str, Any]) -> None:
        if not self.state.serving:
            return
        try:
            await asyncio.wait_for(self._sync(link, request), self.sync_timeout)
        except TimeoutError:
            log.warning("Synchronisation of %s took longer than "
                        "initial_replication_sync_timeout_ms: restarting it",
                        self.peer.get("name"))
            link.close()
        except (ConnectionError, OSError) as e:
            trace.debug("Synchronisation aborted: %s", e)
        finally:
            if self.link is not link:
                self.live_buffer = None

    async def _sync(self, link: Link, request: dict[str, Any]) -> None:
        store = self.store
        last = int(request.get("last_seq", 0))
        their_epochs = request.get("epochs") or []
        compatible = (0 < last <= store.appended_seq and last + 1 >= store.oldest_seq
                      and epoch_at(their_epochs, last) == epoch_at(store.epochs, last))
        first = last + 1 if compatible else store.oldest_seq
        upto = store.appended_seq
        self.backup_in_sync = False
        self.live_buffer = []
        link.send_json(ch.SYNC, {"mode": "incremental" if compatible else "full",
                                 "from": first, "to": upto})
        log.info("Synchronising %s: %s, records %d to %d", self.peer.get("name"),
                 "incremental" if compatible else "full copy", first, upto)
        if upto >= first:
            await self.server.synced(upto)
            store.hold_compaction += 1
            loop = asyncio.get_running_loop()
            try:
                for segment_id, path in store.segments_for(first):
                    records = await loop.run_in_executor(None, read_records, path, segment_id,
                                                         first, upto)
                    chunk: list[bytes] = []
                    size = 0
                    for record in records:
                        chunk.append(record)
                        size += len(record)
                        if size >= RECORDS_CHUNK:
                            link.send(ch.encode(ch.RECORDS, b"".join(chunk)))
                            chunk, size = [], 0
                            await link.drain()
                    if chunk:
                        link.send(ch.encode(ch.RECORDS, b"".join(chunk)))
                        await link.drain()
            finally:
                store.release_compaction()
        if self.link is not link:
            return
        buffered, self.live_buffer = self.live_buffer or [], None
        if buffered:
            link.send(ch.encode(ch.RECORDS, b"".join(buffered)))
        self.sync_done_seq = store.appended_seq
        link.send_json(ch.SYNC_DONE, {"seq": self.sync_done_seq})

    def on_append(self, seq: int, record: bytes) -> None:
        """The replication stream: every record the active appends goes to the backup."""
        if self.link is None or not self.state.serving:
            return
        if self.live_buffer is not None:
            self.live_buffer.append(record)
            return
        if self.sync_done_seq is None:
            return  # no synchronisation started: the backup will ask for what it lacks
        self.outgoing.append(record)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_records)

    def _flush_records(self) -> None:
        self._flush_scheduled = False
        if self.link is not None and self.outgoing:
            self.link.send(ch.encode(ch.RECORDS, b"".join(self.outgoing)))
        self.outgoing.clear()

    def _on_ack(self, seq: int) -> None:
        self.backup_acked = max(self.backup_acked, seq)
        if not self.backup_in_sync and self.sync_done_seq is not None \
                and seq >= self.sync_done_seq and self.state.serving:
            self.backup_in_sync = True
            self.peer_lease.revoke()
            log.info("Backup %s is synchronized with this server (seq %d)",
                     self.peer.get("name"), seq)
            self.set_state(State.ACTIVE, f"backup {self.peer.get('name')} is in sync")
            self._spawn(self._renew(), "renew the lease")
        self.server.update_confirmed()

    def _backup_lost(self) -> None:
        """Keep confirming alone only once the witness knows the backup is out of sync."""
        if not self.witness_address:
            self.backup_in_sync = False
            self.set_state(State.STANDALONE, "backup lost")
            self.server.update_confirmed()
            return
        self.standalone_pending = True
        self._spawn(self._renew(), "renew the lease")

    def _on_failback(self, link: Link, message: dict[str, Any]) -> None:
        phase = message.get("phase")
        if phase == "request" and self.state.serving and self.backup_in_sync:
            self._spawn(self._hand_over(f"failing back to {self.peer.get('name')}"), "fail back")
        elif phase == "go" and not self.state.serving:
            log.info("%s handed over at seq %s: taking over", self.peer.get("name"),
                     message.get("seq"))
            self.promise_until = 0.0
            self.peer_clean_shutdown = False
            self.taking_over = True  # retried every tick until the witness grants it
            self._activate("the active server handed over", force=True)
        elif phase == "shutdown":
            self.peer_clean_shutdown = True

    async def _hand_over(self, why: str) -> None:
        """Failback or failover on shutdown: stop serving, let the backup catch up, hand over."""
        link = self.link
        if link is None:
            return
        self.handing_over = True
        try:
            log.info("Handing over to %s: %s", self.peer.get("name"), why)
            self.server.close_clients(f"this server is handing over to "
                                      f"{self.peer.get('stomp')} ({why})",
                                      self.peer.get("stomp"))
            self.server.persist()
            target = self.store.appended_seq
            deadline = time.monotonic() + self.sync_timeout
            while self.backup_acked < target and time.monotonic() < deadline:
                if self.link is not link:
                    return
                await asyncio.sleep(self.heartbeat / 10)
            if self.backup_acked < target:
                log.warning("Hand-over abandoned: the backup did not confirm seq %d", target)
                return
            if self.witness_address:
                await self._witness_request({"op": "release", "keep_standby": True})
            self.witness_lease.revoke()
            self.handed_over = True
            link.send_json(ch.FAILBACK, {"phase": "go", "seq": target})
            await self._drain(link)
            if not self.stopping:
                self.deferring = True
                self._step_down(why)
        finally:
            self.handing_over = False

    # ------------------------------------------------------------ witness

    async def _witness_request(self, request: dict[str, Any]) -> dict[str, Any] | None:
        if not self.witness_address:
            return None
        request = {"name": self.identity, "epoch": self.store.epoch, "ms": self.activation_ms,
                   **request}
        async with self._witness_lock:
            if request.get("op") == "renew" and (self.handing_over or self.handed_over):
                return None  # a renewal queued behind a release must not revive the lease
            for _ in range(2):
                try:
                    if self.witness is None or self.witness.closed:
                        host, port = split_address(self.witness_address)
                        self.witness = await open_link(host, port, self.secret,
                                                       {"name": self.name}, self.heartbeat)
                        self._said.discard("witness")
                    self.witness.send_json(ch.LEASE, request)
                    reply = await self.witness.recv_json(ch.LEASE_REPLY, self.heartbeat)
                    self.witness_info = reply
                    return reply
                except ch.ChannelError as e:
                    self._say_once("witness", "Witness at %s refused: %s",
                                   self.witness_address, e)
                except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
                    trace.debug("Witness request failed: %s", e)
                if self.witness is not None:
                    self.witness.close()
                    self.witness = None
            self._say_once("witness", "Cannot reach the witness at %s", self.witness_address)
            return None

    async def _renew(self) -> None:
        """Renew the lease, declaring whether the backup is in sync."""
        if not self.state.serving or not self.witness_address:
            return
        standby = self.peer.get("identity") if self.backup_in_sync and not \
            self.standalone_pending else None
        requested = time.monotonic()
        reply = await self._witness_request({"op": "renew", "standby": standby})
        if reply is None:
            return
        if reply.get("granted"):
            self.witness_lease.granted(requested, self.activation_ms)
            if self.standalone_pending and reply.get("standby") is None:
                self.standalone_pending = False
                self.backup_in_sync = False
                self.set_state(State.STANDALONE, "backup lost; the witness knows")
            self.server.update_confirmed()
        elif reply.get("holder") != self.identity and reply.get("holder") in (None, standby) \
                and not reply.get("remaining_ms"):
            # The witness was away (restarted without its memory, or the pair elected this
            # server while it was unreachable): nobody else holds a lease, and the server it
            # last knew as active, if any, is this server's in-sync backup.
            await self._adopt_witness(reply, standby)
        elif int(reply.get("epoch", 0)) > self.store.epoch:
            log.error("The witness says epoch %s is active (mine is %d): stepping down",
                      reply.get("epoch"), self.store.epoch)
            self._step_down("the pair moved on to a higher epoch")

    async def _adopt_witness(self, reply: dict[str, Any], standby: str | None) -> None:
        """Tell a witness that does not know this server as active that it is, at an epoch
        above any the witness granted (journaled, and so replicated, first)."""
        witness_epoch = int(reply.get("epoch", 0))
        if self.store.epoch <= witness_epoch:
            self.store.begin_epoch(witness_epoch + 1)
        requested = time.monotonic()
        answer = await self._witness_request({"op": "adopt", "standby": standby})
        if answer is not None and answer.get("granted"):
            self.witness_lease.granted(requested, self.activation_ms)
            log.info("The witness at %s knows this server as active again (epoch %d, in-sync "
                     "backup %s)", self.witness_address, self.store.epoch, standby)
            self.server.update_confirmed()
        elif answer is not None:
            self._say_once(f"adopt:{answer.get('reason')}", "The witness at %s does not take "
                           "this server as active: %s", self.witness_address,
                           answer.get("reason"))

    # ------------------------------------------------------------ ticks

    async def _tick_loop(self) -> None:
        """Heartbeats and decisions; never waits on the witness, which has its own loop."""
        while not self.stopping:
            try:
                self._tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("HA tick failed")
            await asyncio.sleep(self.heartbeat)

    async def _lease_loop(self) -> None:
        while not self.stopping:
            started = time.monotonic()
            try:
                if self.state.serving:
                    await self._renew()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("Lease renewal failed")
            await asyncio.sleep(max(0.0, self.heartbeat - (time.monotonic() - started)))

    def _tick(self) -> None:
        self._send_heartbeat()
        if self.state.serving:
            if self.link is not None and self.sync_done_seq is not None:
                self.link.send_json(ch.HORIZON, {"seq": self.store.oldest_seq})
            now = time.monotonic()
            # Without lease and promise, confirmations are frozen (confirmable). Give up
            # serving only once that has lasted another activation interval: a late tick on a
            # busy machine must not cost a failover; a refusal from the witness steps down
            # at once (_renew).
            valid_until = max(self.witness_lease.valid_until,
                              self.peer_lease.valid_until if self.backup_in_sync else 0.0)
            # A peer still connected and not serving cannot take over (it synchronises from
            # this server), so only a server that lost its peer too gives up; it confirms
            # nothing meanwhile unless it holds the lease or the promise (confirmable).
            attached = self.link is not None and not self.peer_state.serving
            if self.witness_address and now > valid_until + self.activation and not attached \
                    and not self.activating and not self.handing_over:
                log.error("Lost the witness lease and the backup's promise: not serving any more")
                self._step_down("lost both the witness and the backup")
            self.server.update_confirmed()
        self.decide()

    async def _drain(self, link: Link) -> None:
        try:
            await asyncio.wait_for(link.drain(), self.activation)
        except (OSError, TimeoutError):
            pass

    # ------------------------------------------------------------ management

    def status(self) -> dict[str, Any]:
        store = self.store
        return {
            "name": self.name, "identity": self.identity, "role": self.role,
            "state": self.state.value,
            "epoch": store.epoch, "appended_seq": store.appended_seq,
            "synced_seq": store.synced_seq, "confirmed_seq": self.server.confirmed_seq,
            "synchronized-with-backup": bool(self.state.serving and self.backup_in_sync),
            "synchronized-with-live": bool(not self.state.serving
                                           and self.synchronized_with_live),
            "peer": {"name": self.peer.get("name"), "state": self.peer_state.value,
                     "stomp": self.peer.get("stomp"), "epoch": self.peer.get("epoch")},
            "witness": {"address": self.witness_address or None,
                        "lease_valid": self.witness_lease.valid(time.monotonic()),
                        "holder": (self.witness_info.get("holder") or "").partition("#")[0]
                        or None,
                        "holder_identity": self.witness_info.get("holder")},
        }

    def force(self) -> str | None:
        """`pairmq activate`: an operator says this server's journal is the one to serve.
        Only a server that cannot decide (WAITING, STARTING) takes the order; the reason
        otherwise."""
        if self.state in (State.SYNCING, State.PASSIVE):
            active = self.active_address()
            return (f"this server is {self.state.value}, a backup of the active server"
                    f"{f' at {active}' if active else ''}: forcing is for a WAITING server")
        if not self.state.serving:
            self.force_activation = True
            self.decide()
        return None

    # ------------------------------------------------------------ what clients are told

    def active_address(self) -> str | None:
        """The peer's STOMP address while it serves (where clients should go)."""
        return self.peer.get("stomp") if self.peer_state.serving else None

    def topology(self, own: str) -> str:
        peer = self.peer.get("stomp")
        return f"{own},{peer}" if peer else own



def _node_id(data_dir: Path) -> str:
    path = data_dir / "node-id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        data_dir.mkdir(parents=True, exist_ok=True)
        node_id = secrets.token_hex(4)
        path.write_text(node_id + "\n")
        return node_id
