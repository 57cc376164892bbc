"""Whether a message is taken, and how: the one decision behind producer flow control.

Pure: everything it depends on comes in as arguments. The broker gathers them (is the
dup-id known, is the destination past its limit, which server-wide guards are tripped,
is the journal full) and carries out the answer; the server only acts on it (holds the
frame, sends an ERROR). Order of the checks (docs/durability.md, "Flow control"):

1. a duplicate (its dup-id already accepted) is answered and never counts, blocks or fails;
2. a server-wide shortage (journal full, disk usage, memory budget) holds or refuses the
   messages it concerns, per `[store] full_policy`;
3. a destination past its limit applies its address-full policy;
4. anything else is accepted.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, NamedTuple

from pairmq.core.capacity import Capacity, Shortage
from pairmq.core.queue import Address
from pairmq.core.settings import AddressFullPolicy


class Admission(StrEnum):
    ACCEPTED = "accepted"  # routed; its body stays in memory (the store may still page it)
    PAGED = "paged"  # routed; its body is kept on disk only, once its record is synced
    DUPLICATE = "duplicate"  # dup-id seen before: nothing routed, RECEIPT after the original
    DROPPED = "dropped"  # discarded and counted; RECEIPT sent
    HELD = "held"  # not applied: the frame waits until there is room
    FAILED = "failed"  # not applied: ERROR to the sender


class Cause(StrEnum):
    NONE = "none"
    DESTINATION = "destination"
    MEMORY = Shortage.MEMORY.value
    DISK = Shortage.DISK.value
    JOURNAL = Shortage.JOURNAL.value
    SEQUENCE = "sequence"  # a producer's message out of order (core/producers.py)


class Outcome(NamedTuple):
    """What became of one SEND (or COMMIT): what the server must do with the frame."""

    admission: Admission
    cause: Cause = Cause.NONE
    address: Address | None = None  # HELD by a destination: wait for it to have room
    reason: str = ""  # FAILED: the ERROR's message; HELD: why (for logs)


def decide(*, duplicate: bool, persistent: bool, pageable: bool, destination_full: bool,
           policy: AddressFullPolicy, shortages: frozenset[Shortage],
           full_policy: str) -> tuple[Admission, Cause]:
    """The admission of one message. `pageable`: persistent and every queue it goes to is
    durable (only the journal can hold its body). `shortages` includes JOURNAL when the
    journal takes no more persistent messages."""
    if duplicate:
        return Admission.DUPLICATE, Cause.NONE
    if shortages:
        cause = _server_cause(shortages, persistent)
        if cause is not Cause.NONE:
            return (Admission.HELD if full_policy == "block" else Admission.FAILED), cause
    if destination_full:
        if policy is AddressFullPolicy.PAGE:
            # Only the journal can hold a body out of memory: a non-persistent message
            # stays in memory and counts against the global budget instead.
            return (Admission.PAGED if pageable else Admission.ACCEPTED), Cause.DESTINATION
        if policy is AddressFullPolicy.BLOCK:
            return Admission.HELD, Cause.DESTINATION
        if policy is AddressFullPolicy.FAIL:
            return Admission.FAILED, Cause.DESTINATION
        return Admission.DROPPED, Cause.DESTINATION
    return Admission.ACCEPTED, Cause.NONE


def _server_cause(shortages: frozenset[Shortage], persistent: bool) -> Cause:
    if persistent and Shortage.JOURNAL in shortages:
        return Cause.JOURNAL
    if Shortage.MEMORY in shortages:
        return Cause.MEMORY
    if persistent and Shortage.DISK in shortages:
        return Cause.DISK
    return Cause.NONE


def refusal(admission: Admission, cause: Cause, address: Address | None, capacity: Capacity,
            journal_full: str | None) -> Outcome:
    """The Outcome of a message held or refused, with the sentence that says why (the ERROR
    message under fail)."""
    if cause is Cause.DESTINATION:
        assert address is not None
        return Outcome(admission, cause, address,
                       f"destination {address.name} is full ({address.size} bytes held, "
                       f"max_size_bytes {address.limit}, address_full_policy "
                       f"{address.policy.value}): message not accepted")
    if cause is Cause.JOURNAL:
        reason = f"{journal_full}: persistent message not accepted"
    elif cause is Cause.MEMORY:
        reason = (f"the server is full: messages held in memory take {capacity.memory} "
                  f"bytes, over global_max_size_bytes ({capacity.memory_limit}): message not "
                  "accepted")
    else:
        reason = (f"the server is full: disk usage of the data directory is "
                  f"{capacity.disk_usage or 0:.1f}%, max_disk_usage is "
                  f"{capacity.max_disk_usage}%: persistent message not accepted")
    return Outcome(admission, cause, None, reason)


ACCEPTED: Final = Outcome(Admission.ACCEPTED)
PAGED: Final = Outcome(Admission.PAGED, Cause.DESTINATION)
DUPLICATE: Final = Outcome(Admission.DUPLICATE)
