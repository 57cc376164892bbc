"""What the machine had left when a run began and ended: free space where the tests write
and memory available. A CI run shows only the tail of its output, and a run that fails by
the hundred (a full disk, the memory gone) is explained by these two figures alone."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

GIB = 1024 ** 3


def free_space(path: str | None = None) -> str:
    """Free space on the file system holding `path` (the temp directory by default)."""
    where = path or tempfile.gettempdir()
    usage = shutil.disk_usage(where)
    return f"{usage.free / GIB:.1f} GiB free of {usage.total / GIB:.1f} GiB on {where}"


def memory_available() -> str:
    """MemAvailable from /proc/meminfo, or a word saying it is unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return f"{int(line.split()[1]) / 1024 ** 2:.1f} GiB of memory available"
    except OSError:
        pass
    return "memory available unknown"


def summary(failed: list[str], shown: int = 10) -> str:
    """One paragraph for the end of a run: the machine's state and the first failures."""
    lines = [f"machine: {free_space()}; {memory_available()}"]
    if failed:
        lines.append(f"{len(failed)} failed, the first {min(shown, len(failed))}:")
        lines.extend(f"  {nodeid}" for nodeid in failed[:shown])
    return "\n".join(lines)
