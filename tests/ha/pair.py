"""A pair of pairmq servers (primary, backup) and a witness, as real processes on loopback.

Used by the HA tests and the partition tests. The API is meant to stay stable:

    pair = Pair(tmp_path)                     # allocates ports, starts nothing yet
    pair.start()                              # witness, primary, backup (see `order`)
    pair.wait_formed()                        # primary ACTIVE, backup PASSIVE
    pair.status("primary")                    # GET /status of its admin HTTP (dict or None)
                                              # as the test admin (tests/support/admin.py)
    pair.wait_state("backup", "PASSIVE", 10)  # returns the status
    pair.active()                             # the one serving server's name, or None
    pair.kill("primary"); pair.restart("primary")
    Pair(tmp_path, etcd=cluster.url)          # etcd as the arbiter, no witness process
    pair.connect("backup")                    # a BlockingConnection to its STOMP port

Addresses: every server has a fixed STOMP port, HA listen port and admin port for the
life of the Pair, so a restart is the same server (same data dir, same addresses).
`peer_address_for` / `witness_address_for` ({name: "HOST:PORT"}) override what a server
is told its peer's / the witness's HA address is (to route them through a proxy); they
are plain dicts, read at every (re)start, so they may be changed before `start()`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pairmq.client.plain import BlockingConnection, StompError
from tests.serverproc import ServerProcess, free_port, start_server, wait_for_port
from tests.support.admin import admin_status, admin_user_flags
from tests.support.cli import run_pairmq
from tests.support.waiting import wait_until

NAMES = ("primary", "backup")
SERVING = ("ACTIVE", "STANDALONE")
HOST = "127.0.0.1"


class Pair:
    def __init__(
        self,
        workdir: Path,
        *,
        heartbeat_ms: int = 100,
        activation_ms: int = 400,
        secret: str | None = None,
        secret_for: Mapping[str, str] | None = None,
        with_witness: bool = True,
        flags: Sequence[str] = (),
        flags_for: Mapping[str, Sequence[str]] | None = None,
        peer_address_for: Mapping[str, str] | None = None,
        witness_address_for: Mapping[str, str] | None = None,
        roles: Mapping[str, str] | None = None,
        policy: str = "replication",
        witness_flags: Sequence[str] = (),
        etcd: str = "",
        group: str = "",
        database: str = "",
        lease_ms: int = 1000,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.heartbeat_ms = heartbeat_ms
        self.activation_ms = activation_ms
        # unique per pair: a server of another pair (tests run in parallel) that happens to
        # take a port of this one is refused instead of being taken for the peer
        self.secret = secret if secret is not None else f"pair-{uuid.uuid4().hex}"
        self.secret_for: dict[str, str] = dict(secret_for or {})
        self.policy = policy
        # shared-store: one journal in one directory, the lock decides (no witness)
        self.with_witness = with_witness and policy == "replication" and not etcd
        # etcd as the arbiter (`etcd://...`): no witness process; the pair's name in etcd
        self.etcd = etcd
        self.group = group or f"pair-{uuid.uuid4().hex[:12]}"
        # shared-store with [store] url: the journal and the lease in this database
        self.database = database
        self.lease_ms = lease_ms
        self.shared_dir = self.workdir / "shared"
        if policy == "shared-store" and not database:
            self.shared_dir.mkdir(exist_ok=True)
        self.flags: list[str] = list(flags)
        self.flags_for: dict[str, list[str]] = {n: list(f) for n, f in (flags_for or {}).items()}
        self.peer_address_for: dict[str, str] = dict(peer_address_for or {})
        self.witness_address_for: dict[str, str] = dict(witness_address_for or {})
        self.roles: dict[str, str] = dict(roles or {"primary": "primary", "backup": "backup"})
        self.stomp_port = {n: free_port() for n in NAMES}
        self.ha_port = {n: free_port() for n in NAMES}
        self.admin_port = {n: free_port() for n in NAMES}
        self.witness_port = free_port()
        self.servers: dict[str, ServerProcess | None] = dict.fromkeys(NAMES)
        self.witness_proc: subprocess.Popen | None = None
        self.witness_state = self.workdir / "witness-state.json"
        self.witness_log = self.workdir / "witness.log"
        self.witness_flags: list[str] = list(witness_flags)  # e.g. its TLS files
        self._connections: list[BlockingConnection] = []

    # ------------------------------------------------------------ addresses

    @staticmethod
    def other(name: str) -> str:
        return "backup" if name == "primary" else "primary"

    def ha_address(self, name: str) -> str:
        """The HA channel address `name` listens on."""
        return f"{HOST}:{self.ha_port[name]}"

    def witness_address(self) -> str:
        """The address the witness listens on."""
        return f"{HOST}:{self.witness_port}"

    def stomp_address(self, name: str) -> str:
        return f"{HOST}:{self.stomp_port[name]}"

    def client_address(self, name: str) -> tuple[str, int]:
        """Where clients connect to `name`: its STOMP (host, port)."""
        return (HOST, self.stomp_port[name])

    def client_addresses(self) -> list[tuple[str, int]]:
        """Where clients connect to the pair: each server's STOMP (host, port), the
        primary's first."""
        return [self.client_address(name) for name in NAMES]

    def admin_address(self, name: str) -> str:
        return f"{HOST}:{self.admin_port[name]}"

    def data_dir(self, name: str) -> Path:
        return self.workdir / f"data-{name}"

    def server_flags(self, name: str, extra: Iterable[str] = ()) -> list[str]:
        """The full flag list a (re)start of `name` uses; later flags win."""
        flags = [
            "--policy", self.policy,
            "--role", self.roles[name],
            "--listen", self.ha_address(name),
            "--peer", self.peer_address_for.get(name, self.ha_address(self.other(name))),
            "--secret", self.secret_for.get(name, self.secret),
            "--heartbeat-interval-ms", str(self.heartbeat_ms),
            "--activation-interval-ms", str(self.activation_ms),
            "--admin", self.admin_address(name),
            *admin_user_flags(),  # the management port answers only users with a role
        ]
        if self.policy == "shared-store" and self.database:
            flags += ["--url", self.database, "--group", self.group.replace("-", "_"),
                      "--lease-timeout-ms", str(self.lease_ms)]
        elif self.policy == "shared-store":
            flags += ["--shared-dir", str(self.shared_dir)]
        if self.with_witness:
            flags += ["--witness", self.witness_address_for.get(name, self.witness_address())]
        elif self.etcd:
            flags += ["--witness", self.etcd, "--group", self.group]
        return flags + self.flags + self.flags_for.get(name, []) + list(extra)

    # ------------------------------------------------------------ processes

    def start_witness(self) -> None:
        if self.witness_proc is not None and self.witness_proc.poll() is None:
            return
        args = [sys.executable, "-m", "pairmq", "witness", "--listen", self.witness_address(),
                "--secret", self.secret, "--state", str(self.witness_state),
                *self.witness_flags]
        log = open(self.witness_log, "ab")  # noqa: SIM115 - handed to the child
        self.witness_proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_for_port(HOST, self.witness_port, self.witness_proc)

    def kill_witness(self) -> None:
        if self.witness_proc is not None and self.witness_proc.poll() is None:
            self.witness_proc.send_signal(signal.SIGKILL)
            self.witness_proc.wait(10)

    def stop_witness(self) -> None:
        if self.witness_proc is not None and self.witness_proc.poll() is None:
            self.witness_proc.terminate()
            try:
                self.witness_proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill_witness()

    def start_server(self, name: str, *extra: str) -> ServerProcess:
        """Start (or restart) `name`: same ports, same data dir, earlier logs kept."""
        current = self.servers.get(name)
        if current is not None and current.alive():
            raise RuntimeError(f"{name} is still running")
        self._archive_log(name)
        srv = start_server(self.workdir, *self.server_flags(name, extra), name=name,
                           port=self.stomp_port[name])
        self.servers[name] = srv
        try:
            wait_until(lambda: self.status(name) is not None, f"{name}'s admin HTTP", 20.0)
        except TimeoutError:
            raise RuntimeError(f"{name} does not answer on its admin HTTP:\n"
                               f"{srv.logs()[-3000:]}") from None
        return srv

    def start(self, order: Sequence[str] = NAMES, *, witness: bool = True,
              parallel: bool = False) -> Pair:
        """Start the witness, then the servers in `order` (each waited for, unless
        `parallel`: then all are launched at once, which saves a second per server)."""
        if witness and self.with_witness:
            self.start_witness()
        if not parallel:
            for name in order:
                self.start_server(name)
            return self
        errors: list[BaseException] = []

        def start_one(name: str) -> None:
            try:
                self.start_server(name)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=start_one, args=(n,)) for n in order]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return self

    def wait_formed(self, timeout: float = 15.0, active: str = "primary") -> None:
        """`active` ACTIVE with the other PASSIVE (in sync), each seeing the other so (and,
        on etcd, the lease record naming the passive its standby)."""
        passive = self.other(active)
        self.wait_state(active, "ACTIVE", timeout)
        self.wait_state(passive, "PASSIVE", timeout)

        def views() -> bool:
            a, p = self.status(active), self.status(passive)
            formed = bool(a and p and a["state"] == "ACTIVE" and p["state"] == "PASSIVE"
                          and a["ha"]["peer"]["state"] == "PASSIVE"
                          and p["ha"]["peer"]["state"] == "ACTIVE")
            # on etcd, and the lease record names the backup the standby: an etcd write
            # after the backup's sync, until which the backup may not take over
            return formed and (not self.etcd or a["ha"]["witness"].get("standby")
                               == p["ha"]["identity"])

        try:
            wait_until(views, "the pair formed", timeout)
        except TimeoutError:
            raise TimeoutError(f"the pair did not form with {active} active\n"
                               f"{self.describe()}") from None

    def kill(self, name: str) -> None:
        """SIGKILL: a crash, nothing flushed."""
        srv = self.servers[name]
        if srv is not None:
            srv.kill()

    def stop(self, name: str, timeout: float = 15.0) -> int | None:
        """SIGTERM and wait (SIGKILL after `timeout`); returns the exit code."""
        srv = self.servers[name]
        return srv.stop(timeout) if srv is not None else None

    def restart(self, name: str, *extra: str) -> ServerProcess:
        srv = self.servers[name]
        if srv is not None and srv.alive():
            srv.stop()
        return self.start_server(name, *extra)

    @contextmanager
    def frozen(self, name: str) -> Iterator[None]:
        """`name` frozen with SIGSTOP for the block (SIGCONT after it, whatever happens):
        alive for the kernel, its sockets open, but it reads and answers nothing."""
        srv = self.servers[name]
        assert srv is not None
        os.kill(srv.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(srv.proc.pid, signal.SIGCONT)

    def alive(self, name: str) -> bool:
        srv = self.servers[name]
        return srv is not None and srv.alive()

    def close(self) -> None:
        for conn in self._connections:
            try:
                conn.sock.close()
            except OSError:
                pass
        self._connections.clear()
        for name in NAMES:
            srv = self.servers[name]
            if srv is not None and srv.alive():
                srv.stop(10)
        self.stop_witness()

    # ------------------------------------------------------------ logs

    def _history(self, name: str) -> Path:
        return self.workdir / f"server-{name}.history.log"

    def _archive_log(self, name: str) -> None:
        srv = self.servers.get(name)
        if srv is not None and srv.log_path.exists():
            with open(self._history(name), "a", errors="replace") as f:
                f.write(srv.logs())
                f.write(f"----- {name} restarted -----\n")

    def logs(self, name: str) -> str:
        """Everything `name` logged, over all its runs in this Pair."""
        history = self._history(name)
        text = history.read_text(errors="replace") if history.exists() else ""
        srv = self.servers[name]
        if srv is not None and srv.log_path.exists():
            text += srv.logs()
        return text

    def current_logs(self, name: str) -> str:
        """What the current (or last) run of `name` logged."""
        srv = self.servers[name]
        return srv.logs() if srv is not None else ""

    def witness_logs(self) -> str:
        return self.witness_log.read_text(errors="replace") if self.witness_log.exists() else ""

    def describe(self, lines: int = 25) -> str:
        """States and the last HA log lines of each server, for assertion messages."""
        parts = []
        for name in NAMES:
            st = self.status(name)
            parts.append(f"{name}: {st['state'] if st else 'unreachable'}")
        out = ", ".join(parts)
        for name in NAMES:
            relevant = [line for line in self.logs(name).splitlines()
                        if "pairmq.connection" not in line]
            out += f"\n----- {name} log (HA and server lines) -----\n"
            out += "\n".join(relevant[-lines:])
        witness = self.witness_logs().splitlines()
        out += "\n----- witness log -----\n" + "\n".join(witness[-8:])
        return out

    # ------------------------------------------------------------ management

    def status(self, name: str, timeout: float = 2.0) -> dict[str, Any] | None:
        """GET /status of `name` (as the test admin), or None when it does not answer."""
        if not self.alive(name):
            return None
        return admin_status(self.admin_address(name), timeout)

    def state(self, name: str) -> str | None:
        st = self.status(name)
        return st["state"] if st else None

    def wait_state(self, name: str, state: str | Iterable[str], timeout: float = 10.0
                   ) -> dict[str, Any]:
        """Wait until `name` reports `state` (or one of several); returns its status."""
        wanted = {state} if isinstance(state, str) else set(state)
        last: list[str | None] = [None]

        def check() -> dict[str, Any] | None:
            st = self.status(name)
            last[0] = st["state"] if st else None
            return st if st and st["state"] in wanted else None

        try:
            return wait_until(check, f"{name} in {sorted(wanted)}", timeout)
        except TimeoutError:
            raise TimeoutError(f"{name} did not reach {sorted(wanted)} within {timeout} s "
                               f"(last state {last[0]})\n{self.describe()}") from None

    def serving(self) -> list[str]:
        """The servers that report ACTIVE or STANDALONE (two would be split brain)."""
        return [n for n in NAMES if self.state(n) in SERVING]

    def active(self) -> str | None:
        """The server that serves, if exactly one does."""
        names = self.serving()
        return names[0] if len(names) == 1 else None

    def wait_active(self, timeout: float = 10.0, name: str | None = None) -> str:
        """Wait until exactly one server serves (and it is `name`, if given)."""
        def check() -> str | None:
            serving = self.active()
            return serving if serving and (name is None or serving == name) else None

        try:
            return wait_until(check, "an active server", timeout)
        except TimeoutError:
            raise TimeoutError(f"no{' ' + name if name else ''} active server within "
                               f"{timeout} s\n{self.describe()}") from None

    def activate(self, name: str) -> subprocess.CompletedProcess:
        """`pairmq activate ADMIN --yes` against `name`."""
        return self.cli("activate", self.admin_address(name), "--yes")

    def cli(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """`pairmq ARGS`, logged in as the test admin (tests/support/cli.py)."""
        return run_pairmq(*args, timeout=timeout)

    # ------------------------------------------------------------ clients

    def connect(self, name: str, timeout: float = 5.0) -> BlockingConnection:
        """A BlockingConnection to `name` (StompError if it refuses); closed by close()."""
        conn = BlockingConnection(HOST, self.stomp_port[name], timeout=timeout)
        self._connections.append(conn)
        return conn

    def connect_any(self, timeout: float = 10.0) -> tuple[str, BlockingConnection]:
        """Connect to whichever server accepts first, retrying until `timeout`."""
        def attempt() -> tuple[str, BlockingConnection] | None:
            for name in NAMES:
                if not self.alive(name):
                    continue
                try:
                    return name, self.connect(name, timeout=2.0)
                except (StompError, OSError, ConnectionError, TimeoutError):
                    pass
            return None

        return wait_until(attempt, "a server accepting clients", timeout, interval=0.02)
