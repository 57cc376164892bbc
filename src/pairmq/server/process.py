"""What every pairmq process (server, witness) does around its work: one log format, and
running until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import signal


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


async def until_stop_signal(stop: asyncio.Event | None = None) -> None:
    """Return once SIGTERM or SIGINT arrives, or `stop` is set (the caller then stops
    cleanly)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def build_kind() -> str:
    """Which build this process runs: the compiled build (`make compiled`) has the
    per-message path as extension modules beside, and ahead of, the sources
    (docs/operations.md, "The compiled build"). Found without importing it."""
    spec = importlib.util.find_spec("pairmq.core.broker.broker")
    origin = spec.origin if spec is not None else None
    compiled = origin is not None and origin.endswith(".so")
    return "the per-message path compiled by mypyc" if compiled else "pure Python"
