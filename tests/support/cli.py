"""Commands run the way a user runs them: the `pairmq` command and the system tools some
tests need, each without a terminal and bounded in time, their output kept as text."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.support.admin import admin_env

# the variables `pairmq`'s management commands log in with (docs/configuration.md)
LOGIN_VARIABLES = ("PAIRMQ_USER", "PAIRMQ_PASSWORD")


def run(*argv: str, timeout: float = 30.0, stdin: str | None = None, cwd: Path | None = None,
        env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`argv` run to its end (TimeoutExpired after `timeout`): its exit code, and its
    stdout and stderr as text (an undecodable byte shown as U+FFFD). Its input is `stdin`,
    or nothing at all: never the terminal of the test run, so a command that would ask a
    question finds no one there. `env`: the whole environment (default: this process's)."""
    source = {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
    return subprocess.run(list(argv), capture_output=True, text=True, errors="replace",
                          timeout=timeout, cwd=cwd, env=None if env is None else dict(env),
                          **source)


def run_pairmq(*args: str, as_admin: bool = True, env: Mapping[str, str] | None = None,
           timeout: float = 30.0, stdin: str | None = None, cwd: Path | None = None
           ) -> subprocess.CompletedProcess[str]:
    """`pairmq ARGS` (this interpreter's `python -m pairmq`), logged in as the test admin
    (tests/support/admin.py), or with `as_admin=False` without any login the environment
    of the test run may hold; `env` adds to the environment, and wins."""
    base = {k: v for k, v in os.environ.items() if k not in LOGIN_VARIABLES}
    if as_admin:
        base.update(admin_env())
    return run(sys.executable, "-m", "pairmq", *args, timeout=timeout, stdin=stdin, cwd=cwd,
               env={**base, **(env or {})})


def manage(admin: str, *args: str) -> subprocess.CompletedProcess[str]:
    """An operator's `pairmq ARGS --admin ADMIN` as the test admin; it must succeed."""
    done = run_pairmq(*args, "--admin", admin)
    assert done.returncode == 0, done.stderr
    return done


def passwd(password: str) -> str:
    """The hash `pairmq passwd PASSWORD` prints; the command must succeed."""
    done = run_pairmq("passwd", password, as_admin=False, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
