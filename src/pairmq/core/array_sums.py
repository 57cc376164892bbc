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
from types import ModuleType

PYTHON_LIMIT = 2_000_000  # elements summed in Python before NumPy is worth importing


class _Summer:
    """Which way sums go now: a value that changes once (Python, then NumPy or Python for
    good), not a set of flags."""

    __slots__ = ("numpy", "python_left")

    def __init__(self) -> None:
        self.python_left = PYTHON_LIMIT  # elements until NumPy is tried; -1: tried
        self.numpy: ModuleType | None = None

    def total(self, values: array[int]) -> int:
        numpy = self.numpy
        if numpy is not None:
            return int(numpy.frombuffer(values, dtype=f"u{values.itemsize}").sum(
                dtype="u8"))
        if self.python_left >= 0:
            self.python_left -= len(values)
            if self.python_left <= 0:
                self.numpy = _import_numpy()
                self.python_left = -1
        return sum(values)


def _import_numpy() -> ModuleType | None:
    try:
        return importlib.import_module("numpy")
    except Exception:  # not installed, or broken: the sums stay in Python
        return None


_SUMMER = _Summer()


def total(values: array[int]) -> int:
    """sum(values), for an array of unsigned integers whose sum is below 2**64."""
    return _SUMMER.total(values)
