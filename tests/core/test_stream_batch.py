"""Batched stream reads in the core (x-stream-batch, docs/streams.md): consecutive records
per MESSAGE, bounded by the batch size, the credit left (counted in records), the range's end
and a byte budget; ACKs give back K credits; a resumed session reads a lost batch again; and
the server's delivery gate for a batch is its newest record's."""

from __future__ import annotations

import pytest

from pairmq.core import Broker, CoreError, CoreSettings
from pairmq.core.message import Message
from pairmq.core.settings import Retention
from pairmq.core.stream_log import StreamBatch
from pairmq.server.role.confirmations import Ticket
from pairmq.server.role.role import Role
from tests.support.build import COMPILED

S = "/stream/s"


def broker() -> Broker:
    b = Broker(CoreSettings(stream_retention=Retention(max_bytes=0)))
    b.open_session(1, "1.2")
    return b


def append(b: Broker, n: int, start: int = 0, size: int = 10) -> None:
    for i in range(start, start + n):
        b.send(1, S, {"k": str(i)}, (f"m{i}".ljust(size)).encode(), 1000 + i)


def frames(b: Broker) -> list[tuple[int | str, int]]:
    """(first offset or "end", records) of each frame handed out since last asked."""
    out: list[tuple[int | str, int]] = []
    for d in b.take_outbox().get(1, []):
        if isinstance(d, StreamBatch):
            offsets = [int(m.headers["x-stream-offset"]) for m in d.messages]
            assert offsets == list(range(d.offset, d.offset + len(offsets)))  # consecutive
            out.append((d.offset, len(d.messages)))
        else:
            assert d.entry.message.headers.get("x-stream-end") == "true"
            out.append(("end", 0))
    return out


def test_a_range_comes_in_batches_then_one_end_marker():
    b = broker()
    append(b, 25)
    b.subscribe_stream(1, "r", S, {"x-stream-offset": "first", "x-stream-end-offset": "25",
                                   "x-stream-batch": "10"}, ack="client", prefetch=100)
    assert frames(b) == [(0, 10), (10, 10), (20, 5), ("end", 0)]


def test_a_batch_never_crosses_the_range_end_and_waits_for_appends():
    b = broker()
    append(b, 5)
    b.subscribe_stream(1, "r", S, {"x-stream-offset": "offset=3", "x-stream-end-offset": "9",
                                   "x-stream-batch": "100"})
    assert frames(b) == [(3, 2)]
    append(b, 10, start=5)
    # each append is fed at once: one record per frame while following the tail
    assert frames(b) == [(5, 1), (6, 1), (7, 1), (8, 1), ("end", 0)]


def test_credit_counts_records_and_an_ack_of_a_batch_gives_back_all_of_it():
    b = broker()
    append(b, 40)
    b.subscribe_stream(1, "c", S, {"x-stream-offset": "first", "x-stream-batch": "10"},
                       ack="client", prefetch=15)
    got = b.take_outbox()[1]
    assert [(d.offset, len(d.messages)) for d in got] == [(0, 10), (10, 5)]
    cursor = b.sessions[1].cursors["c"]
    assert cursor.outstanding == 15 and not cursor.can_take()
    b.ack(1, got[0].ack_id, 0)  # ten credits back
    assert frames(b) == [(15, 10)]
    b.ack(1, got[1].ack_id, 0)  # five back; the batch at 15 is still held
    assert frames(b) == [(25, 5)]


def test_client_individual_acks_one_batch():
    b = broker()
    append(b, 6)
    b.subscribe_stream(1, "c", S, {"x-stream-offset": "first", "x-stream-batch": "3"},
                       ack="client-individual", prefetch=6)
    got = b.take_outbox()[1]
    append(b, 3, start=6)
    assert frames(b) == []
    b.ack(1, got[1].ack_id, 0)
    assert frames(b) == [(6, 3)]
    assert b.sessions[1].cursors["c"].outstanding == 6


def test_ack_auto_bounds_a_turn_by_the_window_in_records():
    b = broker()
    append(b, 100)
    b.subscribe_stream(1, "a", S, {"x-stream-offset": "first", "x-stream-batch": "10"},
                       prefetch=30)
    assert frames(b) == [(0, 10), (10, 10), (20, 10)]
    assert b.take_capped(1)
    b.set_writable(1, True, 0)
    assert frames(b) == [(30, 10), (40, 10), (50, 10)]


def test_a_batch_stops_at_the_byte_budget():
    b = broker()
    append(b, 10, size=300 * 1024)
    b.subscribe_stream(1, "r", S, {"x-stream-offset": "first", "x-stream-batch": "100"},
                       ack="client", prefetch=100)
    got = frames(b)
    assert got[0] == (0, 4)  # about 1 MiB; at least one record in each
    assert sum(n for _, n in got) == 10


def test_a_resumed_session_reads_a_lost_batch_again():
    b = broker()
    append(b, 20)
    b.subscribe_stream(1, "c", S, {"x-stream-offset": "first", "x-stream-batch": "5"},
                       ack="client", prefetch=20)
    got = b.take_outbox()[1]
    b.park_session(1)
    assert b.resume_session(1, int(got[1].ack_id), 0) == 10  # the last two batches
    assert frames(b) == [(10, 5), (15, 5)]
    assert b.sessions[1].cursors["c"].outstanding == 20


def test_without_the_header_nothing_changes():
    b = broker()
    append(b, 3)
    b.subscribe_stream(1, "p", S, {"x-stream-offset": "first"})
    assert [type(d).__name__ for d in b.take_outbox()[1]] == ["Delivery"] * 3


@pytest.mark.parametrize("value", ["0", "10001", "x", "-1", "1.5", ""])
def test_a_bad_batch_size_names_the_header_and_value(value):
    b = broker()
    with pytest.raises(CoreError, match=rf"x-stream-batch .*{value!r}"):
        b.subscribe_stream(1, "bad", S, {"x-stream-batch": value})
    assert "bad" not in b.sessions[1].cursors


class _Gates:
    """A role stand-in: each message's gate is what `gates` says."""

    def __init__(self, gates: dict[str, Ticket | None]) -> None:
        self.gates = gates

    def delivery_gate(self, message: Message) -> Ticket | None:
        return self.gates[message.message_id]


@pytest.mark.skipif(COMPILED, reason="calls a Role method on a stand-in; a compiled "
                                    "method takes only a Role")
def test_a_batch_frame_waits_for_its_newest_unconfirmed_record():
    def msg(mid: str) -> Message:
        return Message(mid, S, {}, b"")
    old, new, pending = Ticket(5), Ticket(9), Ticket()
    batch = [msg("a"), msg("b"), msg("c")]
    assert Role.batch_gate(_Gates({"a": None, "b": None, "c": None}), batch) is None
    assert Role.batch_gate(_Gates({"a": old, "b": new, "c": None}), batch) is new
    assert Role.batch_gate(_Gates({"a": new, "b": old, "c": None}), batch) is new
    # not journaled yet (the records the next flush writes): newer than any numbered one
    assert Role.batch_gate(_Gates({"a": old, "b": pending, "c": new}), batch) is pending
