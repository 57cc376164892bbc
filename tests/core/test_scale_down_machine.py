"""core/scale_down.py's transition table, fed views by hand (no I/O)."""

from __future__ import annotations

from pairmq.core.scale_down import Act, Limits, ScaleDown, ScaleDownPhase, Tables, View


def view(now: float, target: str | None = "m1", waiting: int = 0, moving: int = 0,
         unacked: int = 0, clients: int = 0, committing: bool = False,
         tables: Tables = Tables.QUEUED) -> View:
    return View(now, target, waiting, moving, unacked, clients, committing, tables)


def test_the_phases_in_order_and_only_once_everything_is_confirmed_there() -> None:
    m = ScaleDown(0.0, Limits(moving_s=5.0, close_below=100))
    assert m.step(view(0.1, waiting=5000)) == [Act.MOVE]
    assert m.phase is ScaleDownPhase.MOVING and m.target == "m1"
    assert m.step(view(0.2, waiting=50, moving=1000)) == [Act.MOVE, Act.CLOSE_TO_PRODUCERS]
    # a COMMIT being applied: its SENDs are not all in the tables yet
    assert m.step(view(0.3, waiting=0, moving=900, committing=True)) == [Act.MOVE]
    assert m.step(view(0.4, waiting=0, moving=900)) == [Act.MOVE, Act.HAND_OVER]
    # clients go only once nothing is left unconfirmed there
    assert m.step(view(0.5, waiting=0, moving=1)) == [Act.MOVE]
    assert m.phase is ScaleDownPhase.HANDING_OVER
    assert m.step(view(0.6, waiting=0, moving=0, clients=3)) == [Act.MOVE, Act.REDIRECT]
    # what a consumer held comes back as it leaves, and moves too
    assert m.step(view(0.7, waiting=20, clients=1)) == [Act.MOVE]
    assert m.step(view(0.8, moving=20)) == [Act.MOVE]
    assert m.step(view(0.9)) == [Act.FINISH]
    assert m.phase is ScaleDownPhase.DONE and m.step(view(1.0)) == []


def test_the_redirect_waits_a_while_for_consumers_acknowledgements() -> None:
    m = ScaleDown(0.0, Limits(ack_grace_s=2.0))
    assert m.step(view(0.0, waiting=10)) == [Act.MOVE, Act.CLOSE_TO_PRODUCERS]  # few left
    assert m.step(view(0.2)) == [Act.MOVE, Act.HAND_OVER]
    assert m.step(view(0.3, unacked=5)) == [Act.MOVE]
    assert m.step(view(2.3, unacked=5)) == [Act.MOVE, Act.REDIRECT]


def test_a_backup_refuses_producers_from_the_start() -> None:
    m = ScaleDown(0.0, serving=False)
    assert m.step(view(0.1, waiting=10_000)) == [Act.MOVE, Act.CLOSE_TO_PRODUCERS]


def test_no_member_to_take_the_messages_fails_with_the_reason() -> None:
    m = ScaleDown(0.0, Limits(choose_s=10.0))
    assert m.step(view(5.0, target=None, waiting=10)) == []
    assert m.step(view(10.0, target=None, waiting=10)) == [Act.FAIL]
    assert m.phase is ScaleDownPhase.FAILED and "no member" in m.reason


def test_no_progress_for_the_stall_limit_fails_and_a_lost_target_too() -> None:
    m = ScaleDown(0.0, Limits(stall_s=30.0))
    m.step(view(0.0, waiting=10, moving=1000))
    assert m.step(view(29.0, waiting=10, moving=1000)) == [Act.MOVE]
    assert m.step(view(30.0, waiting=10, moving=1000)) == [Act.FAIL]
    assert "nothing moved" in m.reason
    lost = ScaleDown(0.0)
    lost.step(view(0.0, waiting=10))
    assert lost.step(view(1.0, target=None, waiting=10)) == [Act.FAIL]
    assert "no longer reachable" in lost.reason


def test_moving_goes_on_while_the_backlog_shrinks_and_ends_when_it_stops_shrinking() -> None:
    m = ScaleDown(0.0, Limits(moving_s=5.0, close_below=1000))
    m.step(view(0.0, waiting=1_000_000))
    for t in range(1, 100):  # a million moving for 99 s: producers still served
        assert m.step(view(float(t), waiting=1_000_000 - 10_000 * t)) == [Act.MOVE]
    stuck = ScaleDown(0.0, Limits(moving_s=5.0, close_below=1000))
    stuck.step(view(0.0, waiting=50_000))
    assert stuck.step(view(4.9, waiting=50_100, moving=1000)) == [Act.MOVE]
    assert stuck.step(view(5.0, waiting=50_200, moving=1000)) == \
        [Act.MOVE, Act.CLOSE_TO_PRODUCERS]  # producers as fast as the move: they stop


def test_clients_never_go_without_the_producer_tables() -> None:
    m = ScaleDown(0.0)
    m.step(view(0.0, waiting=10, tables=Tables.NOT_SENT))
    assert m.step(view(0.1, tables=Tables.NOT_SENT)) == [Act.MOVE, Act.HAND_OVER]
    assert m.step(view(0.2, tables=Tables.NOT_SENT)) == [Act.MOVE]  # not queued yet
    assert m.step(view(0.3, tables=Tables.REFUSED)) == [Act.FAIL]
    assert "producer sequences" in m.reason
