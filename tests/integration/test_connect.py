"""CONNECT/STOMP: version negotiation, host, authentication, CONNECTED headers, client-id."""

from __future__ import annotations

import pytest

import pairmq
from tests.integration.rawstomp import StompError, unique
from tests.integration.rawstomp import connect as raw_connect
from tests.support.cli import passwd
from tests.support.waiting import wait_until


@pytest.mark.parametrize("command", ["CONNECT", "STOMP"])
def test_version_negotiated_to_highest_common(server, raw_client, command):
    cases = [
        ("1.0,1.1,1.2", "1.2"),
        ("1.2", "1.2"),
        ("1.2,1.1,1.0", "1.2"),
        ("1.0,1.1", "1.1"),
        ("1.1", "1.1"),
        ("1.0", "1.0"),
        ("1.1,2.0", "1.1"),
        ("1.0,1.2,9.9", "1.2"),
    ]
    for offered, expected in cases:
        _, frame = raw_client(server, version=offered, command=command)
        assert frame.command == "CONNECTED", (offered, frame)
        assert frame.headers.get("version") == expected, (offered, frame)


def test_no_accept_version_means_1_0(server, raw_client):
    _, frame = raw_client(server, version=None)
    assert frame.command == "CONNECTED"
    assert frame.headers.get("version") == "1.0"


def test_no_common_version_gets_error_with_supported_versions_and_close(server, raw_client):
    client, frame = raw_client(server, version="2.0,3.1", expect=None)
    assert frame.command == "ERROR", frame
    assert frame.headers.get("version") == "1.0,1.1,1.2"
    assert frame.headers.get("message"), "an ERROR carries a message header"
    assert client.read_until_closed(timeout=5) == []
    # Other connections are unaffected.
    _, ok = raw_client(server)
    assert ok.headers["version"] == "1.2"


def test_any_host_value_is_accepted(server, raw_client):
    for host in ("localhost", "no-such-vhost.example", "/", "127.0.0.1:61613"):
        _, frame = raw_client(server, host=host)
        assert frame.command == "CONNECTED", host


def test_connected_headers(server, raw_client):
    _, first = raw_client(server)
    _, second = raw_client(server)
    for frame in (first, second):
        assert frame.headers["version"] == "1.2"
        assert frame.headers["server"] == f"pairmq/{pairmq.__version__}"
        assert frame.headers.get("heart-beat"), "CONNECTED carries heart-beat"
        assert frame.headers.get("session")
    assert first.headers["session"] != second.headers["session"], "session is per connection"


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_stomp_py_client_of_each_version_round_trips(server, stomp_client, version):
    client = stomp_client(server, version=version)
    connected = client.listener.connected
    assert connected.headers.get("version") == version
    queue = f"/queue/{unique('v')}"
    client.subscribe(queue, ack="client-individual" if version != "1.0" else "client")
    client.send(queue, f"hello {version}", **{"x-custom": "yes"})
    (message,) = client.wait_messages(1)
    assert message.body == f"hello {version}"
    assert message.headers["x-custom"] == "yes"
    client.ack(message)
    client.disconnect()


# -- authentication --------------------------------------------------------------------------


def test_valid_login_from_flag_user_is_accepted(server, raw_client):
    _, frame = raw_client(server, login="admin", passcode="secret")
    assert frame.command == "CONNECTED"


def test_wrong_password_gets_error_and_close(server, raw_client):
    client, frame = raw_client(server, login="admin", passcode="not-the-secret", expect=None)
    assert frame.command == "ERROR"
    assert frame.headers.get("message") == "authentication failed"
    assert client.read_until_closed(timeout=5) == []


def test_unknown_user_error_does_not_reveal_existence(server, raw_client):
    c1, wrong_pw = raw_client(server, login="admin", passcode="nope", expect=None)
    c2, no_user = raw_client(server, login="nobody-here", passcode="nope", expect=None)
    assert wrong_pw.command == no_user.command == "ERROR"
    assert wrong_pw.headers.get("message") == no_user.headers.get("message")
    assert no_user.headers.get("message") == "authentication failed"
    assert wrong_pw.body == no_user.body
    assert c1.read_until_closed(5) == [] and c2.read_until_closed(5) == []


def test_login_is_checked_even_when_anonymous_is_allowed(server, stomp_client, raw_client):
    # `server` allows anonymous access: no login is fine, a wrong login is not.
    _, frame = raw_client(server)
    assert frame.command == "CONNECTED"
    client = stomp_client(server, connect=False)
    error = client.connect("admin", "wrong", expect_error=True)
    assert error.headers.get("message") == "authentication failed"
    client.listener.wait_for(lambda: client.listener.disconnected, 5, "close after ERROR")


def test_anonymous_refused_unless_allowed(server_factory, raw_client):
    srv = server_factory("--user", "admin:secret", anonymous=False)
    client, frame = raw_client(srv, expect=None)
    assert frame.command == "ERROR", "a CONNECT without login needs allow_anonymous = true"
    assert frame.headers.get("message")
    assert client.read_until_closed(5) == []
    _, ok = raw_client(srv, login="admin", passcode="secret")
    assert ok.command == "CONNECTED"


def test_users_from_config_file_plain_password(server_factory, raw_client):
    config = """
[auth]
allow_anonymous = false

[auth.users.alice]
password = "wonderland"
roles = ["admin"]
"""
    srv = server_factory(config_text=config, anonymous=False)
    _, ok = raw_client(srv, login="alice", passcode="wonderland")
    assert ok.command == "CONNECTED"
    client, bad = raw_client(srv, login="alice", passcode="Wonderland", expect=None)
    assert bad.command == "ERROR"
    assert bad.headers.get("message") == "authentication failed"
    assert client.read_until_closed(5) == []


def test_scrypt_hashed_password(server_factory, raw_client):
    hashed = passwd("correct horse")
    assert hashed.startswith("scrypt$"), hashed
    assert "correct horse" not in hashed
    config = f"""
[auth.users.bob]
password = "{hashed}"
roles = []
"""
    srv = server_factory(config_text=config, anonymous=False)
    _, ok = raw_client(srv, login="bob", passcode="correct horse")
    assert ok.command == "CONNECTED"
    for wrong in ("correct horse ", "wrong", hashed):
        client, bad = raw_client(srv, login="bob", passcode=wrong, expect=None)
        assert bad.command == "ERROR", wrong
        assert bad.headers.get("message") == "authentication failed"
        assert client.read_until_closed(5) == []


# -- client-id ---------------------------------------------------------------------------------


def test_client_id_is_exclusive_and_released_on_disconnect(server, raw_client):
    cid = unique("app")
    first, _ = raw_client(server, headers={"client-id": cid})
    second, answer = raw_client(server, headers={"client-id": cid}, expect=None)
    assert answer.command == "ERROR", answer
    assert cid in answer.headers.get("message", "") + answer.text, "the ERROR names the id"
    assert second.read_until_closed(5) == []
    # The first connection is unaffected.
    first.request("SUBSCRIBE", {"destination": "/queue/" + cid, "id": "s"})
    # A clean DISCONNECT releases the id at once.
    first.send_frame("DISCONNECT", {"receipt": "bye"})
    assert [f.command for f in first.read_until_closed(5)] == ["RECEIPT"]
    third, ok = raw_client(server, headers={"client-id": cid})
    assert ok.command == "CONNECTED"
    # A dropped socket releases it too (once the server has seen the close).
    third.close()

    def reconnects() -> bool:
        try:
            client, _ = raw_connect(server.address, headers={"client-id": cid})
        except StompError:
            return False
        client.close()
        return True

    wait_until(reconnects, "client-id released after the socket closed", 5)
