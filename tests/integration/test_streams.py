"""Streams (`/stream/NAME`, docs/streams.md) against a real server: append, read from any
position, bounded ranges with an end marker, independent readers, offsets and contents
through a SIGKILL and restart, retention by size, age and consumer group, dup-ids, stream
info on the SUBSCRIBE's RECEIPT, and the errors bad headers get."""

from __future__ import annotations

import time

import pytest

from tests.integration.rawstomp import ConnectionClosed
from tests.support.servers import restart
from tests.support.streams import append, bodies, info, offsets, read, stream_info, subscribe


def test_append_then_read_from_every_kind_of_start(server, raw_client):
    c, _ = raw_client(server)
    append(c, "/stream/s1", [f"m{i}" for i in range(5)], persistent="false")
    _, receipt = subscribe(c, "/stream/s1", "first")
    assert info(receipt) == (0, 5)
    frames = read(c, 5)
    assert offsets(frames) == [0, 1, 2, 3, 4]
    assert bodies(frames) == [f"m{i}" for i in range(5)]
    for f in frames:
        assert f.headers["destination"] == "/stream/s1"
        assert int(f.headers["timestamp"]) > 0
    stamps = [int(f.headers["timestamp"]) for f in frames]
    from_3 = stamps.index(stamps[3])  # the first appended at or after message 3's time

    r, _ = raw_client(server)
    subscribe(r, "/stream/s1", "offset=2")
    assert offsets(read(r, 3)) == [2, 3, 4]
    subscribe(r, "/stream/s1", "3")
    assert offsets(read(r, 2)) == [3, 4]
    subscribe(r, "/stream/s1", "last")
    assert offsets(read(r, 1)) == [4]
    subscribe(r, "/stream/s1", f"timestamp={stamps[3]}")
    assert offsets(read(r, 5 - from_3)) == list(range(from_3, 5))
    subscribe(r, "/stream/s1", "offset=99")  # beyond next: waits for it
    subscribe(r, "/stream/s1")  # default: next
    r.assert_quiet()
    append(c, "/stream/s1", ["m5"])
    frames = read(r, 5)  # every reader but offset=99 (which still waits) reads on
    assert offsets(frames) == [5] * 5
    assert len({f.headers["subscription"] for f in frames}) == 5
    r.assert_quiet()


def test_bounded_range_end_marker_and_independent_readers(server, raw_client):
    c, _ = raw_client(server)
    append(c, "/stream/s2", [f"m{i}" for i in range(4)])
    a, _ = raw_client(server)
    sub_a, _ = subscribe(a, "/stream/s2", "offset=1", **{"x-stream-end-offset": "3",
                                                         "ack": "client-individual"})
    frames = read(a, 3)
    assert offsets(frames[:2]) == [1, 2]
    end = frames[2]
    assert end.headers["x-stream-end"] == "true"
    assert end.headers["x-stream-offset"] == "3"
    assert end.headers["subscription"] == sub_a
    assert end.headers["destination"] == "/stream/s2"
    assert "message-id" in end.headers and "ack" in end.headers
    assert end.body == b""
    for f in frames:
        a.request("ACK", {"id": f.headers["ack"]})  # acking the marker is harmless
    a.assert_quiet()

    # A range past the end waits for the appends, then ends; another reader is unaffected.
    b, _ = raw_client(server)
    subscribe(b, "/stream/s2", "first", **{"x-stream-end-offset": "6"})
    subscribe(a, "/stream/s2", "first")
    assert offsets(read(b, 4)) == [0, 1, 2, 3]
    assert offsets(read(a, 4)) == [0, 1, 2, 3]  # consuming removed nothing
    append(c, "/stream/s2", ["m4", "m5", "m6"])
    frames = read(b, 3)
    assert offsets(frames[:2]) == [4, 5] and frames[2].headers["x-stream-end"] == "true"
    b.assert_quiet()
    assert offsets(read(a, 3)) == [4, 5, 6]
    assert stream_info(c, "/stream/s2") == (0, 7)


def test_credit_limits_what_a_client_ack_reader_is_sent(server, raw_client):
    c, _ = raw_client(server)
    append(c, "/stream/s3", [f"m{i}" for i in range(10)])
    subscribe(c, "/stream/s3", "first", ack="client", **{"prefetch-count": "3"})
    frames = read(c, 3)
    c.assert_quiet()
    c.request("ACK", {"id": frames[-1].headers["ack"]})  # cumulative: three credits back
    assert offsets(read(c, 3)) == [3, 4, 5]


def test_unknown_stream_info_and_bad_headers(server, raw_client):
    c, _ = raw_client(server)
    assert stream_info(c, "/stream/new") == (0, 0)  # a SUBSCRIBE creates it
    for headers, named in (
        ({"x-stream-must-exist": "true"}, "unknown stream /stream/absent"),
        ({"x-stream-offset": "offset=-1"}, "x-stream-offset"),
        ({"x-stream-offset": "sometime"}, "'sometime'"),
        ({"x-stream-offset": "offset=5", "x-stream-end-offset": "2"}, "x-stream-end-offset"),
        ({"x-stream-end-offset": "x"}, "x-stream-end-offset"),
    ):
        bad, _ = raw_client(server)
        destination = "/stream/absent" if "x-stream-must-exist" in headers else "/stream/new"
        bad.send_frame("SUBSCRIBE", {"destination": destination, "id": "x", **headers})
        frames = bad.read_until_closed()
        assert frames[0].command == "ERROR" and named in frames[0].headers["message"], frames
    bad, _ = raw_client(server)
    bad.send_frame("SEND", {"destination": "/stream/new", "x-stream-group": "g",
                            "x-stream-commit-offset": "-3"})
    assert "x-stream-commit-offset" in bad.read_until_closed()[0].headers["message"]
    append(c, "/stream/new", ["still serving"])
    assert stream_info(c, "/stream/new") == (0, 1)
    with pytest.raises((ConnectionClosed, OSError, TimeoutError)):
        subscribe(bad, "/stream/new")


def test_dup_id_appends_once(server, raw_client):
    c, _ = raw_client(server)
    append(c, "/stream/dups", ["a"], **{"dup-id": "d1"})
    append(c, "/stream/dups", ["a again"], **{"dup-id": "d1"})
    append(c, "/stream/dups", ["b"], **{"dup-id": "d2"})
    subscribe(c, "/stream/dups", "first")
    assert bodies(read(c, 2)) == ["a", "b"]
    c.assert_quiet()


def test_offsets_and_contents_survive_kill_9(server_factory, raw_client):
    srv = server_factory()
    c, _ = raw_client(srv)
    append(c, "/stream/orders", [f"order {i}" for i in range(20)], **{"dup-id": "x"})
    append(c, "/stream/orders", [f"order {i}" for i in range(1, 20)])
    stream_info(c, "/stream/empty")  # created by a SUBSCRIBE, empty
    c.close()
    srv = restart(srv)
    c, _ = raw_client(srv)
    assert stream_info(c, "/stream/orders") == (0, 20)
    assert stream_info(c, "/stream/empty") == (0, 0)
    append(c, "/stream/orders", ["order 0"], **{"dup-id": "x"})  # remembered: dropped
    append(c, "/stream/orders", ["order 20"])
    subscribe(c, "/stream/orders", "first")
    frames = read(c, 21)
    assert offsets(frames) == list(range(21))
    assert bodies(frames) == [f"order {i}" for i in range(21)]


def test_retention_by_size_and_age_with_a_restart(server_factory, raw_client):
    config = """
[streams]
max_bytes = 2000
[streams.retention.aging]
max_age_ms = 300
max_bytes = 0
"""
    srv = server_factory(config_text=config)
    c, _ = raw_client(srv)
    append(c, "/stream/sized", ["x" * 100 for _ in range(40)])
    first, nxt = stream_info(c, "/stream/sized")
    assert nxt == 40 and 0 < first < 40
    append(c, "/stream/aging", ["old"] * 5)
    time.sleep(1.6)  # the age passes, and the server's periodic tick applies it
    assert stream_info(c, "/stream/aging") == (4, 5)  # the newest is always kept
    srv = restart(srv, config_text=config)
    c, _ = raw_client(srv)
    assert stream_info(c, "/stream/sized") == (first, 40)
    assert stream_info(c, "/stream/aging") == (4, 5)
    append(c, "/stream/aging", ["new"])
    subscribe(c, "/stream/aging", "first")
    assert offsets(read(c, 1)) == [5]  # the aged one went with this append


def test_consumer_group_commit_subscribe_and_retention_protection(server_factory, raw_client):
    config = """
[streams.retention]
orders = {max_bytes = 500, group = "spark"}
"""
    srv = server_factory(config_text=config)
    c, _ = raw_client(srv)
    append(c, "/stream/orders", [f"o{i:02d}" * 10 for i in range(20)])
    assert stream_info(c, "/stream/orders") == (0, 20)  # spark has committed nothing
    c.request("SEND", {"destination": "/stream/orders", "x-stream-group": "spark",
                       "x-stream-commit-offset": "7"}, "ignored")
    c.request("SEND", {"destination": "/stream/orders", "x-stream-group": "spark",
                       "x-stream-commit-offset": "3"})  # offsets only move forward
    assert stream_info(c, "/stream/orders") == (7, 20)  # retention up to the group's offset
    srv = restart(srv, config_text=config)
    c, _ = raw_client(srv)
    assert stream_info(c, "/stream/orders") == (7, 20)
    subscribe(c, "/stream/orders", "group", **{"x-stream-group": "spark"})
    assert offsets(read(c, 13)) == list(range(7, 20))
    o, _ = raw_client(srv)
    subscribe(o, "/stream/orders", "group", **{"x-stream-group": "other"})
    assert offsets(read(o, 1)) == [7]  # no offset stored: from the first
