"""A throw-away pairmq pair (primary, backup, witness) on loopback for the pipeline example.

The servers are real `python -m pairmq` processes with the replication policy, exactly
what `pairmq up` starts, but on free ports and in a directory of their own, so the example
runs beside a `make up` pair and leaves nothing behind.
"""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}; see {log}")
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {HOST}:{port} after {timeout} s; see {log}")


class LocalPair:
    """`with LocalPair(workdir) as pair:` starts the witness and both servers; `pair.url`
    is the failover URL clients and the Spark job use."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.secret = secrets.token_urlsafe(16)
        self.witness_port = free_port()
        self.stomp = {"primary": free_port(), "backup": free_port()}
        self.ha = {"primary": free_port(), "backup": free_port()}
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def url(self) -> str:
        servers = ",".join(f"stomp://{HOST}:{self.stomp[n]}" for n in ("primary", "backup"))
        return f"failover:({servers})"

    def _spawn(self, name: str, args: list[str], port: int) -> None:
        log = self.workdir / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "pairmq", *args], stdout=out,
                                    stderr=subprocess.STDOUT)
        self.procs[name] = proc
        wait_port(port, proc, log)

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._spawn("witness", ["witness", "--listen", f"{HOST}:{self.witness_port}",
                                "--secret", self.secret,
                                "--state", str(self.workdir / "witness.state")],
                    self.witness_port)
        for name, other in (("primary", "backup"), ("backup", "primary")):
            self._spawn(name, [
                "server", "--name", name, "--data-dir", str(self.workdir / "data" / name),
                "--stomp", f"{HOST}:{self.stomp[name]}", "--policy", "replication",
                "--role", name, "--listen", f"{HOST}:{self.ha[name]}",
                "--peer", f"{HOST}:{self.ha[other]}",
                "--witness", f"{HOST}:{self.witness_port}", "--secret", self.secret,
                # anonymous clients keep the example short; a real deployment sets users
                "--allow-anonymous", "--dup-cache-size", "200000",
            ], self.stomp[name] if name == "primary" else self.ha[name])

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()

    def __enter__(self) -> LocalPair:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
