"""Which server to try next, and when: pure decisions on the times the caller reports.

A *round* tries every known server once, at once one after the other: a refused TCP
connection or a refusing server (the ERROR of a PASSIVE or WAITING server) moves to the
next one without waiting. A refusal that names the active server (`active-server`) puts
that server first among those left in the round. Only after a round in which every server
refused does the client wait: `retry_interval`, then that times `retry_interval_multiplier`
after each further round, up to `max_retry_interval`. A round starts with the server the
last refusal named, then the one the client was last connected to, then the others in the
order of the URL, then those the pair's `topology` header added.

With a cluster URL (client/members.py) the rounds go over one *member's* servers, with the
rules above. When no server of the member answered in a round (each connection failed or
broke before a word from the server), the next round goes to the next member, in the URL's
order, wrapping around; a server that answers, even to refuse (a backup not serving yet),
keeps the client on its member, whose data it holds. A round that moves on to a member not
tried since the last round counted is not counted against `rounds`: one round over a cluster
is a pass over its members.
"""

from __future__ import annotations

from collections import deque

from pairmq.client.members import Member, member_url, merge_members, parse_member_list
from pairmq.client.options import Address, ClientOptions


def parse_host_port(text: str) -> Address | None:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host, int(port)


class Servers:
    """The servers this client knows, and which it prefers: those of its current member.
    A URL that is not a cluster: URL is one member, the pair (or the one server)."""

    def __init__(self, servers: tuple[Address, ...], members: tuple[Member, ...] = (),
                 start: int = 0, tls: bool = False) -> None:
        """`members`: a cluster URL's (client/members.py), `start` the index of the one to
        begin with; without them, `servers` are the one member."""
        self.cluster = bool(members)
        self.members: list[list[Address]] = [list(m) for m in members or (servers,)]
        self.member = start  # index of the current member in `members`
        self.tls = tls  # the transport the client uses: learned members must match it
        self.cluster_name: str | None = None  # CONNECTED's `cluster-name`, once told
        self.hint: Address | None = None  # the last active-server named by a refusal
        self.current: Address | None = None  # connected to, or last connected to

    @property
    def known(self) -> list[Address]:
        """The current member's servers (refusals' hints and `topology` add to them)."""
        return self.members[self.member]

    def everyone(self) -> list[Address]:
        """Every server of every member, for the messages that list them."""
        return list(dict.fromkeys(a for servers in self.members for a in servers))

    def learn(self, topology: str) -> None:
        """A CONNECTED frame's `topology` header: both servers of the pair."""
        for part in topology.split(","):
            address = parse_host_port(part)
            if address is not None and address not in self.known:
                self.known.append(address)

    def learn_members(self, text: str) -> int:
        """A CONNECTED frame's `cluster-members` header: the members not known are added
        (after those of the URL); returns how many."""
        return merge_members(self.members, parse_member_list(text, self.tls))

    def named(self, text: str | None) -> Address | None:
        """An `active-server` hint: remembered, and added to the known servers."""
        address = parse_host_port(text) if text else None
        if address is not None:
            self.hint = address
            if address not in self.known:
                self.known.append(address)
        return address

    def order(self) -> list[Address]:
        known = self.known
        first = [a for a in (self.hint, self.current) if a is not None and a in known]
        return list(dict.fromkeys(first + known))

    def redirect(self, text: str) -> int | None:
        """An ERROR's `scaled-down-to`: the member that took the messages of the one this
        client was on (docs/cluster.md, Scale-down). It joins the known members and is the
        current one from now on; returns its index (None: unreadable, nothing changes)."""
        found = parse_member_list(text, self.tls)
        if not found:
            return None
        merge_members(self.members, found[:1])
        target = next(i for i, servers in enumerate(self.members) if found[0][0] in servers)
        self.move_to(target)
        return target

    def next_member(self) -> int:
        """The member after the current one, in the URL's order (the first after the last)."""
        return (self.member + 1) % len(self.members)

    def move_to(self, member: int) -> None:
        """Rounds go to `member` now; the old member's hint means nothing there."""
        self.member = member
        self.hint = None

    def member_url(self, member: int | None = None) -> str:
        """A member (the current one by default) as a URL, for events and messages."""
        return member_url(self.members[self.member if member is None else member], self.tls)


class Attempts:
    """The plan of connection attempts after a failure (or at the first connect)."""

    def __init__(self, servers: Servers, options: ClientOptions, rounds: int,
                 now: float) -> None:
        """`rounds`: how many rounds before giving up (-1: no end)."""
        self.servers = servers
        self.rounds = rounds
        self.rounds_left = rounds
        self.interval = options.retry_interval / 1000
        self.multiplier = options.retry_interval_multiplier
        self.max_interval = options.max_retry_interval / 1000
        self.started = now
        self._round: deque[Address] = deque()
        self._tried: set[Address] = set()
        self._answered = False  # a server of this round answered (if only to refuse)
        self._pass: set[int] = set()  # members tried since the last round counted
        self._not_before = now
        self.tries = 0
        self.refusals: list[str] = []  # what each server said, for the final error
        self._start_round(now, wait=False)

    def _start_round(self, now: float, wait: bool) -> bool:
        servers = self.servers
        member = servers.member
        if wait and not self._answered:  # the member is out of reach: try the next one
            member = servers.next_member()
        if member == servers.member or member in self._pass:
            if self.rounds_left == 0:
                return False
            if self.rounds_left > 0:
                self.rounds_left -= 1
            self._pass = set()
        self._pass.add(member)
        if member != servers.member:
            servers.move_to(member)
        if wait:
            self._not_before = now + self.interval
            self.interval = min(self.interval * self.multiplier, self.max_interval)
        self._round = deque(servers.order())
        self._tried = set()
        self._answered = False
        return True

    def next(self, now: float) -> tuple[Address, float] | None:
        """The next server to try and when (a monotonic time); None: give up."""
        if not self._round and not self._start_round(now, wait=True):
            return None
        return self._round[0], self._not_before

    def began(self, address: Address) -> None:
        """The caller is trying `address` now."""
        if self._round and self._round[0] == address:
            self._round.popleft()
        self._tried.add(address)
        self.tries += 1

    def redirected(self, now: float) -> None:
        """The server sent the client to another member (`Servers.redirect`): a new round
        goes there at once, not counted against `rounds`."""
        self._pass = {self.servers.member}
        self._round = deque(self.servers.order())
        self._tried = set()
        self._answered = False
        self._not_before = now

    def refused(self, address: Address, why: str, hint: Address | None = None,
                answered: bool = False) -> None:
        """`address` did not take the client; try the next (the hinted one first).
        `answered`: the server itself refused (an ERROR), so its member is alive."""
        self.refusals.append(f"{address[0]}:{address[1]}: {why}")
        del self.refusals[:-max(10, len(self.servers.everyone()) + 1)]
        self._answered = self._answered or answered or hint is not None
        if hint is not None and hint not in self._tried:
            if hint in self._round:
                self._round.remove(hint)
            self._round.appendleft(hint)

    def summary(self) -> str:
        return "; ".join(self.refusals[-len(self.servers.everyone()) - 1:]) \
            or "no attempt made"
