"""Users and permission rules changed at run time are shared by the pair (issue 19):
journal records that the backup of a replication pair mirrors and the next holder of a
shared store replays. The CLI finds the serving server by itself (the other answers
409)."""

from __future__ import annotations

import pytest

from pairmq.client.plain import BlockingConnection, StompError
from tests.ha.pair import HOST

POLICIES = ["replication", "shared-store"]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_user_added_on_the_active_logs_in_on_the_backup_after_a_kill(pair_factory, policy
                                                                       ) -> None:
    pair = pair_factory(policy=policy, flags=["--no-allow-anonymous"])
    pair.start(parallel=True)
    pair.wait_formed()
    admins = ["--admin", pair.admin_address("backup"), "--admin", pair.admin_address("primary")]
    done = pair.cli("user", "add", "carol", "--role", "app", "--new-password", "carol-pw",
                    *admins)
    assert done.returncode == 0, done.stderr
    assert "does not serve" not in done.stdout  # the backup's 409 is not an error here
    done = pair.cli("user", "remove", "nobody-yet", *admins)
    assert done.returncode == 1 and "no user 'nobody-yet'" in done.stderr, done.stderr
    for pattern, grants in (("#", ["send=app"]), ("locked.#", ["send=nobody"])):
        done = pair.cli("security", "set", pattern, *(f"--grant={g}" for g in grants), *admins)
        assert done.returncode == 0, done.stderr
    BlockingConnection(HOST, pair.stomp_port["primary"], login="carol",
                       passcode="carol-pw").close()
    pair.kill("primary")
    pair.wait_active(15, "backup")
    carol = BlockingConnection(HOST, pair.stomp_port["backup"], login="carol",
                               passcode="carol-pw")
    carol.send("/queue/open", b"the rules came with the journal")
    with pytest.raises(StompError, match=r"lacks permission send on /queue/locked\.x"):
        carol.send("/queue/locked.x", b"refused on the new active too")
    # the new active takes changes too
    done = pair.cli("user", "passwd", "carol", "--new-password", "new-pw", *admins)
    assert done.returncode == 0, done.stderr
    with pytest.raises(StompError, match="authentication failed"):
        BlockingConnection(HOST, pair.stomp_port["backup"], login="carol",
                           passcode="carol-pw")
    listed = pair.cli("user", "list", "--admin", pair.admin_address("backup"))
    assert "carol\tapp\trun time" in listed.stdout, listed
