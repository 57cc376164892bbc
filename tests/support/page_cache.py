"""The kernel's page cache for a file: drop a file from it, and see how much of a byte range
it holds (mincore(2) on a mapping of the file, through ctypes)."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_MAP_FAILED = ctypes.c_void_p(-1).value


def drop(path: Path) -> None:
    """Out of the page cache (its pages are clean: written and synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident(path: Path, offset: int, length: int) -> float:
    """The share of the pages of bytes offset..offset+length of `path` in the page cache."""
    size = path.stat().st_size
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address == _MAP_FAILED:
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            start = offset // page * page
            pages = (min(offset + length, size) - start + page - 1) // page
            vector = (ctypes.c_ubyte * pages)()
            if _libc.mincore(address + start, pages * page, vector) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            return sum(v & 1 for v in vector) / pages
        finally:
            _libc.munmap(address, size)
    finally:
        os.close(fd)
