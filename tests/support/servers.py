"""One real server for a whole test module, for tests that need no fresh one (each names its
own destinations): starting a server per test costs about a second, which a module of
small tests pays many times over."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.serverproc import ServerProcess, start_server


def shared_server(name: str, *flags: str) -> Callable[..., Any]:
    """A module-scoped fixture starting one server (anonymous access allowed) with these
    flags, stopped after the module; assign it to `server` in a test module to override
    the per-test one of tests/conftest.py."""

    @pytest.fixture(scope="module")
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
        srv = start_server(tmp_path_factory.mktemp(name), *flags, name=name)
        yield srv
        srv.stop()

    return fixture
