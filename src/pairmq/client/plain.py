"""One plain STOMP connection to one server, no failover: for tests and tools that need to
see exactly what a given server answers (a refusal, a frame). Applications use the failover
client, `pairmq.client.connect`.
"""

from __future__ import annotations

import socket
import time
from collections import deque

from pairmq.protocol import Frame, FrameParser, serialize


class StompError(Exception):
    """The server answered ERROR; `frame` holds its headers and body."""

    def __init__(self, frame: Frame) -> None:
        self.frame = frame
        super().__init__(frame.headers.get("message", "ERROR"))


class BlockingConnection:
    def __init__(self, host: str, port: int, login: str | None = None,
                 passcode: str | None = None, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.parser = FrameParser()
        self.pending: deque[Frame] = deque()
        self._receipts = 0
        headers = {"accept-version": "1.2", "host": host, "heart-beat": "0,0"}
        if login is not None:
            headers["login"] = login
            headers["passcode"] = passcode or ""
        self._write(Frame("CONNECT", headers))
        connected = self.read_frame(timeout)
        if connected.command != "CONNECTED":
            raise StompError(connected)
        self.server_headers = connected.headers

    def _write(self, frame: Frame) -> None:
        self.sock.sendall(serialize(frame, "1.2"))

    def read_frame(self, timeout: float | None = None) -> Frame:
        """Next frame from the server; ERROR frames raise StompError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.pending:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("no frame from the server in time")
                self.sock.settimeout(remaining)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the server closed the connection")
            self.pending.extend(self.parser.feed(data))
        frame = self.pending.popleft()
        if frame.command == "ERROR":
            raise StompError(frame)
        return frame

    def request(self, frame: Frame, timeout: float = 10.0) -> list[Frame]:
        """Send a frame with a receipt and wait for it; returns frames that arrived before."""
        self._receipts += 1
        receipt = str(self._receipts)
        frame.headers["receipt"] = receipt
        self._write(frame)
        before: list[Frame] = []
        while True:
            reply = self.read_frame(timeout)
            if reply.command == "RECEIPT" and reply.headers.get("receipt-id") == receipt:
                return before
            before.append(reply)

    def send(self, destination: str, body: bytes, headers: dict[str, str] | None = None) -> None:
        """Send and wait for the server's receipt."""
        early = self.request(Frame("SEND", {"destination": destination, **(headers or {})},
                                   body))
        self.pending.extendleft(reversed(early))

    def subscribe(self, destination: str, sub_id: str = "0", ack: str = "auto") -> None:
        early = self.request(Frame("SUBSCRIBE", {"destination": destination, "id": sub_id,
                                                 "ack": ack}))
        self.pending.extendleft(reversed(early))

    def ack(self, message: Frame) -> None:
        self._write(Frame("ACK", {"id": message.headers["ack"]}))

    def close(self) -> None:
        try:
            self.request(Frame("DISCONNECT"), timeout=2.0)
        except (OSError, TimeoutError, StompError):
            pass
        self.sock.close()
