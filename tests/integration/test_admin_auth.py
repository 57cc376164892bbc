"""The management port asks who is calling: writes (POST /activate) need a user with the
admin role, reads (GET /status, /metrics) admin or monitor unless
`anonymous_management_reads` opens them; `allow_anonymous` (STOMP) never opens it.
`pairmq status` and `pairmq activate` log in, and say clearly when they are refused."""

from __future__ import annotations

import base64
import hashlib
import threading
import time
from collections.abc import Callable

import pytest

from tests.ha.pair import Pair
from tests.integration.rawstomp import connect as raw_connect
from tests.integration.rawstomp import unique
from tests.serverproc import ServerProcess, free_port
from tests.support.admin import ADMIN, admin_request
from tests.support.cli import passwd, run_pairmq
from tests.support.waiting import wait_until

BOSS = ("boss", "boss-pw")  # role admin
WATCHER = ("watcher", "watch-pw")  # role monitor
APP = ("app", "app-pw")  # a STOMP user without a management role
USERS = f"""
[auth.users.boss]
password = "{BOSS[1]}"
roles = ["admin"]

[auth.users.watcher]
password = "{WATCHER[1]}"
roles = ["monitor"]

[auth.users.app]
password = "{APP[1]}"
roles = ["producer"]
"""


def start_managed(server_factory: Callable[..., ServerProcess], toml: str = "",
                  *flags: str) -> tuple[ServerProcess, str]:
    """A standalone server with management HTTP, the users above and `toml` added;
    anonymous STOMP clients allowed, so that only the management port's own rule applies."""
    admin = f"127.0.0.1:{free_port()}"
    config = f'[server]\nadmin = "{admin}"\n\n[auth]\nallow_anonymous = true\n{toml}\n{USERS}'
    srv = server_factory(*flags, config_text=config, anonymous=False)
    wait_until(lambda: _answers(admin), "the management port", 10)
    return srv, admin


def _answers(admin: str) -> bool:
    try:
        admin_request(admin, "/status", credentials=None, timeout=1)
    except OSError:
        return False
    return True


def assert_asks_for_credentials(answer: tuple[int, dict[str, str], object], problem: str
                                ) -> None:
    code, headers, body = answer
    assert code == 401, answer
    assert headers.get("WWW-Authenticate") == 'Basic realm="pairmq"', headers
    assert isinstance(body, dict) and problem in body["error"], body


def assert_stomp_serves(srv: ServerProcess) -> None:
    client, _connected = raw_connect(srv.address)
    try:
        queue = f"/queue/{unique('adm')}"
        client.request("SEND", {"destination": queue}, "ping")
        client.send_frame("SUBSCRIBE", {"destination": queue, "id": "1"})
        assert client.read_message().text == "ping"
    finally:
        client.close()


# ------------------------------------------------------------------ the HTTP rules


def test_nothing_is_answered_without_credentials(server_factory) -> None:
    srv, admin = start_managed(server_factory)
    for method, path in (("GET", "/status"), ("GET", "/metrics"), ("POST", "/activate")):
        answer = admin_request(admin, path, method, credentials=None)
        assert_asks_for_credentials(answer, "authentication required")
        assert "admin" in answer[2]["error"]
    # allow_anonymous = true (the config above) lets anonymous STOMP clients in, not here
    assert_stomp_serves(srv)
    assert "Management HTTP refused POST /activate from 127.0.0.1: no credentials" in srv.logs()


def test_a_wrong_password_or_an_unknown_user_is_refused(server_factory) -> None:
    srv, admin = start_managed(server_factory)
    for credentials in (("boss", "not-the-password"), ("nobody", BOSS[1]), ("boss", "")):
        for method, path in (("GET", "/status"), ("POST", "/activate")):
            answer = admin_request(admin, path, method, credentials=credentials)
            assert_asks_for_credentials(answer, "unknown user or wrong password")
    for header in ("Bearer abc", "Basic !!!", "Basic " + base64.b64encode(b"no-colon").decode()):
        answer = admin_request(admin, "/status", credentials=None,
                               headers={"Authorization": header})
        assert_asks_for_credentials(answer, "not valid HTTP basic auth")
    logs = srv.logs()
    assert "refused POST /activate from 127.0.0.1: unknown user or wrong password for 'boss'" \
        in logs
    assert "not-the-password" not in logs


def test_roles_decide_who_reads_and_who_activates(server_factory) -> None:
    srv, admin = start_managed(server_factory)
    # a valid user without a management role: known, but forbidden
    for method, path in (("GET", "/status"), ("POST", "/activate")):
        code, headers, body = admin_request(admin, path, method, credentials=APP)
        assert code == 403, body
        assert "WWW-Authenticate" not in headers
        assert f"{method} {path} needs role" in body["error"] and "'app'" in body["error"]
    # monitor reads, but may not activate
    code, _, status = admin_request(admin, "/status", credentials=WATCHER)
    assert code == 200 and status["state"] == "STANDALONE", status
    code, _, metrics = admin_request(admin, "/metrics", credentials=WATCHER)
    assert code == 200 and "pairmq_serving 1.0" in metrics
    code, _, body = admin_request(admin, "/activate", "POST", credentials=WATCHER)
    assert code == 403 and "needs role admin;" in body["error"], body
    # admin does both: /activate passes the check and meets the standalone server's answer
    code, _, status = admin_request(admin, "/status", credentials=BOSS)
    assert code == 200 and status["name"] == srv.name
    code, _, body = admin_request(admin, "/activate", "POST", credentials=BOSS)
    assert (code, body) == (400, {"error": "not part of a pair"})
    assert "user 'watcher' lacks role admin" in srv.logs()
    assert_stomp_serves(srv)


def test_a_hashed_password_from_pairmq_passwd_is_accepted(server_factory) -> None:
    hashed = passwd("s3cret-hash")
    toml = f'\n[auth.users.ops]\npassword = "{hashed}"\nroles = ["admin"]\n'
    _srv, admin = start_managed(server_factory, toml)
    code, _, status = admin_request(admin, "/status", credentials=("ops", "s3cret-hash"))
    assert code == 200 and status["state"] == "STANDALONE"
    code, _, body = admin_request(admin, "/activate", "POST", credentials=("ops", "s3cret-hash"))
    assert (code, body) == (400, {"error": "not part of a pair"})
    assert_asks_for_credentials(admin_request(admin, "/status", credentials=("ops", hashed)),
                                "wrong password")


@pytest.mark.machine
def test_stomp_keeps_serving_while_a_slow_hash_is_checked(server_factory) -> None:
    """A password hash is checked in a thread: a hash made slow on purpose (scrypt with
    N = 2**17, about half a second) never holds up STOMP clients meanwhile."""
    salt, password = b"slow-salt-123456", "slow-password"
    digest = hashlib.scrypt(password.encode(), salt=salt, n=2**17, r=8, p=1,
                            maxmem=256 * 1024 * 1024, dklen=32)
    b64 = base64.b64encode
    stored = f"scrypt${2**17}$8$1${b64(salt).decode()}${b64(digest).decode()}"
    srv, admin = start_managed(server_factory,
                               f'\n[auth.users.slow]\npassword = "{stored}"\nroles = ["admin"]\n')
    answers: list[int] = []

    def logins() -> None:  # a right password, then wrong ones: a success is remembered
        for given in (password, "wrong-1", "wrong-2"):
            answers.append(admin_request(admin, "/status", credentials=("slow", given),
                                         timeout=30)[0])

    client, _ = raw_connect(srv.address)
    queue = f"/queue/{unique('slow')}"
    round_trips: list[float] = []
    thread = threading.Thread(target=logins)
    started = time.monotonic()
    thread.start()
    try:
        while thread.is_alive():
            t0 = time.monotonic()
            client.request("SEND", {"destination": queue}, "x")
            round_trips.append(time.monotonic() - t0)
            time.sleep(0.01)
    finally:
        thread.join()
        client.close()
    busy = time.monotonic() - started
    assert answers == [200, 401, 401]
    assert busy > 0.75, f"three checks took only {busy:.2f} s: the hash was not slow"
    assert len(round_trips) >= 10, round_trips
    assert max(round_trips) < 0.25, f"a STOMP round trip waited {max(round_trips):.2f} s"


def test_reads_opened_by_the_setting_still_keep_activate_for_admins(server_factory) -> None:
    _srv, admin = start_managed(server_factory, "anonymous_management_reads = true")
    code, _, status = admin_request(admin, "/status", credentials=None)
    assert code == 200 and status["state"] == "STANDALONE"
    code, _, metrics = admin_request(admin, "/metrics", credentials=None)
    assert code == 200 and "pairmq_connections" in metrics
    assert_asks_for_credentials(admin_request(admin, "/activate", "POST", credentials=None),
                                "authentication required")
    code, _, body = admin_request(admin, "/activate", "POST", credentials=WATCHER)
    assert code == 403, body
    code, _, body = admin_request(admin, "/activate", "POST", credentials=BOSS)
    assert (code, body) == (400, {"error": "not part of a pair"})


def test_the_flag_opens_reads_too(server_factory) -> None:
    _srv, admin = start_managed(server_factory, "", "--anonymous-management-reads")
    assert admin_request(admin, "/status", credentials=None)[0] == 200
    assert admin_request(admin, "/activate", "POST", credentials=None)[0] == 401


# ------------------------------------------------------------------ the commands


def test_pairmq_status_logs_in_and_says_why_it_was_refused(server_factory, tmp_path) -> None:
    srv, admin = start_managed(server_factory)
    refused = run_pairmq("status", admin, as_admin=False, cwd=tmp_path)
    assert refused.returncode == 1, refused
    assert refused.stderr.strip() == (
        f"{admin}: authentication required: GET /status needs a user with role admin or "
        "monitor (HTTP basic auth) [HTTP 401] (give --user and --password, or set PAIRMQ_USER "
        "and PAIRMQ_PASSWORD)"), refused.stderr
    wrong = run_pairmq("status", admin, "--user", "boss", "--password", "nope", as_admin=False,
                       cwd=tmp_path)
    assert wrong.returncode == 1
    assert "unknown user or wrong password [HTTP 401]" in wrong.stderr
    assert "Traceback" not in refused.stderr + wrong.stderr
    forbidden = run_pairmq("status", admin, "--user", APP[0], "--password", APP[1],
                           as_admin=False, cwd=tmp_path)
    assert forbidden.returncode == 1 and "[HTTP 403]" in forbidden.stderr, forbidden.stderr

    name = srv.name
    for ok in (run_pairmq("status", admin, "--user", WATCHER[0], "--password", WATCHER[1],
                          as_admin=False, cwd=tmp_path),
               run_pairmq("status", admin, as_admin=False, cwd=tmp_path,
                          env={"PAIRMQ_USER": BOSS[0], "PAIRMQ_PASSWORD": BOSS[1]})):
        assert ok.returncode == 0, ok.stderr
        row = next(line for line in ok.stdout.splitlines() if admin in line)
        assert f" {name} " in row and "STANDALONE" in row, ok.stdout

    no_password = run_pairmq("status", admin, "--user", "boss", as_admin=False, cwd=tmp_path)
    assert no_password.returncode == 2
    assert "needs a password" in no_password.stderr and "PAIRMQ_PASSWORD" in no_password.stderr


def test_pairmq_status_uses_the_local_pairs_credentials(server_factory, tmp_path) -> None:
    """`pairmq up` writes .pairmq-local/credentials (login, password, HA secret); `pairmq
    status` run in the same directory uses them for servers on this machine."""
    _srv, admin = start_managed(server_factory)
    local = tmp_path / "cwd"
    (local / ".pairmq-local").mkdir(parents=True)
    (local / ".pairmq-local" / "credentials").write_text(f"{BOSS[0]}\n{BOSS[1]}\nha-secret\n")
    result = run_pairmq("status", admin, as_admin=False, cwd=local)
    assert result.returncode == 0, result.stderr
    assert "STANDALONE" in result.stdout
    # an explicit user wins over the file
    other = run_pairmq("status", admin, "--user", "boss", "--password", "wrong", as_admin=False,
                       cwd=local)
    assert other.returncode == 1 and "wrong password" in other.stderr


def test_pairmq_activate_needs_an_admin(server_factory, tmp_path) -> None:
    _srv, admin = start_managed(server_factory)
    anonymous = run_pairmq("activate", admin, "--yes", as_admin=False, cwd=tmp_path)
    assert anonymous.returncode == 1
    assert anonymous.stderr.strip() == (
        f"Error: {admin}: authentication required: POST /activate needs a user with role admin "
        "(HTTP basic auth) [HTTP 401] (give --user and --password, or set PAIRMQ_USER and "
        "PAIRMQ_PASSWORD)"), anonymous.stderr
    monitor = run_pairmq("activate", admin, "--yes", "--user", WATCHER[0], "--password",
                         WATCHER[1], as_admin=False, cwd=tmp_path)
    assert monitor.returncode == 1
    assert monitor.stderr.strip() == (
        f"Error: {admin}: forbidden: POST /activate needs role admin; user 'watcher' has: "
        "monitor [HTTP 403]"), monitor.stderr
    boss = run_pairmq("activate", admin, "--yes", "--user", BOSS[0], "--password", BOSS[1],
                      as_admin=False, cwd=tmp_path)
    assert boss.returncode == 1
    assert boss.stderr.strip() == f"Error: {admin}: not part of a pair [HTTP 400]", boss.stderr
    unreachable = run_pairmq("activate", f"127.0.0.1:{free_port()}", "--yes", "--user", BOSS[0],
                             "--password", BOSS[1], as_admin=False, cwd=tmp_path)
    assert unreachable.returncode == 1 and "unreachable" in unreachable.stderr
    assert "Traceback" not in anonymous.stderr + monitor.stderr + boss.stderr \
        + unreachable.stderr


# ------------------------------------------------------------------ a WAITING server


def test_only_an_admin_makes_a_waiting_server_activate(tmp_path) -> None:
    config = tmp_path / "users.toml"
    config.write_text(USERS)
    pair = Pair(tmp_path / "pair", flags=["--config", str(config)])
    try:
        pair.start(parallel=True)
        pair.wait_formed()
        assert pair.stop("primary") == 0  # failover_on_shutdown is off: the backup waits
        pair.wait_state("backup", "WAITING", 10)
        backup = pair.admin_address("backup")

        assert_asks_for_credentials(admin_request(backup, "/activate", "POST", credentials=None),
                                    "authentication required")
        assert admin_request(backup, "/activate", "POST", credentials=WATCHER)[0] == 403
        cli = run_pairmq("activate", backup, "--yes", as_admin=False, cwd=tmp_path)
        assert cli.returncode == 1 and "[HTTP 401]" in cli.stderr, cli.stderr
        time.sleep(1.0)  # more than two activation intervals: nothing was forced
        assert pair.state("backup") == "WAITING", pair.describe()
        assert "An operator forced" not in pair.logs("backup")

        code, _, body = admin_request(backup, "/activate", "POST", credentials=ADMIN)
        assert code == 200 and body["forced"] is True, body
        pair.wait_state("backup", "STANDALONE", 10)
        assert f"An operator forced this server to activate (user {ADMIN[0]})" \
            in pair.logs("backup")
    finally:
        pair.close()



def test_message_bodies_need_the_admin_role_even_with_open_reads(server_factory) -> None:
    """Browsing shows what clients sent: a monitor user, or anyone through
    anonymous_management_reads, sees the destinations' figures but not the messages."""
    _srv, admin = start_managed(server_factory,
                                "anonymous_management_reads = true")
    browse = "/api/messages?destination=/queue/secret"
    code, _, body = admin_request(admin, "/api/destinations", credentials=None)
    assert code == 200 and "destinations" in body
    code, _, body = admin_request(admin, browse, credentials=None)
    assert code == 401 and "needs a user with role admin" in body["error"], body
    code, _, body = admin_request(admin, browse, credentials=WATCHER)
    assert code == 403 and "needs role admin;" in body["error"], body
    code, _, body = admin_request(admin, browse, credentials=BOSS)
    assert code == 200 and body["messages"] == []
