"""Turns of the event loop over 50 ms while several clients load one server (issue 18).

Run from the repository root:

    .venv/bin/python benchmarks/turns.py
    .venv/bin/python benchmarks/turns.py --scenario 1p1c --messages 200000 --runs 3
    .venv/bin/python benchmarks/turns.py --stream --messages 1000000

Starts a standalone server with its management port, runs `benchmarks/throughput.py`
against it (by default 4 producers and 4 competing consumers flooding one queue with
non-persistent 1 KiB messages, then a short paced run), and reads from the server's
`/metrics` how often its 50 ms event-loop timer ran more than 50 ms late (a turn over
50 ms) and how many garbage collections paused it over 50 ms. One JSON line per run. A
turn that runs every busy connection's frames, each within its own budget, added up to
60-100 ms before the budget was shared (server/guards/turn_budget.py).

With --stream: --messages 1 KiB records are sent to a stream (batches of 1,000), then two
readers read half of it each, as the Spark source's tasks do (a bounded subscription,
`x-stream-batch` of 1,000 records a MESSAGE, one ACK per MESSAGE); the figures are those
of the read alone (the counts before it are subtracted). The stream keeps every record.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from tests.serverproc import free_port, start_server  # noqa: E402
from tests.support.admin import admin_user_flags  # noqa: E402

import pairmq.client  # noqa: E402

STREAM = "/stream/turns"

from benchmarks.backlog import over_50ms  # noqa: E402


def one_run(scenario: str, messages: int) -> dict[str, object]:
    workdir = Path(tempfile.mkdtemp(prefix="pairmq-turns-"))
    admin = f"127.0.0.1:{free_port()}"
    server = start_server(workdir, "--admin", admin, *admin_user_flags(),
                          "--allow-anonymous", name="turns")
    try:
        load = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "throughput.py"), "--scenario", scenario,
             "--messages", str(messages), "--paced-seconds", "1",
             "--target", f"{server.host}:{server.port}"],
            cwd=ROOT, capture_output=True, text=True, timeout=900)
        flood = [json.loads(line) for line in load.stdout.splitlines() if line.startswith("{")]
        turns, collections = over_50ms(admin)
    finally:
        server.kill()
        shutil.rmtree(workdir, ignore_errors=True)  # 1.2 GB a stream run: never left behind
    return {"scenario": scenario, "messages": messages,
            "flood_msgs_per_s": flood[0].get("flood_msgs_per_s") if flood else None,
            "turns_over_50ms": turns, "collections_over_50ms": collections,
            "load_exit": load.returncode}


def read_range(url: str, start: int, end: int, counts: list[int]) -> None:
    """Offsets [start, end) of STREAM, as one task of the Spark source reads them."""
    records = 0
    with pairmq.client.connect(url) as client:
        sub = client.subscribe(STREAM, ack="client", headers={
            "x-stream-offset": f"offset={start}", "x-stream-end-offset": str(end),
            "prefetch-count": "2000", "x-stream-batch": "1000"})
        while True:
            message = sub.receive(30)
            if message is None:
                raise RuntimeError(f"reading [{start}, {end}): nothing came for 30 s")
            if "x-stream-batch" in message.headers:
                client.ack(message)
                records += int(message.headers["x-stream-batch"])  # records it packs
            elif message.headers.get("x-stream-end") == "true":
                break
    counts.append(records)


def stream_run(messages: int) -> dict[str, object]:
    workdir = Path(tempfile.mkdtemp(prefix="pairmq-turns-"))
    admin = f"127.0.0.1:{free_port()}"
    server = start_server(workdir, "--admin", admin, *admin_user_flags(),
                          "--allow-anonymous", "--max-bytes", str(messages * 1536),
                          name="turns")  # the stream's retention keeps every record
    url = f"stomp://{server.host}:{server.port}"
    try:
        with pairmq.client.connect(url, send_window=16) as client:
            for first in range(0, messages, 1000):
                client.send_batch_async(STREAM, [(b"x" * 1024, {"n": str(first + i)})
                                                 for i in range(1000)])
            client.flush()
        turns_before, collections_before = over_50ms(admin)
        started = time.monotonic()
        counts: list[int] = []
        readers = [threading.Thread(target=read_range, args=(url, 0, messages // 2, counts)),
                   threading.Thread(target=read_range,
                                    args=(url, messages // 2, messages, counts))]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
        seconds = time.monotonic() - started
        turns, collections = over_50ms(admin)
    finally:
        server.kill()
        shutil.rmtree(workdir, ignore_errors=True)  # 1.2 GB a stream run: never left behind
    return {"stream_records": messages, "readers": 2, "records_read": sum(counts),
            "read_records_per_s": round(messages / seconds),
            "turns_over_50ms": None if turns is None else turns - (turns_before or 0),
            "collections_over_50ms": None if collections is None
            else collections - (collections_before or 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=["1p1c", "4p4c"], default="4p4c")
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--stream", action="store_true",
                        help="fill a stream, then read it with two readers")
    args = parser.parse_args()
    for _ in range(args.runs):
        result = stream_run(args.messages) if args.stream \
            else one_run(args.scenario, args.messages)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
