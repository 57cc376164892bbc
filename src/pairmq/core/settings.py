"""Per-broker messaging settings (the `[destinations]` section of the configuration), and
which address-full rule applies to which destination (per-name overrides, Artemis
wildcards: `*` one word, `#` any number of words, words separated by dots)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

EXPIRED_POLICIES: Final = ("dead-letter", "drop")
# what the server-wide guards do ([store] full_policy)
GLOBAL_FULL_POLICIES: Final = ("fail", "block")
PATTERN_PREFIXES: Final = ("/queue/", "/topic/")


class AddressFullPolicy(StrEnum):
    """What happens to a SEND while its destination holds more than its limit (Artemis)."""

    PAGE = "page"  # persistent: body kept on disk only; the producer carries on
    BLOCK = "block"  # the producer waits until consumers make room
    FAIL = "fail"  # ERROR to the producer
    DROP = "drop"  # discarded and counted; the RECEIPT is still sent


ADDRESS_FULL_POLICIES: Final = tuple(p.value for p in AddressFullPolicy)


@dataclass(frozen=True, slots=True)
class AddressRule:
    """The limit and policy in force for one destination."""

    policy: AddressFullPolicy
    max_size_bytes: int  # 0 = unlimited
    dup_cache_size: int = 20000  # dup-ids it remembers


@dataclass(frozen=True, slots=True)
class DestinationOverride:
    """`[destinations.overrides."PATTERN"]`: what it sets (None: not set, the default or a
    less specific override applies)."""

    pattern: str
    address_full_policy: AddressFullPolicy | None = None
    max_size_bytes: int | None = None
    dup_cache_size: int | None = None

    @property
    def specificity(self) -> tuple[int, int, int]:
        """Higher wins: an exact name, then more literal words, then fewer `#`."""
        words = self.pattern.split("/", 2)[2].split(".")
        wild = sum(1 for w in words if w in ("*", "#"))
        return (0 if wild else 1, len(words) - wild, -words.count("#"))

    def matches(self, destination: str) -> bool:
        return matches(self.pattern, destination)


def pattern_problem(pattern: str) -> str | None:
    """Why `pattern` is not a valid destination pattern (None: it is)."""
    prefix = next((p for p in PATTERN_PREFIXES if pattern.startswith(p)), None)
    if prefix is None:
        return f"must start with {' or '.join(PATTERN_PREFIXES)}, got \"{pattern}\""
    rest = pattern[len(prefix):]
    if not rest:
        return f"has no name after {prefix} (use {prefix}# for all of them)"
    for word in rest.split("."):
        if not word:
            return f"has an empty word (two dots, or a dot at an end): \"{pattern}\""
        if word not in ("*", "#") and ("*" in word or "#" in word):
            return (f"uses a wildcard inside a word (\"{word}\"): * and # stand for whole "
                    "dot-separated words, e.g. /queue/orders.*")
    return None


def matches(pattern: str, destination: str) -> bool:
    """Does `destination` match `pattern`? Both start with the same /queue/ or /topic/."""
    p_prefix, _, p_rest = pattern[1:].partition("/")
    d_prefix, _, d_rest = destination[1:].partition("/")
    if p_prefix != d_prefix or not d_rest:
        return False
    return _match_words(p_rest.split("."), d_rest.split("."))


def _match_words(pattern: list[str], words: list[str]) -> bool:
    if not pattern:
        return not words
    head = pattern[0]
    if head == "#":
        return any(_match_words(pattern[1:], words[i:]) for i in range(len(words) + 1))
    if not words:
        return False
    return (head == "*" or head == words[0]) and _match_words(pattern[1:], words[1:])


@dataclass(frozen=True, slots=True)
class Retention:
    """What a stream keeps (`[streams]`): whole messages are removed from its head while it
    holds more than `max_bytes` or they are older than `max_age_ms` (0: no such limit),
    never the newest one, and never one the protecting `group` has not passed."""

    max_bytes: int = 1024 * 1024 * 1024
    max_age_ms: int = 0
    group: str | None = None


@dataclass(frozen=True, slots=True)
class CoreSettings:
    default_prefetch: int = 1000
    max_delivery_attempts: int = 10  # 0 = unlimited
    dead_letter_prefix: str = "DLQ."
    expired_policy: str = "dead-letter"
    max_size_bytes: int = 64 * 1024 * 1024
    dup_cache_size: int = 20000  # dup-ids remembered per destination, as Artemis
    # Producer sequences (core/producers.py): a producer is forgotten once it stored nothing
    # for this long (7 days, as Kafka's transactional ids), or when a destination has more
    # than max_producers more recently active (0: no such limit).
    producer_expiry_ms: int = 7 * 24 * 3600 * 1000
    max_producers: int = 100_000
    max_destinations: int = 100_000  # made by clients' SENDs and SUBSCRIBEs (0: no limit)
    max_subscriptions_per_connection: int = 10_000  # (0: no limit)
    # an empty, unused queue or topic is deleted once idle this long (core/broker/idle.py);
    # -1: never
    auto_delete_delay_ms: int = 60_000
    # What one transaction may hold until its COMMIT (issue 20): its messages count in
    # the server's memory meanwhile. A COMMIT of at most 1,000 is applied in one turn, as
    # one atomic record; a larger one a slice per turn, atomic by a commit marker in the
    # journal (core/broker/committing.py).
    max_transaction_messages: int = 100_000
    max_transaction_bytes: int = 64 * 1024 * 1024
    resume_ratio: float = 0.9  # a full destination (or server) resumes below this share
    address_full_policy: AddressFullPolicy = AddressFullPolicy.PAGE
    overrides: tuple[DestinationOverride, ...] = ()  # most specific first
    # Bytes of messages held in memory, all destinations together: every message's index
    # (core/capacity.py), plus the bodies not paged out. 0 = no limit.
    global_max_size_bytes: int = 1024 * 1024 * 1024
    max_disk_usage: int = 90  # percent of the data directory's file system; 100 = no check
    full_policy: str = "fail"  # past a server-wide guard: "fail" or "block"
    stream_retention: Retention = Retention()  # every stream's, unless named below
    stream_overrides: tuple[tuple[str, Retention], ...] = ()  # (stream name, its retention)

    def retention_for(self, stream_name: str) -> Retention:
        """The retention of `/stream/NAME` (NAME given)."""
        for name, retention in self.stream_overrides:
            if name == stream_name:
                return retention
        return self.stream_retention

    def rule_for(self, destination: str) -> AddressRule:
        """The policy and limit of one destination: per setting, the most specific override
        that sets it, else the default."""
        policy, limit, dups = self.address_full_policy, self.max_size_bytes, self.dup_cache_size
        found_policy = found_limit = found_dups = False
        for override in self.overrides:
            if found_policy and found_limit and found_dups:
                break
            if not override.matches(destination):
                continue
            if not found_policy and override.address_full_policy is not None:
                policy, found_policy = override.address_full_policy, True
            if not found_limit and override.max_size_bytes is not None:
                limit, found_limit = override.max_size_bytes, True
            if not found_dups and override.dup_cache_size is not None:
                dups, found_dups = override.dup_cache_size, True
        return AddressRule(policy, limit, dups)

    def dup_cache_size_for(self, destination: str) -> int:
        """How many dup-ids `destination` remembers (streams and temporary queues: the
        default; patterns name queues and topics)."""
        if not self.overrides or not destination.startswith(PATTERN_PREFIXES):
            return self.dup_cache_size
        return self.rule_for(destination).dup_cache_size

    @property
    def smallest_dup_cache(self) -> int:
        """The fewest dup-ids any destination remembers: what CONNECTED advertises, so a
        client can refuse to keep more application dup-ids in flight than that."""
        sizes = [o.dup_cache_size for o in self.overrides if o.dup_cache_size is not None]
        return min([self.dup_cache_size, *sizes])

    def paged_beyond(self, destination: str) -> int:
        """Bytes of one destination's messages that recovery brings into memory before it
        leaves the rest on disk: its limit under `page`, else 0 (no such cap)."""
        rule = self.rule_for(destination)
        return rule.max_size_bytes if rule.policy is AddressFullPolicy.PAGE else 0


def sorted_overrides(overrides: list[DestinationOverride]) -> tuple[DestinationOverride, ...]:
    """Most specific first; among equals, the order they were written in."""
    return tuple(sorted(overrides, key=lambda o: o.specificity, reverse=True))
