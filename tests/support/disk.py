"""Small real file systems for a server's data directory: a tmpfs to fill up on purpose,
and a loop-mounted ext4 to freeze (fsfreeze: writes and fdatasync block until thawed);
and a count of the journal's writing system calls, passed through to the real ones.

Mounting needs root or CAP_SYS_ADMIN: where it is not permitted the test is skipped,
saying why. The mount is always undone, lazily if something still holds it, and a frozen
file system is always thawed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pairmq.store.writer import RWF_DSYNC
from tests.support.cli import run


@contextmanager
def small_disk(mountpoint: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of `size` (e.g. "4m") at mountpoint for the duration of the block."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    try:
        mounted = run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mountpoint))
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"cannot mount a small file system here: {e}")
    if mounted.returncode != 0:
        pytest.skip(f"mounting a {size} tmpfs is not permitted here (needs root or "
                    f"CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        if run("umount", str(mountpoint)).returncode != 0:
            run("umount", "-l", str(mountpoint))


@contextmanager
def loop_filesystem(workdir: Path, mountpoint: Path, size_mb: int = 32) -> Iterator[Path]:
    """A fresh ext4 image of `size_mb` in workdir, loop-mounted at mountpoint for the block."""
    for tool in ("mkfs.ext4", "mount", "umount", "fsfreeze"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    image = workdir / "fs.img"
    workdir.mkdir(parents=True, exist_ok=True)
    mountpoint.mkdir(parents=True, exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(size_mb * 1024 * 1024)
    made = run("mkfs.ext4", "-q", "-F", str(image))
    if made.returncode != 0:
        pytest.skip(f"mkfs.ext4 failed: {made.stderr.strip()}")
    mounted = run("mount", "-o", "loop", str(image), str(mountpoint))
    if mounted.returncode != 0:
        pytest.skip("mounting a loop filesystem is not permitted here (needs root and loop "
                    f"devices): {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        thaw(mountpoint)  # never leave it frozen, whatever happened
        if run("umount", str(mountpoint)).returncode != 0:
            run("umount", "-l", str(mountpoint))


def freeze(mountpoint: Path) -> None:
    """fsfreeze -f: from now on writes to the file system block (skipped if refused)."""
    frozen = run("fsfreeze", "-f", str(mountpoint))
    if frozen.returncode != 0:
        pytest.skip(f"fsfreeze is not permitted here: {frozen.stderr.strip()}")


def thaw(mountpoint: Path) -> None:
    run("fsfreeze", "-u", str(mountpoint))


@contextmanager
def frozen(mountpoint: Path) -> Iterator[None]:
    """The file system frozen for the block, thawed after it whatever happens."""
    freeze(mountpoint)
    try:
        yield
    finally:
        thaw(mountpoint)


class DiskCalls:
    """The journal's writing system calls, counted as they pass through to the real ones."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fdatasyncs: list[int] = []
        self.writevs: list[int] = []  # buffers in each
        self.synced_writes: list[int] = []  # pwritev with RWF_DSYNC: buffers in each
        real_sync, real_writev, real_pwritev = os.fdatasync, os.writev, os.pwritev

        def fdatasync(fd):
            self.fdatasyncs.append(fd)
            return real_sync(fd)

        def writev(fd, buffers):
            self.writevs.append(len(buffers))
            return real_writev(fd, buffers)

        def pwritev(fd, buffers, offset, flags=0):
            if flags & RWF_DSYNC:
                self.synced_writes.append(len(buffers))
            return real_pwritev(fd, buffers, offset, flags)

        monkeypatch.setattr(os, "fdatasync", fdatasync)
        monkeypatch.setattr(os, "writev", writev)
        monkeypatch.setattr(os, "pwritev", pwritev)

    @property
    def syncs(self) -> int:
        return len(self.fdatasyncs) + len(self.synced_writes)
