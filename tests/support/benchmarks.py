"""The benchmarks' campaigns (benchmarks/*.py, standalone commands, not a package) imported
by the tests that run them short."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def benchmark(name: str) -> ModuleType:
    """benchmarks/NAME.py as a module, imported once (as `pairmq_NAME`)."""
    module_name = f"pairmq_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # before running it: its dataclasses look it up
    spec.loader.exec_module(module)
    return module
