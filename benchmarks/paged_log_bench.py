"""`PagedLog.add` (what every message paged while serving goes through, when its record
is on disk) in a loop, this build's against another's, alternating.

Run from the repository root:

    .venv/bin/python benchmarks/paged_log_bench.py --ref b14089b --rounds 5

Prints the nanoseconds per call of each round and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
MODULE = "src/pairmq/core/paged_log.py"


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def per_add_ns(module: ModuleType, calls: int) -> float:
    log = module.PagedLog()
    log.attach("q")
    started = time.perf_counter()
    for i in range(calls):
        log.add(1, i, 1100, i + 1, 1170, i)
    return (time.perf_counter() - started) / calls * 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, help="the commit to compare with")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=1_000_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        ref_path = Path(scratch) / "paged_log.py"
        ref_path.write_bytes(subprocess.run(["git", "show", f"{args.ref}:{MODULE}"], cwd=ROOT,
                                            capture_output=True, check=True).stdout)
        builds = {"this": load(ROOT / MODULE, "this_paged_log"),
                  args.ref: load(ref_path, "ref_paged_log")}
        runs: dict[str, list[float]] = {name: [] for name in builds}
        for _ in range(args.rounds):
            for name, module in builds.items():
                runs[name].append(per_add_ns(module, args.calls))
    for name, values in runs.items():
        print(f"{name}: {statistics.median(values):.0f} ns a call "
              f"({', '.join(f'{v:.0f}' for v in values)})")
    print(f"this / {args.ref}: "
          f"{statistics.median(runs['this']) / statistics.median(runs[args.ref]):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
