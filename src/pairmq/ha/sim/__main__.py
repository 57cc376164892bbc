"""`python -m pairmq.ha.sim`: run seeds of the pair's simulation, or replay one.

    python -m pairmq.ha.sim --seed 42 --trace     # one seed, its whole trace
    python -m pairmq.ha.sim --seeds 100000 --jobs 2 [--first 0]
    python -m pairmq.ha.sim --arbiter etcd ...    # etcd as the arbiter (ha/sim/etcd.py)
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from functools import partial

from pairmq.ha.sim.runner import ARBITERS, Result, run_seed

CHUNK = 200


def _chunk(arbiter: str, bounds: tuple[int, int]) -> list[tuple[int, str, str]]:
    failures = []
    for seed in range(*bounds):
        result = run_seed(seed, arbiter=arbiter)
        if not result.ok:
            failures.append((seed, result.problem, result.trace))
    return failures


def _replay(seed: int, trace: bool, arbiter: str) -> int:
    result: Result = run_seed(seed, full_trace=trace, arbiter=arbiter)
    print(f"seed {seed}: {'ok' if result.ok else 'FAILED'} ({result.confirmed} confirmed)")
    print("faults:\n" + result.steps)
    if trace or not result.ok:
        print(result.trace)
    if not result.ok:
        print(result.problem)
    return 0 if result.ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pairmq.ha.sim",
                                     description="deterministic simulation of the HA pair")
    parser.add_argument("--seed", type=int, help="run (replay) one seed")
    parser.add_argument("--trace", action="store_true", help="print the whole trace")
    parser.add_argument("--seeds", type=int, default=1000, help="how many seeds to run")
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--jobs", type=int, default=multiprocessing.cpu_count(),
                        help="parallel processes")
    parser.add_argument("--arbiter", choices=ARBITERS, default="witness",
                        help="who grants the lease: `pairmq witness` or an etcd cluster")
    args = parser.parse_args(argv)
    if args.seed is not None:
        return _replay(args.seed, args.trace, args.arbiter)
    end = args.first + args.seeds
    chunks = [(s, min(s + CHUNK, end)) for s in range(args.first, end, CHUNK)]
    started = time.monotonic()
    done = 0
    failed: list[int] = []
    with multiprocessing.Pool(args.jobs) as pool:
        run = partial(_chunk, args.arbiter)
        for (lo, hi), failures in zip(chunks, pool.imap(run, chunks), strict=True):
            done += hi - lo
            for seed, problem, trace in failures:
                failed.append(seed)
                if len(failed) <= 3:
                    print(f"\n--- seed {seed} FAILED: {problem}\n{trace}\n", flush=True)
                else:
                    print(f"seed {seed} FAILED: {problem}", flush=True)
            elapsed = time.monotonic() - started
            print(f"{done} seeds, {done / elapsed:.0f} seeds/s, {len(failed)} failed",
                  file=sys.stderr, flush=True)
    elapsed = time.monotonic() - started
    print(f"{done} seeds ({args.arbiter}) in {elapsed:.1f} s ({done / elapsed:.0f} seeds/s, "
          f"{args.jobs} jobs): {len(failed)} failed" + (f": {failed[:50]}" if failed else ""))
    if failed:
        print(f"replay one: python -m pairmq.ha.sim --seed {failed[0]} --trace"
              + (f" --arbiter {args.arbiter}" if args.arbiter != "witness" else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
