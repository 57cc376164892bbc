"""A start loads only what its configuration uses (start-up time: docs/benchmarks.md,
"Start-up"): a server alone, or one of a replicated pair with a witness, starts and
serves without importing aiohttp, Rich, the client, the cluster, the database or etcd
pieces; each comes in with its feature. Checked in a fresh interpreter that runs the
command's own code path (the CLI module, then a real start on a real port and a stop)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serverproc import free_port

# Loaded only by the features that need them (server/app.py, server/pair/replication.py,
# cli/main.py's lazy commands).
HEAVY = ("aiohttp", "rich", "asyncpg", "prometheus_client", "pairmq.client",
         "pairmq.server.cluster", "pairmq.server.pair.database", "pairmq.server.pair.etcd_arbiter",
         "pairmq.server.manage", "pairmq.server.stomp.websocket", "pairmq.spark")

START = """
import asyncio, json, sys
import pairmq.cli.main
from pairmq.server.config import load_config
from pairmq.server.app import PairmqServer

async def main():
    server = PairmqServer(load_config(None, json.loads(sys.argv[1]), {}))
    await server.start()
    await server.stop()

asyncio.run(main())
print(json.dumps(sorted(sys.modules)))
"""


def modules_after_a_start(values: dict[str, object]) -> set[str]:
    done = subprocess.run([sys.executable, "-c", START, json.dumps(values)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout.splitlines()[-1]))


def heavy_in(modules: set[str]) -> list[str]:
    return sorted(m for m in modules for heavy in HEAVY
                  if m == heavy or m.startswith(heavy + "."))


def test_a_server_alone_starts_without_the_pieces_of_features_it_does_not_use(tmp_path: Path):
    modules = modules_after_a_start({"name": "alone", "data_dir": str(tmp_path / "d"),
                                     "stomp": f"127.0.0.1:{free_port()}",
                                     "allow_anonymous": True})
    assert "pairmq.store.store" in modules  # it did start
    assert heavy_in(modules) == []


def test_a_replicated_server_with_a_witness_loads_neither_etcd_nor_aiohttp(tmp_path: Path):
    modules = modules_after_a_start({
        "name": "primary", "data_dir": str(tmp_path / "d"),
        "stomp": f"127.0.0.1:{free_port()}", "allow_anonymous": True,
        "policy": "replication", "listen": f"127.0.0.1:{free_port()}",
        "peer": f"127.0.0.1:{free_port()}", "witness": f"127.0.0.1:{free_port()}",
        "secret": "s3cret-s3cret-s3cret"})
    assert "pairmq.server.pair.replication" in modules
    assert heavy_in(modules) == []


@pytest.mark.parametrize("command", ["status", "user"])
def test_the_operator_commands_still_load_when_asked_for(command: str):
    done = subprocess.run([sys.executable, "-m", "pairmq", command, "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert f"pairmq {command} [OPTIONS]" in done.stdout
