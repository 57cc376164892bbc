"""Paging: with a small --paging-bytes, persistent bodies stay on disk (in the journal) and
only their index is held in memory; consumers still get every message, in order, with
its exact body, also after a restart, a dead-letter move or a topic fan-out."""

from __future__ import annotations

import hashlib
import re

import psutil

import pairmq.client
from tests.integration.rawstomp import RawStomp, unique
from tests.serverproc import ServerProcess
from tests.support.servers import restart

P = {"persistent": "true"}
MiB = 1024 * 1024


def payload(i: int, size: int) -> bytes:
    """A body nobody could mistake for another: sha256-derived bytes, tagged with i."""
    seed = hashlib.sha256(b"%d" % i).digest()
    return (b"%06d:" % i + seed * (size // len(seed) + 1))[:size]


def rss(srv: ServerProcess) -> int:
    return psutil.Process(srv.proc.pid).memory_info().rss


def send_many(client: RawStomp, destination: str, count: int, size: int, start: int = 0,
              batch: int = 50) -> None:
    """Persistent SENDs, pipelined by `batch`, every one receipted."""
    for first in range(start, start + count, batch):
        last = min(first + batch, start + count)
        for i in range(first, last):
            client.send_frame("SEND", {"destination": destination, "receipt": f"p{i}",
                                       "x-seq": str(i), **P}, payload(i, size))
        for i in range(first, last):
            client.wait_receipt(f"p{i}", timeout=10)


def receive(client: RawStomp, count: int, ack: bool = False) -> list[tuple[int, bytes]]:
    got = []
    for _ in range(count):
        frame = client.read_message(10)
        got.append((int(frame.headers["x-seq"]), frame.body))
        if ack:
            client.send_frame("ACK", {"id": frame.headers["ack"]})
    return got


def expected(first: int, count: int, size: int) -> list[tuple[int, bytes]]:
    return [(i, payload(i, size)) for i in range(first, first + count)]


def test_500_paged_messages_arrive_in_order_before_and_after_a_restart(server_factory,
                                                                       raw_client):
    flags = ("--paging-bytes", "20000")
    srv = server_factory(*flags)
    queue = f"/queue/{unique('page')}"
    producer, _ = raw_client(srv)
    producer.request("SEND", {"destination": f"/queue/{unique('warm')}", **P}, "warm")
    before = rss(srv)
    send_many(producer, queue, 500, 1024)
    assert rss(srv) - before < 8 * MiB

    consumer, _ = raw_client(srv)
    consumer.request("SUBSCRIBE", {"destination": queue, "id": "s",
                                   "ack": "client-individual", "prefetch-count": "50"})
    assert receive(consumer, 250, ack=True) == expected(0, 250, 1024)
    consumer.request("UNSUBSCRIBE", {"id": "s"})  # its receipt follows the acks' records

    srv = restart(srv, *flags)
    found = re.search(r"\(paging: (\d+) bodies in memory", srv.logs())
    assert found and int(found.group(1)) < 250, srv.logs()  # the rest stayed on disk
    consumer, _ = raw_client(srv)
    consumer.request("SUBSCRIBE", {"destination": queue, "id": "s"})
    assert receive(consumer, 250) == expected(250, 250, 1024)
    try:
        extra = consumer.read_message(0.3)
    except TimeoutError:
        extra = None
    assert extra is None, f"unexpected {extra!r}"


def test_a_large_backlog_stays_on_disk_not_in_memory(server_factory, raw_client):
    """50 MiB of persistent bodies with a 1 MiB paging budget: the server's resident
    memory grows by a small fraction of that, while sending, after a restart and while
    the backlog is consumed."""
    flags = ("--paging-bytes", str(MiB))
    count, size = 800, 64 * 1024
    srv = server_factory(*flags)
    queue = f"/queue/{unique('big')}"
    producer, _ = raw_client(srv)
    producer.request("SEND", {"destination": f"/queue/{unique('warm')}", **P}, "warm")
    idle = rss(srv)
    send_many(producer, queue, count, size)
    grown = rss(srv) - idle
    assert grown < 20 * MiB, f"{grown / MiB:.1f} MiB more for {count * size / MiB:.0f} MiB"

    srv = restart(srv, *flags)
    recovered = rss(srv) - idle
    assert recovered < 20 * MiB, f"{recovered / MiB:.1f} MiB more after recovery"
    consumer, _ = raw_client(srv)
    consumer.request("SUBSCRIBE", {"destination": queue, "id": "s",
                                   "ack": "client-individual", "prefetch-count": "20"})
    got = receive(consumer, count // 2, ack=True)
    assert rss(srv) - idle < 30 * MiB
    got += receive(consumer, count - count // 2, ack=True)
    assert [seq for seq, _ in got] == list(range(count))
    assert all(b == payload(seq, size) for seq, b in got), "a body came back altered"


def test_paged_message_moved_to_the_dead_letter_queue_keeps_its_body(server_factory,
                                                                     raw_client):
    flags = ("--paging-bytes", "0", "--max-delivery-attempts", "1")
    srv = server_factory(*flags)
    name = unique("pdlq")
    producer, _ = raw_client(srv)
    send_many(producer, f"/queue/{name}", 5, 3000)
    consumer, _ = raw_client(srv)
    consumer.request("SUBSCRIBE", {"destination": f"/queue/{name}", "id": "s",
                                   "ack": "client-individual"})
    for _ in range(5):
        frame = consumer.read_message()
        consumer.request("NACK", {"id": frame.headers["ack"]})  # straight to DLQ.<name>

    srv = restart(srv, *flags)
    consumer, _ = raw_client(srv)
    consumer.request("SUBSCRIBE", {"destination": f"/queue/DLQ.{name}", "id": "d"})
    assert receive(consumer, 5) == expected(0, 5, 3000)


def test_paged_topic_messages_reach_every_durable_subscription(server_factory, raw_client):
    flags = ("--paging-bytes", "0")
    srv = server_factory(*flags)
    topic = f"/topic/{unique('pfan')}"
    subscriber, _ = raw_client(srv)
    for sub in ("a", "b"):
        subscriber.request("SUBSCRIBE", {"destination": topic, "id": sub, "durable": "true"})
        subscriber.request("UNSUBSCRIBE", {"id": sub})  # away: the backlog builds up
    producer, _ = raw_client(srv)
    send_many(producer, topic, 60, 2000)
    subscriber.request("SUBSCRIBE", {"destination": topic, "id": "a", "durable": "true"})
    assert receive(subscriber, 60) == expected(0, 60, 2000)

    srv = restart(srv, *flags)
    subscriber, _ = raw_client(srv)
    subscriber.request("SUBSCRIBE", {"destination": topic, "id": "b", "durable": "true"})
    assert receive(subscriber, 60) == expected(0, 60, 2000)


def test_a_full_destination_pages_whatever_the_budget_also_after_a_restart(server_factory,
                                                                           raw_client):
    """address_full_policy page: past max_size_bytes a body stays on disk though the paging
    budget (256 MiB by default) has room, and recovery brings back no more of that
    destination than its limit."""
    flags = ("--max-size-bytes", str(200 * 1024))
    srv = server_factory(*flags)
    queue = f"/queue/{unique('full')}"
    producer, _ = raw_client(srv)
    producer.request("SEND", {"destination": f"/queue/{unique('warm')}", **P}, "warm")
    before = rss(srv)
    send_many(producer, queue, 600, 16 * 1024)  # 9.4 MiB into a 200 KiB destination
    assert rss(srv) - before < 6 * MiB

    srv = restart(srv, *flags)
    found = re.search(r"\(paging: (\d+) bodies in memory", srv.logs())
    # At most what fits in the limit, plus the warm-up message of the other queue.
    assert found and int(found.group(1)) <= 200 * 1024 // (16 * 1024) + 1, srv.logs()
    consumer, _ = raw_client(srv)
    consumer.request("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "client-individual",
                                   "prefetch-count": "50"})
    assert receive(consumer, 600, ack=True) == expected(0, 600, 16 * 1024)


def test_a_restart_reads_a_paged_backlog_through_the_segments_summaries(server_factory):
    """Sealed segments get summaries (store/summary.py); a start after kill -9 reads them
    instead of the records and delivers every message once, in order, with its body, as a
    start that reads every record does (the summaries deleted)."""
    flags = ("--max-size-bytes", str(MiB), "--segment-bytes", str(MiB))
    srv = server_factory(*flags)
    queue = "/queue/summarised"
    count = 20_000
    with pairmq.client.connect(f"stomp://{srv.host}:{srv.port}", send_window=8) as client:
        for first in range(0, count, 500):
            client.send_batch_async(queue, [(payload(i, 512), {"x-seq": str(i)})
                                            for i in range(first, first + 500)])
        client.flush()
    journal = srv.data_dir / "journal"
    assert len(list(journal.glob("journal-*.sum"))) >= 8

    for summaries in (True, False):
        srv = restart(srv, *flags)
        found = re.search(r"\((\d+) of the segments through their summaries\)", srv.logs())
        assert (found is not None and int(found.group(1)) >= 8) is summaries, srv.logs()
        with pairmq.client.connect(f"stomp://{srv.host}:{srv.port}") as consumer:
            sub = consumer.subscribe(queue, ack="client",
                                     headers={"prefetch-count": str(count)})
            got = []
            for _ in range(count):
                message = sub.receive(10)
                assert message is not None, f"only {len(got)} of {count} came"
                got.append((int(message.headers["x-seq"]), message.body))
            assert got == expected(0, count, 512)
            # not acknowledged: the next start finds them all again
        for path in journal.glob("journal-*.sum"):
            path.unlink()


def test_a_start_brings_only_recovery_in_memory_bytes_of_a_backlog_into_memory(server_factory,
                                                                              raw_client):
    """[store] recovery_in_memory_bytes: after kill -9, a start keeps in memory no more of a
    paging destination's backlog than that (the rest is read from the journal as the
    consumer reaches it), and the consumer still gets every message once, in order, with
    its body, the messages sent after the start behind the backlog. With 0, a start
    brings back up to the destination's limit, as before the key."""
    size, count = 4096, 1500  # 6 MiB into a 4 MiB destination, segments of 1 MiB
    flags = ("--max-size-bytes", str(4 * MiB), "--segment-bytes", str(MiB))
    srv = server_factory(*flags)
    queue = f"/queue/{unique('restart')}"
    producer, _ = raw_client(srv)
    send_many(producer, queue, count, size)
    consumer, _ = raw_client(srv)
    consumer.request("SUBSCRIBE", {"destination": queue, "id": "s",
                                   "ack": "client-individual", "prefetch-count": "100"})
    assert receive(consumer, 100, ack=True) == expected(0, 100, size)
    consumer.request("UNSUBSCRIBE", {"id": "s"})

    srv = restart(srv, *flags, "--recovery-in-memory-bytes", "0")
    found = re.search(r"\(paging: (\d+) bodies in memory", srv.logs())
    assert found and int(found.group(1)) > 4 * MiB // (2 * size), srv.logs()  # up to its limit

    srv = restart(srv, *flags, "--recovery-in-memory-bytes", str(256 * 1024))
    found = re.search(r"\(paging: (\d+) bodies in memory", srv.logs())
    assert found and int(found.group(1)) <= 256 * 1024 // size, srv.logs()
    producer, _ = raw_client(srv)
    send_many(producer, queue, 50, size, start=count)
    consumer, _ = raw_client(srv)
    consumer.request("SUBSCRIBE", {"destination": queue, "id": "s",
                                   "ack": "client-individual", "prefetch-count": "100"})
    assert receive(consumer, count - 100 + 50, ack=True) == expected(100, count - 50, size)
    try:
        extra = consumer.read_message(0.3)
    except TimeoutError:
        extra = None
    assert extra is None, f"unexpected {extra!r}"
