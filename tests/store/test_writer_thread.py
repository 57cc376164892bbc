"""The journal's writing thread (store/writer_thread.py): jobs run in order, one at a time,
off the event loop; each outcome comes back on the loop; shutdown waits for what was
handed over."""

from __future__ import annotations

import asyncio
import threading
import time

from pairmq.store.writer_thread import WriterThread


def test_jobs_run_in_order_off_the_loop_and_their_outcomes_come_back_on_it() -> None:
    ran: list[tuple[int, str]] = []
    outcomes: list[tuple[int, BaseException | None, bool]] = []

    async def go() -> None:
        loop = asyncio.get_running_loop()
        worker = WriterThread(loop, "test-writer")
        done = asyncio.Event()

        def job(n: int) -> None:
            ran.append((n, threading.current_thread().name))
            if n == 2:
                raise OSError(28, "No space left on device")

        def outcome(n: int, error: BaseException | None) -> None:
            on_loop = threading.current_thread() is threading.main_thread()
            outcomes.append((n, error, on_loop))
            if n == 3:
                done.set()

        for n in (1, 2, 3):
            worker.submit(lambda n=n: job(n), lambda error, n=n: outcome(n, error))
        await asyncio.wait_for(done.wait(), 5)
        worker.shutdown()

    asyncio.run(go())
    assert ran == [(1, "test-writer"), (2, "test-writer"), (3, "test-writer")]
    assert [(n, on_loop) for n, _, on_loop in outcomes] == [(1, True), (2, True), (3, True)]
    assert outcomes[0][1] is None and outcomes[2][1] is None
    error = outcomes[1][1]
    assert isinstance(error, OSError) and error.errno == 28


def test_shutdown_waits_for_the_jobs_handed_over() -> None:
    finished: list[int] = []

    async def go() -> None:
        worker = WriterThread(asyncio.get_running_loop(), "test-writer")

        def slow(n: int) -> None:
            time.sleep(0.1)
            finished.append(n)

        for n in range(3):
            worker.submit(lambda n=n: slow(n), lambda error: None)
        worker.shutdown()  # as a store's orderly close does, from the loop or a thread
        assert finished == [0, 1, 2]

    asyncio.run(go())


def test_an_outcome_for_a_closed_loop_is_dropped_and_the_thread_goes_on() -> None:
    loop = asyncio.new_event_loop()
    worker = WriterThread(loop, "test-writer")
    loop.close()
    ran = threading.Event()
    worker.submit(lambda: None, lambda error: None)  # its outcome has nowhere to go
    worker.submit(ran.set, lambda error: None)
    assert ran.wait(5), "the thread stopped at the closed loop"
    worker.shutdown()


def test_shutdown_before_any_job_starts_no_thread() -> None:
    loop = asyncio.new_event_loop()
    try:
        before = threading.active_count()
        WriterThread(loop, "test-writer").shutdown()
        assert threading.active_count() == before
    finally:
        loop.close()
