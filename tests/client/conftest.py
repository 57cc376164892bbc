"""Fixtures of the client suite: pairmq clients that are closed at teardown."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import pairmq.client
from pairmq.client import Client
from tests.netproxy import NetProxy
from tests.serverproc import ServerProcess


@pytest.fixture
def client_factory() -> Iterator[Callable[..., Client]]:
    """`client_factory(url, **options)` -> a connected pairmq client (closed at teardown).

    Tests retry fast: retryInterval 50 ms (up to 500 ms) unless they say otherwise."""
    made: list[Client] = []

    def factory(url: str | list[str], **options: Any) -> Client:
        options.setdefault("retry_interval", 50)
        options.setdefault("max_retry_interval", 500)
        client = pairmq.client.connect(url, **options)
        made.append(client)
        return client

    yield factory
    for client in made:
        client.close(timeout=1.0)


@pytest.fixture
def proxy(server: ServerProcess) -> Iterator[NetProxy]:
    """A TCP proxy to `server` that can lose answers and drop connections
    (tests/netproxy.py)."""
    with NetProxy(f"{server.host}:{server.port}") as p:
        yield p
