"""A server run in this process (`pairmq server`): logging, the interpreter's GIL and
garbage-collector settings, the event loop, until a stop signal; a start refused is said in
one line and exits 3."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys

from pairmq.server.app import PairmqServer, StartupError
from pairmq.server.config import ServerConfig
from pairmq.server.process import build_kind, setup_logging, until_stop_signal
from pairmq.server.tls import TlsError
from pairmq.store.gcpause import (
    collect_oldest_in_steps,
    collect_young_less_often,
    freeze_the_start,
)
from pairmq.store.reading import JournalCorrupt

log = logging.getLogger("pairmq.server")

# The journal thread needs the GIL back after each write and fdatasync; from a busy event
# loop that takes up to this long (Python's default is 5 ms, which would add milliseconds
# to every receipt). Only a thread waiting for the GIL shortens the loop's turn.
GIL_SWITCH_S = 0.0002


async def serve(config: ServerConfig) -> None:
    server = PairmqServer(config)
    await server.start()

    def reload() -> None:
        with contextlib.suppress(TlsError):  # logged; the running certificates stay
            server.reload_tls()

    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)
    await until_stop_signal(server.finished)
    await server.stop()


def run(config: ServerConfig) -> None:
    """Run a server in this process until SIGTERM or SIGINT."""
    setup_logging(config.log_level)
    sys.setswitchinterval(GIL_SWITCH_S)
    collect_young_less_often()
    collect_oldest_in_steps()
    log.info("Starting pairmq server %s (pid %d, config %s, %s)", config.name, os.getpid(),
             config.source, build_kind())
    try:
        import uvloop
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    freeze_the_start()
    try:
        runner(serve(config))
    except (StartupError, JournalCorrupt) as e:
        log.error("Cannot start: %s", e)
        sys.exit(3)
    except OSError as e:  # a file or directory it needs (the journal's, a certificate's)
        where = f" ({e.filename})" if e.filename else ""
        log.error("Cannot start: %s%s", e.strerror or e, where)
        sys.exit(3)
