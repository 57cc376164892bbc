"""In a pair with replication_mode "sync", a persistent message reaches the active server's
consumers only once its record is confirmed: on the active's disk and acknowledged by the
backup, or, once the active has dropped its backup (STANDALONE, the witness agreeing), on
its own disk. So a consumer never sees a message the next active server could lack.

The backup is stopped with SIGSTOP: alive for the kernel (its socket stays open) but it
acknowledges nothing, so the active's confirmed_seq (GET /status) stands still. That
sequence number is monotonic: if it is still below the message's record after a window in
which no MESSAGE arrived, the message was unconfirmed during all of that window.
"""

from __future__ import annotations

import pytest

from tests.ha.pair import Pair
from tests.integration import rawstomp
from tests.integration.rawstomp import RawStomp, unique
from tests.support.waiting import wait_until

P = {"persistent": "true"}
HEARTBEAT_MS, ACTIVATION_MS = 250, 4000  # a window of seconds before the backup is dropped
WATCH = 1.5  # seconds a held message is watched for not arriving


def journal(pair: Pair, name: str) -> dict:
    status = pair.status(name)
    assert status is not None, f"{name} does not answer\n{pair.describe()}"
    return {**status["journal"], "state": status["state"]}


def send_and_watch(pair: Pair, producer: RawStomp, consumer: RawStomp, queue: str,
                   body: bytes) -> int:
    """SEND a persistent message while the backup cannot acknowledge; check it is neither
    receipted nor delivered while its record is unconfirmed; returns its record's lowest
    possible sequence number."""
    before = journal(pair, "primary")
    assert before["confirmed_seq"] == before["appended_seq"], before
    record = before["appended_seq"] + 1
    producer.send_frame("SEND", {"destination": queue, "receipt": body.decode(), **P}, body)
    wait_until(lambda: journal(pair, "primary")["appended_seq"] >= record,
               "the SEND's record appended", 5.0)
    with pytest.raises(TimeoutError):
        frame = consumer.read_frame(WATCH)
        raise AssertionError(f"delivered before the backup acknowledged: {frame!r}")
    after = journal(pair, "primary")
    assert after["state"] == "ACTIVE", f"the backup was dropped too soon: {after}"
    assert after["confirmed_seq"] < record, after  # unconfirmed during the whole window
    with pytest.raises(TimeoutError):
        frame = consumer.read_frame(0.2)  # nothing written just before the status either
        raise AssertionError(f"delivered before the backup acknowledged: {frame!r}")
    with pytest.raises(TimeoutError):
        frame = producer.read_frame(0.05)
        raise AssertionError(f"receipted before the backup acknowledged: {frame!r}")
    return record


def test_delivery_waits_for_the_backup_or_for_confirming_alone(pair_factory) -> None:
    pair = pair_factory(heartbeat_ms=HEARTBEAT_MS, activation_ms=ACTIVATION_MS)
    pair.start(parallel=True)
    pair.wait_formed(30)
    address = pair.client_address("primary")
    queue = f"/queue/{unique('gate')}"
    consumer, _ = rawstomp.connect(address)
    producer, _ = rawstomp.connect(address)
    try:
        consumer.request("SUBSCRIBE", {"destination": queue, "id": "q"})

        # The backup comes back before it is dropped: its acknowledgement releases both.
        with pair.frozen("backup"):
            record = send_and_watch(pair, producer, consumer, queue, b"acked-by-backup")
        assert consumer.read_message(5.0).body == b"acked-by-backup"
        assert journal(pair, "primary")["confirmed_seq"] >= record
        assert producer.wait_receipt("acked-by-backup", 5.0).command == "RECEIPT"
        assert journal(pair, "primary")["state"] == "ACTIVE"

        # The backup stays away: the active drops it, goes STANDALONE with the witness's
        # lease and then confirms (and delivers) on its own disk.
        with pair.frozen("backup"):
            record = send_and_watch(pair, producer, consumer, queue, b"confirmed-alone")
            message = consumer.read_message(ACTIVATION_MS / 1000 * 3 + 5)
            after = journal(pair, "primary")
            assert message.body == b"confirmed-alone"
            assert after["state"] == "STANDALONE", after
            assert after["confirmed_seq"] >= record, after
            assert producer.wait_receipt("confirmed-alone", 5.0).command == "RECEIPT"
    finally:
        consumer.close()
        producer.close()
