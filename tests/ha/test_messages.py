"""The peer's and the witness's messages are read once, at the edge, into typed values;
a message that does not say what it must is a protocol error there, not a cast inside a
decision."""

from __future__ import annotations

import pytest

from pairmq.ha import channel as ch
from pairmq.ha import events as ev
from pairmq.ha.messages import (
    FailbackStep,
    MessageError,
    PeerHello,
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
