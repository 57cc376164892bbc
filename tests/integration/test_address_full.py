"""A destination past max_size_bytes (address_full_policy page | block | fail | drop, per
destination by name pattern) and the server-wide guards (global_max_size_bytes,
max_disk_usage, a full journal), against real servers: what producers see, what
consumers get, and that a duplicate is never blocked or refused (docs/durability.md,
"Flow control and full destinations")."""

from __future__ import annotations

import os
import re
import time

import pytest

from pairmq.core.settings import AddressFullPolicy
from pairmq.server.config import ConfigError, load_config
from tests.integration.rawstomp import Frame, RawStomp, encode_frame, unique
from tests.serverproc import ServerProcess, free_port
from tests.support.admin import admin_request, admin_status, admin_user_flags
from tests.support.bulk import drain, payload, produce
from tests.support.cli import run_pairmq
from tests.support.disk import small_disk
from tests.support.servers import restart
from tests.support.waiting import wait_until

P = {"persistent": "true"}
KiB, MiB = 1024, 1024 * 1024


class Admin:
    """A server started with a management port, and what it says about itself."""

    def __init__(self) -> None:
        self.address = f"127.0.0.1:{free_port()}"

    @property
    def flags(self) -> list[str]:
        return ["--admin", self.address, *admin_user_flags()]

    def started(self, srv: ServerProcess) -> ServerProcess:
        """Once it serves: with a management port, the STOMP port opens a moment before."""
        wait_until(lambda: (admin_status(self.address) or {}).get("state") == "STANDALONE",
                   "the server serving", 10)
        return srv

    def destination(self, name: str) -> dict:
        status = wait_until(lambda: admin_status(self.address), "GET /status", 10)
        return status["destinations"][name]

    def capacity(self) -> dict:
        return wait_until(lambda: admin_status(self.address), "GET /status", 10)["capacity"]

    def metric(self, name: str, **labels: str) -> float:
        code, _, text = admin_request(self.address, "/metrics")
        assert code == 200, text
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        line = f"{name}{{{want}}} " if labels else f"{name} "
        for row in text.splitlines():
            if row.startswith(line):
                return float(row.split()[-1])
        raise AssertionError(f"no {line.strip()} in /metrics")


def send_numbered(client: RawStomp, queue: str, numbers: range, body: bytes = b"x" * KiB,
                  dup_ids: bool = True, persistent: bool = True) -> None:
    """Pipelined SENDs with receipt r<n>, x-seq n and dup-id d<n>; waits for nothing."""
    client.send_raw(b"".join(
        encode_frame("SEND", {"destination": queue, "receipt": f"r{n}", "x-seq": str(n),
                              **({"dup-id": f"d{n}"} if dup_ids else {}),
                              **(P if persistent else {})}, body)
        for n in numbers))


def receipts_until(client: RawStomp, stall: float) -> tuple[list[int], Frame | None]:
    """Receipt numbers as they come, until none came for `stall` seconds (then None) or
    another frame came (then that frame)."""
    got: list[int] = []
    while True:
        try:
            frame = client.read_frame(timeout=stall)
        except TimeoutError:
            return got, None
        if frame.command != "RECEIPT":
            return got, frame
        got.append(int(frame.headers["receipt-id"][1:]))


def receipts(client: RawStomp, stall: float) -> list[int]:
    """Receipt numbers as they come, until none came for `stall` seconds."""
    got, other = receipts_until(client, stall)
    assert other is None, f"after receipts {got[-3:]}: {other!r}"
    return got


def consume_seqs(client: RawStomp, queue: str, count: int | None = None) -> list[str]:
    """x-seq of what a new subscription receives: `count` messages, or (None) until none
    comes for half a second."""
    client.send_frame("SUBSCRIBE", {"destination": queue, "id": unique("s")})
    if count is not None:
        return [client.read_message(10).headers["x-seq"] for _ in range(count)]
    got = []
    while True:
        try:
            got.append(client.read_message(0.5).headers["x-seq"])
        except TimeoutError:
            return got


def numbers(count: int) -> list[str]:
    return [str(n) for n in range(count)]


# ----------------------------------------------------------------------------- page


def test_page_is_the_default_producers_carry_on_and_bodies_stay_on_disk(server_factory):
    admin = Admin()
    srv = admin.started(server_factory("--max-size-bytes", str(200 * KiB), *admin.flags))
    queue = f"/queue/{unique('page')}"
    sent = produce(srv.address, queue, 0, 3000, window=200)
    assert sent.max_wait_s < 1.0, f"a receipt took {sent.max_wait_s:.2f} s (#{sent.slowest})"
    held = admin.destination(queue)
    assert held["address_full_policy"] == "page" and held["state"] == "full", held
    assert held["paged_bytes"] > 2.5 * MiB, held  # past the limit: on disk only
    assert held["memory_bytes"] < held["bytes"] - 2.5 * MiB, held
    assert admin.metric("pairmq_destination_paged_bytes", destination=queue) \
        == held["paged_bytes"]
    assert admin.metric("pairmq_destination_full", destination=queue, policy="page") == 1
    assert srv.log_lines("WARNING", queue, "is full", "on disk only")

    drain(srv.address, queue, 0, 3000)  # in order, every body exact
    drained = admin.destination(queue)
    assert drained["bytes"] == 0 and drained["paged_bytes"] == 0, drained
    assert drained["state"] == "open"


@pytest.mark.long  # 300 MiB written, restarted and read (37 s): `make test-long`
def test_300_mib_without_a_consumer_then_drained_in_order_across_a_restart(server_factory):
    """The issue's case: no consumer, 300 MiB of persistent 1 KiB messages with receipts;
    no receipt takes a second, the server keeps the bodies past 64 MiB on disk, and a
    consumer that comes back gets every one in order, intact, also after a kill -9."""
    admin = Admin()
    srv = admin.started(server_factory(*admin.flags, "--log-level", "info"))
    queue = f"/queue/{unique('bulk')}"
    count = 300 * MiB // KiB
    started = time.monotonic()
    sent = produce(srv.address, queue, 0, count)
    assert sent.max_wait_s < 1.0, (f"receipt #{sent.slowest} took {sent.max_wait_s:.2f} s "
                                   f"({count / sent.seconds:.0f} msgs/s)")
    held = admin.destination(queue)
    assert held["paged_bytes"] > 200 * MiB, held  # past 64 MiB: on disk only

    first = count // 3
    drain(srv.address, queue, 0, first)
    srv = admin.started(restart(srv, *admin.flags, "--log-level", "info"))
    recovered = re.search(r"Recovered (\d+) messages .*\(paging: (\d+) bodies in memory",
                          srv.logs())
    assert recovered and int(recovered.group(1)) == count - first, srv.logs()[-2000:]
    assert int(recovered.group(2)) <= 64 * MiB // KiB, "past its limit, a body stays on disk"
    drain(srv.address, queue, first, count - first)
    print(f"300 MiB: produced at {count / sent.seconds:.0f} msgs/s (slowest receipt "
          f"{sent.max_wait_s * 1000:.0f} ms), all in {time.monotonic() - started:.1f} s")


def test_page_keeps_non_persistent_messages_in_memory_up_to_the_global_budget(server_factory,
                                                                             raw_client):
    admin = Admin()
    srv = admin.started(server_factory(
        "--max-size-bytes", str(100 * KiB), "--global-max-size-bytes", str(2 * MiB),
        "--full-policy", "block", *admin.flags))
    queue = f"/queue/{unique('np')}"
    producer, _ = raw_client(srv)
    send_numbered(producer, queue, range(400), body=b"n" * 10 * KiB, persistent=False)
    taken = receipts(producer, stall=1.5)
    # Past the destination's 100 KiB (they cannot be paged): up to the 2 MiB budget.
    assert 150 <= len(taken) < 210, f"{len(taken)} of 10 KiB taken"
    assert taken == list(range(len(taken)))
    assert admin.capacity()["full"] == ["memory"]
    assert admin.metric("pairmq_server_full", reason="memory", policy="block") == 1
    assert srv.log_lines("WARNING", "Server is full", "global_max_size_bytes")

    consumer, _ = raw_client(srv)
    assert consume_seqs(consumer, queue, 400) == numbers(400)
    assert taken + receipts(producer, stall=3) == list(range(400))
    assert srv.log_lines("INFO", "Server has room again")
    assert admin.capacity()["full"] == []


def test_memory_guard_with_full_policy_fail_refuses_with_an_error(server_factory, raw_client):
    srv = server_factory("--global-max-size-bytes", str(MiB), "--full-policy", "fail")
    producer, _ = raw_client(srv)
    queue = f"/queue/{unique('mem')}"
    send_numbered(producer, queue, range(200), body=b"m" * 10 * KiB, persistent=False)
    taken, error = receipts_until(producer, stall=1.0)
    assert taken == list(range(len(taken))) and 90 <= len(taken) < 110, len(taken)
    assert error is not None and error.command == "ERROR", error
    assert "global_max_size_bytes" in error.headers["message"], error
    assert error.headers["receipt-id"] == f"r{len(taken)}"


# ----------------------------------------------------------------------------- block


def test_block_holds_new_messages_but_answers_duplicates_of_a_full_destination(server_factory,
                                                                             raw_client):
    srv = server_factory("--address-full-policy", "block", "--max-size-bytes", "20000")
    queue = f"/queue/{unique('blk')}"
    producer, _ = raw_client(srv)
    send_numbered(producer, queue, range(40))
    taken = receipts(producer, stall=1.5)
    assert 10 <= len(taken) <= 20 and taken == list(range(len(taken))), taken

    # A client resending what it sent (same dup-ids), then one new message: the
    # duplicates are answered at once though the destination is full; the new one waits.
    resender, _ = raw_client(srv)
    send_numbered(resender, queue, range(len(taken)))
    resender.send_raw(encode_frame("SEND", {"destination": queue, "receipt": "rnew",
                                            "x-seq": "new", "dup-id": "new", **P}, "new"))
    assert receipts(resender, stall=1.5) == taken
    assert "Destination" in srv.logs() and srv.log_lines("WARNING", queue, "blocking")

    consumer, _ = raw_client(srv)
    got = consume_seqs(consumer, queue)
    assert [seq for seq in got if seq != "new"] == numbers(40)  # each once, in order
    assert got.count("new") == 1
    assert taken + receipts(producer, stall=2) == list(range(40))
    assert resender.wait_receipt("rnew", timeout=5).command == "RECEIPT"


# ----------------------------------------------------------------------------- fail


def test_fail_refuses_with_an_error_naming_the_destination_and_its_limit(server_factory,
                                                                        raw_client):
    srv = server_factory("--address-full-policy", "fail", "--max-size-bytes", "20000")
    queue = f"/queue/{unique('fail')}"
    producer, _ = raw_client(srv)
    send_numbered(producer, queue, range(40))
    taken, error = receipts_until(producer, stall=1.0)
    assert 10 <= len(taken) <= 20 and taken == list(range(len(taken))), taken
    assert error is not None and error.command == "ERROR", error
    message = error.headers["message"]
    assert queue in message and "20000" in message and "fail" in message, message
    assert error.headers["receipt-id"] == f"r{len(taken)}"
    assert producer.read_until_closed(5) == [], "an ERROR is followed by a close"

    again, _ = raw_client(srv)
    send_numbered(again, queue, range(3))  # duplicates: answered even now
    assert receipts(again, stall=1.0) == [0, 1, 2]
    again.request("SEND", {"destination": f"/queue/{unique('other')}", **P}, "elsewhere")
    consumer, _ = raw_client(srv)
    assert consume_seqs(consumer, queue) == numbers(len(taken))


# ----------------------------------------------------------------------------- drop


def test_drop_discards_counts_and_still_receipts(server_factory, raw_client):
    admin = Admin()
    srv = admin.started(server_factory("--address-full-policy", "drop", "--max-size-bytes",
                                       "20000", *admin.flags))
    queue = f"/queue/{unique('drop')}"
    producer, _ = raw_client(srv)
    send_numbered(producer, queue, range(60))
    assert receipts(producer, stall=1.0) == list(range(60)), "every SEND is receipted"
    consumer, _ = raw_client(srv)
    kept = consume_seqs(consumer, queue)
    assert 10 <= len(kept) <= 20 and kept == numbers(len(kept)), kept
    dropped = 60 - len(kept)
    assert admin.metric("pairmq_messages_dropped_total") == dropped
    assert admin.destination(queue)["dropped"] == dropped
    warnings = srv.log_lines("WARNING", queue, "dropping")
    assert len(warnings) == 1, warnings  # one line per full period, not one per message
    resumed = srv.log_lines("INFO", queue, f"{dropped} messages were dropped")
    assert len(resumed) == 1, srv.logs()[-2000:]


# ----------------------------------------------------------------------------- overrides


OVERRIDES = """
[destinations]
max_size_bytes = 20000

[destinations.overrides."/queue/orders.*"]
address_full_policy = "fail"

[destinations.overrides."/queue/audit.#"]
address_full_policy = "drop"
max_size_bytes = 6000
"""


def test_overrides_by_name_pattern_apply_per_destination(server_factory, raw_client):
    admin = Admin()
    srv = admin.started(server_factory(*admin.flags, config_text=OVERRIDES))
    client, _ = raw_client(srv)
    for name in ("/queue/orders.eu", "/queue/audit.x.y", "/queue/other", "/queue/orders"):
        client.request("SEND", {"destination": name, **P}, "first")
    rules = {name: (admin.destination(name)["address_full_policy"],
                    admin.destination(name)["max_size_bytes"])
             for name in ("/queue/orders.eu", "/queue/audit.x.y", "/queue/other",
                          "/queue/orders")}
    assert rules == {"/queue/orders.eu": ("fail", 20000), "/queue/audit.x.y": ("drop", 6000),
                     "/queue/other": ("page", 20000), "/queue/orders": ("page", 20000)}
    send_numbered(client, "/queue/audit.x.y", range(20))
    assert receipts(client, stall=1.0) == list(range(20))
    assert admin.destination("/queue/audit.x.y")["dropped"] >= 13
    send_numbered(client, "/queue/orders.eu", range(40))
    assert client.read_until_closed(10)[-1].command == "ERROR"


# ----------------------------------------------------------------------------- server guards


def test_disk_usage_guard_refuses_persistent_sends_and_answers_duplicates(server_factory,
                                                                         raw_client):
    admin = Admin()
    srv = admin.started(server_factory(*admin.flags))  # default max_disk_usage: 90%
    queue = f"/queue/{unique('disk')}"
    producer, _ = raw_client(srv)
    send_numbered(producer, queue, range(3))
    assert receipts(producer, stall=1.0) == [0, 1, 2]
    srv = admin.started(restart(srv, "--max-disk-usage", "1", *admin.flags))
    wait_until(lambda: srv.log_lines("WARNING", "Server is full", "max_disk_usage (1%)"),
               "a warning about the disk usage", 5)
    assert admin.capacity()["full"] == ["disk"]
    assert admin.metric("pairmq_server_full", reason="disk", policy="fail") == 1
    client, _ = raw_client(srv)
    send_numbered(client, queue, range(3))  # the same dup-ids: answered
    assert receipts(client, stall=1.0) == [0, 1, 2]
    client.request("SEND", {"destination": queue, "x-seq": "np"}, "not persistent")
    client.send_frame("SEND", {"destination": queue, "receipt": "p", **P}, "persistent")
    error = client.read_frame(5)
    assert error.command == "ERROR" and error.headers["receipt-id"] == "p", error
    assert "max_disk_usage" in error.headers["message"], error
    consumer, _ = raw_client(srv)
    assert consume_seqs(consumer, queue) == ["0", "1", "2", "np"]


def test_disk_usage_guard_holds_producers_until_there_is_room(server_factory, raw_client,
                                                              tmp_path):
    with small_disk(tmp_path / "data-small", "4m") as mountpoint:
        ballast = mountpoint / "ballast"
        ballast.write_bytes(b"\0" * 3 * MiB)  # 75% used
        srv = server_factory("--max-disk-usage", "60", "--full-policy", "block",
                             name="small")
        try:
            wait_until(lambda: srv.log_lines("WARNING", "Server is full", "disk usage"),
                       "a warning about the disk usage", 5)
            producer, _ = raw_client(srv)
            queue = f"/queue/{unique('room')}"
            producer.request("SEND", {"destination": queue}, "not persistent: taken")
            producer.send_frame("SEND", {"destination": queue, "receipt": "held", **P}, "p")
            with pytest.raises(TimeoutError):
                producer.read_frame(1.5)
            ballast.unlink()
            assert producer.wait_receipt("held", timeout=5).command == "RECEIPT"
            assert srv.log_lines("INFO", "Server has room again", "disk usage")
        finally:
            srv.stop()  # before the file system goes away


def test_a_full_journal_still_answers_duplicates(server_factory, raw_client):
    srv = server_factory("--segment-bytes", "65536", "--max-journal-bytes", "200000")
    queue = f"/queue/{unique('jfull')}"
    producer, _ = raw_client(srv)
    n = 0
    journal = srv.data_dir / "journal"
    while sum(p.stat().st_size for p in journal.glob("journal-*.seg")) < 200000:
        assert n < 500, "the journal never reached its limit"
        send_numbered(producer, queue, range(n, n + 1), body=payload(n, 4000))
        producer.wait_receipt(f"r{n}")
        n += 1
    again, _ = raw_client(srv)
    send_numbered(again, queue, range(n), body=b"resent")
    assert receipts(again, stall=2) == list(range(n))
    again.send_frame("SEND", {"destination": queue, "receipt": "new", **P}, "new")
    error = again.read_frame(5)
    assert error.command == "ERROR" and "journal is full" in error.headers["message"], error


# ----------------------------------------------------------------------------- configuration


def write(tmp_path, text: str):
    path = tmp_path / "pairmq.toml"
    path.write_text(text)
    return path


def test_overrides_and_new_keys_are_read_from_the_file(tmp_path):
    config = load_config(write(tmp_path, OVERRIDES + """
[destinations.overrides."/topic/prices.eu"]
max_size_bytes = 0

[store]
max_disk_usage = 100
"""), {"global_max_size_bytes": 12345})
    settings = config.core_settings()
    assert [o.pattern for o in settings.overrides] == [
        "/topic/prices.eu", "/queue/orders.*", "/queue/audit.#"]  # most specific first
    assert settings.rule_for("/topic/prices.eu").max_size_bytes == 0
    assert settings.global_max_size_bytes == 12345 and settings.max_disk_usage == 100
    assert settings.address_full_policy is AddressFullPolicy.PAGE
    half = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    assert load_config().core_settings().global_max_size_bytes == half  # -1, as Artemis
    assert config.store_settings().paged_beyond("/queue/other") == 20000
    assert config.store_settings().paged_beyond("/queue/orders.eu") == 0  # fail: no paging


BAD_OVERRIDES = {
    "pattern-prefix": ('[destinations.overrides."orders.*"]\nmax_size_bytes = 1\n',
                       "must start with /queue/ or /topic/"),
    "pattern-partial-wildcard": ('[destinations.overrides."/queue/orders*"]\n'
                                 'max_size_bytes = 1\n', "inside a word"),
    "unknown-key": ('[destinations.overrides."/queue/a"]\nmax_size = 1\n', "'max_size'"),
    "wrong-type": ('[destinations.overrides."/queue/a"]\nmax_size_bytes = "big"\n',
                   "max_size_bytes must be an integer"),
    "bad-policy": ('[destinations.overrides."/queue/a"]\naddress_full_policy = "pag"\n',
                   "address_full_policy must be one of page, block, fail, drop"),
    "empty": ('[destinations.overrides."/queue/a"]\n', "sets nothing"),
    "not-a-table": ('[destinations]\noverrides = 5\n', "table of destination patterns"),
    "default-policy": ('[destinations]\naddress_full_policy = "pager"\n', "address_full_policy"),
    "disk-zero": ("[store]\nmax_disk_usage = 0\n", "max_disk_usage must be an integer from 1"),
}


@pytest.mark.parametrize("case", sorted(BAD_OVERRIDES))
def test_bad_overrides_and_limits_are_refused_naming_the_key(tmp_path, case):
    text, problem = BAD_OVERRIDES[case]
    with pytest.raises(ConfigError) as refused:
        load_config(write(tmp_path, text))
    assert problem in str(refused.value)
    if "overrides." in text:
        assert "[destinations.overrides." in str(refused.value)


def test_a_server_with_a_bad_pattern_refuses_to_start(tmp_path):
    path = write(tmp_path, BAD_OVERRIDES["pattern-partial-wildcard"][0])
    result = run_pairmq("server", "--config", str(path), "--data-dir", str(tmp_path / "data"),
                        "--stomp", "127.0.0.1:0")
    assert result.returncode != 0
    assert '[destinations.overrides."/queue/orders*"]' in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
