"""Fixtures shared by every test: real server processes on free loopback ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.serverproc import ServerProcess, start_server


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start servers with `server_factory(*flags, config_text=..., anonymous=...)`.

    Every server started is stopped (SIGTERM, then SIGKILL) when the test ends.
    """
    started: list[ServerProcess] = []

    def factory(*flags: str, **kwargs) -> ServerProcess:
        kwargs.setdefault("name", f"s{len(started)}")
        srv = start_server(tmp_path, *flags, **kwargs)
        started.append(srv)
        return srv

    yield factory
    for srv in started:
        srv.stop()


@pytest.fixture
def server(server_factory) -> ServerProcess:
    """One server with default settings, anonymous access allowed, and a user admin/secret."""
    return server_factory("--user", "admin:secret")
