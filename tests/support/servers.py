"""Real servers over a test's life: one for a whole test module (`shared_server`), and the
same server brought down and started again (`restart`)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.serverproc import ServerProcess, start_server


def shared_server(name: str, *flags: str) -> Callable[..., Any]:
    """A module-scoped fixture starting one server (anonymous access allowed) with these
    flags, stopped after the module; assign it to `server` in a test module to override
    the per-test one of tests/conftest.py. Starting a server per test costs about a second,
    which a module of small tests (each naming its own destinations) pays many times over."""

    @pytest.fixture(scope="module")
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
        srv = start_server(tmp_path_factory.mktemp(name), *flags, name=name)
        yield srv
        srv.stop()

    return fixture


def restart(server: ServerProcess, *flags: str, crash: bool = True, **options: Any
            ) -> ServerProcess:
    """Bring `server` down, then start it again on the same data directory, name and port
    with `flags` (and start_server's `options`, such as config_text): only these, not the
    flags it had.

    `crash`: SIGKILL, nothing flushed (a server killed before is left as it is); else
    SIGTERM, which must end it cleanly. Either way the way it ended is checked: a server
    that had died on its own fails the test here."""
    if crash:
        server.kill()
        assert server.proc.returncode == -signal.SIGKILL, \
            f"{server.name} ended with {server.proc.returncode}, not by SIGKILL"
    else:
        code = server.stop()
        assert code == 0, f"clean stop exited {code}: {server.logs()}"
        assert "stopped" in server.logs()
    return server.start_again(*flags, **options)
