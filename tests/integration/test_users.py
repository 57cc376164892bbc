"""Users and roles at run time on a real server (issue 19): `pairmq user ...` and `pairmq
role ...` through the management API; the changes are journal records, so they outlive a
restart, removals of the file's users included; a removed user's connections close."""

from __future__ import annotations

import json

import pytest

from pairmq.client.plain import BlockingConnection, StompError
from tests.serverproc import free_port
from tests.support.admin import ADMIN_USER, admin_user_flags
from tests.support.cli import manage, run_pairmq
from tests.support.waiting import wait_until

SECURITY = """
[auth.users.filed]
password = "from-file"
roles = ["producers"]

[security."orders.#"]
send = ["producers"]
consume = ["producers"]
"""


def managed(server_factory):
    admin = f"127.0.0.1:{free_port()}"
    srv = server_factory("--admin", admin, *admin_user_flags(), config_text=SECURITY,
                         anonymous=False, name="users")
    wait_until(lambda: "Management HTTP on" in srv.logs(), "the management port")
    return srv, admin


def login(srv, user: str, password: str) -> BlockingConnection:
    return BlockingConnection(srv.host, srv.port, login=user, passcode=password)


def refused_login(srv, user: str, password: str) -> str:
    with pytest.raises(StompError) as refused:
        login(srv, user, password)
    return str(refused.value)


def test_add_passwd_grant_revoke_remove(server_factory) -> None:
    srv, admin = managed(server_factory)
    assert "user 'ann' set" in manage(admin, "user", "add", "ann", "--role", "producers",
                                      "--new-password", "pw1").stdout
    ann = login(srv, "ann", "pw1")
    ann.send("/queue/orders.eu", b"by ann")  # the role applies: producers may send
    listed = manage(admin, "user", "list").stdout
    assert "ann\tproducers\trun time" in listed and "filed\tproducers\tfile" in listed
    assert f"{ADMIN_USER}\tadmin\tfile" in listed
    # passwd: the old one no longer logs in
    manage(admin, "user", "passwd", "ann", "--new-password", "pw2")
    assert "authentication failed" in refused_login(srv, "ann", "pw1")
    login(srv, "ann", "pw2").close()
    assert "producers\tann,filed" in manage(admin, "role", "list").stdout
    assert json.loads(manage(admin, "role", "list", "--json").stdout)["roles"]["producers"] == [
        "ann", "filed"]
    users = json.loads(manage(admin, "user", "list", "--json").stdout)["users"]
    assert {"name": "ann", "roles": ["producers"], "source": "run time"} in users
    # revoke: her connection closes; her next one may not send
    manage(admin, "role", "revoke", "producers", "ann")
    with pytest.raises((StompError, OSError)):
        ann.send("/queue/orders.eu", b"after revoke")
    again = login(srv, "ann", "pw2")
    with pytest.raises(StompError, match="lacks permission send"):
        again.send("/queue/orders.eu", b"no role")
    manage(admin, "role", "grant", "producers", "ann")
    ann = login(srv, "ann", "pw2")
    ann.send("/queue/orders.eu", b"granted again")
    # remove: her connection closes, she cannot log in
    manage(admin, "user", "remove", "ann")
    with pytest.raises((StompError, OSError)):
        ann.send("/queue/orders.eu", b"removed")
    assert "authentication failed" in refused_login(srv, "ann", "pw2")
    assert "user 'ann' was removed" in srv.logs()
    assert "pairmq.audit: management: user 'pairmq-test-admin'" in srv.logs()


def test_run_time_changes_outlive_a_restart_and_override_the_file(server_factory) -> None:
    srv, admin = managed(server_factory)
    manage(admin, "user", "add", "bob", "--role", "producers", "--new-password", "bobpw")
    manage(admin, "user", "remove", "filed")  # a user of the file, removed at run time
    srv.stop()
    srv2, admin2 = managed(server_factory)
    assert srv2.data_dir == srv.data_dir
    login(srv2, "bob", "bobpw").close()
    assert "authentication failed" in refused_login(srv2, "filed", "from-file")
    listed = manage(admin2, "user", "list").stdout
    assert "bob\tproducers\trun time" in listed and "filed" not in listed


def test_only_an_admin_changes_users_and_a_bad_request_is_named(server_factory) -> None:
    _srv, admin = managed(server_factory)
    done = run_pairmq("user", "add", "eve", "--new-password", "x", "--admin", admin,
                      env={"PAIRMQ_USER": "filed", "PAIRMQ_PASSWORD": "from-file"})
    assert done.returncode == 1 and "needs role admin" in done.stderr, done.stderr
    done = run_pairmq("user", "remove", "nobody", "--admin", admin)
    assert done.returncode == 1 and "no user 'nobody'" in done.stderr, done.stderr


def test_permission_rules_at_run_time(server_factory) -> None:
    srv, admin = managed(server_factory)
    filed = login(srv, "filed", "from-file")
    filed.send("/queue/orders.eu", b"allowed by the file's rule")
    # a narrower rule set at run time decides for orders.eu
    manage(admin, "security", "set", "orders.eu", "--grant", "send=eu-desk",
           "--grant", "consume=eu-desk")
    listed = manage(admin, "security", "list").stdout
    assert "orders.eu\tsend=eu-desk consume=eu-desk\trun time" in listed, listed
    assert "orders.#\tsend=producers consume=producers\tfile" in listed, listed
    # the connection that sent before is refused too: a decision kept per destination
    # (server/stomp/connection.py) lasts only until the rules change
    with pytest.raises(StompError, match=r"lacks permission send on /queue/orders\.eu"):
        filed.send("/queue/orders.eu", b"refused on the connection that sent before")
    again = login(srv, "filed", "from-file")
    with pytest.raises(StompError, match="lacks permission send on /queue/orders.eu "
                                         r"\(granted to roles: eu-desk\)"):
        again.send("/queue/orders.eu", b"refused now")
    manage(admin, "role", "grant", "eu-desk", "filed")
    login(srv, "filed", "from-file").send("/queue/orders.eu", b"as eu-desk")
    # the file's own rule removed at run time: it stays removed after a restart
    manage(admin, "security", "remove", "orders.#")
    srv.stop()
    srv2, admin2 = managed(server_factory)
    listed = manage(admin2, "security", "list").stdout
    assert "orders.#" not in listed and "orders.eu" in listed, listed
    with pytest.raises(StompError, match=r"lacks permission send on /queue/orders\.us"):
        login(srv2, "filed", "from-file").send("/queue/orders.us", b"no rule matches")
    bad = run_pairmq("security", "set", "/queue/x", "--grant", "send=a", "--admin", admin2)
    assert bad.returncode == 1 and "without /queue/" in bad.stderr, bad.stderr
    bad = run_pairmq("security", "set", "x", "--grant", "sned=a", "--admin", admin2)
    assert bad.returncode == 1 and "unknown permission 'sned'" in bad.stderr, bad.stderr


def test_the_management_api_follows_the_rules_on_pairmq_management(server_factory) -> None:
    """Beside the admin and monitor roles, [security] grants `manage` (changes) and
    `browse` (reads) on pairmq.management."""
    _srv, admin = managed(server_factory)
    manage(admin, "user", "add", "opsy", "--role", "operators", "--new-password", "o")
    manage(admin, "user", "add", "watch", "--role", "dashboards", "--new-password", "w")
    as_opsy = {"PAIRMQ_USER": "opsy", "PAIRMQ_PASSWORD": "o"}
    as_watch = {"PAIRMQ_USER": "watch", "PAIRMQ_PASSWORD": "w"}
    denied = run_pairmq("user", "list", "--admin", admin, env=as_watch)
    assert denied.returncode == 1 and "permission browse on pairmq.management" in \
        denied.stderr, denied.stderr
    manage(admin, "security", "set", "pairmq.management", "--grant", "manage=operators",
           "--grant", "browse=operators,dashboards")
    assert run_pairmq("user", "list", "--admin", admin, env=as_watch).returncode == 0
    refused = run_pairmq("user", "add", "x", "--new-password", "x", "--admin", admin,
                         env=as_watch)
    assert refused.returncode == 1 and "permission manage on pairmq.management" in \
        refused.stderr, refused.stderr
    done = run_pairmq("user", "add", "x", "--new-password", "x", "--admin", admin,
                      env=as_opsy)
    assert done.returncode == 0, done.stderr
