"""The client side of one STOMP connection, sans-IO: frames in and out, its state, the
receipts it waits for, and heart-beat deadlines computed from the `now` it is given.

It knows one socket's worth of STOMP and nothing of servers, failover or applications:
`pairmq.client` builds the failover client on it, one session per socket. Like the parser
it does no I/O: the caller writes the bytes it returns and feeds it the bytes it reads.

States (one transition table, in the manner of h11's `_state.py`):

    CONNECTING --CONNECTED--> CONNECTED --disconnect--> DISCONNECTING --its RECEIPT--> CLOSED
         \\--ERROR / lost-->  CLOSED  <--ERROR / lost--/            \\--ERROR / lost--> CLOSED

A frame the table does not allow in the current state (a MESSAGE before CONNECTED, a second
CONNECTED, a RECEIPT nobody asked for) is a ProtocolError: the server is not speaking STOMP.
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import StrEnum

from .errors import ProtocolError
from .frame import Frame
from .heartbeat import HeartbeatClock, negotiate_heart_beat, parse_heart_beat
from .parser import FrameParser
from .serializer import HEARTBEAT, serialize


class SessionState(StrEnum):
    CONNECTING = "connecting"  # CONNECT written, CONNECTED not read yet
    CONNECTED = "connected"
    DISCONNECTING = "disconnecting"  # DISCONNECT written, waiting for its RECEIPT
    CLOSED = "closed"  # ERROR read, DISCONNECT receipted, or the socket lost


_C, _OK, _D, _X = (SessionState.CONNECTING, SessionState.CONNECTED,
                   SessionState.DISCONNECTING, SessionState.CLOSED)

# (state, what happened) -> the next state. What happened is a server command or one of
# the local events "disconnect", "disconnected" (the DISCONNECT's receipt) and "lost".
TRANSITIONS: dict[tuple[SessionState, str], SessionState] = {
    (_C, "CONNECTED"): _OK,
    (_C, "ERROR"): _X,
    (_C, "lost"): _X,
    (_OK, "MESSAGE"): _OK,
    (_OK, "RECEIPT"): _OK,
    (_OK, "ERROR"): _X,
    (_OK, "disconnect"): _D,
    (_OK, "lost"): _X,
    (_D, "MESSAGE"): _D,
    (_D, "RECEIPT"): _D,
    (_D, "disconnected"): _X,
    (_D, "ERROR"): _X,
    (_D, "lost"): _X,
    (_X, "lost"): _X,
}


class ClientSession:
    """One connection of a client: `connect_bytes()` first, then `send`/`receive`/`tick`.

    `frames_sent` counts the frames written after CONNECT (heart-beats aside): a server that
    resumes a session tells how many of them it applied, and the caller resends the rest.
    """

    __slots__ = ("_clock", "_connect", "_disconnect_receipt", "_outstanding", "_parser",
                 "connected_headers", "error", "frames_sent", "heart_beat", "state",
                 "version")

    def __init__(self, headers: dict[str, str], now: float, *,
                 heart_beat: tuple[int, int] = (0, 0),
                 max_frame_bytes: int = 64 * 1024 * 1024) -> None:
        """`headers`: the CONNECT frame's own (host, login, passcode, client-id, ...);
        `heart_beat`: what this client offers, (can send every, wants every) in ms."""
        self.state = SessionState.CONNECTING
        self.heart_beat = heart_beat
        self._connect = Frame("CONNECT", {
            "accept-version": "1.2", "heart-beat": f"{heart_beat[0]},{heart_beat[1]}",
            **headers})
        self._parser = FrameParser(max_frame_bytes=max_frame_bytes)
        self._clock = HeartbeatClock(0, 0, now)
        self._outstanding: set[str] = set()
        self._disconnect_receipt: str | None = None
        self.connected_headers: dict[str, str] = {}
        self.error: Frame | None = None
        self.frames_sent = 0
        self.version = "1.2"

    # ------------------------------------------------------------ state

    def _move(self, event: str) -> None:
        next_state = TRANSITIONS.get((self.state, event))
        if next_state is None:
            raise ProtocolError(f"unexpected {event} while the session is {self.state}")
        self.state = next_state

    @property
    def outstanding(self) -> frozenset[str]:
        """Receipts asked for and not received yet."""
        return frozenset(self._outstanding)

    # ------------------------------------------------------------ output

    def connect_bytes(self, now: float) -> bytes:
        self._clock.wrote(now)
        return serialize(self._connect, "1.2")

    def send(self, frame: Frame, now: float) -> bytes:
        """Encode a frame to write now; a `receipt` header is remembered as outstanding."""
        if self.state is not SessionState.CONNECTED:
            raise ProtocolError(f"cannot send {frame.command} while the session is {self.state}")
        receipt = frame.headers.get("receipt")
        if receipt is not None:
            self._outstanding.add(receipt)
        self.frames_sent += 1
        self._clock.wrote(now)
        return serialize(frame, self.version)

    def disconnect(self, receipt: str, now: float) -> bytes:
        """DISCONNECT with a receipt; the session is CLOSED once that receipt arrives."""
        data = self.send(Frame("DISCONNECT", {"receipt": receipt}), now)
        self._move("disconnect")
        self._disconnect_receipt = receipt
        return data

    def tick(self, now: float) -> bytes:
        """A heart-beat when one is due, else nothing."""
        if self.state is SessionState.CLOSED or not self._clock.beat_due(now):
            return b""
        self._clock.wrote(now)
        return HEARTBEAT

    # ------------------------------------------------------------ input

    def receive(self, data: bytes, now: float) -> Iterator[Frame]:
        """The frames `data` completes, each applied to the session's state as the caller
        takes it: a caller that acts on each frame in turn (and may write in between) sees
        the state that frame leaves, not the one a later frame of the same read (an ERROR)
        will. ProtocolError, once the good frames before it are taken, when the bytes are
        not STOMP or a frame is out of place."""
        self._clock.read(now)
        try:
            frames = self._parser.feed(data)
        except ProtocolError as error:
            yield from self._apply_all(error.frames, now)
            raise
        yield from self._apply_all(frames, now)

    def _apply_all(self, frames: list[Frame], now: float) -> Iterator[Frame]:
        for frame in frames:
            self._apply(frame, now)
            yield frame

    def _apply(self, frame: Frame, now: float) -> None:
        command = frame.command
        if command == "RECEIPT":
            self._receipt(frame)
        elif command == "CONNECTED":
            self._connected(frame, now)
        elif command == "ERROR":
            self._move("ERROR")
            self.error = frame
        else:
            self._move(command)

    def _receipt(self, frame: Frame) -> None:
        self._move("RECEIPT")
        receipt = frame.headers.get("receipt-id")
        if receipt is None or receipt not in self._outstanding:
            raise ProtocolError(f"RECEIPT for {receipt!r}, which was never asked for")
        self._outstanding.discard(receipt)
        if receipt == self._disconnect_receipt:
            self._move("disconnected")

    def _connected(self, frame: Frame, now: float) -> None:
        self._move("CONNECTED")
        headers = frame.headers
        self.connected_headers = headers
        version = headers.get("version", "1.0")
        if version not in ("1.1", "1.2"):
            raise ProtocolError(f"the server chose STOMP {version}; this client needs 1.2")
        self.version = version
        self._parser.version = version
        sx, sy = parse_heart_beat(headers.get("heart-beat", "0,0"))
        outgoing, incoming = negotiate_heart_beat(*self.heart_beat, sx, sy)
        last_write = self._clock.last_write
        self._clock = HeartbeatClock(outgoing, incoming, now)
        self._clock.wrote(last_write)

    def lost(self) -> None:
        """The socket is gone."""
        self._move("lost")

    # ------------------------------------------------------------ time

    def peer_silent(self, now: float) -> bool:
        """Nothing arrived for twice the negotiated incoming period: take the server for
        dead (only once CONNECTED; the caller bounds the wait for CONNECTED itself)."""
        return self.state is not SessionState.CONNECTING and self._clock.peer_silent(now)

    def silent_for(self, now: float) -> float:
        return self._clock.silent_for(now)

    def next_deadline(self) -> float | None:
        """The next time `tick` or `peer_silent` may have something to say."""
        times = [t for t in (self._clock.next_beat(), self._clock.next_check()) if t]
        return min(times) if times else None
