"""This build against another, in alternating runs: the price of a change, as ratios.

Run from the repository root (or `make bench-compare REF=<git ref>`):

    .venv/bin/python benchmarks/compare.py --ref main
    .venv/bin/python benchmarks/compare.py --ref 038886b --rounds 8 --messages 40000
    .venv/bin/python benchmarks/compare.py --ref HEAD~3 --scenarios durable --fail-above 1.05

The reference's `src/` is taken from git (`git archive REF src`) into a scratch
directory, or given as a directory with `--ref-src DIR` (`make compiled`'s
build/compiled, say: the compiled build against the sources); the other build is the
working tree as it is, uncommitted changes included, or the directory `--src DIR` names
(two compiled builds: `--ref-src` a copy of the earlier one, `--src build/compiled`).
Both run from this checkout's virtualenv (same Python, same libraries), the reference
by `PYTHONPATH`, which is checked before anything is measured.

Each round starts a fresh server of each build (fresh data directory), makes a
discarded warm-up run, then runs every scenario once; which build goes first alternates
between rounds, so that the machine's drift falls on both. Scenarios (1 KiB messages,
one queue, consumers ack:client-individual with prefetch 1000, as `../shared/bench/`):

- durable: 1 producer, 1 consumer, persistent messages each with a receipt, window 100;
- non-persistent: 1 producer, 1 consumer, no persistent header, a receipt on the last
  SEND only;
- durable-4p4c: 4 producers, 4 consumers competing on the queue, as durable.

Printed per scenario: the median rate (messages received and acknowledged per second)
and the median broker CPU per message (µs, the server process: event loop and journal
writer, from the scheduler's run time of its threads, to the microsecond, where the
kernel has /proc/PID/task/*/sched; user and system time otherwise, which come in 10 ms
ticks: 0.5 µs a message over 20,000) of each build, then the median of the per-round
ratios, working tree over reference: rate above 1 and CPU below 1 are better. A change to
the per-message path reports the durable and non-persistent lines of this
(docs/benchmarks.md).

`--load stompbench` drives the shared bench's load generator instead of this
repository's (`--stompbench PATH`, by default `../shared/bench/stompbench.py` beside the
checkout: the harness the peers are compared with, docs/benchmarks.md). Its clients are
raw sockets, one process each; the servers then have a user it logs in as. Same
scenarios, same servers, same alternation. The two generators' figures differ (durable
4P/4C most, docs/benchmarks.md): compare a build with another on one of them.

With `--fail-above X` the exit status is 1 when a scenario's CPU-per-message ratio is
above X (a guard a reviewer can run); `--json FILE` appends one line per run.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import psutil  # noqa: E402
from tests.serverproc import start_server  # noqa: E402

from benchmarks.loadgen import run_time_seconds  # noqa: E402
from benchmarks.persistent import run_load  # noqa: E402


@dataclass(frozen=True)
class Scenario:
    name: str
    producers: int
    consumers: int
    persistent: bool


SCENARIOS = {s.name: s for s in (
    Scenario("durable", 1, 1, True),
    Scenario("non-persistent", 1, 1, False),
    Scenario("durable-4p4c", 4, 4, True),
)}
WARM_UP_MESSAGES = 5000
DEFAULT_STOMPBENCH = ROOT.parent / "shared" / "bench" / "stompbench.py"
STOMPBENCH_USER = '[auth.users.bench]\npassword = "bench"\nroles = ["admin"]\n'
WORK = "work"  # the working tree's name in the output
SEGMENT_BYTES = str(64 << 20)


@dataclass(frozen=True)
class Build:
    name: str  # "work" or the reference as given
    src: Path  # the directory holding the `pairmq` package


@dataclass(frozen=True)
class Run:
    build: str
    scenario: str
    round: int
    msgs_per_s: float
    cpu_us_per_msg: float


def reference_source(ref: str, scratch: Path) -> Path:
    """`src/` of `ref`, extracted from git into `scratch`: no checkout is touched."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref, "src"],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"git archive {ref}: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive.stdout, check=True)
    return scratch / "src"


def check_imports(build: Build) -> None:
    """The server will import `pairmq` from `build.src`, not from an installed copy."""
    found = subprocess.run(
        [sys.executable, "-c", "import pairmq; print(pairmq.__file__)"],
        env=_env(build), capture_output=True, text=True, check=False)
    where = Path(found.stdout.strip() or "?").resolve()
    if found.returncode != 0 or not where.is_relative_to(build.src.resolve()):
        raise SystemExit(f"{build.name}: pairmq imports from {where}, not {build.src} "
                         f"({found.stderr.strip()[-300:]})")


def _env(build: Build) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(build.src)}


def stompbench_load(stompbench: Path, port: int, s: Scenario, messages: int,
                    proc: psutil.Process) -> tuple[float, float]:
    """One run of the shared bench's load generator: (messages per second consumed, the
    server's CPU seconds), as it measured them (`--broker-pid`)."""
    args = [sys.executable, str(stompbench), "--port", str(port), "--login", "bench",
            "--passcode", "bench", "--size", "1024",
            "--window", "100", "--ack", "client-individual", "--prefetch", "1000",
            "--producers", str(s.producers), "--consumers", str(s.consumers),
            "--messages", str(messages), "--broker-pid", str(proc.pid),
            "--persistent" if s.persistent else "--no-persistent"]
    done = subprocess.run(args, cwd=stompbench.parent, capture_output=True, text=True,
                          timeout=900, check=False)
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {}
    if done.returncode != 0 or not result.get("ok"):
        raise RuntimeError(f"stompbench {s.name}: {done.stderr.strip()[-300:] or result}")
    return float(result["consumer_msgs_per_s"]), float(result["broker_cpu_secs"])


def one_round(build: Build, scenarios: list[Scenario], messages: int, rnd: int,
              scratch: Path, stompbench: Path | None = None) -> list[Run]:
    """A fresh server of `build`, a warm-up, then each scenario once (with this
    repository's load generator, or the shared bench's when `stompbench` is given)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"r{rnd}-{build.name[:12]}-", dir=scratch))
    # stompbench logs in (as the peers want it); our generators connect anonymously
    server = start_server(workdir, "--segment-bytes", SEGMENT_BYTES, "--log-level", "warning",
                          name="compare", env={"PYTHONPATH": str(build.src)},
                          config_text=STOMPBENCH_USER if stompbench else None,
                          anonymous=stompbench is None)
    runs = []
    try:
        proc = psutil.Process(server.proc.pid)
        if stompbench is not None:
            stompbench_load(stompbench, server.port, SCENARIOS["durable"], WARM_UP_MESSAGES,
                            proc)
        else:
            warm = run_load(server.host, server.port, 1, 1, WARM_UP_MESSAGES, server=proc)
            if warm.errors:
                raise RuntimeError(f"{build.name}: warm-up failed: {warm.errors[:3]}")
        for s in scenarios:
            before = run_time_seconds(proc.pid)
            if stompbench is not None:
                rate, cpu_s = stompbench_load(stompbench, server.port, s, messages, proc)
            else:
                res = run_load(server.host, server.port, s.producers, s.consumers, messages,
                               server=proc, persistent=s.persistent)
                if res.errors or not server.alive():
                    raise RuntimeError(
                        f"{build.name} {s.name}: {res.errors[:3] or 'server died'}")
                assert res.server_cpu_s is not None
                rate, cpu_s = res.msgs_per_s, res.server_cpu_s
            after = run_time_seconds(proc.pid)
            if before is not None and after is not None:
                cpu_s = after - before  # to the microsecond, not in 10 ms ticks
            runs.append(Run(build.name, s.name, rnd, rate, cpu_s / messages * 1e6))
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return runs


def report(runs: list[Run], ref: str, scenarios: list[Scenario]) -> dict[str, float]:
    """Print medians and ratios; returns each scenario's median CPU-per-message ratio."""
    cpu_ratios = {}
    print(f"\n{'scenario':16} {'build':>12} {'msgs/s':>9} {'CPU µs/msg':>11}")
    for s in scenarios:
        mine = {r.round: r for r in runs if r.scenario == s.name and r.build == WORK}
        theirs = {r.round: r for r in runs if r.scenario == s.name and r.build != WORK}
        for name, rs in ((ref, theirs), (WORK, mine)):
            print(f"{s.name:16} {name[:12]:>12} "
                  f"{statistics.median(r.msgs_per_s for r in rs.values()):9.0f} "
                  f"{statistics.median(r.cpu_us_per_msg for r in rs.values()):11.1f}")
        both = sorted(set(mine) & set(theirs))
        rate = [mine[k].msgs_per_s / theirs[k].msgs_per_s for k in both]
        cpu = [mine[k].cpu_us_per_msg / theirs[k].cpu_us_per_msg for k in both]
        cpu_ratios[s.name] = statistics.median(cpu)
        print(f"{s.name:16} {'ratio':>12} {statistics.median(rate):9.3f} "
              f"{cpu_ratios[s.name]:11.3f}   work/{ref}, median of {len(both)} rounds "
              f"(CPU per round: {' '.join(f'{c:.3f}' for c in cpu)})")
        low, high = spread(cpu)
        print(f"{'':16} {'':>12} {'':>9} {'':>11}   CPU: work costlier in "
              f"{sum(c > 1 for c in cpu)} of {len(cpu)} rounds; the middle half of the "
              f"rounds between {low:.3f} and {high:.3f}")
    return cpu_ratios


def spread(ratios: list[float]) -> tuple[float, float]:
    """Where the middle half of the rounds' ratios lie (all of them, under 4 rounds): a
    median of 1.04 from rounds between 0.98 and 1.10 is not a 4% loss yet."""
    if len(ratios) < 4:
        return min(ratios), max(ratios)
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return q1, q3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--ref", help="git ref to compare the working tree with")
    which.add_argument("--ref-src", type=Path, default=None,
                       help="a directory holding a pairmq package to compare the working "
                            "tree with instead (build/compiled: the compiled build)")
    p.add_argument("--src", type=Path, default=None,
                   help="measure the pairmq package in this directory instead of the working "
                        "tree's src/ (build/compiled against a copy of an earlier one)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--scenarios", default="durable,non-persistent",
                   help=f"comma-separated, of {', '.join(SCENARIOS)}")
    p.add_argument("--fail-above", type=float, default=None,
                   help="exit 1 when a CPU-per-message ratio is above this")
    p.add_argument("--json", default=None, help="append one JSON line per run to this file")
    p.add_argument("--load", choices=("pairmq", "stompbench"), default="pairmq",
                   help="the load generator: benchmarks/persistent.py's, or the shared "
                        "bench's stompbench.py")
    p.add_argument("--stompbench", type=Path, default=DEFAULT_STOMPBENCH,
                   help=f"with --load stompbench (default {DEFAULT_STOMPBENCH})")
    args = p.parse_args(argv)
    if args.ref_src is not None:
        if not (args.ref_src / "pairmq").is_dir():
            p.error(f"--ref-src: no pairmq package in {args.ref_src}")
        where = args.ref_src.resolve()  # its name is what runs are printed under
        args.ref = where.parent.name if where.name == "src" else where.name
    if args.src is not None and not (args.src / "pairmq").is_dir():
        p.error(f"--src: no pairmq package in {args.src}")
    if args.load == "stompbench" and not args.stompbench.is_file():
        p.error(f"--load stompbench: no {args.stompbench} (give --stompbench PATH)")
    unknown = set(args.scenarios.split(",")) - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenario(s) {', '.join(sorted(unknown))}: "
                f"choose from {', '.join(SCENARIOS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    scenarios = [SCENARIOS[n] for n in args.scenarios.split(",")]
    scratch = Path(tempfile.mkdtemp(prefix="pairmq-compare-"))
    try:
        reference = (args.ref_src if args.ref_src is not None
                     else reference_source(args.ref, scratch))
        measured = Build(WORK, ROOT / "src") if args.src is None \
            else Build(WORK, args.src)
        builds = [Build(args.ref, reference), measured]
        for b in builds:
            check_imports(b)
        runs: list[Run] = []
        for rnd in range(1, args.rounds + 1):
            order = builds if rnd % 2 else builds[::-1]
            for build in order:
                got = one_round(build, scenarios, args.messages, rnd, scratch,
                                args.stompbench if args.load == "stompbench" else None)
                for r in got:
                    print(f"round {rnd} {r.build[:12]:>12} {r.scenario:16} "
                          f"{r.msgs_per_s:9.0f} msgs/s {r.cpu_us_per_msg:7.1f} µs/msg",
                          flush=True)
                    if args.json:
                        with open(args.json, "a") as f:
                            f.write(json.dumps(r.__dict__) + "\n")
                runs += got
        cpu_ratios = report(runs, args.ref, scenarios)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.fail_above is not None:
        over = {k: v for k, v in cpu_ratios.items() if v > args.fail_above}
        if over:
            print(f"CPU per message above {args.fail_above} of {args.ref}: "
                  + ", ".join(f"{k} {v:.3f}" for k, v in over.items()), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
