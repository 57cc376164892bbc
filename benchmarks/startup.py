"""Start-up of an empty server: process start to a CONNECTED frame, and the imports in it.

Run from the repository root:

    .venv/bin/python benchmarks/startup.py --runs 10
    .venv/bin/python benchmarks/startup.py --runs 10 --ref 5966786   # two builds, alternating

For each build (this working tree, and `--ref`'s `src/` extracted from git as
benchmarks/compare.py does), alternating, --runs times:

- `import_s`: importing `pairmq.server.run` (what `pairmq server` loads before it reads its
  configuration) in a fresh interpreter, timed inside it;
- `connected_s`: `python -m pairmq server` on an empty data directory, from the process
  start to a CONNECTED frame on its STOMP port (a connection tried every 2 ms), with the
  management port off and, as `connected_admin_s`, on.

The first run of each build is a warm-up (it writes the .pyc files) and is not counted.
Prints one JSON line per build with the medians and every run.
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
import signal  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from tests.serverproc import free_port  # noqa: E402

from benchmarks.compare import WORK, Build, check_imports, reference_source  # noqa: E402

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\n\n\x00"
IMPORT_SCRIPT = ("import time; t = time.perf_counter(); import pairmq.server.run; "
                 "print(time.perf_counter() - t)")


def import_seconds(build: Build) -> float:
    out = subprocess.run([sys.executable, "-c", IMPORT_SCRIPT], env=_env(build),
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def _env(build: Build) -> dict[str, str]:
    """The build's `src/` first; bytecode written and read, as an installed package's is
    (PYTHONDONTWRITEBYTECODE, set by many Dockerfiles and some shells, would have
    every run compile every module of the build: about 0.2 s more here)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(build.src), "PYTHONUNBUFFERED": "1"}


def _connected(port: int) -> bool:
    """One try: connect, CONNECT, read until a frame's end; True on CONNECTED."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2.0) as sock:
            sock.sendall(CONNECT)
            got = b""
            while b"\x00" not in got:
                chunk = sock.recv(4096)
                if not chunk:
                    return False
                got += chunk
            return got.startswith(b"CONNECTED")
    except OSError:
        return False


def connected_seconds(build: Build, workdir: Path, admin: bool, timeout: float = 30.0
                      ) -> float:
    data_dir = workdir / "data"
    shutil.rmtree(data_dir, ignore_errors=True)
    port = free_port()
    cmd = [sys.executable, "-m", "pairmq", "server", "--name", "startup", "--data-dir",
           str(data_dir), "--stomp", f"127.0.0.1:{port}", "--allow-anonymous"]
    if admin:
        cmd += ["--admin", f"127.0.0.1:{free_port()}"]
    log_path = workdir / "server.log"
    with open(log_path, "wb") as log:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(build))
    try:
        while not _connected(port):
            if proc.poll() is not None or time.perf_counter() - started > timeout:
                raise SystemExit(f"{build.name}: no CONNECTED: "
                                 f"{log_path.read_text(errors='replace')[-1500:]}")
            time.sleep(0.002)
        return time.perf_counter() - started
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def one_run(build: Build, workdir: Path) -> dict[str, float]:
    return {"import_s": import_seconds(build),
            "connected_s": connected_seconds(build, workdir, admin=False),
            "connected_admin_s": connected_seconds(build, workdir, admin=True)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--ref", default=None, help="a git ref to measure beside this tree")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pairmq-startup-") as scratch:
        builds = [Build(WORK, ROOT / "src")]
        if args.ref:
            builds.append(Build(args.ref, reference_source(args.ref, Path(scratch))))
        for build in builds:
            check_imports(build)
        runs: dict[str, list[dict[str, float]]] = {b.name: [] for b in builds}
        for i in range(args.runs + 1):
            for build in builds if i % 2 == 0 else builds[::-1]:
                workdir = Path(scratch) / f"run-{build.name}"
                workdir.mkdir(exist_ok=True)
                figures = one_run(build, workdir)
                if i:  # the first writes the .pyc files
                    runs[build.name].append(figures)
        for build in builds:
            done = runs[build.name]
            line = {"build": build.name, "runs": len(done)}
            for key in ("import_s", "connected_s", "connected_admin_s"):
                line[key] = round(statistics.median(r[key] for r in done), 3)
            line["every_run"] = done
            print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
