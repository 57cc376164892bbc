"""The pair's lease kept in etcd, deterministic: time is an argument, etcd is the caller's.

With `[ha] witness = "etcd://..."` no process of ours answers the lease requests: each
server answers its own, against one record in etcd that only a compare-and-swap on its
revision changes. The rules are the witness's (`WitnessLeases`, ha/lease.py), run on the
record as this server last read it; the lease's time is each server's own observation.

Why it is safe (docs/ha.md, "The lease on etcd"):

- **One history of the record.** A server writes the record only in a transaction that
  compares its `mod_revision` with the revision its decision was taken on. etcd is
  linearizable: of two decisions taken on the same revision, one commits and the other
  fails (and reads the record anew, then decides again). So the records form one
  sequence, each decided on its predecessor, as the witness's state does; a request that
  commits late (sent, given up on by its server, applied after) was decided on a revision
  that is gone, and fails. The revision is the fencing token: nothing written on an old
  revision survives a newer one.
- **Time without a shared clock.** The holder counts its lease from the moment it *sent*
  the renewal, shortened by DRIFT (ha/lease.py `LeaseView`): it stops before the write
  that renewed it was even committed plus `ms`. Another server counts `ms` from when it
  first *received* that revision of the record, which is after the commit. It may take
  over only by a write on that revision, and the holder extends its lease only by a write
  too, which changes the revision and makes the taking-over fail. So the holder has
  stopped confirming before another server may write that it holds the lease.
- **etcd's own leases are not used.** A new etcd leader extends every lease it inherits
  (a dead holder keeps one for longer than its TTL) and a TTL is whole seconds, at least
  the leader's election time: both would only make failover slower. Nothing here depends
  on when etcd thinks a lease ends; its clock is never read.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pairmq.ha.lease import WitnessLeases, answer

FORMAT = 1  # the record's layout; a newer one is refused by name
ATTEMPTS = 4  # decisions per request: one per revision found changed under it


class RecordError(Exception):
    """The record under the pair's prefix is not this pair's: the message says why."""


def prefix(group: str) -> str:
    """The keys of one pair (`[ha] group`): several pairs share one etcd cluster."""
    return f"/pairmq/pairs/{group}/"


def record_key(group: str) -> str:
    return prefix(group) + "lease"


def fingerprint(group: str, secret: str) -> str:
    """Names the pair without giving its secret away: another pair configured with the
    same group (a copied configuration) has another secret, and is refused by name."""
    return hmac.new(secret.encode(), group.encode(), hashlib.sha256).hexdigest()[:16]


@dataclass(frozen=True)
class Record:
    """The pair's lease as etcd keeps it: the witness's state, without its clock."""

    group: str
    pair: str  # fingerprint(group, secret)
    holder: str | None = None
    epoch: int = 0
    standby: str | None = None
    ms: int = 0  # the lease the holder last asked for, counted by each reader
    released: bool = False  # the holder gave it back: nobody need wait
    orders: dict[str, list[int]] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return json.dumps({"format": FORMAT, "group": self.group, "pair": self.pair,
                           "holder": self.holder, "epoch": self.epoch,
                           "standby": self.standby, "ms": self.ms,
                           "released": self.released, "orders": self.orders},
                          separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes, key: str) -> Record:
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise RecordError(f"etcd key {key} is not a pairmq lease record ({e}): another "
                              "program writes under this pair's prefix") from None
        if not isinstance(data, dict) or not isinstance(data.get("format"), int):
            raise RecordError(f"etcd key {key} is not a pairmq lease record")
        if data["format"] > FORMAT:
            raise RecordError(f"etcd key {key} has lease record format {data['format']}, "
                              f"newer than this server's ({FORMAT}): upgrade this server")
        try:
            orders = {str(k): [int(x) for x in v] for k, v in data.get("orders", {}).items()}
            return cls(group=str(data["group"]), pair=str(data["pair"]),
                       holder=_opt_str(data.get("holder")), epoch=int(data["epoch"]),
                       standby=_opt_str(data.get("standby")), ms=int(data["ms"]),
                       released=bool(data.get("released", False)), orders=orders)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise RecordError(f"etcd key {key} is not a pairmq lease record "
                              f"(field {e})") from None


def _opt_str(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError("holder")
    return value


@dataclass(frozen=True)
class Seen:
    """One revision of the record, as this server saw it: `seen_at` is when it first
    received that revision (its monotonic clock), which is after etcd committed it."""

    record: Record | None
    revision: int  # the key's mod_revision; 0: there is no record yet
    seen_at: float


class Stage(Enum):
    """What the session needs next from etcd (the caller does it, then feeds the result)."""

    READ = "read"  # the record, linearizable
    WRITE = "write"  # a transaction: if mod_revision == `compare`, put `value`; else read
    DONE = "done"  # `reply` is the answer


@dataclass(frozen=True)
class Next:
    stage: Stage
    compare: int = 0
    value: bytes = b""
    reply: dict[str, Any] | None = None


class LeaseSession:
    """One server's lease requests against the record: sans-IO, one request at a time.

    `begin(request, now)` says what to do first; the caller feeds what etcd said
    (`read`, `wrote`, `write_failed`) and gets the next step, until DONE. It keeps the
    revision it last saw between requests, so a renewal is one transaction."""

    def __init__(self, group: str, pair: str) -> None:
        self.group = group
        self.pair = pair
        self.key = record_key(group)
        self.seen: Seen | None = None
        self._request: dict[str, Any] = {}
        self._attempts = 0
        self._write: Record | None = None
        self._reply: dict[str, Any] | None = None

    def begin(self, request: dict[str, Any], now: float) -> Next:
        self._request = request
        self._attempts = 0
        if self.seen is None or request.get("op") != "renew":
            return Next(Stage.READ)  # a renewal is decided on the revision it last wrote
        return self._decide(now)

    def read(self, raw: bytes | None, revision: int, now: float) -> Next:
        """The record as etcd holds it (None, revision 0: none yet). RecordError: the
        record is not this pair's."""
        self._saw(raw, revision, now)
        return self._decide(now)

    def wrote(self, revision: int, now: float) -> Next:
        """The transaction committed at `revision`: the decision stands."""
        assert self._write is not None and self._reply is not None
        self.seen = Seen(self._write, revision, now)
        return Next(Stage.DONE, reply=self._reply)

    def write_failed(self, raw: bytes | None, revision: int, now: float) -> Next:
        """The record changed under the decision (the transaction's failure branch read
        it): decide again on what it is now. Unless it is this very write, committed by an
        earlier try of the same transaction whose answer was lost (the bytes carry the
        request's order number: no other request writes them)."""
        if self._write is not None and raw == self._write.to_bytes():
            return self.wrote(revision, now)
        return self.read(raw, revision, now)

    def observe(self, raw: bytes | None, revision: int, now: float) -> None:
        """The record as read between requests (a server reads it every heartbeat, so that
        when it needs to take over it has counted the holder's lease since about when the
        holder last renewed it). Any read will do, even a stale member's: a revision is
        only ever seen after etcd committed it. One older than the revision seen already
        (a lagging member) changes nothing."""
        if self.seen is not None and revision < self.seen.revision:
            return
        self._saw(raw, revision, now)

    def _saw(self, raw: bytes | None, revision: int, now: float) -> None:
        if self.seen is not None and self.seen.revision == revision:
            return  # still the revision seen before: it is counted from then
        record = None if raw is None else Record.from_bytes(raw, self.key)
        if record is not None:
            if record.group != self.group:
                raise RecordError(f"etcd key {self.key} holds the lease of group "
                                  f"{record.group!r}, not {self.group!r}")
            if record.pair != self.pair:
                raise RecordError(f"etcd key {self.key} belongs to another pair with group "
                                  f"{self.group!r} (its [ha] secret differs): give each "
                                  "pair its own [ha] group")
        self.seen = Seen(record, revision, now)

    def _decide(self, now: float) -> Next:
        seen = self.seen
        assert seen is not None
        self._attempts += 1
        request = self._request
        leases = _leases(seen)
        reply = answer(leases, request, now)
        op = request.get("op")
        if self._attempts > ATTEMPTS:
            return Next(Stage.DONE, reply={**reply, "granted": False,
                                           "reason": "the lease record kept changing"})
        if op == "query" or not reply["granted"] or (
                op == "release" and (seen.record is None
                                     or seen.record.holder != request.get("name"))):
            return Next(Stage.DONE, reply=reply)
        self._write = Record(self.group, self.pair, leases.holder, leases.epoch,
                             leases.standby, int(request.get("ms", 0)), op == "release",
                             dict(leases.orders))
        self._reply = reply
        return Next(Stage.WRITE, compare=seen.revision, value=self._write.to_bytes())


def _leases(seen: Seen) -> WitnessLeases:
    """The witness's state as this server may assume it: the holder's lease runs `ms`
    from when this server first saw the revision that granted or renewed it."""
    record = seen.record
    if record is None:
        return WitnessLeases()
    expires = seen.seen_at if record.released else seen.seen_at + record.ms / 1000
    return WitnessLeases(record.holder, record.epoch, expires, record.standby, record.ms,
                         dict(record.orders))
