"""Colocated backups (docs/cluster.md, "Colocated backups"): a live asks the cluster for a
backup, a member with room hosts one. Two pure parts, fed what the members publish in
their statuses and time, returning what to publish and do; the driver
(server/cluster/colocated.py) looks, acts and feeds them again.

The live's side is `BackupRequest`, one transition table:

- NOT_WANTED: `request_backup` is off.
- ASKING: it names one member in its status (`backup_ask`); that member starts a backup
  for it, or says it has no room. No answer within the retry interval, or a refusal, and
  the next member is asked; each ask is a try (and so is a look that finds every member
  full, after which it waits the retry interval unless one has room again); past
  `backup_request_retries` tries it gives up (-1: never). No member reachable at all is
  no try. The first ask of a live that starts waits (up to the retry interval) until
  every member it knows is reachable: members starting together then see each other and
  form the ring below.
- STARTING: the member lists it among the backups it hosts; the backup dials this live's
  HA channel. No link within `start_s` and it asks again (the member is counted as
  refusing for that round).
- BACKED_UP: the HA link to the backup is up.
- GIVEN_UP: no member had room within the tries; it says so, and serves on without a
  backup. A backup that dials it anyway takes it to BACKED_UP.

A link that ends (the machine hosting the backup died) counts for `lost_s` before the live
says it has no backup and asks again: a backup that merely reconnects does not move.

Why one member at a time: two members both starting a backup for one live would race for
its HA channel, one of them to copy the journal for nothing. Naming the member in the
live's status makes the choice the live's alone; a member starts a backup only for a live
that names it, and stops one only when that live names another member (never because the
live went silent: a silent live may be dead, and its backup is then about to serve).

The host's side is `hosting_plan`: which asks it takes, which it refuses, which backups it
stops.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum


class RequestPhase(StrEnum):
    NOT_WANTED = "not_wanted"
    ASKING = "asking"
    STARTING = "starting"
    BACKED_UP = "backed_up"
    GIVEN_UP = "given_up"


@dataclass(frozen=True)
class Candidate:
    """Another member, as its last status says."""

    member: str
    hosting_me: bool  # it lists this live among the backups it hosts
    refusing_me: str | None  # why it did not take this live's ask (None: it did not refuse)
    room: bool  # it hosts fewer backups than its max_backups
    hosted: int  # backups it hosts now


@dataclass(frozen=True)
class RequestView:
    me: str  # this live's member name
    now: float  # s, monotonic
    linked: bool  # the HA channel to a backup is up
    candidates: tuple[Candidate, ...]  # the colocated members reachable now
    unreachable: int = 0  # other members known and not reachable (yet)


@dataclass(frozen=True)
class RequestLimits:
    retries: int  # asks before giving up (-1: never)
    retry_s: float  # how long an ask waits for its answer
    start_s: float = 60.0  # a member that took the ask: how long until its backup dials
    lost_s: float = 2.0  # a link down this long: the backup is gone


@dataclass(frozen=True)
class BackupRequest:
    phase: RequestPhase
    member: str | None = None  # asked, starting, or hosting this live's backup
    since: float = 0.0  # the current phase began (s, monotonic)
    tries: int = 0  # asks made since the live last had a backup
    problem: str | None = None
    # members that refused (or never answered) this round, asked again only after all
    passed: frozenset[str] = field(default_factory=frozenset)
    unlinked_since: float | None = None  # BACKED_UP: the link ended then

    @staticmethod
    def start(wanted: bool, now: float) -> BackupRequest:
        return BackupRequest(RequestPhase.ASKING if wanted else RequestPhase.NOT_WANTED,
                             since=now)

    @property
    def asking(self) -> str | None:
        """The member this live names in its status (`backup_ask`)."""
        if self.phase in (RequestPhase.ASKING, RequestPhase.STARTING,
                          RequestPhase.BACKED_UP):
            return self.member
        return None

    def status(self) -> dict[str, object]:
        return {"phase": self.phase.value, "member": self.member, "tries": self.tries,
                "problem": self.problem}


def step(r: BackupRequest, view: RequestView, limits: RequestLimits
         ) -> tuple[BackupRequest, list[str]]:
    """The next state, and what to log (plain words, one line each)."""
    now = view.now
    if r.phase is RequestPhase.NOT_WANTED:
        return r, []
    by_name = {c.member: c for c in view.candidates}
    if view.linked and r.phase is not RequestPhase.BACKED_UP:
        host = next((c.member for c in view.candidates if c.hosting_me), r.member)
        where = f" on member {host}" if host else ""
        return (BackupRequest(RequestPhase.BACKED_UP, host, now, 0),
                [f"This live has a backup{where}"])
    if r.phase is RequestPhase.BACKED_UP:
        if view.linked:
            host = r.member or next((c.member for c in view.candidates if c.hosting_me), None)
            if r.unlinked_since is None and host == r.member:
                return r, []
            return replace(r, member=host, unlinked_since=None), []
        since = now if r.unlinked_since is None else r.unlinked_since
        if now - since < limits.lost_s:
            return replace(r, unlinked_since=since), []
        where = f" (hosted by member {r.member})" if r.member else ""
        lost = BackupRequest(RequestPhase.ASKING, None, now, 0,
                             passed=frozenset({r.member}) if r.member else frozenset())
        nxt, lines = _ask(lost, view.me, by_name, now, limits)
        return nxt, [f"This live lost its backup{where}: it carries on without a backup "
                     "and asks the cluster for another", *lines]
    if r.phase is RequestPhase.GIVEN_UP:
        return r, []
    if r.phase is RequestPhase.STARTING:
        hosting = by_name.get(r.member or "")
        if hosting is not None and hosting.hosting_me and now - r.since < limits.start_s:
            return r, []
        if hosting is None and now - r.since < limits.start_s:
            return r, []  # not reachable right now: it may be restarting the backup
        why = "stopped hosting it" if hosting is not None and not hosting.hosting_me else \
            f"had no backup dial in within {limits.start_s:g} s"
        nxt = replace(r, phase=RequestPhase.ASKING, member=None, since=now,
                      passed=r.passed | {r.member or ""})
        nxt, lines = _ask(nxt, view.me, by_name, now, limits)
        return nxt, [f"Member {r.member} {why}", *lines]
    # ASKING
    if r.tries == 0 and r.member is None and view.unreachable and \
            now - r.since < limits.retry_s:
        # the first ask of a live that starts: the members that start with it are waited
        # for (up to the retry interval), so that the ring order sees them all
        return replace(r, problem="waiting for the other members to be reachable"), []
    asked = by_name.get(r.member or "") if r.member else None
    if asked is not None and asked.hosting_me:
        return (replace(r, phase=RequestPhase.STARTING, since=now, problem=None),
                [f"Member {r.member} starts a backup for this live"])
    if r.member is not None and asked is not None and asked.refusing_me is None \
            and now - r.since < limits.retry_s:
        return r, []  # asked, no answer yet
    if r.member is None and r.tries > 0 and now - r.since < limits.retry_s and \
            not any(c.room for c in view.candidates):
        return r, []  # no member had room and none has now: wait the retry interval
    lines = []
    if r.member is not None:
        why = asked.refusing_me if asked is not None and asked.refusing_me else \
            "no answer"
        lines.append(f"Member {r.member} did not take the backup request: {why}")
        r = replace(r, passed=r.passed | {r.member}, member=None)
    nxt, more = _ask(r, view.me, by_name, now, limits)
    return nxt, lines + more


def _ask(r: BackupRequest, me: str, by_name: dict[str, Candidate], now: float,
         limits: RequestLimits) -> tuple[BackupRequest, list[str]]:
    """Ask the next member with room, or give up. The one hosting fewest backups first;
    among equals, the next after this live in the ring of member names: lives that ask at
    once then each ask a different member (m0 asks m1, m1 asks m2, m2 asks m0), where
    "the first by name" would have two of them ask each other and the third find none."""
    if not by_name:  # nobody to ask is not a try: the first member reachable is asked
        return replace(r, phase=RequestPhase.ASKING, member=None,
                       problem="no other member reachable"), []
    if limits.retries >= 0 and r.tries >= limits.retries + 1:
        why = (f"no member took a backup request in {r.tries} tries "
               f"(backup_request_retries = {limits.retries}): this live serves without a backup")
        return (BackupRequest(RequestPhase.GIVEN_UP, None, now, r.tries, why),
                [why])
    fresh = [c for c in by_name.values() if c.room and c.member not in r.passed]
    if not fresh and r.passed:  # every member passed this round: a new round
        r = replace(r, passed=frozenset())
        fresh = [c for c in by_name.values() if c.room]
    if not fresh:  # a try: asked of the members, none has room
        return replace(r, member=None, since=now, tries=r.tries + 1,
                       problem="no member has room for a backup"), []
    ring = sorted({me, *by_name})
    choice = min(fresh, key=lambda c: (c.hosted,
                                       (ring.index(c.member) - ring.index(me)) % len(ring)))
    return (replace(r, phase=RequestPhase.ASKING, member=choice.member, since=now,
                    tries=r.tries + 1, problem=None),
            [f"Asking member {choice.member} to host a backup for this live"])


@dataclass(frozen=True)
class Ask:
    """A live's `backup_ask`, as a host reads it."""

    live: str  # the live's member name
    member: str  # the member it asks
    ha: str  # the live's HA channel, which the backup dials
    server: str  # the live's server name
    group: str  # its pair's group (etcd keys)


@dataclass(frozen=True)
class HostingPlan:
    start: tuple[Ask, ...]
    refuse: dict[str, str]  # live -> why
    stop: tuple[str, ...]  # lives whose backups stop here


def hosting_plan(me: str, asks: tuple[Ask, ...], hosted: frozenset[str],
                 max_backups: int) -> HostingPlan:
    """What a host does with the asks it sees: it starts a backup for each live that names
    it while it has room, refuses the rest, and stops the backup of a live that now names
    another member. `hosted`: the lives it hosts a backup for."""
    start, refuse, stop = [], {}, []
    count = len(hosted)
    for ask in sorted(asks, key=lambda a: a.live):
        if ask.member != me:
            if ask.live in hosted and ask.member:
                stop.append(ask.live)
                count -= 1
            continue
        if ask.live in hosted:
            continue
        if count >= max_backups:
            refuse[ask.live] = f"member {me} hosts {count} of max_backups = {max_backups}"
            continue
        start.append(ask)
        count += 1
    return HostingPlan(tuple(start), refuse, tuple(stop))
