"""JavaScript clients under Node for the WebSocket tests: stompjs (`@stomp/stompjs`) and
`ws`, at the exact versions of tests/support/js/package-lock.json, installed on first use
into .cache/node/ (git-ignored) with `npm ci`; installed again when the lock changes.

The scripts the tests run live in tests/support/js/; they find the packages through
NODE_PATH. Node and npm must be on PATH (the tests are skipped without Node).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import run

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "support" / "js"
NODE_DIR = ROOT / ".cache" / "node"
MANIFESTS = ("package.json", "package-lock.json")
INSTALL_TIMEOUT_S = 300.0


def _digest() -> str:
    digest = hashlib.sha256()
    for name in MANIFESTS:
        digest.update((SCRIPTS / name).read_bytes())
    return digest.hexdigest()


def node_modules() -> Path:
    """The installed packages' directory (installing them first when needed)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js and npm are needed for the stompjs tests")
    NODE_DIR.mkdir(parents=True, exist_ok=True)
    stamp = NODE_DIR / ".installed"
    wanted = _digest()
    with open(NODE_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install at a time, whoever else asks
        if not stamp.exists() or stamp.read_text() != wanted:
            for name in MANIFESTS:
                shutil.copyfile(SCRIPTS / name, NODE_DIR / name)
            result = run("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error",
                         cwd=NODE_DIR, timeout=INSTALL_TIMEOUT_S)
            if result.returncode != 0:
                raise RuntimeError(f"npm ci in {NODE_DIR} failed:\n{result.stdout}\n"
                                   f"{result.stderr}")
            stamp.write_text(wanted)
    return NODE_DIR / "node_modules"


def start_script(script: str, config: dict[str, Any]) -> subprocess.Popen[str]:
    """`node tests/support/js/SCRIPT CONFIG-AS-JSON`, its stdout a pipe of text lines."""
    env = {**os.environ, "NODE_PATH": str(node_modules())}
    return subprocess.Popen(["node", str(SCRIPTS / script), json.dumps(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
