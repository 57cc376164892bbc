"""The Spark tests' fixtures: one local SparkSession for the whole run (a cold one takes
6-12 s here), real servers and pairs from the other suites' helpers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.ha.pair import Pair
from tests.support.spark import spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator:
    try:
        session = spark_session()
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    yield session
    session.stop()


@pytest.fixture
def pair_factory(tmp_path: Path) -> Iterator[Callable[..., Pair]]:
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
    p = pair_factory()
    p.start(parallel=True)
    p.wait_formed()
    return p

