"""Dispatch with a message selector matching 1 message in 10 on a queue of 100,000 (issue 23).

Run from the repository root:

    .venv/bin/python benchmarks/selector_dispatch.py                  # both, 3 runs each
    .venv/bin/python benchmarks/selector_dispatch.py --messages 100000 --runs 5 --only server

`core`: the broker alone (no I/O). 100,000 messages wait in a queue, every tenth with
`color:red`; a consumer subscribes with `color = 'red'` and takes the 10,000 it matches
(ack:auto, turn by turn as the server drives it). Timed: the SUBSCRIBE (it indexes the
queue once) and the deliveries; beside it, a consumer without a selector taking 10,000
messages from a queue of 10,000 (the rate a selector should come near).

`server`: the same through a real server and a raw STOMP socket: the queue filled with
non-persistent 100-byte messages, then a client-individual consumer with the selector
reads and ACKs the 10,000 it matches; beside it, a plain consumer on a queue of 10,000.
Figures are messages delivered per second, one JSON line per run.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from tests.serverproc import start_server  # noqa: E402

from pairmq.core import Broker, CoreSettings  # noqa: E402

SELECTOR = "color = 'red'"
NOW = 1_000_000


def _core_fill(broker: Broker, queue: str, messages: int, every: int) -> None:
    for i in range(messages):
        headers = {"color": "red" if i % every == 0 else "blue", "n": str(i)}
        broker.send(1, queue, headers, b"x" * 100, NOW)


def _core_drain(broker: Broker, conn: int, want: int) -> int:
    got = 0
    while got < want:
        out = broker.take_outbox().get(conn, [])
        if not out:
            if not broker.take_capped(conn):
                break
            broker.set_writable(conn, True, NOW)
            continue
        got += len(out)
    return got


def core_run(messages: int, every: int) -> dict[str, object]:
    broker = Broker(CoreSettings(default_prefetch=1000))
    broker.open_session(1, "1.2")
    broker.open_session(2, "1.2")
    _core_fill(broker, "/queue/sel", messages, every)
    started = time.perf_counter()
    broker.subscribe(2, "s", "/queue/sel", NOW, selector=SELECTOR)
    subscribed = time.perf_counter()
    got = _core_drain(broker, 2, messages // every)
    selective = time.perf_counter() - subscribed

    plain = Broker(CoreSettings(default_prefetch=1000))
    plain.open_session(1, "1.2")
    plain.open_session(2, "1.2")
    _core_fill(plain, "/queue/plain", messages // every, 1)
    begun = time.perf_counter()
    plain.subscribe(2, "s", "/queue/plain", NOW)
    plain_got = _core_drain(plain, 2, messages // every)
    plain_s = time.perf_counter() - begun
    return {"mode": "core", "queue": messages, "matched": got,
            "subscribe_ms": round((subscribed - started) * 1000, 1),
            "selective_msgs_per_s": round(got / selective),
            "plain_msgs_per_s": round(plain_got / plain_s),
            "ratio": round((got / selective) / (plain_got / plain_s), 2)}


# ----------------------------------------------------------------- through a server

def _frame(command: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    head = "".join(f"{k}:{v}\n" for k, v in headers.items())
    return f"{command}\n{head}\n".encode() + body + b"\x00"


class Raw:
    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address)
        self.buffer = b""
        self.sock.sendall(_frame("CONNECT", {"accept-version": "1.2", "host": "localhost"}))
        assert self.next().startswith(b"CONNECTED")

    def next(self) -> bytes:
        while b"\x00" not in self.buffer:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise AssertionError("server closed the connection")
            self.buffer += chunk
        frame, _, self.buffer = self.buffer.partition(b"\x00")
        self.buffer = self.buffer.lstrip(b"\n")
        return frame

    def fill(self, queue: str, messages: int, every: int) -> None:
        """Non-persistent SENDs, one RECEIPT at the end (the connection is ordered)."""
        chunk = []
        for i in range(messages):
            colour = "red" if i % every == 0 else "blue"
            chunk.append(_frame("SEND", {"destination": queue, "color": colour,
                                         "n": str(i)}, b"x" * 100))
            if len(chunk) == 1000:
                self.sock.sendall(b"".join(chunk))
                chunk = []
        chunk.append(_frame("SEND", {"destination": "/queue/fence", "receipt": "filled"}))
        self.sock.sendall(b"".join(chunk))
        while b"receipt-id:filled" not in self.next():
            pass

    def consume(self, queue: str, want: int, selector: str | None) -> float:
        headers = {"destination": queue, "id": "s", "ack": "client-individual",
                   "prefetch-count": "500"}
        if selector is not None:
            headers["selector"] = selector
        started = time.perf_counter()
        self.sock.sendall(_frame("SUBSCRIBE", headers))
        acks = []
        for _ in range(want):
            frame = self.next()
            ack = frame.split(b"\nack:", 1)[1].split(b"\n", 1)[0]
            acks.append(_frame("ACK", {"id": ack.decode()}))
            if len(acks) == 100:
                self.sock.sendall(b"".join(acks))
                acks = []
        elapsed = time.perf_counter() - started
        if acks:
            self.sock.sendall(b"".join(acks))
        return elapsed

    def close(self) -> None:
        self.sock.close()


def server_run(messages: int, every: int) -> dict[str, object]:
    workdir = Path(tempfile.mkdtemp(prefix="pairmq-selectors-"))
    server = start_server(workdir, "--allow-anonymous", name="selectors")
    try:
        address = (server.host, server.port)
        producer = Raw(address)
        producer.fill("/queue/sel", messages, every)
        producer.fill("/queue/plain", messages // every, 1)
        consumer = Raw(address)
        selective = consumer.consume("/queue/sel", messages // every, SELECTOR)
        consumer.close()
        plain_consumer = Raw(address)
        plain = plain_consumer.consume("/queue/plain", messages // every, None)
        plain_consumer.close()
        producer.close()
    finally:
        server.stop()
    want = messages // every
    return {"mode": "server", "queue": messages, "matched": want,
            "selective_msgs_per_s": round(want / selective),
            "plain_msgs_per_s": round(want / plain),
            "ratio": round(plain / selective, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=10, help="1 message in EVERY matches")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=("core", "server"))
    args = parser.parse_args()
    for _ in range(args.runs):
        if args.only in (None, "core"):
            print(json.dumps(core_run(args.messages, args.every)), flush=True)
        if args.only in (None, "server"):
            print(json.dumps(server_run(args.messages, args.every)), flush=True)


if __name__ == "__main__":
    main()
