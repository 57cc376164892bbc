"""The server's sans-IO STOMP session (server/stomp/session.py): its phases in one table,
which frames each phase applies, ignores or refuses, why frames wait, and the permission
check every frame passes before its handler runs."""

from __future__ import annotations

import pytest

from pairmq.core.permissions import Exists, Permission, Rule, SecurityRules
from pairmq.server.stomp.session import (
    COMMANDS,
    COUNTED,
    TRANSITIONS,
    Intake,
    InvalidTransition,
    Phase,
    ServerSession,
    Wait,
)

RULES = SecurityRules([
    Rule("orders.#", {Permission.SEND: frozenset({"producers"}),
                      Permission.CONSUME: frozenset({"consumers"}),
                      Permission.BROWSE: frozenset({"ops"}),
                      Permission.CREATE_NON_DURABLE_QUEUE: frozenset({"consumers"}),
                      Permission.DELETE_NON_DURABLE_QUEUE: frozenset({"consumers"})}),
])


def session_in(phase: Phase) -> ServerSession:
    session = ServerSession()
    path = {Phase.AWAITING_CONNECT: [], Phase.LOGGING_IN: ["checking"],
            Phase.CONNECTED: ["logged-in"], Phase.DISCONNECTING: ["logged-in", "DISCONNECT"],
            Phase.CLOSED: ["closed"]}[phase]
    for event in path:
        session.step(event)
    assert session.phase is phase
    return session


def test_a_login_checked_at_once_or_in_a_thread_both_end_connected() -> None:
    at_once = ServerSession()
    assert at_once.step("logged-in") is Phase.AWAITING_CONNECT
    assert at_once.phase is Phase.CONNECTED
    checked = ServerSession()
    checked.step("checking")
    checked.step("checking")  # a delayed attempt whose hash is then checked in a thread
    checked.step("logged-in")
    assert checked.phase is Phase.CONNECTED


@pytest.mark.parametrize("phase", list(Phase))
def test_every_phase_can_close(phase: Phase) -> None:
    session = session_in(phase)
    session.step("closed")
    assert session.closed


@pytest.mark.parametrize(("phase", "event"), [
    (Phase.AWAITING_CONNECT, "DISCONNECT"),  # the handler is never reached: refused first
    (Phase.CONNECTED, "logged-in"),  # a second login
    (Phase.DISCONNECTING, "logged-in"),
    (Phase.CLOSED, "logged-in"),  # a thread's answer after the socket closed
    (Phase.CLOSED, "DISCONNECT"),
])
def test_what_the_table_does_not_allow_is_a_bug_said_aloud(phase: Phase, event: str) -> None:
    session = session_in(phase)
    with pytest.raises(InvalidTransition, match=event):
        session.step(event)
    assert session.phase is phase


def test_the_table_names_only_known_phases_and_reaches_each() -> None:
    reached = {Phase.AWAITING_CONNECT} | set(TRANSITIONS.values())
    assert reached == set(Phase)


@pytest.mark.parametrize(("phase", "command", "refusal"), [
    (Phase.AWAITING_CONNECT, "CONNECT", None),
    (Phase.AWAITING_CONNECT, "STOMP", None),
    (Phase.AWAITING_CONNECT, "SEND",
     "not connected: the first frame must be CONNECT or STOMP, not SEND"),
    (Phase.AWAITING_CONNECT, "FLY", "unknown command 'FLY'"),
    (Phase.CONNECTED, "SEND", None),
    (Phase.CONNECTED, "DISCONNECT", None),
    (Phase.CONNECTED, "CONNECT", "already connected"),
    (Phase.CONNECTED, "STOMP", "already connected"),
    (Phase.CONNECTED, "FLY", "unknown command 'FLY'"),
])
def test_which_frames_each_phase_applies(phase: Phase, command: str,
                                         refusal: str | None) -> None:
    assert session_in(phase).refusal(command) == refusal


def test_frames_are_read_until_a_disconnect_and_wait_while_a_login_is_checked() -> None:
    assert [p for p in Phase if session_in(p).intake is not Intake.IGNORE] == [
        Phase.AWAITING_CONNECT, Phase.LOGGING_IN, Phase.CONNECTED]
    assert [p for p in Phase if session_in(p).holds_frames] == [Phase.LOGGING_IN]
    assert [p for p in Phase if session_in(p).owns_broker_session] == [
        Phase.CONNECTED, Phase.DISCONNECTING]


@pytest.mark.parametrize("wait", [w for w in Wait if w is not Wait.NONE])
def test_a_reason_to_wait_holds_frames_until_it_is_cleared(wait: Wait) -> None:
    session = session_in(Phase.CONNECTED)
    session.wait = wait
    assert session.holds_frames and session.intake is not Intake.IGNORE
    session.wait = Wait.NONE
    assert not session.holds_frames


def test_only_frames_after_connect_count_for_a_resumed_session() -> None:
    # the rule the connection applies to every frame it applied (connection.py `handle`)
    counted = [c for c in ("CONNECT", "STOMP", "SEND", "ACK", "DISCONNECT") if c in COUNTED]
    assert counted == ["SEND", "ACK", "DISCONNECT"]


@pytest.mark.parametrize("phase", list(Phase))
@pytest.mark.parametrize("wait", list(Wait))
def test_intake_and_applies_say_what_the_phase_and_the_wait_say(phase: Phase,
                                                                wait: Wait) -> None:
    """The values the shell reads per frame agree with the rules written out: a command is
    in `applies` exactly when `refusal` has nothing against it, and `intake` holds frames
    while logging in or waiting, ignores them after a DISCONNECT or once closed."""
    session = session_in(phase)
    session.wait = wait
    for command in (*COMMANDS, "BOGUS"):
        assert (command in session.applies) == (session.refusal(command) is None), command
    ignored = phase in (Phase.DISCONNECTING, Phase.CLOSED)
    held = not ignored and (phase is Phase.LOGGING_IN or wait is not Wait.NONE)
    assert session.intake is (Intake.IGNORE if ignored else Intake.HOLD if held
                              else Intake.APPLY)
    assert (session.intake is not Intake.IGNORE) == (not ignored)
    assert session.holds_frames == held


def test_without_rules_everything_is_allowed() -> None:
    session = session_in(Phase.CONNECTED)
    assert session.denial("SEND", {"destination": "/queue/orders.eu"}, None, Exists()) is None


@pytest.mark.parametrize(("roles", "command", "headers", "exists", "lacks"), [
    ({"producers"}, "SEND", {"destination": "/queue/orders.eu"}, Exists(), None),
    ({"consumers"}, "SEND", {"destination": "/queue/orders.eu"}, Exists(), "send"),
    ({"consumers"}, "SUBSCRIBE", {"destination": "/queue/orders.eu", "id": "1"}, Exists(),
     None),
    ({"consumers"}, "SUBSCRIBE",
     {"destination": "/queue/orders.eu", "id": "1", "browser": "true"}, Exists(), "browse"),
    ({"ops"}, "SUBSCRIBE",
     {"destination": "/queue/orders.eu", "id": "1", "browser": "true"}, Exists(), None),
    ({"ops"}, "SUBSCRIBE", {"destination": "/queue/orders.eu", "id": "1"}, Exists(),
     "consume"),
    ({"consumers"}, "UNSUBSCRIBE", {"id": "t"}, Exists(non_durable_topic="/topic/orders.x"),
     None),
    ({"producers"}, "UNSUBSCRIBE", {"id": "t"},
     Exists(non_durable_topic="/topic/orders.x"), "deleteNonDurableQueue"),
    ({"producers"}, "ACK", {"id": "a"}, Exists(), None),
])
def test_the_permission_check_names_what_is_lacking(roles, command, headers, exists,
                                                    lacks) -> None:
    session = session_in(Phase.CONNECTED)
    session.login = "u"
    session.roles = frozenset(roles)
    refusal = session.denial(command, headers, RULES, exists)
    if lacks is None:
        assert refusal is None
    else:
        assert refusal is not None and str(refusal).startswith(
            f"permission denied: user 'u' lacks permission {lacks} on ")
