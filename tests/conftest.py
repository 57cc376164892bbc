"""Fixtures shared by every test: real server processes on free loopback ports."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import serverproc
from tests.ha.pair import Pair
from tests.integration.clients import Client
from tests.serverproc import ServerProcess, start_server
from tests.support.admin import hashed
from tests.support.browser import Browser, missing
from tests.support.build import COMPILED
from tests.support.certs import Pki, make_pki
from tests.support.etcd import EtcdCluster, require_etcd
from tests.support.machine_state import free_space, memory_available, summary
from tests.support.postgres import PostgresServer, database_name, require_postgres

serverproc.LOG_LEVEL = "debug"

LOG_TAIL_LINES = 80


# `make test` runs the suite in two steps: first the tests that mostly wait on servers, on
# two pytest-xdist workers; then the heavy ones, one at a time, each with the machine to
# itself as far as the suite goes. Heavy: marked `slow` (long campaigns) or `machine` (two
# busy processes, or a time bound under a second), and the tests on a SparkSession (each
# worker would start its own, a JVM: tests/spark/conftest.py). Marked here `heavy`, which
# `-m` selects on.
HEAVY_MARKERS = ("slow", "machine")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.get_closest_marker(m) for m in HEAVY_MARKERS) \
                or "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.heavy)


def pytest_report_header(config: pytest.Config) -> str:
    build = "compiled (PYTHONPATH=build/compiled)" if COMPILED else "pure Python"
    return f"machine: {free_space()}; {memory_available()}\npairmq: {build}"


_FAILED: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Failures as they come (on the controller too, which xdist's workers report to)."""
    if report.failed and report.nodeid not in _FAILED:
        _FAILED.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The machine's state and the first failures, printed last: runs after an internal
    error too, and CI shows only the tail of the output."""
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller says it
        return
    print("\n" + summary(_FAILED), flush=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """On a failure, show the tail of every server and witness log the test wrote, and of
    the PostgreSQL server's it used: a CI run is often the only witness of a rare failure."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    tmp_path = funcargs.get("tmp_path")
    logs = sorted(Path(tmp_path).rglob("*.log")) if tmp_path is not None else []
    postgres = funcargs.get("postgres_server")
    if isinstance(postgres, PostgresServer) and postgres.log_path.exists():
        logs.append(postgres.log_path)  # in a directory of its own, not under tmp_path
    for log in logs:
        lines = _without_refused(log.read_text(errors="replace").splitlines())[-LOG_TAIL_LINES:]
        report.sections.append((f"log {log.name} (last {len(lines)} lines)", "\n".join(lines)))


_CONNECTION = re.compile(r"onnection (\d+) ")
_REFUSED = re.compile(r"Closing connection (\d+) from \S+: this server is [A-Z]+")


def _without_refused(lines: list[str]) -> list[str]:
    """Drop the chatter of clients knocking at a server that does not serve (HA tests
    retry every few ms), which would push everything else out of the tail."""
    refused = {m.group(1) for line in lines if (m := _REFUSED.search(line))}
    if not refused:
        return lines
    kept = [line for line in lines
            if not ((m := _CONNECTION.search(line)) and m.group(1) in refused)]
    return [*kept, f"({len(refused)} connections refused by a server not serving: not shown)"]


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start servers with `server_factory(*flags, config_text=..., anonymous=...)`.

    Every server started is stopped (SIGTERM, then SIGKILL) when the test ends, and so is
    every later start of one (tests/support/servers.py's `restart`).
    """
    started: list[ServerProcess] = []

    def factory(*flags: str, **kwargs) -> ServerProcess:
        kwargs.setdefault("name", f"s{len(started)}")
        return start_server(tmp_path, *flags, on_start=started.append, **kwargs)

    yield factory
    for srv in started:
        srv.stop()


@pytest.fixture
def server(server_factory) -> ServerProcess:
    """One server with default settings, anonymous access allowed, and a user admin/secret."""
    return server_factory("--user", f"admin:{hashed('secret')}")


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """A CA and the server's and clients' certificates signed by it (tests/support/certs.py)."""
    return make_pki(tmp_path / "pki")


@pytest.fixture
def stomp_client() -> Iterator[Callable[..., Client]]:
    """`stomp_client(server, version="1.2", login=None, passcode=None, headers=None,
    heartbeats=(0, 0), connect=True)` -> a CONNECTED stomp.py Client (closed at teardown)."""
    made: list[Client] = []

    def factory(
        target: ServerProcess | tuple[str, int],
        version: str = "1.2",
        login: str | None = None,
        passcode: str | None = None,
        headers: dict[str, str] | None = None,
        heartbeats: tuple[int, int] = (0, 0),
        connect: bool = True,
    ) -> Client:
        address = target.address if isinstance(target, ServerProcess) else target
        client = Client(address, version=version, heartbeats=heartbeats)
        made.append(client)
        if connect:
            client.connect(login, passcode, headers=headers)
        return client

    yield factory
    for client in made:
        client.close()


@pytest.fixture
def pair_factory(tmp_path: Path) -> Iterator[Callable[..., Pair]]:
    """`pair_factory(**Pair options)` -> a Pair (not started); every one is closed at teardown."""
    made: list[Pair] = []

    def factory(**kwargs) -> Pair:
        pair = Pair(tmp_path / f"pair{len(made)}", **kwargs)
        made.append(pair)
        return pair

    yield factory
    for pair in made:
        pair.close()


@pytest.fixture
def pair(pair_factory) -> Pair:
    """A fresh pair (tests/ha/pair.py), started and formed: primary ACTIVE, backup PASSIVE."""
    p = pair_factory()
    p.start(parallel=True)
    p.wait_formed()
    return p


@pytest.fixture
def etcd_cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    """A started 3-member etcd cluster on loopback (tests/support/etcd.py), every member
    killed at teardown. Skipped where Debian's etcd-server is missing, except in CI: `make
    test` installs it there (`make test-deps`), so a missing etcd fails loudly."""
    require_etcd()
    cluster = EtcdCluster(tmp_path / "etcd")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def etcd_cluster_unstarted(tmp_path: Path) -> Iterator[EtcdCluster]:
    """As `etcd_cluster`, its addresses known but no member started yet (the test starts it:
    a server that finds etcd unreachable at its start)."""
    require_etcd()
    cluster = EtcdCluster(tmp_path / "etcd")
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A started PostgreSQL cluster on loopback (tests/support/postgres.py), one per test
    session (per pytest-xdist worker), stopped and removed at its end. Tests share it: one
    that stops, restarts or kills it leaves it running again (`start()`); `postgres_db`
    gives each its own database. Skipped where PostgreSQL is missing, except in CI: `make
    test` installs it there (`make test-deps`), so a missing one fails loudly."""
    require_postgres()
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def postgres_db(postgres_server: PostgresServer, request: pytest.FixtureRequest
                ) -> Iterator[str]:
    """The URL of a new, empty database on `postgres_server`, named after the test;
    dropped at teardown (its connections closed). The server is started again first if an
    earlier test left it stopped."""
    postgres_server.start()
    name = database_name(request.node.name, uuid.uuid4().hex[:8])
    url = postgres_server.create_database(name)
    yield url
    postgres_server.start()
    postgres_server.drop_database(name)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    """Chromium driving the console (tests/support/browser.py); skipped where it is
    missing, except in CI: `make test` installs it there, so it fails loudly."""
    reason = missing()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    b = Browser(tmp_path)
    yield b
    b.close()
