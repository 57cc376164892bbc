"""The client side of a STOMP connection, sans-IO: states, receipts, heart-beat deadlines."""

from __future__ import annotations

import pytest

from pairmq.protocol import (
    ClientSession,
    Frame,
    FrameParser,
    ProtocolError,
    SessionState,
    serialize,
)


def server_bytes(command: str, **headers: str) -> bytes:
    return serialize(Frame(command, {k.replace("_", "-"): v for k, v in headers.items()}))


def list_of(session: ClientSession, data: bytes, now: float) -> list[Frame]:
    return list(session.receive(data, now))


def connected(heart_beat: str = "0,0", now: float = 0.0,
              offer: tuple[int, int] = (0, 0)) -> ClientSession:
    session = ClientSession({"host": "h"}, now, heart_beat=offer)
    session.connect_bytes(now)
    list_of(session, server_bytes("CONNECTED", version="1.2", heart_beat=heart_beat), now)
    return session


def test_connect_frame_offers_12_and_the_heart_beat_and_carries_the_callers_headers():
    session = ClientSession({"host": "h", "login": "u", "passcode": "p"}, 0.0,
                            heart_beat=(500, 1000))
    (frame,) = FrameParser().feed(session.connect_bytes(0.0))
    assert frame.command == "CONNECT"
    assert frame.headers["accept-version"] == "1.2"
    assert frame.headers["heart-beat"] == "500,1000"
    assert frame.headers["login"] == "u"
    assert session.state is SessionState.CONNECTING


def test_connected_then_frames_counted_and_receipts_tracked():
    session = connected()
    assert session.state is SessionState.CONNECTED
    session.send(Frame("SEND", {"destination": "/queue/a", "receipt": "r1"}, b"x"), 1.0)
    session.send(Frame("ACK", {"id": "1"}), 1.0)
    assert session.frames_sent == 2
    assert session.outstanding == {"r1"}
    frames = list_of(session, server_bytes("RECEIPT", receipt_id="r1"), 1.0)
    assert [f.command for f in frames] == ["RECEIPT"]
    assert session.outstanding == frozenset()


def test_a_receipt_never_asked_for_is_a_protocol_error():
    session = connected()
    with pytest.raises(ProtocolError, match="never asked"):
        list_of(session, server_bytes("RECEIPT", receipt_id="nobody"), 0.0)


@pytest.mark.parametrize("command", ["MESSAGE", "RECEIPT"])
def test_nothing_but_connected_or_error_before_connected(command):
    session = ClientSession({}, 0.0)
    session.connect_bytes(0.0)
    with pytest.raises(ProtocolError, match="while the session is connecting"):
        list_of(session, server_bytes(command, receipt_id="x", subscription="1"), 0.0)


def test_error_closes_and_is_kept():
    session = connected()
    list_of(session, server_bytes("ERROR", message="boom"), 0.0)
    assert session.state is SessionState.CLOSED
    assert session.error is not None and session.error.headers["message"] == "boom"
    with pytest.raises(ProtocolError):
        session.send(Frame("SEND", {"destination": "/queue/a"}), 0.0)


def test_disconnect_closes_on_its_own_receipt_only():
    session = connected()
    session.send(Frame("SEND", {"destination": "/queue/a", "receipt": "r1"}), 0.0)
    session.disconnect("bye", 0.0)
    assert session.state is SessionState.DISCONNECTING
    list_of(session, server_bytes("RECEIPT", receipt_id="r1"), 0.0)
    assert session.state is SessionState.DISCONNECTING
    list_of(session, server_bytes("RECEIPT", receipt_id="bye"), 0.0)
    assert session.state is SessionState.CLOSED


def test_a_10_server_is_refused():
    session = ClientSession({}, 0.0)
    session.connect_bytes(0.0)
    with pytest.raises(ProtocolError, match=r"1\.0"):
        list_of(session, server_bytes("CONNECTED", version="1.0"), 0.0)


def test_heart_beats_are_due_from_the_negotiated_period_and_silence_is_twice_it():
    # we offer (1000, 1000); the server (2000, 3000): we send every max(1000, 3000) = 3 s and
    # expect something every max(2000, 1000) = 2 s, dead after 4 s of silence
    session = connected("2000,3000", now=0.0, offer=(1000, 1000))
    assert session.tick(2.0) == b""
    assert session.tick(2.9) == b"\n"  # 0.95 of 3 s after the last write
    assert session.tick(3.0) == b""  # the beat counts as a write
    assert not session.peer_silent(3.9)
    assert session.peer_silent(4.1)
    list_of(session, b"\n", 4.2)  # a server heart-beat counts as life
    assert not session.peer_silent(8.0)
    assert session.next_deadline() == pytest.approx(min(2.9 + 2.85, 4.2 + 4.0))


def test_no_heart_beats_when_either_side_wants_none():
    session = connected("0,0", offer=(1000, 1000))
    assert session.tick(1000.0) == b""
    assert not session.peer_silent(1000.0)
    assert session.next_deadline() is None


def test_every_transition_in_the_table_leads_somewhere_known():
    from pairmq.protocol.session import TRANSITIONS

    for (state, _event), target in TRANSITIONS.items():
        assert state in SessionState and target in SessionState
    closed = SessionState.CLOSED
    assert all(target is closed for (state, _), target in TRANSITIONS.items()
               if state is closed)


def test_each_frame_of_a_read_is_applied_only_when_taken():
    """A RECEIPT and an ERROR in one read: while the caller handles the RECEIPT the session
    is still CONNECTED (it may still write), CLOSED once it takes the ERROR."""
    session = connected()
    session.send(Frame("SEND", {"destination": "/queue/a", "receipt": "r1"}), 0.0)
    frames = session.receive(server_bytes("RECEIPT", receipt_id="r1")
                             + server_bytes("ERROR", message="bye"), 0.0)
    assert next(frames).command == "RECEIPT"
    session.send(Frame("ACK", {"id": "1"}), 0.0)
    assert next(frames).command == "ERROR"
    assert session.state is SessionState.CLOSED


def test_good_frames_before_bad_bytes_are_taken_then_the_error_raised():
    session = connected()
    session.send(Frame("SEND", {"destination": "/queue/a", "receipt": "r1"}), 0.0)
    frames = session.receive(server_bytes("RECEIPT", receipt_id="r1")
                             + b"MESSAGE\ncontent-length:x\n\n\x00", 0.0)
    assert next(frames).command == "RECEIPT"
    with pytest.raises(ProtocolError):
        next(frames)
