"""The batched stream MESSAGE body (protocol/batch.py, docs/streams.md): records round-trip,
escaping of header names and values, and a cut or overlong body is a ProtocolError."""

from __future__ import annotations

import pytest

from pairmq.protocol import ProtocolError
from pairmq.protocol.batch import (
    RECORD_HEAD,
    decode_records,
    encode_records,
    header_block,
    parse_header_block,
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
