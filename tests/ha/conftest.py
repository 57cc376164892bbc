"""Fixtures of the HA suite: a pair of real server processes and a witness."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.ha.pair import Pair


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
    """A fresh pair, started and formed: primary ACTIVE, backup PASSIVE."""
    p = pair_factory()
    p.start(parallel=True)
    p.wait_formed()
    return p
