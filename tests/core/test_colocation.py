"""The colocated backup request and hosting plan (core/colocation.py), fed views and time:
no process, no socket. The real members are in tests/cluster/test_colocated.py."""

from __future__ import annotations

from pairmq.core.colocation import (
    Ask,
    BackupRequest,
    Candidate,
    RequestLimits,
    RequestPhase,
    RequestView,
    hosting_plan,
    step,
)

LIMITS = RequestLimits(retries=-1, retry_s=5.0, start_s=60.0, lost_s=2.0)


def member(name: str, *, hosting_me: bool = False, refusing: str | None = None,
           room: bool = True, hosted: int = 0) -> Candidate:
    return Candidate(name, hosting_me, refusing, room, hosted)


def view(now: float, *candidates: Candidate, linked: bool = False, me: str = "m1"
         ) -> RequestView:
    return RequestView(me, now, linked, candidates)


def backed_up_on_m2() -> BackupRequest:
    r, _ = step(BackupRequest.start(True, 0.0), view(0.0, member("m2")), LIMITS)
    r, _ = step(r, view(0.5, member("m2", hosting_me=True)), LIMITS)
    r, _ = step(r, view(1.0, member("m2", hosting_me=True), linked=True), LIMITS)
    assert r.phase is RequestPhase.BACKED_UP
    return r


def test_lives_asking_at_once_form_a_ring_not_a_pair_and_an_orphan() -> None:
    """Among members hosting as few, each live asks the next after it by name: with the
    first by name, m0 and m1 would ask each other and m2 find no room."""
    others = {"m0": ("m1", "m2"), "m1": ("m0", "m2"), "m2": ("m0", "m1")}
    asked = {}
    for me, names in others.items():
        r, _ = step(BackupRequest.start(True, 0.0),
                    view(0.0, *(member(n) for n in names), me=me), LIMITS)
        asked[me] = r.asking
    assert asked == {"m0": "m1", "m1": "m2", "m2": "m0"}


def test_the_member_hosting_fewest_is_asked_first() -> None:
    r, lines = step(BackupRequest.start(True, 0.0),
                    view(0.0, member("m2", hosted=1), member("m3", hosted=0)), LIMITS)
    assert (r.phase, r.asking, r.tries) == (RequestPhase.ASKING, "m3", 1)
    assert lines == ["Asking member m3 to host a backup for this live"]


def test_an_ask_taken_then_a_link_is_backed_up() -> None:
    r, _ = step(BackupRequest.start(True, 0.0), view(0.0, member("m2")), LIMITS)
    r, lines = step(r, view(0.5, member("m2", hosting_me=True)), LIMITS)
    assert (r.phase, r.member) == (RequestPhase.STARTING, "m2")
    assert r.asking == "m2"  # it keeps naming the member: that one keeps hosting it
    r, _ = step(r, view(30.0, member("m2", hosting_me=True)), LIMITS)
    assert r.phase is RequestPhase.STARTING  # copying the journal may take a while
    r, lines = step(r, view(31.0, member("m2", hosting_me=True), linked=True), LIMITS)
    assert (r.phase, r.member, r.tries) == (RequestPhase.BACKED_UP, "m2", 0)
    assert lines == ["This live has a backup on member m2"]


def test_a_refusal_or_silence_moves_to_the_next_member() -> None:
    r, _ = step(BackupRequest.start(True, 0.0),
                view(0.0, member("m2"), member("m3")), LIMITS)
    assert r.asking == "m2"
    r, lines = step(r, view(0.5, member("m2", refusing="full"), member("m3")), LIMITS)
    assert (r.asking, r.tries) == ("m3", 2)
    assert lines[0] == "Member m2 did not take the backup request: full"
    r, _ = step(r, view(4.0, member("m2"), member("m3")), LIMITS)
    assert r.asking == "m3"  # within the retry interval: still waiting for m3
    r, lines = step(r, view(5.5, member("m2"), member("m3")), LIMITS)
    assert lines[0] == "Member m3 did not take the backup request: no answer"
    assert (r.asking, r.tries) == ("m2", 3)  # every member passed: a new round


def test_past_its_retries_a_live_gives_up_and_says_why() -> None:
    limits = RequestLimits(retries=1, retry_s=1.0)
    r, _ = step(BackupRequest.start(True, 0.0), view(0.0, member("m2", room=False)), limits)
    assert (r.phase, r.asking, r.problem) == (RequestPhase.ASKING, None,
                                              "no member has room for a backup")
    r, _ = step(r, view(0.5, member("m2", room=False)), limits)
    assert r.tries == 1  # waits the retry interval between tries
    r, _ = step(r, view(1.1, member("m2", room=False)), limits)
    assert r.tries == 2
    r, lines = step(r, view(2.2, member("m2", room=False)), limits)
    assert r.phase is RequestPhase.GIVEN_UP and r.asking is None
    assert "this live serves without a backup" in (r.problem or "") and lines == [r.problem]
    # a backup that dials in anyway is taken
    r, _ = step(r, view(9.0, member("m2", room=False, hosting_me=True), linked=True), limits)
    assert (r.phase, r.member) == (RequestPhase.BACKED_UP, "m2")


def test_a_lost_backup_is_said_and_another_member_asked() -> None:
    r = backed_up_on_m2()
    # m2's machine died: its link ended, and it is no longer reachable
    r, lines = step(r, view(10.0, member("m3")), LIMITS)
    assert r.phase is RequestPhase.BACKED_UP and not lines  # a reconnect may come
    r, lines = step(r, view(11.0, member("m3")), LIMITS)
    assert r.phase is RequestPhase.BACKED_UP
    r, lines = step(r, view(12.5, member("m3")), LIMITS)
    assert (r.phase, r.asking, r.tries) == (RequestPhase.ASKING, "m3", 1)
    assert lines == ["This live lost its backup (hosted by member m2): it carries on without "
                     "a backup and asks the cluster for another",
                     "Asking member m3 to host a backup for this live"]


def test_a_backup_that_reconnects_within_the_grace_is_not_lost() -> None:
    r = backed_up_on_m2()
    r, _ = step(r, view(10.0, member("m2", hosting_me=True)), LIMITS)
    r, lines = step(r, view(11.0, member("m2", hosting_me=True), linked=True), LIMITS)
    r, lines = step(r, view(20.0, member("m2", hosting_me=True)), LIMITS)
    assert r.phase is RequestPhase.BACKED_UP and not lines  # the grace counts anew


def test_a_member_that_took_the_ask_but_no_backup_came_is_passed_over() -> None:
    r, _ = step(BackupRequest.start(True, 0.0),
                view(0.0, member("m2"), member("m3", hosted=1)), LIMITS)
    r, _ = step(r, view(1.0, member("m2", hosting_me=True), member("m3", hosted=1)), LIMITS)
    r, lines = step(r, view(62.0, member("m2", hosting_me=True), member("m3", hosted=1)),
                    LIMITS)
    assert lines[0] == "Member m2 had no backup dial in within 60 s"
    assert r.asking == "m3"


def test_not_wanted_asks_nothing() -> None:
    r, lines = step(BackupRequest.start(False, 0.0), view(0.0, member("m2")), LIMITS)
    assert (r.phase, r.asking, lines) == (RequestPhase.NOT_WANTED, None, [])


def ask(live: str, to: str) -> Ask:
    return Ask(live, to, f"127.0.0.1:7{live[1:]}00", f"{live}-server", live)


def test_a_host_takes_asks_up_to_max_backups_and_refuses_the_rest() -> None:
    plan = hosting_plan("m0", (ask("m1", "m0"), ask("m2", "m0"), ask("m3", "m4")),
                        frozenset(), max_backups=1)
    assert [a.live for a in plan.start] == ["m1"]
    assert plan.refuse == {"m2": "member m0 hosts 1 of max_backups = 1"}
    assert plan.stop == ()


def test_a_host_stops_a_backup_only_when_its_live_names_another_member() -> None:
    hosted = frozenset({"m1", "m2"})
    # m1 asks m3 now; m2 is silent (dead, perhaps: its backup is about to serve)
    plan = hosting_plan("m0", (ask("m1", "m3"),), hosted, max_backups=2)
    assert plan.stop == ("m1",) and plan.start == () and plan.refuse == {}
    # a hosted live that still names this member needs nothing
    plan = hosting_plan("m0", (ask("m1", "m0"), ask("m2", "m0")), hosted, max_backups=2)
    assert plan == type(plan)((), {}, ())


def test_no_member_reachable_is_no_try_and_the_first_reachable_is_asked_at_once() -> None:
    """A live that starts before the others: with retries = 0 it still asks once."""
    limits = RequestLimits(retries=0, retry_s=5.0)
    r, lines = step(BackupRequest.start(True, 0.0), view(0.0), limits)
    assert (r.phase, r.tries, r.problem, lines) == (RequestPhase.ASKING, 0,
                                                    "no other member reachable", [])
    r, lines = step(r, view(0.5, member("m2")), limits)
    assert (r.asking, r.tries, r.problem) == ("m2", 1, None)
    r, lines = step(r, view(1.0, member("m2", refusing="full")), limits)
    assert r.phase is RequestPhase.GIVEN_UP and "in 1 tries" in (r.problem or "")


def test_a_member_with_room_again_is_asked_without_waiting_the_interval() -> None:
    r, _ = step(BackupRequest.start(True, 0.0), view(0.0, member("m2", room=False)), LIMITS)
    assert (r.asking, r.tries, r.problem) == (None, 1, "no member has room for a backup")
    r, _ = step(r, view(1.0, member("m2", room=False)), LIMITS)
    assert r.tries == 1  # nothing changed: it waits
    r, _ = step(r, view(1.5, member("m2")), LIMITS)
    assert (r.asking, r.tries) == ("m2", 2)


def test_a_starting_live_waits_for_the_members_it_knows_before_its_first_ask() -> None:
    """Members started one after another: m1 up first would ask m0, the only one it
    sees, and m0 ask m1 back, leaving m2 no room. Waiting for every known member (up
    to the retry interval) keeps the ring."""
    r, lines = step(BackupRequest.start(True, 0.0),
                    RequestView("m1", 0.5, False, (member("m0"),), unreachable=1), LIMITS)
    assert (r.asking, r.tries, lines) == (None, 0, [])
    assert r.problem == "waiting for the other members to be reachable"
    r, _ = step(r, RequestView("m1", 2.0, False, (member("m0"), member("m2"))), LIMITS)
    assert (r.asking, r.tries) == ("m2", 1)
    # a member that never comes is waited for up to the retry interval only
    r, _ = step(BackupRequest.start(True, 0.0),
                RequestView("m1", 5.0, False, (member("m0"),), unreachable=1), LIMITS)
    assert (r.asking, r.tries) == ("m0", 1)
