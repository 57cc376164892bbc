"""A process that journals traffic through a real Store (its writer thread, segments of
4 KiB: a summary every few records) until it is killed, for tests that kill it with
SIGKILL (tests/store/test_summary_crashes.py, test_summary_prefix.py): `python -m
tests.support.summary_writer DIRECTORY FIRST PARTIAL SEGMENT [COUNT MOMENT [KIND]]`.

It recovers the journal in DIRECTORY (through its summaries, as a start does), then runs
`mixed_traffic` from round FIRST on, in segments of SEGMENT bytes with a prefix summary
every PARTIAL bytes (0: none; store/summary_builder.py), and prints, for each summary its
writer thread writes, `summary N half KIND` once half of it is in its `.tmp` file,
`summary N whole KIND` once all of it is, `summary N renamed KIND` once it has its name
(KIND: `sealed`, or `prefix` for a prefix summary of the segment being written). With
COUNT and MOMENT (half, whole or renamed) the writer thread stops for good at that moment
of the COUNT-th summary (of that KIND, if given): a kill then lands exactly there.
`killed` (below) runs it and kills it.
"""

from __future__ import annotations

import asyncio
import os
import random
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

MOMENTS = ("half", "whole", "renamed")
SEGMENT_BYTES = 4096


def main(argv: list[str]) -> int:
    from pairmq.store import writer
    from pairmq.store.summary import summary_path
    from pairmq.store.summary_builder import PendingSummary
    from tests.support.summaries import begin_mixed, mixed_traffic, open_store

    directory, first, partial, segment = Path(argv[0]), int(argv[1]), int(argv[2]), \
        int(argv[3])
    stop_at = (int(argv[4]), argv[5]) if len(argv) > 4 else None
    stop_kind = argv[6] if len(argv) > 6 else None
    written = 0  # summaries of `stop_kind` (any, without) begun

    def write_summary_file(directory: Path, segment_id: int,
                           summary: PendingSummary) -> None:
        """As the writer's own, in steps that say where they are (and may stop there)."""
        nonlocal written
        kind = "sealed" if summary.sealed else "prefix"
        written += stop_kind in (None, kind)
        data = summary.data()
        path = summary_path(directory, segment_id)
        temporary = path.with_name(path.name + ".tmp")
        with open(temporary, "wb") as f:
            f.write(data[:len(data) // 2])
            f.flush()
            said(segment_id, "half", kind)
            f.write(data[len(data) // 2:])
        said(segment_id, "whole", kind)
        os.replace(temporary, path)
        said(segment_id, "renamed", kind)

    def said(segment_id: int, moment: str, kind: str) -> None:
        print(f"summary {segment_id} {moment} {kind}", flush=True)
        if stop_at == (written, moment) and stop_kind in (None, kind):
            time.sleep(3600)  # until killed

    writer.write_summary_file = write_summary_file  # type: ignore[assignment]

    async def go() -> None:
        broker, store = await open_store(directory, segment_bytes=segment,
                                         partial_summary_bytes=partial,
                                         summary_records_per_item=1)
        begin_mixed(broker, store)
        print("ready", flush=True)
        round_ = first
        while True:
            await mixed_traffic(broker, store, 5, round_)
            round_ += 5

    asyncio.run(go())
    return 0


def killed(directory: Path, first: int, count: int, moment: str | None,
           timeout: float = 30.0, partial: int = 0, segment: int = SEGMENT_BYTES,
           kind: str | None = None) -> int:
    """Run the writer on `directory` and kill it with SIGKILL at `moment` of the
    `count`-th summary it writes (stopped there), or with `moment` None a few
    milliseconds after that summary got its name, while it goes on (wherever that lands).
    With `kind` (prefix or sealed) only the summaries of that kind count. Returns the
    segment id of that summary."""
    args = [str(directory), str(first), str(partial), str(segment)] \
        + ([str(count), moment] if moment else []) + ([kind] if moment and kind else [])
    with tempfile.TemporaryFile() as errors:  # (a pipe nobody reads could fill up)
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.summary_writer", *args],
            stdout=subprocess.PIPE, stderr=errors, cwd=Path(__file__).parents[2])
        try:
            seen = 0
            for line in _lines(process, errors, time.monotonic() + timeout):
                words = line.split()
                if words[:1] != ["summary"] or words[2] != (moment or "renamed") \
                        or kind not in (None, words[3]):
                    continue
                seen += 1
                if seen == count:
                    if moment is None:
                        time.sleep(random.uniform(0, 0.02))
                    process.send_signal(signal.SIGKILL)
                    process.wait(10)
                    assert process.returncode == -signal.SIGKILL, process.returncode
                    return int(words[1])
            raise AssertionError("the writer ended before it was killed")
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(10)
            assert process.stdout is not None
            process.stdout.close()


def _lines(process: subprocess.Popen[bytes], errors: IO[bytes], deadline: float
           ) -> Iterator[str]:
    """The lines the process prints, until `deadline` (then TimeoutError)."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    pending = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise TimeoutError("the summary writer said nothing in time")
            chunk = os.read(fd, 65536)
            if not chunk:
                errors.seek(0)
                raise AssertionError(f"the summary writer ended: "
                                     f"{errors.read().decode(errors='replace')}")
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.decode()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
