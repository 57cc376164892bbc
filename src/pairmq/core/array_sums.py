"""The sum of an array of unsigned integers: in C through NumPy once a start has summed
enough to be worth its import, in Python otherwise.

A start appends ten million recovered entries to paged logs and sums their sizes and
lengths, chunk by chunk (core/paged_log.py `extend`). Python's `sum` makes an int of every
element: 0.5 s of a 1.4 s start with ten million waiting (docs/benchmarks.md). NumPy sums
the same 4,096-entry chunk in about a microsecond; importing it costs about 70 ms, so it is
imported only after PYTHON_LIMIT elements were summed in Python (a start of a million
waiting messages or fewer never imports it). NumPy is optional (`pairmq[fast]`): without
it, or if its import fails, sums stay in Python, with the same results.
"""

from __future__ import annotations

import importlib
from array import array
from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import Final

PYTHON_LIMIT: Final = 2_000_000  # elements summed in Python before NumPy is worth importing


class _Summer:
    """Sums in the way that holds now, `way`: Python counting what it sums (until
    PYTHON_LIMIT), then NumPy, or Python for good when NumPy cannot be imported."""

    __slots__ = ("python_left", "way")

    def __init__(self) -> None:
        self.python_left = PYTHON_LIMIT  # elements summed in Python before NumPy is tried
        self.way: Callable[[array[int]], int] = self._counting

    def total(self, values: array[int]) -> int:
        return self.way(values)

    def _counting(self, values: array[int]) -> int:
        self.python_left -= len(values)
        if self.python_left <= 0:
            numpy = _import_numpy()
            self.way = sum if numpy is None else partial(_numpy_total, numpy)
        return sum(values)


def _numpy_total(numpy: ModuleType, values: array[int]) -> int:
    return int(numpy.frombuffer(values, dtype=f"u{values.itemsize}").sum(dtype="u8"))


def _import_numpy() -> ModuleType | None:
    try:
        return importlib.import_module("numpy")
    except Exception:  # not installed, or broken: the sums stay in Python
        return None


_SUMMER = _Summer()


def total(values: array[int]) -> int:
    """sum(values), for an array of unsigned integers whose sum is below 2**64."""
    return _SUMMER.total(values)
