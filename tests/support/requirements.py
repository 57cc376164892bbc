"""Programs the tests need from Debian (`make test-deps` installs them): a test skips where
one is missing, except in CI, where a missing one is a broken setup and fails the test."""

from __future__ import annotations

import os


def require(missing: str | None) -> None:
    """`missing`: why the program cannot run here, or None when it can."""
    import pytest  # only tests call this; benchmarks use the fixtures without pytest

    if missing is None:
        return
    if os.environ.get("CI"):
        pytest.fail(missing)
    pytest.skip(missing)
