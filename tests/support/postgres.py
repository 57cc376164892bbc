"""A real, throwaway PostgreSQL cluster on loopback, for the tests of what pairmq keeps in
PostgreSQL. Debian's postgresql (`make test-deps`, or `make pg-deps`, installs it).

    server = PostgresServer()              # finds the binaries, picks a port, makes a dir
    server.start()                         # initdb on the first start, then waits until ready
    server.url("orders")                   # "postgresql://pairmq:...@127.0.0.1:PORT/orders"
    server.create_database("orders")       # returns that URL
    server.sql("SELECT 1", database="orders")  # psql's output, unaligned: "1\\n"
    server.restart("immediate")            # a shutdown without checkpoint: crash recovery next
    server.kill()                          # SIGKILL of the postmaster (and of its children)
    server.close()                         # stopped, its directory removed (the fixture does it)

The cluster is made by initdb in a directory of its own under the system's temp dir (not a
test's tmp_path: pytest's is closed to other users, and the tests run as root, which
PostgreSQL refuses to run as: as root, initdb and the postmaster run as the `postgres` user,
who owns the directory). The superuser is USER, with PASSWORD, over TCP on 127.0.0.1 (every
connection authenticated by SCRAM, the socket's too); the socket is in the directory.
fsync and synchronous_commit are on (PostgreSQL's defaults, set explicitly): a row committed
before a crash is there after it. `log_path` is the server's log (tests/conftest.py shows its
tail when a test on the `postgres_server` fixture fails).

The postmaster is this process's child (`postgres -D`, not daemonized by pg_ctl): stopping it
is what `pg_ctl stop -m MODE` does (SIGTERM smart, SIGINT fast, SIGQUIT immediate, then wait),
and no cluster outlives the test process: the postmaster is killed when the thread that
started it exits (Linux's parent-death signal; every postmaster is started from one thread
that lives as long as the process), and its children end when they find it gone. Only the
directory is left behind by a pytest killed without running its fixtures' ends.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Literal

from tests.serverproc import free_port
from tests.support.requirements import require

PG_LIB = Path("/usr/lib/postgresql")  # Debian's: one bin/ per major version
HOST = "127.0.0.1"
USER = "pairmq"
PASSWORD = "pairmq-test-secret"
OS_USER = "postgres"  # whom initdb and the postmaster run as when the tests run as root
START_TIMEOUT = 30.0  # crash recovery included
STOP_TIMEOUT = 30.0
SQL_TIMEOUT = 60.0

# Written to postgresql.conf after initdb. Small shared buffers and few connections: a test
# run may hold one cluster per xdist worker, and tests of their own.
SETTINGS = {
    "listen_addresses": HOST,
    "max_connections": "50",
    "shared_buffers": "32MB",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "logging_collector": "off",  # the log is the postmaster's stderr: log_path
    "log_line_prefix": "%m [%p] %q%u@%d ",
    "log_min_messages": "info",
}

ShutdownMode = Literal["smart", "fast", "immediate"]
# pg_ctl stop -m MODE sends these
_SHUTDOWN_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT,
                     "immediate": signal.SIGQUIT}

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
# Every postmaster is forked from this one thread: the parent-death signal fires when the
# *thread* that forked a child ends, and this one ends only with the process.
_launcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="postgres-launcher")


class PostgresError(Exception):
    """PostgreSQL is missing here, or a cluster did not start, stop, or run a statement."""


def find_bin_dir() -> Path | None:
    """The bin/ of the newest PostgreSQL installed (/usr/lib/postgresql/N/bin), or None."""
    found = []
    for bin_dir in PG_LIB.glob("*/bin"):
        if bin_dir.parent.name.isdigit() and os.access(bin_dir / "postgres", os.X_OK) \
                and os.access(bin_dir / "initdb", os.X_OK):
            found.append((int(bin_dir.parent.name), bin_dir))
    return max(found)[1] if found else None


def missing() -> str | None:
    """Why a cluster cannot run here (None when it can)."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        return (f"PostgreSQL missing (no {PG_LIB}/*/bin/postgres): `make test-deps` (or "
                "`make pg-deps`) installs Debian's postgresql")
    for program in ("psql", "pg_isready"):
        if not os.access(bin_dir / program, os.X_OK):
            return f"{bin_dir / program} missing: Debian's postgresql-client provides it"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(OS_USER)
        except KeyError:
            return (f"running as root, and there is no `{OS_USER}` user to run PostgreSQL as "
                    "(Debian's postgresql package creates it)")
    return None


def require_postgres() -> None:
    """Skip the test where PostgreSQL is missing (fail it in CI: tests/support/requirements.py)."""
    require(missing())


def quote_ident(name: str) -> str:
    """`name` as an SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def _die_with_parent() -> None:
    """In the child, before exec (and after the switch to OS_USER, which would clear it):
    SIGKILL when the launcher thread (the process) dies."""
    if _libc is not None:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class PostgresServer:
    """One PostgreSQL cluster (a postmaster and its data directory) on HOST:`port`."""

    def __init__(self, *, port: int | None = None, settings: dict[str, str] | None = None
                 ) -> None:
        reason = missing()
        if reason is not None:
            raise PostgresError(reason)
        bin_dir = find_bin_dir()
        assert bin_dir is not None
        self.bin_dir = bin_dir
        self.version = int(bin_dir.parent.name)
        self.host = HOST
        self.port = port if port is not None else free_port()
        self.user = USER
        self.password = PASSWORD
        self.settings = {**SETTINGS, **(settings or {})}
        # as root: initdb and the postmaster run as OS_USER (both refuse root)
        self._owner = pwd.getpwnam(OS_USER) if os.geteuid() == 0 else None
        self.workdir = Path(tempfile.mkdtemp(prefix="pairmq-pg-")).resolve()
        self.data_dir = self.workdir / "data"
        self.socket_dir = self.workdir / "socket"
        self.log_path = self.workdir / "postgres.log"
        self.socket_dir.mkdir()
        self.log_path.touch()
        if self._owner is not None:
            for path in (self.workdir, self.socket_dir, self.log_path):
                os.chown(path, self._owner.pw_uid, self._owner.pw_gid)
        self.proc: subprocess.Popen[bytes] | None = None
        self.closed = False

    def owner_ids(self) -> tuple[int, int]:
        """(uid, gid) the server runs as: a directory it must write (a tablespace's) is
        given to it."""
        if self._owner is None:
            return os.getuid(), os.getgid()
        return self._owner.pw_uid, self._owner.pw_gid

    # ------------------------------------------------------------ addresses

    def url(self, database: str = "postgres") -> str:
        """postgresql://USER:PASSWORD@HOST:PORT/DATABASE (libpq's, psycopg's)."""
        return (f"postgresql://{USER}:{urllib.parse.quote(PASSWORD, safe='')}@{self.host}:"
                f"{self.port}/{urllib.parse.quote(database, safe='')}")

    @property
    def pid(self) -> int | None:
        """The postmaster's, while it runs."""
        return self.proc.pid if self.alive() and self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # ------------------------------------------------------------ processes

    def _env(self) -> dict[str, str]:
        """This process's environment without libpq's PG* variables (a PGDATA or PGPORT
        of the machine's must not redirect anything), in the C locale."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C")
        if self._owner is not None:
            env.update(HOME=self._owner.pw_dir, USER=OS_USER, LOGNAME=OS_USER)
        return env

    def _run_as(self) -> tuple[int | None, int | None, list[int] | None]:
        """Popen's user, group and extra_groups: OS_USER's when this process is root, None
        (unchanged) otherwise."""
        if self._owner is None:
            return None, None, None
        return self._owner.pw_uid, self._owner.pw_gid, []

    def _initdb(self) -> None:
        pwfile = self.workdir / "pwfile"
        pwfile.write_text(PASSWORD + "\n")
        if self._owner is not None:
            os.chown(pwfile, self._owner.pw_uid, self._owner.pw_gid)
        args = [str(self.bin_dir / "initdb"), f"--pgdata={self.data_dir}",
                f"--username={USER}", f"--pwfile={pwfile}", "--auth=scram-sha-256",
                "--encoding=UTF8", "--no-locale", "--no-instructions"]
        uid, gid, groups = self._run_as()
        try:
            done = subprocess.run(args, cwd=self.workdir, env=self._env(),
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=120,
                                  check=False, user=uid, group=gid, extra_groups=groups)
        finally:
            pwfile.unlink(missing_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"----- initdb: {' '.join(args)}\n".encode() + done.stdout + done.stderr)
        if done.returncode != 0:
            raise PostgresError(f"initdb exited with code {done.returncode}:\n"
                                f"{(done.stdout + done.stderr).decode(errors='replace')}")
        with open(self.data_dir / "postgresql.conf", "a") as conf:
            conf.write("\n# tests/support/postgres.py\n")
            for name, value in {**self.settings, "port": str(self.port),
                                "unix_socket_directories": str(self.socket_dir)}.items():
                conf.write(f"{name} = '{value}'\n")

    def start(self, timeout: float = START_TIMEOUT) -> PostgresServer:
        """initdb on the first start; then the postmaster unless it runs; returns once it
        accepts connections (after crash recovery, when it was killed)."""
        if self.closed:
            raise PostgresError("this server is closed")
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        if not self.alive():
            self._launch()
        self.wait_ready(timeout)
        return self

    def _launch(self) -> None:
        # what kill() leaves: processes of the cluster (it waits for none to be left), and
        # postmaster.pid, which is stale then. A new postmaster refuses a postmaster.pid
        # whose pid runs (another cluster's process may have that pid by now).
        if self._cluster_pids():
            raise PostgresError(f"processes of the cluster in {self.data_dir} still run: "
                                f"{self._cluster_pids()}")
        (self.data_dir / "postmaster.pid").unlink(missing_ok=True)
        args = [str(self.bin_dir / "postgres"), "-D", str(self.data_dir)]
        uid, gid, groups = self._run_as()
        with open(self.log_path, "ab") as log:  # the child keeps its own copy
            log.write(f"----- postgres started: {' '.join(args)}\n".encode())
            log.flush()
            self.proc = _launcher.submit(
                subprocess.Popen, args, cwd=self.workdir, env=self._env(),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent, start_new_session=True, user=uid, group=gid,
                extra_groups=groups).result()

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Until pg_isready says the server accepts connections; PostgresError (with the
        log's tail) if the postmaster exits first, TimeoutError after `timeout`."""
        deadline = time.monotonic() + timeout
        args = [str(self.bin_dir / "pg_isready"), "-q", "-h", self.host, "-p", str(self.port),
                "-U", USER, "-d", "postgres", "-t", "1"]
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise PostgresError(f"postgres exited with code {self.proc.returncode}:\n"
                                    f"{self.log_tail()}")
            if subprocess.run(args, env=self._env(), stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=10, check=False).returncode == 0:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"postgres on port {self.port} not ready within {timeout} s"
                                   f"\n{self.log_tail()}")
            time.sleep(0.02)

    def stop(self, mode: ShutdownMode = "fast", timeout: float = STOP_TIMEOUT) -> None:
        """As `pg_ctl stop -m MODE`: smart waits for the clients to leave, fast disconnects
        them and checkpoints, immediate stops at once (no checkpoint: crash recovery at the
        next start). Returns once the postmaster and its children are gone; kill() after
        `timeout`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(_SHUTDOWN_SIGNALS[mode])
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def restart(self, mode: ShutdownMode = "fast", timeout: float = START_TIMEOUT) -> None:
        """stop(mode), then start(): returns once it accepts connections again."""
        self.stop(mode)
        self.start(timeout)

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL of the postmaster: a crash. Its children (backends, checkpointer, ...)
        would end soon after on their own; they are killed too, and kill() returns once
        none is left, so that nothing of the cluster commits after it returns."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout)
        deadline = time.monotonic() + timeout
        while pids := self._cluster_pids():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() >= deadline:
                raise PostgresError(f"processes of {self.data_dir} still run after SIGKILL: "
                                    f"{pids}")
            time.sleep(0.01)

    def _cluster_pids(self) -> list[int]:
        """Every process working in the data directory: PostgreSQL's all chdir there (the
        postmaster's children become orphans, not identified by a parent, once it dies)."""
        data_dir = str(self.data_dir)
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if cwd == data_dir or cwd == data_dir + " (deleted)":
                pids.append(int(entry.name))
        return pids

    def close(self) -> None:
        """Stopped (fast, killed if that takes long) and its directory removed: the end of a
        test, whatever state it left the server in."""
        if self.closed:
            return
        self.closed = True
        try:
            self.stop("fast", timeout=10.0)
        finally:
            self.kill()
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------ data

    def sql(self, statement: str, database: str = "postgres", timeout: float = SQL_TIMEOUT
            ) -> str:
        """Run `statement` (one or more, `;`-separated, each on its own as psql runs a
        script) through psql, stopping at the first error (PostgresError); returns psql's
        output: the rows, unaligned (`|` between columns), without headers."""
        args = [str(self.bin_dir / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                "-h", self.host, "-p", str(self.port), "-U", USER, "-d", database, "-f", "-"]
        env = {**self._env(), "PGPASSWORD": PASSWORD, "PGCONNECT_TIMEOUT": "10"}
        done = subprocess.run(args, input=statement.encode(), env=env, capture_output=True,
                              timeout=timeout, check=False)
        if done.returncode != 0:
            raise PostgresError(f"psql on {database!r} exited with code {done.returncode}: "
                                f"{done.stderr.decode(errors='replace').strip()}\n"
                                f"statement: {statement}")
        return done.stdout.decode()

    def create_database(self, name: str) -> str:
        """CREATE DATABASE `name`; returns its URL."""
        self.sql(f"CREATE DATABASE {quote_ident(name)}")
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """DROP DATABASE `name`, its connections closed first (WITH (FORCE)), if it exists."""
        self.sql(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")

    # ------------------------------------------------------------ logs

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def database_name(test_name: str, suffix: str) -> str:
    """A database name for a test: its name, lowercased, [a-z0-9_] only, then `suffix`,
    within PostgreSQL's 63 bytes."""
    stem = re.sub(r"[^a-z0-9_]+", "_", test_name.lower()).strip("_")
    return f"{stem[:63 - len(suffix) - 1]}_{suffix}"
