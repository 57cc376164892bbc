"""A backup hosted by a colocated member (server/cluster/hosting.py), as its child process
(the member starts it; nobody types it):
`python -m pairmq.cli.hosted_backup SPEC PARENT`, SPEC being the configuration the
member derived from its own (server/cluster/colocated.py) and wrote in the backup's data
directory, PARENT the member's process id. It runs as any server does, stops on SIGTERM,
and is killed by the kernel when the member's process dies (PR_SET_PDEATHSIG): it is set
here, after exec, rather than between fork and exec, where a server's threads make any
Python code unsafe.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
from pathlib import Path

from pairmq.server.config import ServerConfig
from pairmq.server.run import run

PR_SET_PDEATHSIG = 1


def die_with(parent: int) -> None:
    """The kernel kills this process when its parent dies; if the parent died already
    (before this line), it ends now."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        sys.exit(f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}")
    if os.getppid() != parent:
        sys.exit(f"member process {parent} is gone: not starting its hosted backup")


def main(argv: list[str]) -> None:
    if len(argv) != 2 or not argv[1].isdigit():
        sys.exit("usage: python -m pairmq.cli.hosted_backup SPEC PARENT_PID")
    die_with(int(argv[1]))
    config = pickle.loads(Path(argv[0]).read_bytes())
    if not isinstance(config, ServerConfig):
        sys.exit(f"{argv[0]}: not a hosted backup's configuration")
    run(config)


if __name__ == "__main__":
    main(sys.argv[1:])
