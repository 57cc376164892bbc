"""Drive the client's sans-IO engine by hand: the test plays the servers, frame by frame.

    run = Scripted("failover:(stomp://a:1,stomp://b:2)")
    run.connect("a:1")                     # the engine's next attempt, a socket, CONNECTED
    result = run.engine.send("/queue/q", b"x", None, True, run.now)
    (frame,) = run.written()               # frames the engine wrote since the last look
    run.reply("RECEIPT", receipt_id=frame.headers["receipt"])
"""

from __future__ import annotations

from pairmq.client.engine import Engine
from pairmq.client.options import parse_options
from pairmq.protocol import Frame, FrameParser, serialize


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


class Scripted:
    def __init__(self, url: str, **options) -> None:
        options.setdefault("client_failure_check_period", 0)
        self.now = 1000.0
        self.engine = Engine(parse_options(url, options), self.now, name="t")
        self._parser: FrameParser | None = None

    def tick(self, seconds: float = 0.0) -> None:
        self.now += seconds
        self.engine.tick(self.now)

    def next_attempt(self) -> tuple[str, float] | None:
        plan = self.engine.next_attempt(self.now)
        if plan is None:
            return None
        (host, port), at = plan
        return f"{host}:{port}", at - self.now

    def open(self, server: str) -> Frame:
        """The engine's socket to `server` opened: returns the CONNECT it wrote."""
        plan = self.next_attempt()
        assert plan is not None and plan[0] == server, f"expected to try {server}, got {plan}"
        self.engine.trying(address(server))
        self.engine.opened(address(server), self.now)
        self._parser = FrameParser()
        (connect,) = self.written()
        return connect

    def refuse_tcp(self, server: str) -> None:
        plan = self.next_attempt()
        assert plan is not None and plan[0] == server, f"expected to try {server}, got {plan}"
        self.engine.trying(address(server))
        self.engine.attempt_failed(address(server), "connection refused", self.now)

    def connect(self, server: str, **headers: str) -> Frame:
        """Open a socket to `server` and answer CONNECTED; returns the CONNECT frame."""
        connect = self.open(server)
        self.reply("CONNECTED", version="1.2", **headers)
        return connect

    def reply(self, command: str, body: bytes = b"", **headers: str) -> None:
        hdrs = {k.replace("_", "-"): v for k, v in headers.items()}
        self.engine.receive(serialize(Frame(command, hdrs, body)), self.now)

    def message(self, sub_id: str, message_id: str, ack: str | None = None,
                body: bytes = b"m", **headers: str) -> None:
        extra = {"ack": ack} if ack is not None else {}
        self.reply("MESSAGE", body, subscription=sub_id, message_id=message_id,
                   destination="/queue/q", **extra, **headers)

    def lose(self, why: str = "the server closed the connection") -> None:
        self.engine.lost(why, self.now)
        self._parser = None

    def written(self) -> list[Frame]:
        """The frames the engine wrote on its current socket since the last call."""
        _, data = self.engine.take_output()
        if self._parser is None:
            return []
        return [f for f in self._parser.feed(data)]

    def receipt_all(self, frames: list[Frame]) -> None:
        for frame in frames:
            receipt = frame.headers.get("receipt")
            if receipt is not None:
                self.reply("RECEIPT", receipt_id=receipt)
