"""Start and stop real pairmq server processes for tests and benchmarks."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

_handed_out: set[int] = set()

# The servers' log level when neither flags nor config set one; None leaves the server's
# default (benchmarks measure that). The test suite sets "debug" (tests/conftest.py), so
# that a failure report shows connections opening and closing.
LOG_LEVEL: str | None = None


def free_port() -> int:
    """A free loopback port, never one this process handed out before: a port is only
    bound later, by a server, and the kernel may offer a released one again at once (a
    pair's HA and admin ports once got the same one)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no free loopback port found that was not handed out already")


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
    """A pairmq server running as a real subprocess."""

    host: str
    port: int
    proc: subprocess.Popen
    data_dir: Path
    log_path: Path
    args: list[str] = field(default_factory=list)

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

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
) -> ServerProcess:
    """Start `python -m pairmq server` with the given flags and wait until it listens.

    `config_text` is written to a TOML file passed with --config; flags win over it.
    `open_files`: the process's limit on open files (RLIMIT_NOFILE), if not the default.
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
        wait_for_port("127.0.0.1", port, proc, start_timeout)
    except Exception:
        proc.kill()
        proc.wait()
        output = log_path.read_text(errors="replace")
        raise RuntimeError(f"server failed to start: {output}") from None
    return ServerProcess("127.0.0.1", port, proc, data_dir, log_path, args)
