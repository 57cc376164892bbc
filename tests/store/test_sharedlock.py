"""The shared store's lock file with real locks: another process, a removed file, a new holder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pairmq.store.sharedlock import SharedLock, verify

HOLD = """
import sys, time
from pathlib import Path
from pairmq.store.sharedlock import SharedLock
lock = SharedLock(Path(sys.argv[1]), "other")
print(lock.try_acquire(), flush=True)
time.sleep(30)
"""


def test_a_lock_held_by_another_process_is_busy_and_names_it(tmp_path: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "True"
        lock = SharedLock(tmp_path, "me")
        assert not lock.try_acquire()
        assert lock.holder().startswith(f"other (pid {other.pid}")
    finally:
        other.kill()
        other.wait()
    assert lock.try_acquire()  # a dead holder's lock is free (the kernel dropped it)
    lock.release()


def test_verification_proves_only_the_file_and_record_it_locked(tmp_path: Path) -> None:
    lock = SharedLock(tmp_path, "me")
    assert lock.try_acquire()
    seen = lock.observe()
    assert seen is not None and verify(seen, lock.token, 10.0, 1.0).valid(10.9)
    assert not verify(seen, lock.token, 10.0, 1.0).valid(11.0)

    lock.path.unlink()
    seen = lock.observe()
    assert seen is not None
    assert verify(seen, lock.token, 0.0, 1.0).reason == "the lock file was removed"

    newcomer = SharedLock(tmp_path, "new")
    assert newcomer.try_acquire()  # a new file at the path: nobody holds it
    seen = lock.observe()
    assert seen is not None
    assert verify(seen, lock.token, 0.0, 1.0).reason == \
        "the lock file was replaced by another file"
    lock.release()
    newcomer.release()


def test_a_record_overwritten_by_another_holder_fails_verification(tmp_path: Path) -> None:
    lock = SharedLock(tmp_path, "me")
    assert lock.try_acquire()
    # What a holder granted the same file after the lock was lost (NFS lease expiry) writes.
    with open(lock.path, "r+b") as f:
        f.write(b'{"token": "someone-else"}'.ljust(512))
    # (opening and closing the file in this process dropped our POSIX lock, as on NFS)
    seen = lock.observe()
    assert seen is not None
    assert verify(seen, lock.token, 0.0, 1.0).reason == \
        "another server wrote its holder record into the lock file"
    lock.release()
