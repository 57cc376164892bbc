"""Which build the tests run: the pure-Python sources, or the compiled build (`make
compiled`, then PYTHONPATH=build/compiled), whose per-message modules are extension
modules that mypyc made from the same sources."""

from __future__ import annotations

from pathlib import Path

import pytest

import pairmq.core.broker.broker

COMPILED = Path(pairmq.core.broker.broker.__file__ or "").suffix == ".so"

# Tests of the sources themselves (they parse a class's source, or count the attributes
# CPython's shared-key tables hold): the compiled build's classes have no source, and
# mypyc's native classes keep their attributes in fixed fields. The pure-Python run of the
# suite checks them; the sources are the same.
reads_the_sources = pytest.mark.skipif(
    COMPILED, reason="checks the Python sources; the compiled build's classes have none")
