"""The journal's one writing thread: a job in, its outcome back on the event loop.

A one-thread ThreadPoolExecutor did this through `run_in_executor`: for every group a
concurrent Future, an asyncio Future chained to it and their callbacks, all of it
interpreted Python, 2% of the event loop's time on the compiled build at 40,000 durable
messages/s (docs/benchmarks.md). A thread that takes jobs from a SimpleQueue and answers
with `call_soon_threadsafe` does the same with two C calls.

The thread is a daemon: an exit that does not wait for the group in flight loses nothing
confirmed, since nothing in it was confirmed yet (`shutdown` does wait, for the store's
orderly close).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Final

Done = Callable[[BaseException | None], None]
_STOP: Final = None  # the job that ends the thread


class WriterThread:
    """Runs one job at a time, in order; `done(error)` is called on the loop after each."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._loop = loop
        self._name = name
        self._jobs: SimpleQueue[tuple[Callable[[], None], Done] | None] = SimpleQueue()
        self._worker: threading.Thread | None = None  # started by the first job

    def submit(self, job: Callable[[], None], done: Done) -> None:
        if self._worker is None:
            self._worker = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._worker.start()
        self._jobs.put((job, done))

    def shutdown(self) -> None:
        """Let the job in flight (and any queued) finish, then end the thread."""
        thread = self._worker
        if thread is None:
            return
        self._jobs.put(_STOP)
        if thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        jobs = self._jobs
        while True:
            item = jobs.get()
            if item is None:
                return
            self._one(item[0], item[1])
            item = None  # hold nothing of the group while waiting for the next

    def _one(self, job: Callable[[], None], done: Done) -> None:
        error: BaseException | None = None
        try:
            job()
        except BaseException as exc:  # handed to the loop, as a future would hold it
            error = exc
        try:
            self._loop.call_soon_threadsafe(done, error)
        except RuntimeError:  # the loop is closed: nobody is waiting for the outcome
            pass
