"""The peer's and the witness's messages are read once, at the edge, into typed values;
a message that does not say what it must is a protocol error there, not a cast inside a
decision."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pairmq.ha import channel as ch
from pairmq.ha import events as ev
from pairmq.ha.messages import (
    Failback,
    FailbackStep,
    MessageError,
    PeerHello,
    SeqMessage,
    StoreHello,
    SyncOffer,
    SyncRequest,
    WitnessPurpose,
    WitnessReply,
)
from pairmq.ha.states import State


def test_a_hello_round_trips_and_missing_fields_take_their_defaults() -> None:
    hello = PeerHello(name="b", identity="b#1", role="backup", state=State.PASSIVE, epoch=4,
                      last_seq=9, epochs=((1, 1), (4, 7)), stomp="b:1", ts=2.5, echo=1.5,
                      in_sync=True)
    assert PeerHello.from_wire(hello.to_wire()) == hello
    assert PeerHello.from_wire({}) == PeerHello()
    assert PeerHello.from_wire({"role": "primary"}).primary


@pytest.mark.parametrize("field, value", [
    ("state", "ASLEEP"), ("epoch", "4"), ("epoch", True), ("in_sync", 1), ("ts", "now"),
    ("epochs", [[1]]), ("epochs", 3), ("name", 7),
])
def test_a_hello_that_does_not_say_what_it_must_is_refused(field: str, value: object) -> None:
    with pytest.raises(MessageError, match=field if field != "state" else "ASLEEP"):
        PeerHello.from_wire({field: value})


def test_a_failback_message_names_a_known_step() -> None:
    event = ev.from_channel(ch.FAILBACK, {"phase": "go", "seq": 7})
    assert event == ev.FailbackMessage(FailbackStep.GO, 7)
    with pytest.raises(MessageError):
        ev.from_channel(ch.FAILBACK, {"phase": "later"})
    with pytest.raises(MessageError):
        ev.from_channel(ch.ACK, {})
    assert isinstance(MessageError("x"), ch.ChannelError)  # the channel closes, as for any


def test_a_witness_reply_is_typed() -> None:
    replied = ev.witness_replied(WitnessPurpose.RENEW, {"granted": True, "holder": "a#1",
                                                        "epoch": 3, "remaining_ms": 900,
                                                        "standby": None}, 1.0)
    assert replied.reply == WitnessReply(True, "a#1", 3, 900, "", None)
    assert replied.reply.holder_name == "a"
    assert ev.witness_replied(WitnessPurpose.STOP, None, 1.0).reply is None
    with pytest.raises(MessageError):
        WitnessReply.from_wire({"granted": "yes"})
    with pytest.raises(MessageError):
        WitnessReply.from_wire({"holder": 5})


def test_the_control_messages_keep_their_bytes_on_the_wire() -> None:
    """A server of an older version reads and writes these very bytes: a pair upgraded one
    server at a time still talks."""
    sent = [
        (ch.SYNC, SyncRequest(3, 41, ((1, 1), (3, 20)))),
        (ch.SYNC, SyncOffer("incremental", 42, 57)),
        (ch.SYNC_DONE, SeqMessage(57)),
        (ch.ACK, SeqMessage(56)),
        (ch.HORIZON, SeqMessage(12)),
        (ch.FAILBACK, Failback(FailbackStep.REQUEST)),
        (ch.FAILBACK, Failback(FailbackStep.GO, 57)),
        (ch.FAILBACK, Failback(FailbackStep.GO)),
        (ch.FAILBACK, Failback(FailbackStep.SHUTDOWN)),
    ]
    assert [ch.encode_json(kind, message.to_wire())[5:] for kind, message in sent] == [
        b'{"request":true,"epoch":3,"last_seq":41,"epochs":[[1,1],[3,20]]}',
        b'{"mode":"incremental","from":42,"to":57}',
        b'{"seq":57}', b'{"seq":56}', b'{"seq":12}',
        b'{"phase":"request"}', b'{"phase":"go","seq":57}', b'{"phase":"go"}',
        b'{"phase":"shutdown"}',
    ]
    hello = StoreHello("b", "backup", "h:2", "", 1.5, State.PASSIVE, 4)
    assert ch.encode_json(ch.HEARTBEAT, hello.to_wire())[5:] == (
        b'{"name":"b","role":"backup","stomp":"h:2","stomp_tls":"","ts":1.5,'
        b'"state":"PASSIVE","epoch":4}')
    # ... and each reads back as what was sent, the shared store's hello as a hello
    assert [type(m).from_wire(m.to_wire()) for _, m in sent] == [m for _, m in sent]
    assert PeerHello.from_wire(hello.to_wire()) == PeerHello(
        name="b", role="backup", state=State.PASSIVE, epoch=4, stomp="h:2", ts=1.5)


def test_a_control_message_that_does_not_say_what_it_must_is_refused() -> None:
    assert ev.from_channel(ch.SYNC, {"request": True}) == ev.SyncRequested(SyncRequest())
    assert ev.from_channel(ch.SYNC, {"mode": "full", "from": 1}) == ev.SyncOffered("full", 1)
    for kind, message in [(ch.SYNC, {"request": True, "last_seq": "4"}),
                          (ch.SYNC, {"request": True, "epochs": [[1]]}),
                          (ch.SYNC, {"mode": "full"}), (ch.SYNC, {"from": 1}),
                          (ch.SYNC_DONE, {"seq": None}), (ch.ACK, {"seq": 1.5}),
                          (ch.FAILBACK, {}), (ch.FAILBACK, {"phase": "go", "seq": "7"})]:
        with pytest.raises(MessageError):
            ev.from_channel(kind, message)


@given(st.lists(st.tuples(st.integers(1, 13), st.binary(max_size=300)), max_size=12),
       st.lists(st.integers(1, 400), max_size=30))
def test_the_channel_reads_its_messages_whatever_the_cuts_between_reads(
        messages: list[tuple[int, bytes]], cuts: list[int]) -> None:
    """Messages are read whole and in order, whichever bytes each socket read brings; a
    header written ahead of its payload's pieces (`Link.send_parts`: the replication
    stream's records, not joined) makes the bytes `encode` makes."""
    wire = b"".join(ch.header(kind, len(payload)) + payload for kind, payload in messages)
    assert wire == b"".join(ch.encode(kind, payload) for kind, payload in messages)
    reader = ch.MessageReader()
    read: list[tuple[int, bytes]] = []
    pos = 0
    for cut in cuts:
        read += reader.feed(wire[pos:pos + cut])
        pos += cut
    read += reader.feed(wire[pos:])
    assert read == messages


def test_a_message_past_the_limit_is_refused_by_its_header() -> None:
    reader = ch.MessageReader(max_message=100)
    assert reader.feed(ch.encode(ch.RECORDS, b"x" * 100)) == [(ch.RECORDS, b"x" * 100)]
    with pytest.raises(ch.ChannelError, match="message of 101 bytes exceeds 100"):
        reader.feed(ch.header(ch.RECORDS, 101))
