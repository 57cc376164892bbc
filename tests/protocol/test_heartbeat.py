"""Heart-beat header parsing and negotiation."""

from __future__ import annotations

import pytest

from pairmq.protocol import ProtocolError, negotiate_heart_beat, parse_heart_beat


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0,0", (0, 0)), ("10000,5000", (10000, 5000)), (" 10, 20 ", (10, 20)), ("007,1", (7, 1))],
)
def test_parse(value, expected):
    assert parse_heart_beat(value) == expected


@pytest.mark.parametrize(
    "value",
    ["", "1", "1,2,3", "-1,0", "0,-5", "a,b", "1.5,2", ",", "1,", "+1,1", "1 0,2", "\u0661,2"],
)
def test_parse_rejects(value):
    with pytest.raises(ProtocolError, match="invalid heart-beat"):
        parse_heart_beat(value)


def test_doc_example_server_offers_h_h():
    # docs/stomp.md: the server sends every max(H, cy) and expects every max(cx, H).
    h = 10000
    assert negotiate_heart_beat(h, h, 4000, 20000) == (20000, 10000)
    assert negotiate_heart_beat(h, h, 30000, 1000) == (10000, 30000)


@pytest.mark.parametrize(
    ("local", "remote", "expected"),
    [
        ((0, 0), (1000, 1000), (0, 0)),  # we disable both directions
        ((1000, 1000), (0, 0), (0, 0)),  # they disable both
        ((1000, 0), (0, 500), (1000, 0)),  # only we send
        ((0, 1000), (500, 0), (0, 1000)),  # only they send
        ((1000, 1000), (1000, 0), (0, 1000)),  # they do not want ours
        ((1000, 1000), (0, 1000), (1000, 0)),  # they send none
    ],
)
def test_negotiate(local, remote, expected):
    assert negotiate_heart_beat(*local, *remote) == expected
