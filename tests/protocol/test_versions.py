"""Version negotiation from accept-version."""

from __future__ import annotations

import pytest

from pairmq.protocol import SUPPORTED_VERSIONS, negotiate_version


def test_supported():
    assert SUPPORTED_VERSIONS == ("1.0", "1.1", "1.2")


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, "1.0"),
        ("1.0", "1.0"),
        ("1.1", "1.1"),
        ("1.2", "1.2"),
        ("1.0,1.1,1.2", "1.2"),
        ("1.2,1.0", "1.2"),
        ("1.0,1.1", "1.1"),
        ("1.1, 1.0", "1.1"),
        ("1.1,2.0", "1.1"),
        ("2.0", None),
        ("", None),
        ("1.3,2.1", None),
        ("1", None),
    ],
)
def test_negotiate_version(header, expected):
    assert negotiate_version(header) == expected
