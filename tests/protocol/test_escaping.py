"""escape_header / unescape_header per STOMP version."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pairmq.protocol import ProtocolError, escape_header, unescape_header

RAW = "a:b\nc\\d\re"


def test_1_2_escapes_all_four():
    assert escape_header(RAW, "1.2") == "a\\cb\\nc\\\\d\\re"
    assert unescape_header("a\\cb\\nc\\\\d\\re", "1.2") == RAW


def test_1_1_leaves_cr_alone():
    assert escape_header(RAW, "1.1") == "a\\cb\\nc\\\\d\re"
    assert unescape_header("a\\cb\\nc\\\\d\re", "1.1") == RAW


def test_1_0_has_no_escaping():
    assert escape_header(RAW, "1.0") == RAW
    assert unescape_header("a\\cb\\t", "1.0") == "a\\cb\\t"


def test_plain_values_come_back_unchanged():
    for version in ("1.0", "1.1", "1.2"):
        assert escape_header("/queue/a b", version) == "/queue/a b"
        assert unescape_header("/queue/a b", version) == "/queue/a b"


def test_backslashes_are_escaped_once():
    assert escape_header("\\n", "1.2") == "\\\\n"
    assert unescape_header("\\\\n", "1.2") == "\\n"
    assert unescape_header("\\\\\\\\", "1.2") == "\\\\"


@pytest.mark.parametrize(
    ("value", "version", "message"),
    [
        ("a\\tb", "1.2", "undefined escape sequence \\t in header"),
        ("a\\rb", "1.1", "undefined escape sequence \\r in header"),
        ("\\C", "1.2", "undefined escape sequence \\C in header"),
        ("ab\\", "1.2", "incomplete escape sequence at end of header"),
        ("\\\\\\", "1.1", "incomplete escape sequence at end of header"),
    ],
)
def test_undefined_escapes(value, version, message):
    with pytest.raises(ProtocolError) as info:
        unescape_header(value, version)
    assert str(info.value) == message


def test_unknown_version():
    with pytest.raises(ValueError):
        escape_header("a", "2.0")
    with pytest.raises(ValueError):
        unescape_header("a", "2.0")


@pytest.mark.parametrize(
    ("wire", "value"),
    [
        ("ID\\cpairmq-1\\c42", "ID:pairmq-1:42"),  # a message id: only \c, the quick path
        ("\\\\c", "\\c"),  # an escaped backslash before a c is not a colon
        ("\\\\\\c", "\\:"),
        ("\\c\\\\", ":\\"),
    ],
)
def test_colon_escapes_decode_left_to_right(wire, value):
    assert unescape_header(wire, "1.2") == value
    assert unescape_header(wire, "1.1") == value


@settings(max_examples=500)
@given(st.text(alphabet="\\c:nr\n\rx", max_size=16))
def test_escaping_round_trips(value):
    assert unescape_header(escape_header(value, "1.2"), "1.2") == value
    assert unescape_header(escape_header(value, "1.1"), "1.1") == value  # CR goes raw
