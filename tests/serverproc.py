"""Start and stop real pairmq server processes for tests and benchmarks."""

from __future__ import annotations

import os
import random
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_handed_out: set[int] = set()
_ports = random.Random()  # its own: a test that seeds `random` must not pick the ports

# Servers listen on ports below the kernel's ephemeral range (32768 and up), so that no
# client's outgoing connection can take the port of a server that is down for a restart.
# Under pytest-xdist every worker takes its own slice of the range: two workers never hand
# out the same port, even one that neither has bound yet.
PORT_RANGE = (12000, 32000)

# The servers' log level when neither flags nor config set one; None leaves the server's
# default (benchmarks measure that). The test suite sets "debug" (tests/conftest.py), so
# that a failure report shows connections opening and closing.
LOG_LEVEL: str | None = None


def _own_ports() -> range:
    """This process's slice of PORT_RANGE: all of it, or one worker's share under xdist
    (PYTEST_XDIST_WORKER is "gw0", "gw1", ...)."""
    low, high = PORT_RANGE
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or workers <= 1:
        return range(low, high)
    share = (high - low) // workers
    start = low + int(worker[2:]) * share
    return range(start, start + share)


def free_port() -> int:
    """A free loopback port of this process's slice, never one handed out before: a port
    is only bound later, by a server, so a port still free now may be another test's
    already (a pair's HA and admin ports once got the same one)."""
    ports = _own_ports()
    for _ in range(1000):
        port = _ports.choice(ports)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {ports} that was not handed out already")


def reserve_ports(ports: list[int]) -> bool:
    """Hand out all of `ports` at once, as free_port hands out one, when each is free and
    none is handed out already (nor twice in `ports`); else none of them. For ports a
    server derives from others (a hosted backup's: its live's plus an offset)."""
    if len(set(ports)) != len(ports) or any(p in _handed_out or p >= 65536 for p in ports):
        return False
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    _handed_out.update(ports)
    return True


def wait_for_port(host: str, port: int, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"server did not listen on {host}:{port} within {timeout}s")


@dataclass
class ServerProcess:
    """A pairmq server running as a real subprocess.

    It keeps what it was started with (`workdir`, `name`, `port`), so that `start_again`
    starts the same server: same data directory, log name and address. `on_start`, if
    set, is told of every start, the first and each later one (tests/conftest.py's
    `server_factory` stops them all when the test ends)."""

    host: str
    port: int
    proc: subprocess.Popen
    data_dir: Path
    log_path: Path
    args: list[str] = field(default_factory=list)
    name: str = "test"
    workdir: Path | None = None
    on_start: Callable[[ServerProcess], None] | None = None

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_lines(self, *needles: str) -> list[str]:
        """The lines of its log that hold every one of `needles`."""
        return [line for line in self.logs().splitlines() if all(n in line for n in needles)]

    def kill(self) -> None:
        """A real crash: SIGKILL, no cleanup."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss(self) -> int:
        """The server process's resident memory, in bytes."""
        import psutil  # a test dependency only

        return psutil.Process(self.proc.pid).memory_info().rss

    def start_again(self, *flags: str, **options: Any) -> ServerProcess:
        """The same server started anew, with `flags` and start_server's `options`; this
        one must be down (tests/support/servers.py's `restart` brings it down first)."""
        if self.workdir is None:
            raise RuntimeError(f"{self.name} was not started by start_server")
        if self.alive():
            raise RuntimeError(f"{self.name} is still running")
        return start_server(self.workdir, *flags, name=self.name, port=self.port,
                            on_start=self.on_start, **options)


def start_server(
    workdir: Path,
    *flags: str,
    config_text: str | None = None,
    port: int | None = None,
    anonymous: bool = True,
    name: str = "test",
    env: dict[str, str] | None = None,
    start_timeout: float = 20.0,
    open_files: int | None = None,
    on_start: Callable[[ServerProcess], None] | None = None,
    wait_listening: bool = True,
) -> ServerProcess:
    """Start `python -m pairmq server` with the given flags and wait until it listens.

    `config_text` is written to a TOML file passed with --config; flags win over it.
    `open_files`: the process's limit on open files (RLIMIT_NOFILE), if not the default.
    `on_start`: told of the server once it listens, and of every `start_again` of it.
    `wait_listening`: False returns at once (a server that waits for something first, or
    is expected to refuse to start).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    data_dir = workdir / f"data-{name}"
    log_path = workdir / f"server-{name}-{port}.log"
    args = [sys.executable, "-m", "pairmq", "server"]
    if config_text is not None:
        cfg = workdir / f"{name}-{port}.toml"
        cfg.write_text(config_text)
        args += ["--config", str(cfg)]
    args += ["--name", name, "--data-dir", str(data_dir), "--stomp", f"127.0.0.1:{port}"]
    if anonymous:
        args.append("--allow-anonymous")
    if LOG_LEVEL and "--log-level" not in flags and "log_level" not in (config_text or ""):
        args += ["--log-level", LOG_LEVEL]
    args += list(flags)
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    if env:
        full_env.update(env)
    log = open(log_path, "wb")  # noqa: SIM115 - handed to the child
    limit = None if open_files is None else (
        lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files)))
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                            preexec_fn=limit)
    log.close()
    try:
        if wait_listening:
            wait_for_port("127.0.0.1", port, proc, start_timeout)
            admin = _admin_address(list(flags), config_text)
            if admin is not None:  # it opens a moment after the STOMP port
                host, _, admin_port = admin.rpartition(":")
                wait_for_port(host, int(admin_port), proc, start_timeout)
    except Exception:
        proc.kill()
        proc.wait()
        output = log_path.read_text(errors="replace")
        raise RuntimeError(f"server failed to start: {output}") from None
    server = ServerProcess("127.0.0.1", port, proc, data_dir, log_path, args, name=name,
                           workdir=workdir, on_start=on_start)
    if on_start is not None:
        on_start(server)
    return server


def _admin_address(flags: list[str], config_text: str | None) -> str | None:
    """The management port a server is started with (by flag, or by its [server] admin key)
    if it has one with a fixed port: its console is imported in a thread once the STOMP
    port is open (server/app.py), so it answers a moment later."""
    address = None
    if "--admin" in flags:
        address = flags[flags.index("--admin") + 1]
    elif config_text is not None:
        found = re.search(r'^admin\s*=\s*"([^"]+)"', config_text, re.MULTILINE)
        address = found.group(1) if found else None
    if address is None or address.endswith(":0") or ":" not in address:
        return None
    return address
