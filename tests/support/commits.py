"""Large STOMP transactions against real servers: stage one, COMMIT it, and check after a
crash that its messages are all there, once and in order, or none of them (the COMMIT
applied in slices over many turns, with a commit marker in the journal).

    conn = BlockingConnection(srv.host, srv.port)
    stage(conn, "big", "/queue/x", 50_000)        # BEGIN, then SENDs numbered 0..49,999
    replies = Replies(conn)                        # RECEIPTs read from a thread
    send_commit(conn, "big")                       # COMMIT, receipt "commit-big", not waited
    srv.kill()
    ...restart...
    outcome = all_or_none(drain(address, "/queue/x"), 50_000)   # "all" or "none"
    if "commit-big" in replies.receipts: assert outcome == "all"

Every message staged carries a header `n` (its number) and the body `body(n)`, so that a
drain can tell each one apart, see a duplicate, a gap and the order.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from pairmq.client.plain import BlockingConnection, StompError
from pairmq.protocol import Frame, serialize
from tests.support.bulk import Address, Wire

BODY_SIZE = 100


def body(n: int, size: int = BODY_SIZE) -> bytes:
    """Message n's body: its number, then padding to `size` bytes."""
    return (b"%08d:" % n).ljust(size, b"m")


def stage(conn: BlockingConnection, transaction: str, destination: str, count: int, *,
          first: int = 0, persistent: bool = True, size: int = BODY_SIZE, chunk: int = 1000,
          sync_every: int = 5000, timeout: float = 30.0) -> None:
    """BEGIN `transaction` and SEND messages first..first+count-1 in it (header n, body
    body(n)), pipelined `chunk` frames a write; every `sync_every` messages, and at the
    end, the last SEND carries a receipt that is waited for, so the client never runs far
    ahead of the server and a refusal (an ERROR: StompError) shows up where it happened."""
    conn.request(Frame("BEGIN", {"transaction": transaction}), timeout=timeout)
    head = {"destination": destination, "transaction": transaction}
    if persistent:
        head["persistent"] = "true"
    end, n, unsynced = first + count, first, 0
    while n < end:
        last = min(end, n + chunk)
        if unsynced + (last - n) >= sync_every or last == end:
            # every frame of this chunk but its last one, then that one with a receipt
            conn.sock.sendall(b"".join(serialize(Frame("SEND", {**head, "n": str(i)},
                                                       body(i, size)), "1.2")
                                       for i in range(n, last - 1)))
            conn.request(Frame("SEND", {**head, "n": str(last - 1)}, body(last - 1, size)),
                         timeout=timeout)
            unsynced = 0
        else:
            conn.sock.sendall(b"".join(serialize(Frame("SEND", {**head, "n": str(i)},
                                                       body(i, size)), "1.2")
                                       for i in range(n, last)))
            unsynced += last - n
        n = last


def commit_receipt(transaction: str) -> str:
    """The receipt id `send_commit` asks for."""
    return f"commit-{transaction}"


def send_commit(conn: BlockingConnection, transaction: str) -> str:
    """Write the COMMIT of `transaction` with a receipt, without waiting for anything;
    returns the receipt id."""
    receipt = commit_receipt(transaction)
    conn.sock.sendall(serialize(Frame("COMMIT", {"transaction": transaction,
                                                 "receipt": receipt}), "1.2"))
    return receipt


class Replies:
    """Everything the server answers on `conn`, read from a thread until the connection
    ends (a kill of the server ends it): RECEIPT ids, each with the moment it was read,
    and the ERROR frame if one came. Nothing else may be written on `conn` meanwhile
    except with `conn.sock.sendall`."""

    def __init__(self, conn: BlockingConnection, timeout: float = 120.0) -> None:
        self.conn = conn
        self.timeout = timeout
        self.receipts: dict[str, float] = {}
        self.error: Frame | None = None
        self.ended: str | None = None  # how the connection ended
        self.other: list[Frame] = []
        self._thread = threading.Thread(target=self._run, daemon=True, name="replies")
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                frame = self.conn.read_frame(self.timeout)
                if frame.command == "RECEIPT":
                    self.receipts[frame.headers.get("receipt-id", "")] = time.monotonic()
                else:
                    self.other.append(frame)
        except StompError as e:
            self.error = e.frame
            self.ended = f"ERROR {e.frame.headers.get('message')!r}"
        except (OSError, ConnectionError, TimeoutError) as e:
            self.ended = repr(e)

    def wait(self, receipt: str, timeout: float) -> float | None:
        """When `receipt` arrived (time.monotonic), waiting up to `timeout`; None if it
        did not (or the connection ended first)."""
        deadline = time.monotonic() + timeout
        while receipt not in self.receipts and self._thread.is_alive() \
                and time.monotonic() < deadline:
            time.sleep(0.005)
        return self.receipts.get(receipt)

    def join(self, timeout: float = 10.0) -> None:
        """Until the connection ended (after the server was killed, or closed it)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"the connection did not end within {timeout} s")


def drain(address: Address, destination: str, *, idle: float = 1.0,
          timeout: float = 120.0, size: int = BODY_SIZE,
          expect: int | None = None) -> list[int]:
    """Consume `destination` (ack auto) until nothing more comes for `idle` seconds (or,
    with `expect`, until that many came and then nothing for `idle`): the `n` header of
    every message in the order they came. Every body must be body(n)."""
    wire = Wire(address, timeout=timeout)
    ns: list[int] = []
    deadline = time.monotonic() + timeout
    try:
        wire.sock.sendall((f"SUBSCRIBE\nid:drain\ndestination:{destination}\nack:auto\n"
                           f"\n\x00").encode())
        while True:
            frame = wire.buffered()
            if frame is not None:
                if frame.command != b"MESSAGE":
                    raise AssertionError(f"after {len(ns)} messages of {destination}: "
                                         f"{frame!r}")
                n = int(frame.header(b"n"))
                if frame.body != body(n, size):
                    raise AssertionError(f"message n={n} arrived with another body: "
                                         f"{frame.body[:40]!r}")
                ns.append(n)
                continue
            if time.monotonic() > deadline:
                raise AssertionError(f"{destination}: still draining after {timeout} s "
                                     f"({len(ns)} messages)")
            quiet = expect is None or len(ns) >= expect
            if not wire.read_more(idle if quiet else min(30.0, timeout)):
                if quiet:
                    break
                raise AssertionError(f"{destination}: {len(ns)} of {expect} messages, then "
                                     "nothing")
    finally:
        wire.close()
    return ns


def all_or_none(ns: list[int], count: int, first: int = 0) -> str:
    """"none" when no message came, "all" when messages first..first+count-1 each came
    once, in order; anything else (a part, a duplicate, a stranger, another order) fails,
    saying what."""
    if not ns:
        return "none"
    expected = range(first, first + count)
    seen = set(ns)
    duplicates = len(ns) - len(seen)
    strangers = sorted(seen - set(expected))
    missing = [n for n in expected if n not in seen]
    if duplicates or strangers or missing:
        raise AssertionError(
            f"a part of the transaction: {len(ns)} messages of {count}, {len(seen)} distinct, "
            f"{duplicates} duplicates, {len(missing)} missing (first {missing[:5]}, last "
            f"{missing[-5:]}), strangers {strangers[:5]}")
    if ns != list(expected):
        at = next(i for i, (a, b) in enumerate(zip(ns, expected, strict=True)) if a != b)
        raise AssertionError(f"all {count} messages once, but out of order: position {at} "
                             f"holds n={ns[at]} ({ns[max(0, at - 3):at + 4]})")
    return "all"


def depth(status: dict[str, Any] | None, destination: str) -> int | None:
    """The number of messages `destination` holds in a GET /status answer (0 when it is
    not listed), None without an answer."""
    if status is None:
        return None
    return int(status["destinations"].get(destination, {}).get("messages", 0))


def close_abruptly(conn: BlockingConnection) -> None:
    """Close the socket without DISCONNECT, as a client that dies would."""
    try:
        conn.sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    conn.sock.close()
