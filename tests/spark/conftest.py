"""The Spark tests' fixtures: one local SparkSession for the whole run (a cold one takes
6-12 s here), real servers and pairs come from tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.support.spark import spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator:
    try:
        session = spark_session()
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    yield session
    session.stop()
