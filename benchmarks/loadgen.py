"""What every benchmark orchestrator shares: its generator processes and its CPU counters.

Load generators run one per process (multiprocessing, fork) and report on one events
queue: ("ready", role, index, None) once connected (and subscribed), then
("done", role, index, result) at the end, with result["error"] set if they failed.
"""

from __future__ import annotations

import math
import os
import queue
import resource
import time
from pathlib import Path
from typing import Any

import psutil


class GeneratorPool:
    """Starts generator processes, waits for them to be ready, and collects their reports."""

    def __init__(self, ctx: Any, events: Any, errors: list[str]) -> None:
        self.ctx = ctx
        self.events = events
        self.errors = errors  # generator errors are appended here, as they arrive
        self.procs: dict[tuple[str, int], Any] = {}
        self.ready: set[tuple[str, int]] = set()
        self.results: dict[tuple[str, int], dict[str, Any]] = {}

    def launch(self, role: str, index: int, target: Any, args: tuple) -> None:
        p = self.ctx.Process(target=target, args=args, name=f"{role}-{index}")
        p.start()
        self.procs[(role, index)] = p

    def take(self, timeout: float) -> None:
        """Handle at most one event, waiting up to `timeout` seconds for it."""
        try:
            kind, role, index, payload = self.events.get(timeout=timeout)
        except queue.Empty:
            return
        if kind == "ready":
            self.ready.add((role, index))
        else:
            self.results[(role, index)] = payload
            if payload.get("error"):
                self.errors.append(payload["error"])

    def wait_ready(self, role: str, count: int, timeout: float) -> bool:
        keys = [(role, i) for i in range(count)]
        until = time.monotonic() + timeout
        while not all(k in self.ready for k in keys):
            if self.errors:
                return False
            if time.monotonic() > until:
                missing = ", ".join(f"{r} {i}" for r, i in keys if (r, i) not in self.ready)
                self.errors.append(f"not ready within {timeout:.0f}s: {missing}")
                return False
            self.take(0.05)
        return True

    def role_results(self, role: str) -> list[dict[str, Any]]:
        return [r for (r_role, _), r in self.results.items() if r_role == role]

    def collect(self, timeout: float) -> None:
        """Wait for every process's report, then join them all; a silent one is an error."""
        until = time.monotonic() + timeout
        while len(self.results) < len(self.procs) and time.monotonic() < until:
            self.take(0.05)
        for key, p in self.procs.items():
            p.join(max(0.1, until - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(5)
            if key not in self.results:
                self.errors.append(f"{key[0]} {key[1]} did not report")


def split(total: int, parts: int) -> list[int]:
    """`total` shared out as evenly as whole numbers allow."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def cpu_seconds() -> float:
    """User+system CPU seconds of this process (all its threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run_time_seconds(pid: int) -> float | None:
    """CPU seconds the live threads of a process have run, to the microsecond: the
    scheduler's `se.sum_exec_runtime` in /proc/PID/task/*/sched, where user and system time
    come in 10 ms ticks (over 20,000 messages a tick is 0.5 µs a message). A thread that
    ended is not counted: a server's event loop and journal writer live as long as it does.
    None on a kernel without those files (CONFIG_SCHED_DEBUG)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0.0
    for tid in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/sched").read_text()
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("se.sum_exec_runtime"):
                total += float(line.rsplit(":", 1)[1]) / 1000.0  # in ms there
                break
        else:
            return None
    return total


def process_cpu(proc: psutil.Process | None) -> float | None:
    """User+system CPU seconds of a server and any processes it spawned."""
    if proc is None:
        return None
    try:
        total = 0.0
        for p in [proc, *proc.children(recursive=True)]:
            t = p.cpu_times()
            total += t.user + t.system
        return total
    except psutil.Error:
        return None


def thread_cpu(proc: psutil.Process | None) -> dict[int, float]:
    """CPU seconds per thread of a server (thread id -> user+system)."""
    if proc is None:
        return {}
    try:
        return {t.id: t.user_time + t.system_time for t in proc.threads()}
    except psutil.Error:
        return {}


def host_busy_cpu() -> float:
    """CPU seconds the whole machine spent busy (all cores, kernel work included)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def nearest_rank(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of unsorted values, in their own unit."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def percentile_ms(ordered_ns: list[int], q: float) -> float | None:
    """Nearest-rank percentile, in ms, of already sorted nanosecond values."""
    if not ordered_ns:
        return None
    return round(ordered_ns[max(0, math.ceil(q * len(ordered_ns)) - 1)] / 1e6, 3)
