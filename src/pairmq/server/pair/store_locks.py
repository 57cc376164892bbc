"""The lock a shared-store pair's servers take before writing their one journal, as the
shared-store driver (server/pair/shared_store.py) uses it: a file lock on the shared
directory, or the fenced lease in the database ([store] url).

Each answers in the terms of ha/shared_store.py: an acquisition that is granted gives a
proof, and says from when the journal may be written (`ready_at`); a verification renews
the proof or ends it with a reason.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pairmq.store.sharedlock import NO_PROOF, Proof, SharedLock, fresh_proof, verify, wait_out


@dataclass(frozen=True)
class Acquired:
    proof: Proof
    ready_at: float  # monotonic: no proof of the previous holder runs past this


@dataclass(frozen=True)
class Refused:
    holder: str  # who holds it, or why it could not be tried
    retry_at: float | None = None  # monotonic: when the holder's hold ends unless renewed


class StoreLock(Protocol):
    async def try_acquire(self) -> Acquired | Refused: ...

    async def verify(self) -> Proof: ...

    async def release(self) -> None: ...

    def status(self) -> dict[str, Any]: ...


class FileStoreLock:
    """The lock file of a shared directory (store/sharedlock.py); its calls run in
    executor threads (on NFS they can block)."""

    def __init__(self, shared_dir: Path, name: str, validity: float) -> None:
        self.shared_dir = shared_dir
        self.lock = SharedLock(shared_dir, name)
        self.validity = validity

    async def try_acquire(self) -> Acquired | Refused:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            acquired = await loop.run_in_executor(None, self.lock.try_acquire)
        except OSError as e:
            return Refused(f"nobody known (cannot open the lock file: {e})")
        if acquired:
            # the previous holder's proofs started before our record was written (now)
            return Acquired(fresh_proof(started, self.validity),
                            wait_out(time.monotonic(), self.validity))
        return Refused(await loop.run_in_executor(None, self.lock.holder))

    async def verify(self) -> Proof:
        started = time.monotonic()
        try:
            seen = await asyncio.get_running_loop().run_in_executor(None, self.lock.observe)
        except OSError as e:
            return Proof(0.0, f"cannot read the lock file: {e}")
        return NO_PROOF if seen is None else verify(seen, self.lock.token, started,
                                                    self.validity)

    async def release(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.lock.release)

    def status(self) -> dict[str, Any]:
        return {"dir": str(self.shared_dir), "lock_held": self.lock.held}
