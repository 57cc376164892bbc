"""The example pipeline (examples/pipeline, `make pipeline`) runs end to end and its output
is exact: a small run, in its own process, as a user starts it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tests.support.cli import run

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.long  # CI time: its sink and source are tested in make test
@pytest.mark.machine  # its own Spark (a JVM) beside the servers
def test_the_example_pipeline_computes_every_window_and_alert_exactly(tmp_path: Path):
    done = run(sys.executable, "-m", "examples.pipeline.run", "--orders", "2000", "--minutes",
               "3", "--workdir", str(tmp_path), cwd=ROOT, timeout=300)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0 and last.endswith(": OK"), \
        f"exit {done.returncode}: {last}\n{done.stderr[-3000:]}"
