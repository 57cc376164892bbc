"""`pairmq server --config FILE`, the same settings as flags (a flag wins), and bad
configurations refused at start with a message naming the key."""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.integration.rawstomp import connect as raw_connect
from tests.integration.rawstomp import unique
from tests.serverproc import start_server
from tests.support.cli import run_pairmq

GOOD_CONFIG = """
[server]
heartbeat_ms = 300

[destinations]
default_prefetch = 2
max_delivery_attempts = 1
dead_letter_prefix = "CFG."

[auth]
allow_anonymous = false

[auth.users.carol]
password = "from-file"
roles = ["admin"]
"""


def dead_letter_queue_of(srv, stomp_client, login=None, passcode=None) -> str:
    """NACK one message once and return the name of the queue it was dead-lettered to."""
    name = unique("cfg")
    queue = f"/queue/{name}"
    consumer = stomp_client(srv, login=login, passcode=passcode)
    consumer.subscribe(queue, ack="client-individual")
    consumer.send(queue, "x")
    consumer.nack(consumer.wait_messages(1)[0])
    for prefix in ("CFG.", "FLAG.", "DLQ."):
        reader = stomp_client(srv, login=login, passcode=passcode)
        reader.subscribe(f"/queue/{prefix}{name}")
        reader.send(f"/queue/{prefix}{name}", "marker")
        reader.wait_body("marker")
        if reader.bodies() != ["marker"]:
            return prefix
    raise AssertionError("the message was not dead-lettered")


def test_settings_from_config_file(server_factory, stomp_client, raw_client):
    srv = server_factory(config_text=GOOD_CONFIG, anonymous=False)
    _, connected = raw_client(srv, login="carol", passcode="from-file")
    assert connected.headers["heart-beat"] == "300,300"
    _, refused = raw_client(srv, expect=None)
    assert refused.command == "ERROR", "allow_anonymous = false from the file"
    queue = f"/queue/{unique('pf')}"
    consumer = stomp_client(srv, login="carol", passcode="from-file")
    for i in range(5):
        consumer.send(queue, str(i))
    consumer.subscribe(queue, ack="client-individual")
    consumer.wait_messages(2)
    consumer.send(queue, "sync")
    time.sleep(0.3)
    assert len(consumer.messages) == 2, "default_prefetch = 2 from the file"
    assert dead_letter_queue_of(srv, stomp_client, "carol", "from-file") == "CFG."


def test_flags_win_over_the_config_file(server_factory, stomp_client, raw_client):
    # server_factory passes --allow-anonymous (anonymous=True) after --config.
    srv = server_factory(
        "--heartbeat-ms", "700", "--dead-letter-prefix", "FLAG.", config_text=GOOD_CONFIG
    )
    _, connected = raw_client(srv)
    assert connected.command == "CONNECTED", "--allow-anonymous wins over the file"
    assert connected.headers["heart-beat"] == "700,700"
    _, carol = raw_client(srv, login="carol", passcode="from-file")
    assert carol.command == "CONNECTED", "settings the flags do not name still come from the file"
    assert dead_letter_queue_of(srv, stomp_client) == "FLAG."


def test_no_allow_anonymous_flag_wins_over_the_file(server_factory, raw_client):
    config = "[auth]\nallow_anonymous = true\n"
    srv = server_factory(
        "--no-allow-anonymous", "--user", "dave:pw", config_text=config, anonymous=False
    )
    _, frame = raw_client(srv, expect=None)
    assert frame.command == "ERROR"
    _, ok = raw_client(srv, login="dave", passcode="pw")
    assert ok.command == "CONNECTED"


def run_server(tmp_path: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run `python -m pairmq server ARGS`; it must exit by itself (a bad config) in time."""
    cmd = [
        sys.executable,
        "-m",
        "pairmq",
        "server",
        "--stomp",
        "127.0.0.1:0",
        "--data-dir",
        str(tmp_path / "data"),
        *args,
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the server started instead of refusing: {err}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


BAD_CONFIGS = {
    "unknown-key": ('[server]\nname = "x"\nbogus_setting = 1\n', "bogus_setting"),
    "unknown-section": ("[nonsense]\nx = 1\n", "nonsense"),
    "unknown-user-key": ('[auth.users.erin]\npasswrd = "x"\n', "passwrd"),
    "wrong-type-int": ('[limits]\nmax_headers = "many"\n', "max_headers"),
    "wrong-type-float": ("[destinations]\nmax_delivery_attempts = 1.5\n", "max_delivery_attempts"),
    "wrong-type-bool": ('[auth]\nallow_anonymous = "yes"\n', "allow_anonymous"),
    "wrong-type-string": ("[destinations]\ndead_letter_prefix = 7\n", "dead_letter_prefix"),
    "impossible-zero": ("[limits]\nmax_headers = 0\n", "max_headers"),
    "impossible-negative": ("[server]\nheartbeat_ms = -5\n", "heartbeat_ms"),
    "bad-policy": ('[destinations]\nexpired_policy = "sometimes"\n', "expired_policy"),
    "bad-log-level": ('[server]\nlog_level = "loud"\n', "log_level"),
    "bad-listener": ('[server]\nstomp = "not an address"\n', "stomp"),
    "section-not-table": ("server = 5\n", "server"),
    # TLS (docs/security.md): what is missing or unusable is named
    "tls-without-cert": ('[server]\nstomp_tls = "127.0.0.1:0"\n',
                         "[tls] cert and key are required by stomp_tls"),
    "tls-missing-file": ('[server]\nadmin_tls = true\n[tls]\ncert = "absent.pem"\n'
                         'key = "absent.key"\n', "[tls] cert absent.pem: no such file"),
    "tls-bad-client-auth": ('[tls]\nclient_auth = "sometimes"\n', "client_auth"),
    "security-unknown-permission": ('[security."orders.#"]\nsnd = ["producers"]\n',
                                    "unknown permission 'snd'"),
    "security-prefixed-pattern": ('[security."/queue/orders"]\nsend = ["p"]\n',
                                  "without /queue/, /topic/ or /stream/"),
    "security-roles-not-list": ('[security."#"]\nsend = "producers"\n',
                                "send must be a list of role names"),
    "ha-tls-without-pair": ('[ha]\ntls = true\n[tls]\ncert = "a"\nkey = "b"\n',
                            "[ha] tls is set but [ha] policy is \"none\""),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_is_refused_naming_the_key(tmp_path, case):
    text, key = BAD_CONFIGS[case]
    path = tmp_path / "bad.toml"
    path.write_text(text)
    result = run_server(tmp_path, "--config", str(path))
    assert result.returncode != 0
    assert key in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_a_second_server_on_a_data_directory_is_refused_naming_the_first(tmp_path):
    first = start_server(tmp_path, name="first")
    try:
        with pytest.raises(RuntimeError) as refused:
            start_server(tmp_path, "--data-dir", str(first.data_dir), name="second")
        message = str(refused.value)
        assert f"data directory {first.data_dir} is in use by another pairmq server" in message
        assert f"first (pid {first.proc.pid}" in message and "Traceback" not in message
        assert first.proc.poll() is None  # the first one serves on
    finally:
        first.stop()


def test_invalid_toml_is_refused(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[server\nname = \n")
    result = run_server(tmp_path, "--config", str(path))
    assert result.returncode != 0
    assert result.stderr.strip()
    assert "Traceback" not in result.stderr, result.stderr
    assert "broken.toml" in result.stderr or "toml" in result.stderr.lower(), result.stderr


def test_missing_config_file_is_refused(tmp_path):
    result = run_server(tmp_path, "--config", str(tmp_path / "absent.toml"))
    assert result.returncode != 0
    assert "absent.toml" in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("flag", "value", "key"),
    [
        ("--max-headers", "many", "max-headers"),
        ("--max-headers", "0", "max_headers"),
        ("--expired-policy", "sometimes", "expired_policy"),
        ("--default-prefetch", "-1", "default_prefetch"),
        ("--stomp", "", "stomp and stomp_tls are both empty"),
    ],
)
def test_bad_flag_values_are_refused(tmp_path, flag, value, key):
    result = run_server(tmp_path, flag, value)
    assert result.returncode != 0
    assert key in result.stderr.replace("-", "_") or key in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_ready_line_reports_the_real_port(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "pairmq",
        "server",
        "--name",
        "portzero",
        "--stomp",
        "127.0.0.1:0",
        "--data-dir",
        str(tmp_path / "data"),
        "--allow-anonymous",
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True)
    reader.start()
    try:
        pattern = re.compile(r"pairmq server portzero ready: STOMP on 127\.0\.0\.1:(\d+)")
        deadline = time.monotonic() + 20
        port = None
        seen = []
        while port is None and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            seen.append(line)
            if match := pattern.search(line):
                port = int(match.group(1))
        assert port, f"no ready line: {seen}"
        assert port != 0
        client, frame = raw_connect(("127.0.0.1", port))
        assert frame.command == "CONNECTED"
        client.close()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_passwd_prints_a_hash(tmp_path):
    result = run_pairmq("passwd", "hunter2", as_admin=False, timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scrypt$"), result.stdout
    assert "hunter2" not in result.stdout


def test_tls_files_that_cannot_be_used_are_refused_naming_them(tmp_path):
    from tests.support.certs import make_pki

    pki = make_pki(tmp_path / "pki")
    other = pki.foreign.issue("other")
    # a key that is not the certificate's
    result = run_server(tmp_path, "--stomp-tls", "127.0.0.1:0", "--tls-cert",
                        str(pki.server.cert), "--tls-key", str(other.key))
    assert result.returncode != 0 and "cannot be used together" in result.stderr, \
        result.stderr
    assert str(pki.server.cert) in result.stderr and "Traceback" not in result.stderr
    # client certificates asked for, but no CA to check them with
    result = run_server(tmp_path, *pki.server_flags(client_auth="required")[:4],
                        "--stomp-tls", "127.0.0.1:0", "--tls-client-auth", "required")
    assert result.returncode != 0 and "[tls] ca is required" in result.stderr, result.stderr
