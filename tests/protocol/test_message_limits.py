"""What a message may hold so that its MESSAGE frames fit the server's own limits
(protocol/limits.py): its headers, with the ones the server adds on delivery; its size;
and for a batched SEND's records, what the frame parser would have checked."""

from __future__ import annotations

import pytest

from pairmq.protocol import ProtocolError
from pairmq.protocol.limits import BYTES_ADDED, HEADERS_ADDED, MessageLimits

LIMITS = MessageLimits(max_frame_bytes=4096, max_headers=20, max_header_bytes=100)
NOT_KEPT = frozenset({"destination", "receipt", "content-length"})


def headers(count: int) -> dict[str, str]:
    return {f"h{i}": "v" for i in range(count)}


def test_a_message_keeps_max_headers_less_what_the_server_adds() -> None:
    assert LIMITS.most_headers == 20 - HEADERS_ADDED
    LIMITS.check(headers(10), 10)
    with pytest.raises(ProtocolError, match=r"too many headers in a message: 11 kept with it, "
                                            r"at most 10 \(max_headers 20 less the 10"):
        LIMITS.check(headers(11), 10)


def test_headers_the_message_does_not_keep_are_not_counted() -> None:
    frame = {**headers(10), "destination": "/queue/q", "receipt": "r", "content-length": "1"}
    LIMITS.check(frame, 1, not_kept=NOT_KEPT)
    with pytest.raises(ProtocolError, match="13 kept"):
        LIMITS.check(frame, 1)


def test_a_message_leaves_room_for_the_bytes_the_server_adds() -> None:
    most = 4096 - BYTES_ADDED
    LIMITS.check({"a": "b"}, most - 5)  # 1 + 1 + 2 bytes of header
    with pytest.raises(ProtocolError, match=rf"a message too large: {most + 1} bytes, at most "
                                            rf"{most}"):
        LIMITS.check({"a": "b"}, most - 3)


def test_a_batch_record_counts_the_frames_headers_with_its_own() -> None:
    frame = {"destination": "/queue/q", **headers(6)}
    LIMITS.check_batch([({"n": "1"}, b"x"), ({**{f"r{i}": "v" for i in range(4)}}, b"y")],
                       frame, NOT_KEPT)
    with pytest.raises(ProtocolError, match="too many headers in message 2 of the batched "
                                            "SEND: 11 kept"):
        LIMITS.check_batch([({"n": "1"}, b"x"), ({f"r{i}": "v" for i in range(5)}, b"y")],
                           frame, NOT_KEPT)


@pytest.mark.parametrize(("record", "error"), [
    ({"x": "y" * 100}, "header line too long in message 1 of the batched SEND"),
    ({"x": "a\x00b"}, r"NUL \(octet 0\) in a header of message 1"),
    ({"a\x00": "b"}, r"NUL \(octet 0\) in a header of message 1"),
])
def test_a_batch_record_gets_the_checks_of_a_frame(record, error) -> None:
    with pytest.raises(ProtocolError, match=error):
        LIMITS.check_batch([(record, b"x")], {"destination": "/queue/q"}, NOT_KEPT)
