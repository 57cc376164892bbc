"""The stomp.py failover recipe (examples/stomp_py_failover.py) against a real pair: kill -9
of the active twice with a failback in between, the PASSIVE backup's `active-server` hint,
and a consumer that resubscribes and skips what it already handled."""

from __future__ import annotations

import collections
import threading
import time

from examples.stomp_py_failover import FailoverClient, parse_address

from tests.ha.pair import Pair
from tests.support.waiting import wait_until

WINDOW = 20  # messages in flight between two flushes: several are unreceipted at a kill


class Sender:
    """Sends `m-N` through the recipe from a thread until stopped; `receipted` grows as each
    window is flushed (so every id in it was confirmed by a RECEIPT)."""

    def __init__(self, client: FailoverClient, destination: str) -> None:
        self.client, self.destination = client, destination
        self.receipted: list[str] = []
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        n = 0
        try:
            while not self.stop_event.is_set():
                window = [f"m-{i}" for i in range(n, n + WINDOW)]
                for dup_id in window:
                    self.client.send(self.destination, f"body {dup_id}", dup_id, wait=False)
                n += WINDOW
                self.client.flush(timeout=30)
                self.receipted.extend(window)
        except BaseException as e:
            self.error = e

    def wait_more(self, count: int, timeout: float = 20.0) -> None:
        target = len(self.receipted) + count
        wait_until(lambda: self.error is not None or len(self.receipted) >= target,
                   f"{target} receipts (pending {len(self.client.pending)}, history "
                   f"{self.client.history})", timeout)
        if self.error is not None:
            raise self.error

    def stop(self) -> list[str]:
        self.stop_event.set()
        self.thread.join(40)
        assert not self.thread.is_alive(), f"sender stuck, pending {len(self.client.pending)}"
        if self.error is not None:
            raise self.error
        return self.receipted


def depth(pair: Pair, name: str, destination: str) -> int | None:
    st = pair.status(name)
    return None if st is None else st["destinations"].get(destination, {}).get("messages", 0)


def collapsed(history: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Consecutive reconnections to one server counted once."""
    return [a for i, a in enumerate(history) if i == 0 or history[i - 1] != a]


def test_producer_survives_two_kills_and_a_failback_exactly_once(pair: Pair) -> None:
    queue = "/queue/stomp-py-recipe"
    primary, backup = (pair.client_address(n) for n in ("primary", "backup"))
    # only the primary's address: the recipe learns the backup from CONNECTED's topology
    producer = FailoverClient([pair.stomp_address("primary")])
    sender = Sender(producer, queue)
    try:
        sender.wait_more(100)
        assert producer.servers == [primary, backup]

        pair.kill("primary")
        pair.wait_active(15, "backup")
        sender.wait_more(100)
        assert producer.history[-1] == backup

        pair.start_server("primary")  # failback: the backup closes its clients, naming it
        pair.wait_formed(20)
        sender.wait_more(100)
        assert producer.history[-1] == primary

        pair.kill("primary")
        pair.wait_active(15, "backup")
        sender.wait_more(100)
        receipted = sender.stop()
    finally:
        sender.stop_event.set()
        producer.close()
    assert collapsed(producer.history) == [primary, backup, primary, backup], producer.history
    assert producer.resent > 0 and not producer.pending and not producer.refused
    assert len(set(receipted)) == len(receipted)
    # every dup-id stored once: the queue holds exactly as many messages as were receipted
    stored = depth(pair, "backup", queue)
    assert stored == len(receipted), \
        f"{stored} stored for {len(receipted)} receipted dup-ids\n{pair.describe()}"

    delivered: collections.Counter[str] = collections.Counter()
    consumer = FailoverClient([pair.stomp_address("backup")], dedupe=False)  # count raw
    try:
        consumer.subscribe(queue, lambda frame: delivered.update([frame.headers["dup-id"]]))
        wait_until(lambda: delivered.total() >= len(receipted),
                   f"{len(receipted)} deliveries (got {delivered.total()})", 20)
        time.sleep(0.5)  # anything more would be a duplicate
        wait_until(lambda: depth(pair, "backup", queue) == 0, "every ACK applied", 10)
    finally:
        consumer.close()
    assert set(delivered) == set(receipted)
    doubled = {d: n for d, n in delivered.items() if n > 1}
    assert not doubled, f"delivered more than once: {list(doubled.items())[:10]}"


def test_first_pointed_at_the_passive_backup_follows_the_hint(pair: Pair) -> None:
    primary, backup = (pair.client_address(n) for n in ("primary", "backup"))
    client = FailoverClient([pair.stomp_address("backup")])  # the backup alone: PASSIVE
    try:
        client.send("/queue/hinted", "hello", "hinted-1", timeout=15)
        assert client.hint == primary  # named by the backup's refusal
        assert client.history == [primary]
        assert client.servers == [backup, primary]
    finally:
        client.close()
    assert pair.state("backup") == "PASSIVE"
    assert "this server is PASSIVE" in pair.current_logs("backup")
    assert depth(pair, "primary", "/queue/hinted") == 1


def test_consumer_resubscribes_after_a_kill_and_skips_what_it_handled(pair: Pair) -> None:
    queue = "/queue/stomp-py-consumer"
    servers = [pair.stomp_address(n) for n in ("primary", "backup")]
    producer = FailoverClient(servers)
    handled: collections.Counter[str] = collections.Counter()
    entered, release = threading.Event(), threading.Event()

    def handler(frame) -> None:
        entered.set()
        release.wait(30)  # the first message is being handled when the active dies
        handled[frame.headers["dup-id"]] += 1

    consumer = FailoverClient(servers, dedupe=True)
    try:
        for i in range(30):
            producer.send(queue, f"before {i}", f"before-{i}", wait=False)
        producer.flush(15)
        consumer.subscribe(queue, handler)
        assert entered.wait(15)
        pair.kill("primary")
        pair.wait_active(15, "backup")
        release.set()  # its ACK goes to a dead connection: the backup delivers it again
        for i in range(30):
            producer.send(queue, f"after {i}", f"after-{i}", wait=False)
        producer.flush(20)
        expected = {f"{when}-{i}" for when in ("before", "after") for i in range(30)}
        wait_until(lambda: set(handled) >= expected,
                   f"all handled (missing {sorted(expected - set(handled))[:5]})", 20)
        wait_until(lambda: depth(pair, "backup", queue) == 0, "every ACK applied", 10)
    finally:
        release.set()
        consumer.close()
        producer.close()
    assert set(handled) == expected
    assert all(n == 1 for n in handled.values()), handled.most_common(3)
    assert consumer.skipped >= 1  # at least the message in the handler came again
    assert consumer.history == [parse_address(s) for s in servers]
