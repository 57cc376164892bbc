"""Fixtures of the integration suite: stomp.py and raw clients that are closed at teardown."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration import rawstomp
from tests.serverproc import ServerProcess
from tests.support.disk import loop_filesystem


def _address(target: ServerProcess | tuple[str, int]) -> tuple[str, int]:
    return target.address if isinstance(target, ServerProcess) else target


@pytest.fixture
def raw_client() -> Iterator[Callable[..., Any]]:
    """`raw_client(server, **connect_kwargs)` -> (RawStomp, answer frame); closed at teardown."""
    made: list[rawstomp.RawStomp] = []

    def factory(
        target: ServerProcess | tuple[str, int], **kwargs: Any
    ) -> tuple[rawstomp.RawStomp, rawstomp.Frame]:
        kwargs.setdefault("expect", "CONNECTED")
        client, frame = rawstomp.connect(_address(target), **kwargs)
        made.append(client)
        return client, frame

    yield factory
    for client in made:
        client.close()


@pytest.fixture
def loop_mounted_data_dir(tmp_path: Path) -> Iterator[Path]:
    """A small ext4 filesystem (a loop-mounted image) as the data dir of a server named
    "frozen", to freeze with tests/support/disk.py; skipped where mounting is not
    permitted."""
    with loop_filesystem(tmp_path, tmp_path / "data-frozen") as mountpoint:
        yield mountpoint
