"""[ha] settings the server refuses at start, with a message that says what to change."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.serverproc import free_port, start_server
from tests.support.cli import run, run_pairmq


def run_server(workdir: Path, *flags: str) -> subprocess.CompletedProcess:
    """Run `pairmq server` expecting it to refuse its configuration and exit."""
    return run_pairmq("server", "--name", "cfg", "--data-dir", str(workdir / "data"), "--stomp",
                      f"127.0.0.1:{free_port()}", "--allow-anonymous", *flags)


def ha_flags(**overrides: str) -> list[str]:
    values = {"policy": "replication", "role": "primary", "listen": f"127.0.0.1:{free_port()}",
              "peer": f"127.0.0.1:{free_port()}", "witness": f"127.0.0.1:{free_port()}",
              "secret": "s", "heartbeat-interval-ms": "100", "activation-interval-ms": "400"}
    values.update(overrides)
    flags = []
    for key, value in values.items():
        if value is not None:
            flags += [f"--{key}", value]
    return flags


def test_activation_interval_below_twice_the_heartbeat_is_refused(tmp_path: Path) -> None:
    result = run_server(tmp_path, *ha_flags(**{"heartbeat-interval-ms": "500",
                                               "activation-interval-ms": "999"}))
    assert result.returncode != 0
    err = result.stderr
    assert "activation_interval_ms (999)" in err, err
    assert "twice" in err and "heartbeat_interval_ms (500)" in err, err
    assert not (tmp_path / "data" / "journal").exists() or not any(
        (tmp_path / "data" / "journal").iterdir())


def test_activation_interval_of_exactly_twice_the_heartbeat_starts(tmp_path: Path) -> None:
    srv = start_server(tmp_path, *ha_flags(**{"heartbeat-interval-ms": "200",
                                              "activation-interval-ms": "400"}), name="ok")
    try:
        assert srv.alive()
    finally:
        srv.stop()


def test_missing_secret_is_refused(tmp_path: Path) -> None:
    result = run_server(tmp_path, *ha_flags(secret=None))
    assert result.returncode != 0
    assert "secret is required" in result.stderr, result.stderr


def test_empty_secret_is_refused(tmp_path: Path) -> None:
    result = run_server(tmp_path, *ha_flags(secret=""))
    assert result.returncode != 0
    assert "secret is required" in result.stderr, result.stderr


def test_secret_in_the_config_file_is_required_too(tmp_path: Path) -> None:
    config = tmp_path / "pair.toml"
    config.write_text(f'[ha]\npolicy = "replication"\nlisten = "127.0.0.1:{free_port()}"\n'
                      f'peer = "127.0.0.1:{free_port()}"\n')
    result = run_server(tmp_path, "--config", str(config))
    assert result.returncode != 0
    assert "secret is required" in result.stderr, result.stderr
    assert str(config) in result.stderr, result.stderr


def test_witness_without_secret_is_refused(tmp_path: Path) -> None:
    result = run(sys.executable, "-m", "pairmq", "witness", "--listen",
                 f"127.0.0.1:{free_port()}", env={"PATH": "/usr/bin:/bin"})
    assert result.returncode != 0
    assert "--secret" in result.stderr, result.stderr


@pytest.mark.parametrize(("witness", "extra", "says"), [
    ("etcdx://127.0.0.1:2379", [], 'scheme "etcdx://" is not etcd:// or etcds://'),
    ("etcd://", [], "names no etcd member"),
    ("etcd://127.0.0.1:2379,", [], "names no etcd member"),
    ("etcd://127.0.0.1:2379/pairmq", [], "has a path"),
    ("etcd://127.0.0.1:2379,127.0.0.1:2379", [], "names a member twice"),
    ("etcd://127.0.0.1:high", [], '"127.0.0.1:high" is not HOST:PORT'),
    ("etcd://127.0.0.1:2379", [], "group is required with an etcd witness"),
    ("etcd://127.0.0.1:2379", ["--group", "a/b"], '"a/b" must be letters, digits'),
    ("etcds://127.0.0.1:2379", ["--group", "g"],
     "etcd_cert (or [tls] cert), etcd_key (or [tls] key), etcd_ca (or [tls] ca) required"),
    ("etcds://127.0.0.1:2379", ["--group", "g", "--etcd-cert", "/nonexistent/c.pem",
                                "--etcd-key", "/nonexistent/k.pem",
                                "--etcd-ca", "/nonexistent/ca.pem"],
     "etcd_cert (or [tls] cert) /nonexistent/c.pem: no such file"),
])
def test_a_bad_etcd_witness_is_refused_by_name(tmp_path: Path, witness: str,
                                               extra: list[str], says: str) -> None:
    result = run_server(tmp_path, *ha_flags(witness=witness), *extra)
    assert result.returncode != 0
    assert says in result.stderr, result.stderr
    assert "--witness" in result.stderr or "--group" in result.stderr or "[ha]" in result.stderr
