"""Packing a batched SEND (client/batching.py), checked against the server's own decoder:
what `send_batch` and the Spark sink put in a frame is what the server reads out of it."""

from __future__ import annotations

import itertools

import pytest

from pairmq.client import ClientError
from pairmq.client.batching import BatchBuilder, pack_batch
from pairmq.protocol.batch import MAX_SEND_BATCH, SEND_BATCH_HEADER, decode_send_records


def test_in_a_transaction_pack_batch_gives_each_persistent_message_a_dup_id():
    ids = (f"auto-{n}" for n in itertools.count())
    body, headers, dup_ids = pack_batch(
        [b"a", "é", (b"c", {"dup-id": "mine", "k": "v"}), (b"d", None)],
        {"content-type": "text/plain"}, True, lambda: next(ids))
    assert headers == {"content-type": "text/plain", SEND_BATCH_HEADER: "4"}
    assert dup_ids == ("auto-0", "auto-1", "mine", "auto-2")
    records = decode_send_records(body, 4)
    assert [b for _, b in records] == [b"a", "é".encode(), b"c", b"d"]
    assert [h for h, _ in records] == [{"dup-id": "auto-0"}, {"dup-id": "auto-1"},
                                       {"dup-id": "mine", "k": "v"}, {"dup-id": "auto-2"}]


def test_outside_a_transaction_only_the_applications_dup_ids_are_kept():
    """The frame's producer stamp names the messages (the engine adds it)."""
    body, _, dup_ids = pack_batch([b"a", (b"c", {"dup-id": "mine"})], None, True, None)
    assert dup_ids == ("mine",)
    assert decode_send_records(body, 2) == [({}, b"a"), ({"dup-id": "mine"}, b"c")]


def test_a_non_persistent_batch_names_no_message():
    body, _, dup_ids = pack_batch([b"a", b"b"], None, False, lambda: "never")
    assert dup_ids == ()
    assert decode_send_records(body, 2) == [({}, b"a"), ({}, b"b")]


@pytest.mark.parametrize(("items", "headers", "message"), [
    ([], None, "1 to 10000 messages, got 0"),
    ([b"x"] * (MAX_SEND_BATCH + 1), None, "got 10001"),
    ([b"x"], {"dup-id": "d"}, "dup-id names one message"),
    ([(b"x", {"receipt": "r"})], None, r"message 1 sets \['receipt'\]"),
    ([b"x", (b"y", {"pairmq-seq": "3"})], None, r"message 2 sets \['pairmq-seq'\]: a batch's "
                                                r"producer stamp is on the frame"),
])
def test_what_cannot_be_a_batch_is_named(items, headers, message):
    with pytest.raises(ClientError, match=message):
        pack_batch(items, headers, True, lambda: "d")


def test_the_builder_numbers_each_frame_from_where_the_last_one_ended():
    builder = BatchBuilder("q:1", epoch=7)
    builder.add(b"one")
    builder.add(b"two", {"k": "v:w"})
    builder.add(b"")
    assert builder.count == 3 and builder.size > len(b"onetwo")
    body, headers = builder.take()
    assert headers == {SEND_BATCH_HEADER: "3", "pairmq-producer": "q:1",
                       "pairmq-producer-epoch": "7", "pairmq-seq": "0"}
    assert decode_send_records(body, 3) == [({}, b"one"), ({"k": "v:w"}, b"two"), ({}, b"")]
    assert (builder.count, builder.size) == (0, 0)  # the next frame starts empty
    builder.add(b"four")
    _, headers = builder.take()
    assert headers["pairmq-seq"] == "3"
    with pytest.raises(ClientError, match="got 0"):
        builder.take()


def test_the_builder_of_epoch_0_sends_no_epoch_header():
    builder = BatchBuilder("w:0")
    builder.add(b"x")
    assert builder.take()[1] == {SEND_BATCH_HEADER: "1", "pairmq-producer": "w:0",
                                 "pairmq-seq": "0"}
