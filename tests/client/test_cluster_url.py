"""Cluster URLs: parsing (client/members.py), the member a client starts with, the rule by
which it moves to another member (client/topology.py), what CONNECTED's `cluster-members`
teaches it, the events that say so; then two real standalone servers as two members."""

from __future__ import annotations

import random
import threading

import pytest

from pairmq.client import ConfigurationError, EventKind, FailoverEvent, Outcome, parse_options
from pairmq.client.link import Link
from pairmq.client.members import (
    ClusterFailoverEvent,
    choose_member,
    member_url,
    merge_members,
    parse_cluster_url,
    parse_member_list,
)
from tests.serverproc import free_port
from tests.support.scripted import Scripted

A = "failover:(stomp://a:1,stomp://b:2)"
B = "failover:(stomp://c:3,stomp://d:4)"
C = "stomp://e:5"
URL = (f"cluster:({A},{B},{C})?retryInterval=100&retryIntervalMultiplier=2"
       "&maxRetryInterval=400")


def run_on(member: int = 0, url: str = URL, **options) -> Scripted:
    return Scripted(url, cluster_member=member, **options)


# ---------------------------------------------------------------- parsing


def test_a_cluster_url_names_its_members_in_order_and_options_after_the_parenthesis():
    o = parse_options("cluster:(failover:(stomp://A1:1,stomp://A2:2),failover:(stomp://B1:3,"
                      "stomp://B2:4),stomp://C1:5)?clusterMember=2&retryInterval=7", {})
    assert o.members == ((("A1", 1), ("A2", 2)), (("B1", 3), ("B2", 4)), (("C1", 5),))
    assert o.servers == (("A1", 1), ("A2", 2), ("B1", 3), ("B2", 4), ("C1", 5))
    assert (o.cluster_member, o.retry_interval) == (2, 7)
    assert parse_options(URL, {"cluster_member": 1}).cluster_member == 1  # keywords win


def test_a_cluster_url_accepts_spaces_bare_addresses_tls_and_one_member():
    o = parse_options(" cluster:( failover:( stomp+ssl://a:1 , ssl://b:2 ) , stomp+ssl://[::1]:3 )",
                      {})
    assert o.members == ((("a", 1), ("b", 2)), (("::1", 3),)) and o.tls
    assert parse_options("cluster:(h:1)", {}).members == ((("h", 1),),)
    assert parse_options("cluster:(failover:(h:1,h:1))", {}).members == ((("h", 1),),)


def test_other_urls_and_lists_of_addresses_keep_their_meaning():
    assert parse_options(A, {}).members == ()
    assert parse_options(["stomp://a:1", "stomp://b:2"], {}).members == ()
    with pytest.raises(ConfigurationError, match="not a server address"):
        parse_options([f"cluster:({A})"], {})  # a list holds addresses, not URLs


@pytest.mark.parametrize(("url", "keywords", "message"), [
    (f"cluster:({A},,{C})", {}, "cluster URL: member 2 is empty"),
    (f"cluster:({A},)", {}, "cluster URL: member 2 is empty"),
    ("cluster:()", {}, "cluster URL: no member"),
    ("cluster:stomp://a:1", {}, r"cluster URL: expected '\(' after cluster:"),
    (f"cluster:({A}", {}, "cluster URL: unbalanced parentheses"),
    ("cluster:(failover:(stomp://a:1,stomp://b:2)", {}, "unbalanced parentheses"),
    (f"cluster:({A}))", {}, "unexpected"),
    (f"cluster:({A})retryInterval=5", {}, r"options go after '\?'"),
    ("cluster:(failover:(stomp://a:1)?retryInterval=5,stomp://e:5)", {},
     "cluster URL: member 1: options go after the cluster's closing parenthesis"),
    ("cluster:(failover:(),stomp://e:5)", {}, "cluster URL: member 1 names no server"),
    ("cluster:(stomp://e:5,failover:stomp://a:1)", {},
     r"cluster URL: member 2: expected failover:\(ADDRESS,ADDRESS\)"),
    ("cluster:(stomp://e:5,stomp://a:port)", {},
     "cluster URL: member 2: not a server address: 'stomp://a:port'"),
    (f"cluster:({A},cluster:({C}))", {}, "member 2: a cluster cannot be a member"),
    (f"cluster:({A},stomp://b:2)", {}, "server b:2 is in member 1 and member 2"),
    (f"cluster:({A},stomp+ssl://e:5)", {}, "all use TLS or none does"),
    (f"cluster:({A},{C})?clusterMembr=1", {}, "unknown URL parameter 'clusterMembr'"),
    (f"cluster:({A},{C})?clusterMember=2", {}, "cluster_member is 2, but the cluster URL "
                                               r"names 2 members \(0 to 1"),
    (f"cluster:({A},{C})", {"cluster_member": -2}, "option cluster_member must be >= -1"),
    (A, {"cluster_member": 1}, "the URL is not a cluster: URL"),
])
def test_a_bad_cluster_url_is_named(url, keywords, message):
    with pytest.raises(ConfigurationError, match=message):
        parse_options(url, keywords)


def test_a_member_written_back_as_a_url_reads_the_same():
    for servers, tls in (((("a", 1), ("b", 2)), False), ((("e", 5),), True),
                         ((("::1", 6), ("f", 7)), False)):
        text = member_url(servers, tls)
        assert parse_cluster_url(f"cluster:({text})").members == (servers,)
    assert member_url([("a", 1), ("b", 2)], False) == A
    assert member_url([("e", 5)], True) == "stomp+ssl://e:5"


# ---------------------------------------------------------------- the member a client starts with


def test_a_pinned_member_is_where_the_client_starts():
    for member, first in ((0, "a:1"), (1, "c:3"), (2, "e:5")):
        run = run_on(member)
        assert run.next_attempt() == (first, 0.0)
        assert run.engine.servers.member_url() == (A, B, C)[member]


def test_by_default_clients_start_on_members_picked_at_random():
    rng = random.Random(7)
    picks = [choose_member(3, -1, rng) for _ in range(300)]
    assert set(picks) == {0, 1, 2} and all(picks.count(m) > 50 for m in range(3))
    assert choose_member(3, 2, rng) == 2
    assert [choose_member(3, -1, random.Random(1)) for _ in range(3)] == \
        [choose_member(3, -1, random.Random(1))] * 3  # a seed repeats its choice
    starts = {Scripted(URL).next_attempt()[0] for _ in range(60)}  # os.urandom seeds
    assert starts == {"a:1", "c:3", "e:5"}


# ---------------------------------------------------------------- moving between members


def test_a_round_in_which_no_server_of_the_member_answered_moves_to_the_next_and_wraps():
    run = run_on(0)
    run.connect("a:1", session="s1")
    run.lose()
    plans = []
    for server in ("a:1", "b:2", "c:3", "d:4", "e:5", "a:1", "b:2", "c:3"):
        name, wait = run.next_attempt()
        plans.append((name, round(wait, 3)))
        run.refuse_tcp(server)
    assert plans == [("a:1", 0.0), ("b:2", 0.0), ("c:3", 0.1), ("d:4", 0.1), ("e:5", 0.2),
                     ("a:1", 0.4), ("b:2", 0.4), ("c:3", 0.4)]  # backoff between rounds
    assert run.engine.servers.member == 1


def test_a_server_that_refuses_keeps_the_client_on_its_member_and_its_hint_is_followed():
    """A backup not serving yet answers: the member lives, and holds the client's data."""
    run = run_on(0)
    run.connect("a:1", session="s1")
    run.lose()
    run.refuse_tcp("a:1")
    run.open("b:2")
    run.reply("ERROR", message="this server is WAITING")
    name, wait = run.next_attempt()
    assert (name, round(wait, 3)) == ("a:1", 0.1)  # the same member again, after the wait
    run.tick(wait)
    run.refuse_tcp("a:1")
    run.open("b:2")
    run.reply("ERROR", message="this server is PASSIVE", active_server="z:9")
    assert run.next_attempt() == ("z:9", 0.0)  # the hint joins the member, tried at once
    run.refuse_tcp("z:9")
    assert run.engine.servers.known == [("a", 1), ("b", 2), ("z", 9)]
    assert run.next_attempt()[0] == "z:9"  # a new round on member A, the hint first
    assert run.engine.servers.member == 0


def test_a_hint_is_forgotten_when_the_client_moves_and_the_last_server_leads_only_at_home():
    run = run_on(0)
    run.refuse_tcp("a:1")
    run.connect("b:2", session="s1")
    run.lose()
    run.refuse_tcp("b:2")  # the server it was connected to goes first in its member
    run.refuse_tcp("a:1")
    assert run.next_attempt()[0] == "c:3"
    assert run.engine.servers.hint is None


def test_connect_tries_every_member_once_before_it_gives_up():
    run = run_on(1)  # initialConnectAttempts 1: one pass over the members
    for server in ("c:3", "d:4", "e:5", "a:1", "b:2"):
        run.refuse_tcp(server)
    assert run.next_attempt() is None and run.engine.link is Link.FAILED
    assert all(s in str(run.engine.error) for s in ("a:1", "b:2", "c:3", "d:4", "e:5"))


def test_reconnect_attempts_count_passes_over_the_members():
    run = run_on(0, reconnect_attempts=2)
    run.connect("a:1", session="s1")
    pending = run.engine.send("/queue/q", b"x", None, True, run.now)
    run.written()
    run.lose()
    for server in ["a:1", "b:2", "c:3", "d:4", "e:5"] * 2:
        run.refuse_tcp(server)
    assert run.next_attempt() is None and pending.outcome is Outcome.UNKNOWN
    (event,) = run.engine.take_events()
    assert isinstance(event, ClusterFailoverEvent) and event.kind is EventKind.DISCONNECT
    assert (event.old_member, event.member, event.member_changed) == (A, None, False)


def test_moving_resends_the_unconfirmed_with_their_stamps_and_the_event_names_the_member():
    run = run_on(0)
    run.connect("a:1", session="s1")
    results = [run.engine.send("/queue/q", b"%d" % i, None, True, run.now) for i in range(2)]
    before = run.written()
    run.lose()
    for server in ("a:1", "b:2", "c:3"):
        run.refuse_tcp(server)
    run.connect("d:4", session="s2")
    again = run.written()
    assert [f.body for f in again] == [b"0", b"1"]
    assert [(f.headers["pairmq-producer"], f.headers["pairmq-seq"]) for f in again] == \
        [(f.headers["pairmq-producer"], f.headers["pairmq-seq"]) for f in before]
    run.receipt_all(again)
    assert all(r.outcome is Outcome.CONFIRMED for r in results)
    (event,) = run.engine.take_events()
    assert isinstance(event, ClusterFailoverEvent) and isinstance(event, FailoverEvent)
    assert (event.old_server, event.new_server, event.resent) == ("a:1", "d:4", 2)
    assert (event.old_member, event.member, event.member_changed) == (A, B, True)


def test_a_failover_inside_the_member_says_the_member_did_not_change():
    run = run_on(0)
    run.connect("a:1", session="s1")
    run.lose()
    run.refuse_tcp("a:1")
    run.connect("b:2", session="s2")
    (event,) = run.engine.take_events()
    assert (event.old_member, event.member, event.member_changed) == (A, A, False)


def test_a_client_of_a_failover_url_keeps_its_plain_events_and_ignores_cluster_members():
    run = Scripted(A)
    run.connect("a:1", session="s1", cluster_members=f"{A} {B}")
    assert run.engine.servers.members == [[("a", 1), ("b", 2)]]
    run.lose()
    run.refuse_tcp("a:1")
    run.refuse_tcp("b:2")
    assert run.next_attempt()[0] == "a:1"  # no member to move to
    run.connect("a:1", session="s2")
    (event,) = run.engine.take_events()
    assert type(event) is FailoverEvent


# ---------------------------------------------------------------- learning members


def test_cluster_members_adds_the_members_not_known_and_topology_only_the_current_one():
    run = run_on(1, url="cluster:(stomp://a:1,stomp://c:3)")
    run.connect("c:3", session="s1", topology="c:3,d:4", cluster_name="east",
                cluster_members="failover:(stomp://c:3,stomp://d:4) "
                "failover:(stomp://a:1,stomp://b:2) failover:(stomp://f:6,stomp://g:7) "
                "stomp://h:8 stomp+ssl://x:9 failover:(broken) stomp://a:x")
    servers = run.engine.servers
    assert servers.members == [[("a", 1), ("b", 2)], [("c", 3), ("d", 4)],
                               [("f", 6), ("g", 7)], [("h", 8)]]
    assert servers.cluster_name == "east"
    run.lose()
    order = []
    for _ in range(9):
        server = run.next_attempt()[0]
        order.append(server)
        run.refuse_tcp(server)
    assert order == ["c:3", "d:4", "f:6", "g:7", "h:8", "a:1", "b:2", "c:3", "d:4"]


def test_a_tls_client_learns_the_tls_members():
    run = run_on(0, url="cluster:(stomp+ssl://a:1)")
    run.connect("a:1", session="s1", cluster_members="stomp://p:1",
                cluster_members_tls="stomp+ssl://a:1 stomp+ssl://t:2")
    assert run.engine.servers.members == [[("a", 1)], [("t", 2)]]
    assert run.engine.servers.member_url(1) == "stomp+ssl://t:2"


def test_the_member_list_reader_skips_what_it_cannot_read():
    assert parse_member_list("  stomp://a:1   failover:(stomp://b:2,stomp://c:3)\t", False) \
        == [(("a", 1),), (("b", 2), ("c", 3))]
    assert parse_member_list("failover:(stomp://a:1", False) == []
    assert parse_member_list("stomp://a:1 nonsense stomp+ssl://b:2 failover:(x:1)?a=b", False) \
        == [(("a", 1),)]
    assert parse_member_list("", True) == []


def test_merging_keeps_positions_and_a_server_in_one_member():
    known = [[("a", 1)], [("c", 3)]]
    assert merge_members(known, [(("a", 1), ("b", 2)), (("c", 3), ("a", 1)),
                                 (("f", 6),), (("f", 6), ("g", 7))]) == 1
    assert known == [[("a", 1), ("b", 2)], [("c", 3)], [("f", 6), ("g", 7)]]


# ---------------------------------------------------------------- real servers


def test_two_standalone_servers_as_two_members_the_client_moves_when_its_member_dies(
        server_factory, client_factory):
    one, two = server_factory(name="one"), server_factory(name="two")
    first, second = (f"stomp://127.0.0.1:{s.port}" for s in (one, two))
    events: list[FailoverEvent] = []
    moved = threading.Event()

    def listener(event: FailoverEvent) -> None:
        events.append(event)
        moved.set()

    client = client_factory(f"cluster:({first},{second})?clusterMember=0",
                            failover_listener=listener)
    assert client.server == f"127.0.0.1:{one.port}"
    assert client.send("/queue/cluster", b"on one").outcome is Outcome.CONFIRMED
    one.kill()
    result = client.send("/queue/cluster", b"on two", timeout=20)
    assert result.outcome is Outcome.CONFIRMED
    assert moved.wait(10)
    (event,) = events
    assert isinstance(event, ClusterFailoverEvent) and event.kind is EventKind.FAILOVER
    assert (event.old_server, event.new_server) == (f"127.0.0.1:{one.port}",
                                                    f"127.0.0.1:{two.port}")
    assert (event.old_member, event.member, event.member_changed) == (first, second, True)
    assert client.server == f"127.0.0.1:{two.port}"
    reader = client_factory(f"stomp://127.0.0.1:{two.port}")
    sub = reader.subscribe("/queue/cluster")
    message = sub.receive(5)
    assert message is not None and message.body == b"on two"
    reader.ack(message)
    assert sub.receive(0.3) is None  # what went to server one stayed there


def test_connect_goes_on_to_the_next_member_when_the_pinned_one_is_down(server_factory,
                                                                     client_factory):
    up = server_factory(name="up")
    client = client_factory(f"cluster:(stomp://127.0.0.1:{free_port()},"
                            f"stomp://127.0.0.1:{up.port})?clusterMember=0")
    assert client.server == f"127.0.0.1:{up.port}"
    assert client.send("/queue/cluster-connect", b"x").outcome is Outcome.CONFIRMED
