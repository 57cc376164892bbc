"""What the tests of `pairmq up` share: its fixed loopback ports, held by one test at a
time across pytest-xdist workers (a lock file), and whether a port is in use."""

from __future__ import annotations

import fcntl
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK = Path(tempfile.gettempdir()) / "pairmq-up-ports.lock"


def in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def up_ports() -> Iterator[None]:
    """For the block, no other test of this machine runs `pairmq up` (they wait)."""
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
