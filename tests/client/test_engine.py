"""The failover client's decisions, without sockets: the test plays the servers frame by frame
(tests/support/scripted.py). The same engine runs against real pairs in the other tests."""

from __future__ import annotations

import pytest

from pairmq.client import (
    AckFailed,
    ClientClosed,
    ClientError,
    EventKind,
    Outcome,
    TransactionOutcomeUnknown,
    TransactionRolledBack,
)
from pairmq.client.link import Link
from tests.support.scripted import Scripted

URL = ("failover:(stomp://a:1,stomp://b:2)?retryInterval=100&retryIntervalMultiplier=2"
       "&maxRetryInterval=400")


def up(connected_headers: dict[str, str] | None = None, **options) -> Scripted:
    run = Scripted(URL, **options)
    run.connect("a:1", session="s1", topology="a:1,b:2",
                **{k.replace("-", "_"): v for k, v in (connected_headers or {}).items()})
    assert run.engine.link is Link.UP
    return run


def fail_over(run: Scripted) -> None:
    """The active server a:1 dies; the backup b:2 takes the client (a fresh session)."""
    run.lose()
    run.refuse_tcp("a:1")
    run.connect("b:2", session="s9")


def send(run: Scripted, body: bytes = b"x", persistent: bool = True):
    return run.engine.send("/queue/q", body, None, persistent, run.now)


def subscribe(run: Scripted, ack: str = "client-individual", sub_id: str = "s"):
    state, op = run.engine.subscribe("/queue/q", ack, None, sub_id, run.now)
    run.receipt_all(run.written())
    assert op.outcome is Outcome.CONFIRMED
    return state


# ---------------------------------------------------------------- sending


def test_persistent_send_carries_a_producer_stamp_and_a_receipt_and_is_confirmed_by_it():
    run = up()
    result = send(run)
    (frame,) = run.written()
    assert frame.headers["persistent"] == "true"
    assert "dup-id" not in frame.headers and result.dup_id is None
    assert frame.headers["pairmq-producer"] == result.stamp.producer
    assert frame.headers["pairmq-producer"].startswith(run.engine.name + ".")
    assert frame.headers["pairmq-seq"] == "0" and "pairmq-producer-epoch" not in frame.headers
    assert result.outcome is Outcome.PENDING
    run.reply("RECEIPT", receipt_id=frame.headers["receipt"])
    assert result.outcome is Outcome.CONFIRMED
    assert not run.engine.unconfirmed


def test_each_destination_numbers_its_messages_from_0_and_a_batch_takes_as_many_numbers():
    run = up()
    send(run, b"a")
    run.engine.send("/queue/other", b"x", None, True, run.now)
    run.engine.send("/queue/q", b"packed", {"pairmq-batch": "5"}, True, run.now)
    send(run, b"b")
    frames = run.written()
    assert [(f.headers["destination"], f.headers["pairmq-seq"]) for f in frames] == [
        ("/queue/q", "0"), ("/queue/other", "0"), ("/queue/q", "1"), ("/queue/q", "6")]
    assert len({f.headers["pairmq-producer"] for f in frames}) == 1


def test_two_clients_of_the_same_name_are_different_producers():
    one, two = up(), up()
    assert one.engine.name == two.engine.name
    assert one.engine.sequences.producer != two.engine.sequences.producer


def test_an_applications_dup_id_is_kept_beside_the_stamp():
    run = up()
    result = run.engine.send("/queue/q", b"x", {"dup-id": "mine-1"}, True, run.now)
    (frame,) = run.written()
    assert result.dup_id == frame.headers["dup-id"] == "mine-1"
    assert frame.headers["pairmq-seq"] == "0"


def test_a_send_in_a_transaction_gets_a_dup_id_and_no_stamp():
    run = up()
    run.engine.begin(run.now)
    result = send(run)
    frame = run.written()[-1]
    assert frame.headers["dup-id"] == result.dup_id
    assert "pairmq-producer" not in frame.headers and result.stamp is None


def test_a_stamp_the_application_gave_is_kept_and_later_numbers_follow_it():
    run = up()
    producer = run.engine.sequences.producer
    run.engine.send("/queue/q", b"x", {"pairmq-producer": producer, "pairmq-seq": "41"}, True,
                    run.now)
    send(run)
    assert [f.headers["pairmq-seq"] for f in run.written()] == ["41", "42"]


def test_a_refused_message_moves_what_followed_it_to_a_new_epoch_numbered_from_0():
    """The server closes the connection at its ERROR: nothing after the refused message
    was taken, so its successors would leave a hole in the numbers."""
    run = up()
    results = [send(run, b"%d" % i) for i in range(4)]
    frames = run.written()
    run.reply("RECEIPT", receipt_id=frames[0].headers["receipt"])
    run.reply("ERROR", message="destination full", receipt_id=frames[1].headers["receipt"])
    assert results[1].outcome is Outcome.FAILED
    late = send(run, b"late")  # sent while reconnecting: waits, numbered in the new epoch
    run.connect("a:1", session="s2")
    again = run.written()
    assert [f.body for f in again] == [b"2", b"3", b"late"]
    assert [(f.headers["pairmq-producer-epoch"], f.headers["pairmq-seq"]) for f in again] == [
        ("1", "0"), ("1", "1"), ("1", "2")]
    assert results[2].stamp.epoch == late.stamp.epoch == 1
    other = run.engine.send("/queue/other", b"o", None, True, run.now)
    assert other.stamp.epoch == 0, "other destinations keep their numbers"


def test_the_applications_dup_ids_in_flight_may_not_outnumber_the_servers_dup_cache():
    run = up(connected_headers={"dup-cache-size": "3"})
    assert run.engine.sequences.dup_cache_size == 3
    for i in range(3):
        run.engine.send("/queue/q", b"x", {"dup-id": f"a{i}"}, True, run.now)
    send(run)  # the client's own stamps count for nothing
    with pytest.raises(ClientError, match=r"4 messages with the application's own dup-ids.*"
                                           r"\(3 per destination"):
        run.engine.send("/queue/q", b"x", {"dup-id": "a3"}, True, run.now)
    assert send(run).stamp.seq == 4, "the refused send took no number"
    run.engine.send("/queue/elsewhere", b"x", {"dup-id": "b0"}, True, run.now)  # per queue
    first = run.written()[0]
    run.reply("RECEIPT", receipt_id=first.headers["receipt"])  # one confirmed: room again
    run.engine.send("/queue/q", b"x", {"dup-id": "a3"}, True, run.now)


def test_non_persistent_send_has_no_receipt_and_is_sent_once_written():
    run = up()
    result = send(run, persistent=False)
    (frame,) = run.written()
    assert "receipt" not in frame.headers and "dup-id" not in frame.headers
    assert result.outcome is Outcome.SENT


def test_an_error_for_a_send_fails_it_and_it_is_not_sent_again():
    run = up()
    bad = send(run, b"bad")
    (frame,) = run.written()
    run.reply("ERROR", message="destination full", receipt_id=frame.headers["receipt"])
    assert bad.outcome is Outcome.FAILED and "destination full" in str(bad.error)
    assert run.engine.link is Link.CONNECTING  # an ERROR ends the connection
    run.connect("a:1", session="s2")
    assert run.written() == []  # nothing to resend


# ---------------------------------------------------------------- a fresh session after a failure


def test_failover_recreates_subscriptions_first_then_resends_in_order_with_the_same_stamps():
    run = up()
    subscribe(run)
    results = [send(run, b"%d" % i) for i in range(3)]
    first = run.written()
    run.reply("RECEIPT", receipt_id=first[0].headers["receipt"])  # the first one got through
    run.lose()
    assert run.engine.link is Link.CONNECTING
    late = send(run, b"during")  # the application goes on while the client reconnects
    run.refuse_tcp("a:1")  # the dead server: next one at once
    run.connect("b:2", session="s9")
    resubscribe = run.written()
    assert [f.command for f in resubscribe] == ["SUBSCRIBE"]  # nothing else before its receipt
    assert run.engine.link is Link.RECOVERING
    run.receipt_all(resubscribe)
    again = run.written()
    assert [f.body for f in again] == [b"1", b"2", b"during"]
    assert [f.headers["pairmq-seq"] for f in again] == ["1", "2", "3"]
    assert [f.headers["pairmq-seq"] for f in again] == [str(r.stamp.seq)
                                                        for r in (*results[1:], late)]
    run.receipt_all(again)
    assert all(r.outcome is Outcome.CONFIRMED for r in (*results, late))
    (event,) = run.engine.take_events()
    assert event.kind is EventKind.FAILOVER
    assert (event.old_server, event.new_server, event.resent) == ("a:1", "b:2", 2)
    assert not event.resumed


def test_a_refusal_names_the_active_server_which_is_tried_next():
    run = up()
    run.lose()
    run.open("a:1")
    run.reply("ERROR", message="this server is PASSIVE", active_server="c:3")
    assert run.next_attempt() == ("c:3", 0.0)


def test_after_a_round_of_refusals_the_client_waits_longer_each_round():
    run = up()
    run.lose()
    waits = []
    for _ in range(4):
        for server in ("a:1", "b:2"):
            plan = run.next_attempt()
            assert plan is not None
            if plan[1] > 0:
                waits.append(round(plan[1], 3))
                run.tick(plan[1])
            run.refuse_tcp(server)
    assert waits == [0.1, 0.2, 0.4]  # retryInterval 100 ms, x2 each round, up to 400 ms


def test_gives_up_after_the_reconnect_attempts_and_says_so():
    run = up(reconnect_attempts=1)
    pending = send(run)
    run.written()
    run.lose()
    run.refuse_tcp("a:1")
    run.refuse_tcp("b:2")
    assert run.next_attempt() is None
    assert run.engine.link is Link.FAILED
    assert pending.outcome is Outcome.UNKNOWN and isinstance(pending.error, ClientClosed)
    (event,) = run.engine.take_events()
    assert event.kind is EventKind.DISCONNECT and event.new_server is None
    with pytest.raises(ClientClosed, match="gave up"):
        send(run)


def test_a_wrong_password_is_final():
    run = Scripted(URL)
    run.open("a:1")
    run.reply("ERROR", message="authentication failed")
    assert run.engine.link is Link.FAILED
    assert "authentication failed" in str(run.engine.error)
    assert run.next_attempt() is None


def test_silence_from_the_server_is_a_failure():
    run = Scripted(URL, client_failure_check_period=2000)
    run.connect("a:1", heart_beat="1000,1000")
    run.tick(1.9)
    assert run.engine.link is Link.UP
    run.tick(0.2)  # 2.1 s of silence: twice the 1 s the server promised
    assert run.engine.link is Link.CONNECTING


# ---------------------------------------------------------------- what was delivered before


def test_buffered_client_ack_messages_are_dropped_and_old_ones_cannot_be_acked():
    run = up()
    state = subscribe(run)
    run.message("s", "m1", ack="1")
    run.message("s", "m2", ack="2")
    handed = run.engine.take_message(state)
    fail_over(run)
    run.receipt_all(run.written())
    assert run.engine.take_message(state) is None  # m2 was dropped: the server has it back
    with pytest.raises(AckFailed, match="will deliver it again"):
        run.engine.ack(handed, run.now)
    run.message("s", "m1", ack="7", redelivered="true")
    again = run.engine.take_message(state)
    assert again.message_id == "m1" and again.redelivered
    run.engine.ack(again, run.now)  # this one is of the new session


def test_an_ack_in_doubt_is_repeated_by_the_client_and_the_message_not_handed_out_again():
    run = up()
    state = subscribe(run)
    run.message("s", "m1", ack="1")
    message = run.engine.take_message(state)
    run.engine.ack(message, run.now)
    (ack,) = run.written()  # its receipt never comes
    assert ack.command == "ACK"
    fail_over(run)
    run.receipt_all(run.written())
    run.message("s", "m1", ack="3", redelivered="true")  # the new server never got the ack
    assert run.engine.take_message(state) is None
    (again,) = run.written()
    assert (again.command, again.headers["id"]) == ("ACK", "3")
    assert run.engine.stats["in_doubt_acked"] == 1


def test_client_ack_messages_wait_while_the_link_is_down():
    run = up()
    state = subscribe(run)
    run.message("s", "m1", ack="1")
    run.lose()
    assert run.engine.take_message(state) is None


# ---------------------------------------------------------------- transactions


def test_a_transaction_open_across_a_failover_is_rolled_back():
    run = up()
    begin = run.engine.begin(run.now)
    run.receipt_all(run.written())
    assert begin.outcome is Outcome.CONFIRMED
    sent = send(run)
    fail_over(run)
    assert sent.outcome is Outcome.ROLLED_BACK
    later = send(run)  # in the same (voided) transaction: not written
    assert later.outcome is Outcome.ROLLED_BACK
    assert run.written() == []
    with pytest.raises(TransactionRolledBack):
        run.engine.end_transaction(True, run.now)
    run.engine.begin(run.now)  # a new one may start


def test_a_commit_cut_off_by_the_failover_has_an_unknown_outcome():
    run = up()
    run.engine.begin(run.now)
    run.receipt_all(run.written())
    send(run)
    commit = run.engine.end_transaction(True, run.now)
    run.written()
    fail_over(run)
    assert commit.outcome is Outcome.UNKNOWN
    assert isinstance(commit.error, TransactionOutcomeUnknown)


def test_a_transaction_commits_its_sends_together():
    run = up()
    run.engine.begin(run.now)
    run.receipt_all(run.written())
    sent = [send(run), send(run)]
    commit = run.engine.end_transaction(True, run.now)
    frames = run.written()
    assert [f.command for f in frames] == ["SEND", "SEND", "COMMIT"]
    assert all("receipt" not in f.headers for f in frames[:2])
    assert all(r.outcome is Outcome.PENDING for r in sent)
    run.receipt_all(frames)
    assert commit.outcome is Outcome.CONFIRMED
    assert all(r.outcome is Outcome.CONFIRMED for r in sent)


def test_one_transaction_at_a_time():
    run = up()
    run.engine.begin(run.now)
    with pytest.raises(ClientError, match="is open"):
        run.engine.begin(run.now)


# ---------------------------------------------------------------- resuming a session


def test_a_resumed_session_confirms_what_the_server_applied_and_resends_the_rest():
    run = up(connection_ttl=5000)
    run.engine.take_output()
    run.lose()
    run.connect("a:1", session="s1", resume_key="k1")  # a first session with a resume key
    run.receipt_all(run.written())
    state = subscribe(run)  # frame 1 of the session
    run.message("s", "m1", ack="4")
    message = run.engine.take_message(state)
    applied = send(run, b"applied")  # frame 2
    run.engine.ack(message, run.now)  # frame 3
    lost = send(run, b"lost")  # frame 4
    run.written()
    run.lose()
    connect = run.open("a:1")
    assert connect.headers["resume-session"] == "s1"
    assert connect.headers["resume-key"] == "k1"
    assert connect.headers["resume-last-ack"] == "4"
    assert connect.headers["connection-ttl"] == "5000"
    run.reply("CONNECTED", version="1.2", session="s1", resumed="true", resume_frames="3",
              resume_key="k2")
    assert applied.outcome is Outcome.CONFIRMED
    (again,) = run.written()
    assert again.body == b"lost"
    run.receipt_all([again])
    assert lost.outcome is Outcome.CONFIRMED
    event = run.engine.take_events()[-1]
    assert event.resumed and event.resent == 1
    assert run.engine.take_message(state) is None
    run.message("s", "m2", ack="5")
    assert run.engine.take_message(state).message_id == "m2"


def test_a_transaction_ended_while_the_client_reconnects_is_rolled_back_whole():
    """Sent in, and committed, while the link was down: none of its frames may reach the
    new server (which never heard of the transaction)."""
    run = up()
    run.engine.begin(run.now)
    run.receipt_all(run.written())
    first = send(run)  # written on the session that fails
    run.lose()
    second = send(run)  # queued while reconnecting
    commit = run.engine.end_transaction(True, run.now)
    run.refuse_tcp("a:1")
    run.connect("b:2", session="s9")
    assert run.written() == []
    assert {first.outcome, second.outcome} == {Outcome.ROLLED_BACK}
    assert commit.outcome is Outcome.ROLLED_BACK
    assert isinstance(commit.error, TransactionRolledBack)


def test_one_ack_receipt_per_round_trip_and_any_receipt_confirms_earlier_acks():
    run = up()
    state = subscribe(run)
    for n in range(1, 4):
        run.message("s", f"m{n}", ack=str(n))
    for _ in range(3):
        run.engine.ack(run.engine.take_message(state), run.now)
    acks = run.written()
    assert ["receipt" in f.headers for f in acks] == [True, False, False]
    later = send(run)  # its receipt confirms the three ACKs written before it
    (frame,) = run.written()
    run.reply("RECEIPT", receipt_id=frame.headers["receipt"])
    assert later.outcome is Outcome.CONFIRMED
    fail_over(run)
    run.receipt_all(run.written())
    assert not run.engine.in_doubt  # nothing was left unconfirmed


def test_output_waits_for_an_answer_only_when_one_is_owed_for_a_written_frame():
    """A frame whose own receipt is the only one awaited must be written at once: the
    server owes nothing yet, so waiting for its answer would stall (a consumer whose
    prefetch is used up gets nothing more until its ACK goes out)."""
    run = up()
    state = subscribe(run)
    run.message("s", "m1", ack="1")
    run.engine.ack(run.engine.take_message(state), run.now)
    assert not run.engine.may_wait_to_write()  # the ACK's own receipt: write it now
    (ack,) = run.written()
    assert "receipt" in ack.headers
    send(run)
    assert run.engine.may_wait_to_write()  # the ACK's receipt is owed: the SEND may wait
    run.reply("RECEIPT", receipt_id=ack.headers["receipt"])
    assert not run.engine.may_wait_to_write()  # only the SEND's own receipt is awaited


def test_acks_without_receipt_are_in_doubt_after_a_failure():
    run = up()
    state = subscribe(run)
    for n in range(1, 3):
        run.message("s", f"m{n}", ack=str(n))
    for _ in range(2):
        run.engine.ack(run.engine.take_message(state), run.now)
    run.written()
    fail_over(run)
    run.receipt_all(run.written())
    assert set(run.engine.in_doubt) == {("s", "m1"), ("s", "m2")}


# ---------------------------------------------------------------- streams


def test_a_receipt_s_headers_stay_with_its_operation_for_stream_offsets():
    from pairmq.client.streams import info_headers, offsets_from_receipt

    run = up()
    _, op = run.engine.subscribe("/stream/orders", "auto", info_headers(True), None, run.now)
    (frame,) = run.written()
    assert frame.headers["x-stream-must-exist"] == "true"
    run.reply("RECEIPT", receipt_id=frame.headers["receipt"], x_stream_first_offset="3",
              x_stream_next_offset="10")
    assert op.outcome is Outcome.CONFIRMED
    assert offsets_from_receipt("/stream/orders", op.receipt_headers) == (3, 10)
    with pytest.raises(ClientError, match="did not report the offsets"):
        offsets_from_receipt("/stream/orders", {"receipt-id": "x"})
