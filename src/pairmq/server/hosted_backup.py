"""A backup hosted by a colocated member (server/cluster/hosting.py), as its child process:
`python -m pairmq.server.hosted_backup SPEC`, SPEC being the configuration the member
derived from its own (server/cluster/colocated.py) and wrote in the backup's data
directory. It runs as any server does, and stops on SIGTERM.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

from pairmq.server.app import run
from pairmq.server.config import ServerConfig


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit("usage: python -m pairmq.server.hosted_backup SPEC")
    config = pickle.loads(Path(argv[0]).read_bytes())
    if not isinstance(config, ServerConfig):
        sys.exit(f"{argv[0]}: not a hosted backup's configuration")
    run(config)


if __name__ == "__main__":
    main(sys.argv[1:])
