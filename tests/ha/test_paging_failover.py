"""A full destination through a failover of the pair: what the active server paged is
delivered in order by the backup once it takes over, and a client resending duplicates
to a full destination after a failover is answered, never blocked (docs/durability.md,
"Flow control and full destinations")."""

from __future__ import annotations

import time

import pytest

from tests.ha.pair import Pair
from tests.integration.rawstomp import RawStomp, encode_frame
from tests.integration.rawstomp import connect as raw_connect
from tests.support.bulk import drain, produce

KiB, MiB = 1024, 1024 * 1024
QUEUE = "/queue/paged"


def address(pair: Pair, name: str) -> tuple[str, int]:
    host, _, port = pair.stomp_address(name).rpartition(":")
    return host, int(port)


def fail_over(pair: Pair) -> None:
    pair.kill("primary")
    pair.wait_active(15, "backup")


@pytest.mark.long
def test_300_mib_paged_on_the_active_are_drained_in_order_from_the_backup(pair: Pair) -> None:
    count = 300 * MiB // KiB
    started = time.monotonic()
    sent = produce(address(pair, "primary"), QUEUE, 0, count)
    assert sent.max_wait_s < 1.0, (f"receipt #{sent.slowest} took {sent.max_wait_s:.2f} s "
                                   f"({count / sent.seconds:.0f} msgs/s)")
    held = pair.status("primary")["destinations"][QUEUE]
    assert held["paged_bytes"] > 200 * MiB, held
    fail_over(pair)
    drain(address(pair, "backup"), QUEUE, 0, count)
    print(f"300 MiB through the pair: produced at {count / sent.seconds:.0f} msgs/s (slowest "
          f"receipt {sent.max_wait_s * 1000:.0f} ms), all in {time.monotonic() - started:.1f} s")


def send(client: RawStomp, numbers: range) -> None:
    client.send_raw(b"".join(
        encode_frame("SEND", {"destination": QUEUE, "receipt": f"r{n}", "x-seq": str(n),
                              "dup-id": f"d{n}", "persistent": "true"}, b"x" * KiB)
        for n in numbers))


def receipts(client: RawStomp, stall: float) -> list[int]:
    got = []
    while True:
        try:
            frame = client.read_frame(stall)
        except TimeoutError:
            return got
        assert frame.command == "RECEIPT", frame
        got.append(int(frame.headers["receipt-id"][1:]))


def test_resending_duplicates_to_a_full_destination_after_a_failover_is_answered(
        pair_factory) -> None:
    pair = pair_factory(flags=["--address-full-policy", "block", "--max-size-bytes", "20000"])
    pair.start(parallel=True)
    pair.wait_formed()
    producer, _ = raw_connect(address(pair, "primary"))
    send(producer, range(40))
    taken = receipts(producer, stall=1.5)
    assert 10 <= len(taken) <= 20 and taken == list(range(len(taken))), taken
    producer.close()
    fail_over(pair)

    backup = address(pair, "backup")
    newcomer, _ = raw_connect(backup)
    newcomer.send_frame("SEND", {"destination": QUEUE, "receipt": "new", "x-seq": "new",
                                 "persistent": "true"}, "new")
    with pytest.raises(TimeoutError):  # the destination came back full: a new one waits
        newcomer.read_frame(1.0)
    resender, _ = raw_connect(backup)
    send(resender, range(len(taken)))  # every one a duplicate
    assert receipts(resender, stall=2.0) == taken

    consumer, _ = raw_connect(backup)
    consumer.send_frame("SUBSCRIBE", {"destination": QUEUE, "id": "s"})
    got = [consumer.read_message(10).headers["x-seq"] for _ in range(len(taken) + 1)]
    assert got == [str(n) for n in taken] + ["new"]
    assert newcomer.wait_receipt("new", 5).command == "RECEIPT"
    for client in (newcomer, resender, consumer):
        client.close()
