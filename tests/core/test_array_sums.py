"""core/array_sums.py: the same sums whichever way they are taken (Python's `sum` until a
start has summed enough, NumPy after, Python for good when NumPy cannot be imported), and
a recovered paged log's totals the same either way."""

from __future__ import annotations

from array import array
from functools import partial

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pairmq.core import array_sums
from pairmq.core.array_sums import PYTHON_LIMIT, _Summer
from pairmq.core.paged_log import PagedLog

U32 = st.integers(min_value=0, max_value=2**32 - 1)


def sums_with_numpy(summer: _Summer) -> bool:
    return isinstance(summer.way, partial)


@given(st.lists(U32, max_size=5000), st.sampled_from("IL"))
def test_numpy_sums_as_python_does(values: list[int], typecode: str) -> None:
    pytest.importorskip("numpy")
    summer = _Summer()
    summer.python_left = 0  # the next sum reaches the limit: NumPy from the one after
    numbers = array(typecode, values)
    assert summer.total(numbers) == sum(values)
    assert sums_with_numpy(summer)
    assert summer.total(numbers) == sum(values)


def test_numpy_is_imported_only_past_the_limit() -> None:
    pytest.importorskip("numpy")
    summer = _Summer()
    chunk = array("I", [1023] * 4096)
    summed = 0
    while summed + len(chunk) <= PYTHON_LIMIT:
        assert summer.total(chunk) == 1023 * 4096
        summed += len(chunk)
    assert not sums_with_numpy(summer)  # a start of a million waiting never pays its import
    assert summer.total(chunk) == 1023 * 4096
    assert sums_with_numpy(summer)


def test_without_numpy_sums_stay_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(name: str) -> None:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(array_sums.importlib, "import_module", refuse)
    summer = _Summer()
    summer.python_left = 0
    values = array("I", [2**32 - 1, 5, 7])
    assert summer.total(values) == 2**32 + 11
    assert summer.way is sum  # not tried again
    assert summer.total(values) == 2**32 + 11


def test_a_recovered_log_has_the_same_totals_either_way(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """PagedLog.extend with NumPy summing and with Python summing: the same held bytes and
    the same per-chunk totals, which the start's accounting uses (store/pages.py)."""
    pytest.importorskip("numpy")
    count = 3 * 4096 + 17
    offsets = array("I", range(0, count * 1100, 1100))
    lengths = array("I", (1000 + i % 97 for i in range(count)))
    orders = array("Q", range(1, count + 1))
    sizes = array("I", (900 + i % 89 for i in range(count)))

    def extended(summer: _Summer) -> tuple[int, list[tuple[int, int, int]]]:
        monkeypatch.setattr(array_sums, "_SUMMER", summer)
        log = PagedLog()
        log.extend(7, array("I", [0]), array("I", [5]), array("Q", [0]), array("I", [3]))
        held = log.extend(7, offsets, lengths, orders, sizes)
        totals = [(len(chunk), chunk.length_total, chunk.size_total)
                  for _, chunk, _ in log.chunks_from(0)]
        return held, totals

    in_python = _Summer()
    in_python.way = sum  # never NumPy
    with_numpy = _Summer()
    with_numpy.python_left = 0
    assert extended(in_python) == extended(with_numpy)
    assert sums_with_numpy(with_numpy)
    held, totals = extended(in_python)
    assert held == sum(sizes)
    assert sum(t[2] for t in totals) == sum(sizes) + 3
    assert sum(t[1] for t in totals) == sum(lengths) + 5
