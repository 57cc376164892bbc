"""The members of a pairmq cluster as client URLs name them: parsing and choosing, no I/O.

A cluster is several *members*, each a pair of servers (active + backup) or one standalone
server. One client URL names them all, each member as the URL a client of that member alone
would be given:

    cluster:(failover:(stomp://a1:61613,stomp://a2:61614),stomp://c1:61613)?retryInterval=100

The client works with one member at a time and moves to the next only when no server of its
member can be reached (client/topology.py). Members share neither messages nor dup-ids, so a
move may deliver a message twice (docs/clients.md, "Clusters"); that is why moving is left to
the last resort, and why a client says when it moved (`ClusterFailoverEvent`).

The grammar lives here, apart from the engine, because it nests (a cluster of failover URLs)
and serves twice: the URL the application gives, and the `cluster-members` header by which a
server tells the client the members it did not know. The first refuses with a message naming
the member at fault; the second, written by a server, never stops the client: what it cannot
read is skipped.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pairmq.client.errors import ConfigurationError
from pairmq.client.results import FailoverEvent

Address = tuple[str, int]
Member = tuple[Address, ...]  # one member's servers, in the order the URL gives them

TLS_SCHEMES = ("stomp+ssl://", "ssl://", "stomp+tls://")
CLUSTER_PREFIX = "cluster:"
FAILOVER_PREFIX = "failover:"


def parse_address(text: str) -> Address:
    """`stomp://host:port`, `tcp://host:port` or `host:port`; `stomp+ssl://host:port` (TLS:
    see `pairmq.client.options.parse_options`)."""
    raw = text.strip()
    for scheme in ("stomp://", "tcp://", *TLS_SCHEMES):
        if raw.startswith(scheme):
            raw = raw[len(scheme):]
            break
    raw = raw.rstrip("/")
    host, sep, port = raw.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigurationError(f"not a server address: {text!r} (expected "
                                 "stomp://HOST:PORT)")
    return host, int(port)


def is_cluster_url(url: str) -> bool:
    return url.strip().startswith(CLUSTER_PREFIX)


@dataclass(frozen=True)
class ClusterURL:
    """What a `cluster:(...)?query` URL says, before its options are read."""

    members: tuple[Member, ...]
    addresses: tuple[str, ...]  # every address as written: the TLS check reads the schemes
    query: str  # after `?`, undecoded ("" without one)


def _closing(text: str, where: str) -> int:
    """The index of the `)` that closes the `(` at text[0]."""
    depth = 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return i
    raise ConfigurationError(f"{where}: unbalanced parentheses in {text!r}")


def _split(text: str, is_separator: Callable[[str], bool], where: str) -> list[str]:
    """`text` cut at the separators outside parentheses (members hold commas of their own)."""
    parts: list[str] = []
    depth = start = 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise ConfigurationError(f"{where}: a ')' without its '(' in {text!r}")
        elif depth == 0 and is_separator(char):
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ConfigurationError(f"{where}: unbalanced parentheses in {text!r}")
    parts.append(text[start:])
    return parts


def _member(text: str, where: str) -> tuple[Member, list[str]]:
    """One member: `failover:(ADDRESS,ADDRESS...)` (a pair) or one ADDRESS (a standalone
    server). Returns its servers and its addresses as written."""
    raw = text.strip()
    if not raw:
        raise ConfigurationError(f"{where} is empty")
    if raw.startswith(CLUSTER_PREFIX):
        raise ConfigurationError(f"{where}: a cluster cannot be a member of a cluster")
    if raw.startswith(FAILOVER_PREFIX):
        rest = raw[len(FAILOVER_PREFIX):].lstrip()
        if not rest.startswith("("):
            raise ConfigurationError(f"{where}: expected failover:(ADDRESS,ADDRESS), got "
                                     f"{raw!r}")
        close = _closing(rest, where)
        after = rest[close + 1:].strip()
        if after.startswith("?"):
            raise ConfigurationError(f"{where}: options go after the cluster's closing "
                                     f"parenthesis, for all members, not on one ({after!r})")
        if after:
            raise ConfigurationError(f"{where}: unexpected {after!r} after {rest[:close + 1]!r}")
        written = [part.strip() for part in rest[1:close].split(",") if part.strip()]
        if not written:
            raise ConfigurationError(f"{where} names no server: {raw!r}")
    else:
        written = [raw]
    servers = []
    for address in written:
        try:
            servers.append(parse_address(address))
        except ConfigurationError as e:
            raise ConfigurationError(f"{where}: {e}") from None
    return tuple(dict.fromkeys(servers)), written


def parse_cluster_url(url: str) -> ClusterURL:
    """`cluster:(MEMBER,MEMBER...)?query`; a ConfigurationError names what is wrong and, where
    one member is at fault, its position (from 1)."""
    text = url.strip()
    if not text.startswith(CLUSTER_PREFIX):
        raise ConfigurationError(f"not a cluster URL: {url!r} (expected cluster:(...))")
    rest = text[len(CLUSTER_PREFIX):].lstrip()
    if not rest.startswith("("):
        raise ConfigurationError("cluster URL: expected '(' after cluster:, as in "
                                 "cluster:(failover:(stomp://a1:1,stomp://a2:2),stomp://b:3)")
    close = _closing(rest, "cluster URL")
    inner, after = rest[1:close], rest[close + 1:]
    if after and not after.startswith("?"):
        raise ConfigurationError(f"cluster URL: unexpected {after!r} after its closing "
                                 "parenthesis (options go after '?')")
    if not inner.strip():
        raise ConfigurationError(f"cluster URL: no member in {url!r}")
    members: list[Member] = []
    written: list[str] = []
    home: dict[Address, int] = {}
    for position, part in enumerate(_split(inner, lambda c: c == ",", "cluster URL"), 1):
        servers, addresses = _member(part, f"cluster URL: member {position}")
        for address in servers:
            if address in home:
                raise ConfigurationError(
                    f"cluster URL: server {address[0]}:{address[1]} is in member "
                    f"{home[address]} and member {position} (a server belongs to one member)")
            home[address] = position
        members.append(servers)
        written += addresses
    return ClusterURL(tuple(members), tuple(written), after[1:])


def parse_member_list(text: str, tls: bool) -> list[Member]:
    """A CONNECTED frame's `cluster-members` header: member URLs separated by spaces. Those
    over the other transport than the client's (`tls`), and those it cannot read, are
    skipped: a server's header must not stop the client."""
    try:
        parts = _split(text, str.isspace, "cluster-members")
    except ConfigurationError:
        return []
    members = []
    for part in parts:
        if not part.strip():
            continue
        try:
            servers, written = _member(part, "cluster-members")
        except ConfigurationError:
            continue
        if all(address.startswith(TLS_SCHEMES) == tls for address in written):
            members.append(servers)
    return members


def merge_members(known: list[list[Address]], learned: Iterable[Member]) -> int:
    """Add what `learned` tells to `known` (in place); returns the number of members added.

    A learned member that shares a server with a known one is that member: its other servers
    join it (a URL may name one server of a pair). Any other is a new member, placed last so
    that the positions of those known do not change. A server stays in one member."""
    added = 0
    for member in learned:
        home = next((i for i, servers in enumerate(known)
                     if any(address in servers for address in member)), None)
        fresh = [a for a in member if not any(a in servers for servers in known)]
        if home is not None:
            known[home].extend(fresh)
        elif fresh:
            known.append(fresh)
            added += 1
    return added


def member_url(servers: Iterable[Address], tls: bool) -> str:
    """A member as its URL: `failover:(stomp://h:p,stomp://h:p)` or `stomp://h:p`."""
    scheme = "stomp+ssl://" if tls else "stomp://"
    names = [f"{scheme}[{host}]:{port}" if ":" in host else f"{scheme}{host}:{port}"
             for host, port in servers]
    return names[0] if len(names) == 1 else f"failover:({','.join(names)})"


def choose_member(count: int, pinned: int, rng: random.Random) -> int:
    """The member a new client starts with: `pinned` (option cluster_member) unless it is -1,
    else one at random, so that many clients given the same URL spread over the members
    instead of all crowding the first."""
    if pinned >= count:
        raise ConfigurationError(f"option cluster_member is {pinned}, but the cluster has "
                                 f"{count} member(s): 0 to {count - 1}, or -1 (at random)")
    return pinned if pinned >= 0 else rng.randrange(count)


@dataclass(frozen=True, slots=True)
class ClusterFailoverEvent(FailoverEvent):
    """The failover event of a client given a cluster URL: which member it was on and is on.

    `member_changed` is the one to watch: after a move, messages unconfirmed at the moment
    of the move may be delivered twice (docs/clients.md, "Clusters")."""

    old_member: str | None = None  # the URL of the member of the failed connection
    member: str | None = None  # the URL of the member connected to now (None: DISCONNECT)
    member_changed: bool = False  # moved to another member
