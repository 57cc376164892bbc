"""A progress bar for a benchmark's long phases: on stderr and only on a terminal, so the
figures a benchmark prints on stdout stay clean for scripts and files."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


@contextmanager
def progress_bar(what: str, total: int) -> Iterator[Callable[[int], None]]:
    """Yields `advance_to(done)`."""
    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True,
                  disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task(what, total=total)
        yield lambda done: bar.update(task, completed=done)
