"""Turns of the event loop over 50 ms while several clients load one server (issue 18).

Run from the repository root:

    .venv/bin/python benchmarks/turns.py
    .venv/bin/python benchmarks/turns.py --scenario 1p1c --messages 200000 --runs 3

Starts a standalone server with its management port, runs `benchmarks/throughput.py`
against it (by default 4 producers and 4 competing consumers flooding one queue with
non-persistent 1 KiB messages, then a short paced run), and reads from the server's
`/metrics` how often its 50 ms event-loop timer ran more than 50 ms late (a turn over
50 ms) and how many garbage collections paused it over 50 ms. One JSON line per run. A
turn that runs every busy connection's frames, each within its own budget, added up to
60-100 ms before the budget was shared (server/turns.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402

from tests.serverproc import free_port, start_server  # noqa: E402
from tests.support.admin import admin_user_flags  # noqa: E402

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
    return {"scenario": scenario, "messages": messages,
            "flood_msgs_per_s": flood[0].get("flood_msgs_per_s") if flood else None,
            "turns_over_50ms": turns, "collections_over_50ms": collections,
            "load_exit": load.returncode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=["1p1c", "4p4c"], default="4p4c")
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    for _ in range(args.runs):
        print(json.dumps(one_run(args.scenario, args.messages)), flush=True)


if __name__ == "__main__":
    main()
