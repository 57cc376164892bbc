"""serialize(): wire layout, content-length, escaping by version and command."""

from __future__ import annotations

import pytest

from pairmq.protocol import HEARTBEAT, Frame, serialize


def test_layout():
    frame = Frame("SEND", {"destination": "/queue/a", "receipt": "r"}, b"hi")
    assert serialize(frame) == b"SEND\ndestination:/queue/a\nreceipt:r\ncontent-length:2\n\nhi\x00"


def test_no_headers_no_body():
    assert serialize(Frame("DISCONNECT")) == b"DISCONNECT\n\n\x00"


def test_content_length_is_added_only_for_a_body():
    assert serialize(Frame("RECEIPT", {"receipt-id": "1"})) == b"RECEIPT\nreceipt-id:1\n\n\x00"
    assert serialize(Frame("SEND", {}, b"\x00\x01")) == b"SEND\ncontent-length:2\n\n\x00\x01\x00"


def test_a_callers_content_length_is_kept_as_is():
    frame = Frame("SEND", {"content-length": "1", "x": "y"}, b"abc")
    assert serialize(frame) == b"SEND\ncontent-length:1\nx:y\n\nabc\x00"


def test_the_frame_is_not_modified():
    frame = Frame("SEND", {"x": "a:b"}, b"abc")
    serialize(frame)
    assert frame == Frame("SEND", {"x": "a:b"}, b"abc")


def test_utf8():
    assert serialize(Frame("SEND", {"ключ": "✓"})) == "SEND\nключ:✓\n\n\x00".encode()


@pytest.mark.parametrize(
    ("version", "line"),
    [
        ("1.2", b"k\\cx:a\\cb\\nc\\\\d\\re"),
        ("1.1", b"k\\cx:a\\cb\\nc\\\\d\re"),
    ],
)
def test_escaping_by_version(version, line):
    frame = Frame("MESSAGE", {"k:x": "a:b\nc\\d\re"})
    assert serialize(frame, version) == b"MESSAGE\n" + line + b"\n\n\x00"


def test_1_1_escapes_when_only_a_colon_is_present():
    assert serialize(Frame("MESSAGE", {"k": "a:b"}), "1.1") == b"MESSAGE\nk:a\\cb\n\n\x00"


def test_a_cr_alone_is_escaped_in_1_2_and_raw_in_1_1():
    assert serialize(Frame("MESSAGE", {"k": "a\rb"}), "1.2") == b"MESSAGE\nk:a\\rb\n\n\x00"
    assert serialize(Frame("MESSAGE", {"k": "a\rb"}), "1.1") == b"MESSAGE\nk:a\rb\n\n\x00"


@pytest.mark.parametrize("command", ["CONNECT", "CONNECTED", "STOMP"])
def test_connect_frames_are_not_escaped(command):
    frame = Frame(command, {"passcode": "a:b\\c", "version": "1.2"})
    assert serialize(frame, "1.2") == f"{command}\npasscode:a:b\\c\nversion:1.2\n\n\x00".encode()


def test_1_0_is_not_escaped():
    frame = Frame("MESSAGE", {"path": "C:\\temp"})
    assert serialize(frame, "1.0") == b"MESSAGE\npath:C:\\temp\n\n\x00"


@pytest.mark.parametrize(("command", "version"), [("MESSAGE", "1.0"), ("CONNECTED", "1.2")])
def test_line_ends_cannot_forge_headers_where_escaping_is_off(command, version):
    frame = Frame(command, {"x": "a\nmessage-id:forged\r\n", "y\n": "z"})
    wire = serialize(frame, version)
    assert wire == f"{command}\nx:a message-id:forged  \ny :z\n\n\x00".encode()


def test_heartbeat():
    assert HEARTBEAT == b"\n"
