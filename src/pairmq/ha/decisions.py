"""What the replication machine does of its own accord: the rules `_decide` applies after
every input (and at every tick and deadline), as one table.

An input's step (ha/steps.py, ha/serving_steps.py) records what happened; `_decide` then
reads the situation, not the input: it walks `DECISIONS` in order, and the first rule
whose phases hold the machine's phase and whose condition holds is applied, and ends the
walk, unless it `goes_on` (then the rules below it still apply, to the phase it left).
Read a row as "in these phases, when this holds, do that, because". A rule with no action
says the phase stays as it is, and why.

Phases in no row are moved by their own inputs only: the serving phases other than ACTIVE
(their steps and the lease's end), ACTIVATING (the witness's replies, the recovery),
STEPPING_DOWN (the journal read back), STOPPING and STOPPED. Which phase changes exist at all is
TRANSITIONS (ha/phases.py); the rules' grounds are in ha/replication.py's docstring and
docs/ha.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from pairmq.ha import channel as ch
from pairmq.ha.events import Log, Send
from pairmq.ha.messages import Failback, FailbackStep
from pairmq.ha.phases import JournalDisk, Phase
from pairmq.ha.rules import FAREWELL_HEARD
from pairmq.ha.rules import ReplicationRules as Machine
from pairmq.ha.states import State

INFO, WARNING = logging.INFO, logging.WARNING
P = Phase

Condition = Callable[[Machine, float], bool]
Action = Callable[[Machine, float], None]


@dataclass(frozen=True)
class Rule:
    phases: frozenset[Phase]  # where it applies
    when: Condition
    then: Action | None  # None: the phase stays as it is
    why: str
    goes_on: bool = False  # after it, the rules below still apply


def decide(m: Machine, now: float) -> None:
    """Take the next safe step for the current situation: the first rule that holds."""
    for rule in DECISIONS:
        if m.phase in rule.phases and rule.when(m, now):
            if rule.then is not None:
                rule.then(m, now)
            if not rule.goes_on:
                return


# ------------------------------------------------------------ conditions

def _peer_serves(m: Machine, now: float) -> bool:
    return m.connected and m.peer_state.serving


def _peer_serves_nothing(m: Machine, now: float) -> bool:
    return m.connected and not m.peer_state.serving


def _peer_undecided(m: Machine, now: float) -> bool:
    """Connected to a peer that neither serves nor follows anyone."""
    return m.connected and m.peer_state in (State.STARTING, State.WAITING)


def _alone(m: Machine, now: float) -> bool:
    return not m.connected


def _no_serving_peer(m: Machine, now: float) -> bool:
    return not _peer_serves(m, now)


def _serving_peer_and_order(m: Machine, now: float) -> bool:
    return _peer_serves(m, now) and m.order


def _serving_peer_and_failback(m: Machine, now: float) -> bool:
    return _peer_serves(m, now) and m.cfg.role == "primary" and m.cfg.allow_failback \
        and m.peer.role == "backup"


def _undecided_peer_and_witness(m: Machine, now: float) -> bool:
    return _peer_undecided(m, now) and m.cfg.witness


def _undecided_peer_older(m: Machine, now: float) -> bool:
    return _peer_undecided(m, now) and not m.cfg.witness and m._won()


def _undecided_peer_newer(m: Machine, now: float) -> bool:
    return _peer_undecided(m, now) and not m.cfg.witness and not m._won()


def _alone_farewell_heard(m: Machine, now: float) -> bool:
    return _alone(m, now) and m.peer_farewell


def _alone_promise_ran_out(m: Machine, now: float) -> bool:
    return _alone(m, now) and now >= m.promise_until


def _journal_stalled(m: Machine, now: float) -> bool:
    return m.disk is JournalDisk.STALLED


# ------------------------------------------------------------ actions

def _take_over(m: Machine, now: float) -> None:
    m._activate("the active server handed over", force=True, back_to=P.TAKING_OVER)


def _cancel_order(m: Machine, now: float) -> None:
    m.order = False
    m._emit(Log(WARNING, f"Forced activation cancelled: {m.peer.name} is serving, this "
                         "server synchronises from it"))


def _follow(m: Machine, now: float) -> None:
    m._request_sync()


def _ask_to_fail_back(m: Machine, now: float) -> None:
    m._enter(P.FAILBACK_ASKED, "in sync: asking to fail back")
    m._emit(Log(INFO, f"In sync with {m.peer.name}: asking to fail back "
                      "(allow_failback = true)"))
    m._emit(Send(ch.FAILBACK, Failback(FailbackStep.REQUEST)))


def _backup_of_nobody(m: Machine, now: float) -> None:
    m._enter(P.WAITING, f"{m.peer.name} does not serve")


def _activate_if_the_witness_names_it(m: Machine, now: float) -> None:
    m._activate("the witness names this server", query=True, won=m._won())


def _activate_newer(m: Machine, now: float) -> None:
    m._activate("the peer's journal is older")


def _wait_for_newer_peer(m: Machine, now: float) -> None:
    m._enter(P.WAITING, f"{m.peer.name} holds the newer journal and should become active")


def _wait_after_farewell(m: Machine, now: float) -> None:
    m._enter(P.WAITING, FAREWELL_HEARD)


def _take_over_from_the_lost(m: Machine, now: float) -> None:
    m._activate("the active server is gone", back_to=P.ORPHANED)


def _activate_alone(m: Machine, now: float) -> None:
    m._activate_alone()


def _hand_over_stalled(m: Machine, now: float) -> None:
    m._hand_over_stalled(now)


def _to(*phases: Phase) -> frozenset[Phase]:
    return frozenset(phases)


# ------------------------------------------------------------ the table

DECISIONS: tuple[Rule, ...] = (
    # -- serving with an in-sync backup on a disk that stopped completing writes
    Rule(_to(P.ACTIVE), _journal_stalled, _hand_over_stalled,
         "the journal's disk stalled (stall_timeout_ms): the in-sync backup holds every "
         "record appended (streamed before this server's fsync, acknowledged after its own): "
         "hand over to it at once (HANDING_OVER), as a failback does; this server rejoins as "
         "its backup once its disk completes writes (ha/handover.py)"),
    # -- handed over to: activate, whatever the peer says, unless it serves again
    Rule(_to(P.TAKING_OVER), _no_serving_peer, _take_over,
         "the active handed over and is gone or serves no more: activate, again until "
         "the witness grants it"),
    # -- a serving peer: follow it
    Rule(_to(P.STARTING, P.WAITING, P.DEFERRING, P.SYNCING, P.PASSIVE, P.FAILBACK_ASKED,
             P.TAKING_OVER, P.ORPHANED), _serving_peer_and_order, _cancel_order,
         "an operator's force is for a server that cannot decide: a serving peer decides",
         goes_on=True),
    Rule(_to(P.STARTING, P.WAITING, P.DEFERRING, P.ORPHANED), _peer_serves, _follow,
         "the peer serves: copy its journal (SYNCING), a backup of it"),
    Rule(_to(P.PASSIVE), _serving_peer_and_failback, _ask_to_fail_back,
         "in sync, the primary with allow_failback, the peer the backup: ask for the "
         "primary's place back (FAILBACK_ASKED)"),
    Rule(_to(P.SYNCING, P.PASSIVE, P.FAILBACK_ASKED, P.TAKING_OVER), _peer_serves, None,
         "following the serving peer (TAKING_OVER: waiting until it serves no more)"),
    # -- a connected peer that serves nothing
    Rule(_to(P.DEFERRING), _undecided_peer_and_witness, _activate_if_the_witness_names_it,
         "the peer handed over to is undecided (it gave up taking over, or restarted): the "
         "witness decides, as from WAITING (simulator seed 3011: the witness down when the "
         "lease was given back, the link cut after \"go\": each server waited for the other)"),
    Rule(_to(P.DEFERRING), _peer_serves_nothing, None,
         "handed over to the peer: let it activate, do not compete"),
    Rule(_to(P.ORPHANED, P.PASSIVE, P.FAILBACK_ASKED), _peer_serves_nothing,
         _backup_of_nobody,
         "a backup of nobody: saying PASSIVE would keep the peer waiting for this server to "
         "follow it (simulator seed 92); decide again as WAITING, by the rules below",
         goes_on=True),
    Rule(_to(P.STARTING, P.WAITING), _undecided_peer_and_witness,
         _activate_if_the_witness_names_it,
         "both undecided: the witness is the pair's memory, the server it last granted "
         "activates; the journals decide only on a new witness, or when it cannot be "
         "reached (the two servers agree: ha/activation.py)"),
    Rule(_to(P.STARTING, P.WAITING), _undecided_peer_older, _activate_newer,
         "both undecided, no witness: the newer journal activates (ha/election.py), this one"),
    Rule(_to(P.STARTING), _undecided_peer_newer, _wait_for_newer_peer,
         "both undecided, no witness: the peer holds the newer journal and activates"),
    Rule(_to(P.STARTING, P.WAITING), _peer_serves_nothing, None,
         "the peer is a backup that will see this server serves nothing, or it holds the "
         "newer journal and activates: wait for it"),
    # -- no peer
    Rule(_to(P.ORPHANED), _alone_farewell_heard, _wait_after_farewell,
         "the active said it stops without failover: not taking over (FAREWELL_HEARD)"),
    Rule(_to(P.ORPHANED), _alone_promise_ran_out, _take_over_from_the_lost,
         "was in sync, and the promise not to take over ran out: activate (the witness "
         "grants it only once the old lease has ended)"),
    Rule(_to(P.ORPHANED), _alone, None,
         "the promise not to take over still runs: the active may still confirm on it"),
    Rule(_to(P.STARTING, P.WAITING, P.DEFERRING), _alone, _activate_alone,
         "no peer: serve only if this journal is certainly the newest (an operator's "
         "force; a new pair's primary without a witness; else the witness decides)"),
)
