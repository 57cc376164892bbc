"""Batched frames (protocol/batch.py): the stream MESSAGE body (docs/streams.md) and the
batched SEND body (`pairmq-batch`, docs/stomp.md). Records round-trip, header names and values are
escaped, and a cut, overlong or miscounted body is a ProtocolError."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pairmq.protocol import ProtocolError
from pairmq.protocol.batch import (
    MAX_SEND_BATCH,
    RECORD_HEAD,
    SEND_BATCH_HEADER,
    SEND_HEAD,
    append_send_record,
    decode_records,
    decode_send_records,
    encode_records,
    encode_send_records,
    header_block,
    parse_header_block,
    parse_send_batch,
)


def test_records_round_trip_in_order():
    records = [
        (7, 1_700_000_000_123, "ID:a-1", {"persistent": "true", "k": "v"}, b"x" * 200),
        (8, 1_700_000_000_124, "ID:a-2", {"persistent": "true", "k": "v"}, b""),
        (9, 0, "", {}, bytes(range(256))),  # NUL and every other byte in a body
    ]
    decoded = decode_records(encode_records(records))
    assert decoded == records
    assert decoded[0][3] is decoded[1][3]  # one parse for one header block


def test_the_fixed_header_is_little_endian_and_26_bytes():
    body = encode_records([(1, 2, "m", {"a": "b"}, b"xyz")])
    assert RECORD_HEAD.size == 26
    assert body == (b"\x01" + b"\x00" * 7 + b"\x02" + b"\x00" * 7 + b"\x01\x00"
                    + b"\x04\x00\x00\x00" + b"\x03\x00\x00\x00" + b"m" + b"a:b\n" + b"xyz")


@pytest.mark.parametrize("name,value", [
    ("a:b", "c:d"), ("line", "one\ntwo"), ("back", "sl\\ash"), ("cr", "a\rb"),
    ("ünï", "cödé"), ("empty", "")])
def test_names_and_values_are_escaped_as_stomp_1_2(name, value):
    block = header_block([(name, value), ("plain", "x")])
    assert block.count(b"\n") == 2
    assert parse_header_block(block) == {name: value, "plain": "x"}


def test_the_first_of_a_repeated_header_wins():
    assert parse_header_block(b"a:1\na:2\n") == {"a": "1"}


@pytest.mark.parametrize("cut", [1, 25, 27, 30])
def test_a_cut_body_is_a_protocol_error(cut):
    body = encode_records([(1, 2, "m", {"a": "b"}, b"xyz")])
    with pytest.raises(ProtocolError, match="batch"):
        decode_records(body[:cut])


def test_a_header_line_without_a_colon_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="colon"):
        parse_header_block(b"nocolon\n")


def test_an_empty_body_has_no_records():
    assert decode_records(b"") == []


def test_a_header_block_without_its_final_newline_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="newline"):
        parse_header_block(b"a:1\nb:2")


# ----------------------------------------------------------------------------- batched SEND


def test_send_records_round_trip_in_order():
    records = [
        ({"dup-id": "o-1", "persistent": "true"}, b"first"),
        ({"dup-id": "o-2", "persistent": "true"}, b""),  # an empty body
        ({}, bytes(range(256))),  # no headers of its own; NUL and every other byte
        ({"dup-id": "o-2", "persistent": "true"}, b"\x00" * 3),
    ]
    body = encode_send_records(records)
    decoded = decode_send_records(body, len(records))
    assert decoded == records
    assert [type(b) for _, b in decoded] == [bytes] * 4


@pytest.mark.parametrize("name,value", [
    ("a:b", "c:d"), ("line", "one\ntwo"), ("back", "sl\\ash"), ("cr", "a\rb"),
    ("ünï", "cödé ✓"), ("empty", ""), ("dup-id", "id:with\\all\nthree")])
def test_send_record_headers_round_trip_escaped(name, value):
    records = [({name: value, "plain": "x"}, b"body"), ({name: value}, b"")]
    assert decode_send_records(encode_send_records(records), 2) == records


def test_the_send_record_header_is_two_little_endian_u32():
    parts: list[bytes | memoryview] = []
    append_send_record(parts, header_block([("a", "b")]), b"xyz")
    body = b"".join(parts)
    assert SEND_HEAD.size == 8
    assert body == b"\x04\x00\x00\x00" + b"\x03\x00\x00\x00" + b"a:b\n" + b"xyz"
    assert encode_send_records([({"a": "b"}, b"xyz")]) == body


@pytest.mark.parametrize(("packed", "count", "says"), [
    (3, 4, "packs 3 messages"),
    (3, 2, "packs 3 messages"),  # one too many: counted exactly
    (5, 2, "packs more than 3 messages"),  # more: the decoder stops reading at count + 1
    (0, 1, "packs 0 messages"),
])
def test_a_body_that_packs_another_count_than_x_batch_is_a_protocol_error(packed, count, says):
    body = encode_send_records([({"n": str(i)}, b"m") for i in range(packed)])
    with pytest.raises(ProtocolError) as caught:
        decode_send_records(body, count)
    message = str(caught.value)
    assert says in message
    assert f"{SEND_BATCH_HEADER} header says {count}" in message


def test_the_right_count_decodes_and_an_empty_body_packs_none():
    body = encode_send_records([({}, b"a"), ({}, b"b")])
    assert [b for _, b in decode_send_records(body, 2)] == [b"a", b"b"]
    assert decode_send_records(b"", 0) == []


def cut_points() -> list[tuple[int, str]]:
    """(bytes kept, what the error must say) for cuts inside the second of three messages."""
    first = len(encode_send_records([({"k": "v"}, b"one")]))
    return [
        (first + 1, "header of message 2"),
        (first + SEND_HEAD.size - 1, "header of message 2"),
        (first + SEND_HEAD.size, "message 2 runs past"),  # its header block is missing
        (first + SEND_HEAD.size + 3, "message 2 runs past"),  # cut inside its header block
        (first + SEND_HEAD.size + len(b"k:v\n") + 1, "message 2 runs past"),  # inside its body
    ]


@pytest.mark.parametrize(("keep", "says"), cut_points())
def test_a_cut_send_body_names_the_message_it_cut(keep, says):
    body = encode_send_records([({"k": "v"}, b"one"), ({"k": "v"}, b"two"),
                                ({"k": "v"}, b"three")])
    with pytest.raises(ProtocolError, match=says):
        decode_send_records(body[:keep], 3)


def test_a_cut_inside_the_first_message_names_message_1():
    body = encode_send_records([({"k": "v"}, b"one")])
    with pytest.raises(ProtocolError, match="header of message 1"):
        decode_send_records(body[:3], 1)
    with pytest.raises(ProtocolError, match="message 1 runs past"):
        decode_send_records(body[:-1], 1)


def test_a_send_header_block_that_is_not_utf8_is_a_protocol_error():
    # A peer's bytes: the server must answer with an ERROR, not fail inside (a
    # UnicodeDecodeError is no ProtocolError, so the connection would report an internal
    # error).
    parts: list[bytes | memoryview] = []
    append_send_record(parts, b"k:\xff\xfe\n", b"body")
    with pytest.raises(ProtocolError):
        decode_send_records(b"".join(parts), 1)


@pytest.mark.parametrize("value", ["1", "2", "10", str(MAX_SEND_BATCH)])
def test_x_batch_from_1_to_the_maximum_is_the_count(value):
    assert parse_send_batch(value) == int(value)


def test_no_x_batch_header_is_no_batch():
    assert parse_send_batch(None) is None


@pytest.mark.parametrize("value", [
    "0", str(MAX_SEND_BATCH + 1), "-1", "abc", "", " 5", "5 ", "+5", "1.0"])
def test_a_bad_x_batch_is_a_protocol_error_naming_the_header(value):
    with pytest.raises(ProtocolError, match=SEND_BATCH_HEADER):
        parse_send_batch(value)


@pytest.mark.parametrize("value", [
    "²",  # str.isdigit() is true of it, int() is not
    pytest.param("0" * 4400 + "1", id="4401-digits"),  # past sys.get_int_max_str_digits()
])
def test_an_x_batch_of_digits_int_cannot_read_is_a_protocol_error(value):
    # A peer's header (a header line may be 10 KiB): the server must answer with an ERROR,
    # not fail inside with a ValueError (reported as an internal error).
    with pytest.raises(ProtocolError, match=SEND_BATCH_HEADER):
        parse_send_batch(value)


# Small texts that favour the characters escaping is about (as tests/protocol/test_properties).
header_text = st.text(
    alphabet=st.one_of(st.sampled_from(":\\\n\r\x00 é✓"), st.characters(codec="utf-8")),
    max_size=12,
)
send_records = st.lists(
    st.tuples(st.dictionaries(header_text, header_text, max_size=5), st.binary(max_size=64)),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(send_records)
def test_any_send_records_round_trip(records):
    body = encode_send_records(records)
    assert decode_send_records(body, len(records)) == records
    if records:  # one message more or fewer than the body packs is refused
        with pytest.raises(ProtocolError, match=SEND_BATCH_HEADER):
            decode_send_records(body, len(records) + 1)
        with pytest.raises(ProtocolError, match=SEND_BATCH_HEADER):
            decode_send_records(body, len(records) - 1)
