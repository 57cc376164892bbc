"""Which server to try next, and when: pure decisions on the times the caller reports.

A *round* tries every known server once, at once one after the other: a refused TCP
connection or a refusing server (the ERROR of a PASSIVE or WAITING server) moves to the
next one without waiting. A refusal that names the active server (`active-server`) puts
that server first among those left in the round. Only after a round in which every server
refused does the client wait: `retry_interval`, then that times `retry_interval_multiplier`
after each further round, up to `max_retry_interval`. A round starts with the server the
last refusal named, then the one the client was last connected to, then the others in the
order of the URL, then those the pair's `topology` header added.
"""

from __future__ import annotations

from collections import deque

from pairmq.client.options import Address, ClientOptions


def parse_host_port(text: str) -> Address | None:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host, int(port)


class Servers:
    """The servers this client knows, and which it prefers."""

    def __init__(self, servers: tuple[Address, ...]) -> None:
        self.known: list[Address] = list(servers)
        self.hint: Address | None = None  # the last active-server named by a refusal
        self.current: Address | None = None  # connected to, or last connected to

    def learn(self, topology: str) -> None:
        """A CONNECTED frame's `topology` header: both servers of the pair."""
        for part in topology.split(","):
            address = parse_host_port(part)
            if address is not None and address not in self.known:
                self.known.append(address)

    def named(self, text: str | None) -> Address | None:
        """An `active-server` hint: remembered, and added to the known servers."""
        address = parse_host_port(text) if text else None
        if address is not None:
            self.hint = address
            if address not in self.known:
                self.known.append(address)
        return address

    def order(self) -> list[Address]:
        first = [a for a in (self.hint, self.current) if a is not None]
        return list(dict.fromkeys(first + self.known))


class Attempts:
    """The plan of connection attempts after a failure (or at the first connect)."""

    def __init__(self, servers: Servers, options: ClientOptions, rounds: int,
                 now: float) -> None:
        """`rounds`: how many rounds before giving up (-1: no end)."""
        self.servers = servers
        self.rounds_left = rounds
        self.interval = options.retry_interval / 1000
        self.multiplier = options.retry_interval_multiplier
        self.max_interval = options.max_retry_interval / 1000
        self.started = now
        self._round: deque[Address] = deque()
        self._tried: set[Address] = set()
        self._not_before = now
        self.tries = 0
        self.refusals: list[str] = []  # what each server said, for the final error
        self._start_round(now, wait=False)

    def _start_round(self, now: float, wait: bool) -> bool:
        if self.rounds_left == 0:
            return False
        if self.rounds_left > 0:
            self.rounds_left -= 1
        if wait:
            self._not_before = now + self.interval
            self.interval = min(self.interval * self.multiplier, self.max_interval)
        self._round = deque(self.servers.order())
        self._tried = set()
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

    def refused(self, address: Address, why: str, hint: Address | None = None) -> None:
        """`address` did not take the client; try the next (the hinted one first)."""
        self.refusals.append(f"{address[0]}:{address[1]}: {why}")
        del self.refusals[:-10]
        if hint is not None and hint not in self._tried:
            if hint in self._round:
                self._round.remove(hint)
            self._round.appendleft(hint)

    def summary(self) -> str:
        return "; ".join(self.refusals[-len(self.servers.known) - 1:]) or "no attempt made"
