"""Permissions per destination, in the model of Artemis' security settings (issue 19,
docs/security.md): rules keyed by a name pattern grant each permission to roles.

- A pattern matches the destination's name without its `/queue/`, `/topic/` or
  `/stream/` prefix, by words separated by `.`: `*` is one word, `#` any number of
  words (none included), as Artemis' wildcards.
- The most specific matching rule wins, and only it: a destination's permissions are
  never the union of several rules (Artemis' behaviour, and the one that lets a narrow
  rule take rights away). More specific: more literal words, then fewer `#`, then fewer
  `*`.
- What a frame needs is decided here (`needed`), from its command and headers and what
  exists, so that the server checks every frame in one place, before its handler runs.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final


class Permission(StrEnum):
    """Artemis' names, as users write them in `[security."PATTERN"]`."""

    SEND = "send"
    CONSUME = "consume"
    BROWSE = "browse"  # a queue browser (SUBSCRIBE browser:true, core/browsing.py)
    CREATE_DURABLE_QUEUE = "createDurableQueue"
    DELETE_DURABLE_QUEUE = "deleteDurableQueue"
    CREATE_NON_DURABLE_QUEUE = "createNonDurableQueue"
    DELETE_NON_DURABLE_QUEUE = "deleteNonDurableQueue"
    MANAGE = "manage"  # reserved for the management API's per-destination actions


# What the management API's requests are checked on: `manage` for changes, `browse` for
# reads (Artemis checks its management address the same way).
MANAGEMENT: Final = "pairmq.management"
# /amq/queue/NAME is RabbitMQ's name for the queue or stream NAME (core/rabbitmq.py)
PREFIXES: Final = ("/queue/", "/topic/", "/stream/", "/temp-queue/", "/amq/queue/")
# A connection's own temporary queues: making one (SUBSCRIBE /temp-queue/NAME) needs
# createNonDurableQueue on NAME; sending to one, or to its /reply-queue/ name, needs nothing.
PRIVATE: Final = ("/temp-queue/", "/reply-queue/")


def rule_pattern_problem(pattern: str) -> str | None:
    """Why `pattern` cannot be a rule's pattern, or None."""
    if not pattern:
        return "must not be empty (\"#\" matches every destination)"
    if pattern.startswith("/"):
        return (f"names the destination without /queue/, /topic/ or /stream/, got "
                f"{pattern!r}")
    if any(not word for word in pattern.split(".")):
        return f"has an empty word (two dots, or a dot at an end): {pattern!r}"
    return None


def _matches(pattern: tuple[str, ...], words: tuple[str, ...]) -> bool:
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(_matches(rest, words[i:]) for i in range(len(words) + 1))
    if not words:
        return False
    return (head == "*" or head == words[0]) and _matches(rest, words[1:])


@dataclass(frozen=True)
class Rule:
    pattern: str
    grants: Mapping[Permission, frozenset[str]]  # permission -> roles

    @property
    def words(self) -> tuple[str, ...]:
        return tuple(self.pattern.split("."))

    @property
    def specificity(self) -> tuple[int, int, int]:
        words = self.words
        return (sum(w not in ("#", "*") for w in words), -words.count("#"),
                -words.count("*"))


class SecurityRules:
    """The rules of a server; `None` in its place means none are configured (everyone
    authenticated may do everything)."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        # most specific first; equal ones keep the order they were written in
        self.rules = sorted(rules, key=lambda r: r.specificity, reverse=True)
        self._cache: dict[str, Rule | None] = {}

    def rule_for(self, name: str) -> Rule | None:
        """The rule that decides for a destination name (its prefix removed)."""
        if name not in self._cache:
            words = tuple(name.split("."))
            self._cache[name] = next((r for r in self.rules if _matches(r.words, words)),
                                     None)
            if len(self._cache) > 10_000:
                self._cache.clear()
        return self._cache[name]

    def roles(self) -> frozenset[str]:
        """Every role some rule grants something to."""
        return frozenset(role for rule in self.rules for granted in rule.grants.values()
                         for role in granted)

    def allows(self, roles: Iterable[str], permission: Permission, destination: str) -> bool:
        if destination.startswith("/reply-queue/"):
            return True
        rule = self.rule_for(name_of(destination))
        if rule is None:
            return False  # rules exist, none is about this destination: nobody
        return bool(rule.grants.get(permission, frozenset()) & set(roles))

    def roles_for(self, permission: Permission, destination: str) -> frozenset[str]:
        rule = self.rule_for(name_of(destination))
        return frozenset() if rule is None else rule.grants.get(permission, frozenset())

    def refusal(self, login: str | None, roles: Iterable[str],
                needs: Iterable[tuple[Permission, str]]) -> Refusal | None:
        """The first of `needs` these roles lack, as the ERROR says it; None: allowed."""
        for permission, destination in needs:
            if not self.allows(roles, permission, destination):
                who = f"user {login!r}" if login else "an anonymous client"
                return Refusal(who, permission, destination,
                               self.roles_for(permission, destination))
        return None


@dataclass(frozen=True)
class Refusal:
    who: str
    permission: Permission
    destination: str
    granted: frozenset[str]  # the roles that have it there

    def __str__(self) -> str:
        granted = ", ".join(sorted(self.granted)) or "none"
        return (f"permission denied: {self.who} lacks permission {self.permission} on "
                f"{self.destination} (granted to roles: {granted})")


def name_of(destination: str) -> str:
    for prefix in PREFIXES:
        if destination.startswith(prefix):
            return destination[len(prefix):]
    return destination


@dataclass(frozen=True)
class Exists:
    """What the broker says exists, for the frame at hand."""

    durable_topic: str | None = None  # the topic of the durable subscription it names
    # the topic of the non-durable subscription an UNSUBSCRIBE ends (its queue is deleted)
    non_durable_topic: str | None = None


# The commands `needed` may ask a permission for: any other frame needs none.
PERMISSIONED: Final = frozenset({"SEND", "SUBSCRIBE", "UNSUBSCRIBE"})


def needed(command: str, headers: Mapping[str, str], exists: Exists
           ) -> list[tuple[Permission, str]]:
    """The permissions a frame needs, each with the destination it needs it on."""
    destination = headers.get("destination", "")
    if command == "SEND":
        return [(Permission.SEND, destination)] \
            if destination and not destination.startswith(PRIVATE) else []
    if command == "SUBSCRIBE" and destination:
        if destination.startswith("/temp-queue/"):
            return [(Permission.CREATE_NON_DURABLE_QUEUE, destination)]
        if destination.startswith(PRIVATE):
            return []
        if headers.get("browser") == "true":  # a queue browser takes nothing (core/browsing.py)
            return [(Permission.BROWSE, destination)]
        need = [(Permission.CONSUME, destination)]
        if destination.startswith("/topic/"):
            if durable_name(headers) is None:
                need.append((Permission.CREATE_NON_DURABLE_QUEUE, destination))
            elif exists.durable_topic != destination:  # new (or moved to this topic)
                need.append((Permission.CREATE_DURABLE_QUEUE, destination))
        return need
    if command == "UNSUBSCRIBE":
        if durable_name(headers) is not None and exists.durable_topic is not None:
            return [(Permission.DELETE_DURABLE_QUEUE, exists.durable_topic)]
        if exists.non_durable_topic is not None:  # its queue goes with it, as in Artemis
            return [(Permission.DELETE_NON_DURABLE_QUEUE, exists.non_durable_topic)]
    return []


def durable_name(headers: Mapping[str, str]) -> str | None:
    """The durable subscription a SUBSCRIBE or UNSUBSCRIBE names (ActiveMQ's header, or
    `durable:true` with its id), as the server reads it."""
    name = headers.get("activemq.subscriptionName")
    if name is None and (headers.get("durable") == "true"
                         or headers.get("persistent") == "true"):
        name = headers.get("id")
    return name


def unchecked_roles(users: Mapping[str, Iterable[str]], rules: SecurityRules | None,
                    built_in: Iterable[str]) -> dict[str, list[str]]:
    """Roles of users (name -> roles) that nothing grants or checks: neither built in
    (the management port's admin and monitor) nor named by a rule. Likely typos (`admn`),
    which would otherwise leave a user without what was meant for it. Role -> its users."""
    known = set(built_in) | (rules.roles() if rules is not None else set())
    found: dict[str, list[str]] = {}
    for user, roles in users.items():
        for role in roles:
            if role not in known:
                found.setdefault(role, []).append(user)
    return found
