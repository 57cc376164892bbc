"""A small real file system for a server's data directory (a tmpfs), to fill up on purpose.

Mounting needs root or CAP_SYS_ADMIN: where it is not permitted the test is skipped,
saying why. The mount is always undone, lazily if something still holds it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30)


@contextmanager
def small_disk(mountpoint: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of `size` (e.g. "4m") at mountpoint for the duration of the block."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    try:
        mounted = _run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mountpoint))
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"cannot mount a small file system here: {e}")
    if mounted.returncode != 0:
        pytest.skip(f"mounting a {size} tmpfs is not permitted here (needs root or "
                    f"CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        if _run("umount", str(mountpoint)).returncode != 0:
            _run("umount", "-l", str(mountpoint))
