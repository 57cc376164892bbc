"""Role changes with connections, frames and receipts in flight.

A connection belongs to the role its server had when it was accepted; when the server
changes role (takes over, steps down, fails back), the connection is closed with an
ERROR naming the active server and is never served by the new role. A RECEIPT for a
persistent SEND is sent only once the message's own record is in the journal.
"""

from __future__ import annotations

import time
import uuid

from tests.ha.clients import Load, consumed_exactly_once
from tests.ha.pair import HOST, NAMES, SERVING, Pair
from tests.integration.rawstomp import ConnectionClosed, RawStomp, StompError, connect
from tests.support.journal import JournalIndex

FAST = {"heartbeat_ms": 100, "activation_ms": 300}  # the settings of the original report


def _address(pair: Pair, name: str) -> tuple[str, int]:
    return HOST, pair.stomp_port[name]


def _frames_until_closed(sock: RawStomp, timeout: float = 5.0) -> list | None:
    """Every frame until the server closes the connection; None if it is still open."""
    try:
        return sock.read_until_closed(timeout)
    except TimeoutError:
        return None
    except OSError:  # reset by the server after its last frame
        return []


def _frames_for(sock: RawStomp, seconds: float) -> list:
    """Every frame that arrives within `seconds` (or until the server closes)."""
    frames = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            frames.append(sock.read_frame(left))
        except (OSError, ConnectionClosed):
            break  # timed out, closed or reset
    return frames


def _queue_contents(pair: Pair, name: str, queue: str, idle: float = 1.0) -> list[bytes]:
    client, _ = connect(_address(pair, name))
    with client:
        client.send_frame("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "auto"})
        return client.bodies_until_quiet(idle)


def _send_with_receipt(pair: Pair, name: str, queue: str, body: bytes) -> None:
    client, _ = connect(_address(pair, name))
    with client:
        client.request("SEND", {"destination": queue, "persistent": "true"}, body)


def test_a_socket_opened_while_passive_is_closed_when_its_server_takes_over(pair_factory):
    """The original report: a socket accepted by the PASSIVE backup, used after failover,
    got CONNECTED and a RECEIPT (much later) for a message that was never stored."""
    pair = pair_factory(**FAST)
    pair.start(parallel=True)
    pair.wait_formed()
    queue = f"/queue/role-{uuid.uuid4().hex[:8]}"
    idle = RawStomp(_address(pair, "backup"))  # accepted while PASSIVE; nothing sent yet
    try:
        assert idle.is_open(0.3)
        passive_role = pair.status("backup")["role_generation"]
        pair.kill("primary")
        pair.wait_state("backup", SERVING, 10)
        assert pair.status("backup")["role_generation"] > passive_role, "a new role serves"
        frames = _frames_until_closed(idle)
        assert frames is not None, "the socket of the PASSIVE role is still open"
        assert [f.command for f in frames] == ["ERROR"], frames
        assert frames[0].headers.get("active-server") == pair.stomp_address("backup"), \
            "the ERROR names the server that is now active (here: the same one)"
        try:  # what the report's client did next: CONNECT and SEND on the old socket
            idle.send_frame("CONNECT", {"accept-version": "1.2", "host": "localhost"})
            idle.send_frame("SEND", {"destination": queue, "persistent": "true",
                                     "receipt": "old-socket"}, b"from the old socket")
            late = _frames_until_closed(idle, 2.0) or []
        except OSError:
            late = []
        assert not [f for f in late if f.command in ("CONNECTED", "RECEIPT")], late
    finally:
        idle.close()
    # The server serves fresh connections, and holds exactly what was receipted.
    _send_with_receipt(pair, "backup", queue, b"receipted")
    assert _queue_contents(pair, "backup", queue) == [b"receipted"]


def test_a_connected_client_of_a_server_that_stepped_down_is_never_served_again(pair_factory):
    """A client CONNECTED while its server served; the server fails back to the primary
    (a new role, PASSIVE) and later takes over again (another role): the old connection
    was closed at the first change, naming the active server, and got no RECEIPT since."""
    pair = pair_factory(**FAST)
    pair.start(parallel=True)
    pair.wait_formed()
    queue = f"/queue/role-{uuid.uuid4().hex[:8]}"
    pair.kill("primary")
    pair.wait_state("backup", SERVING, 10)
    old, _ = connect(_address(pair, "backup"))
    try:
        old.request("SEND", {"destination": queue, "persistent": "true"}, b"before")
        pair.restart("primary")  # syncs, then takes its place back (allow_failback)
        pair.wait_state("primary", "ACTIVE", 20)
        pair.wait_state("backup", "PASSIVE", 10)
        frames = _frames_until_closed(old)
        assert frames is not None, "the old connection is still open after its role ended"
        errors = [f for f in frames if f.command == "ERROR"]
        assert errors, f"the old connection was not closed with an ERROR: {frames}"
        assert errors[0].headers.get("active-server") == pair.stomp_address("primary")
        pair.kill("primary")  # the backup takes over again: yet another role
        pair.wait_state("backup", SERVING, 10)
        try:
            old.send_frame("SEND", {"destination": queue, "persistent": "true",
                                    "receipt": "after"}, b"after")
            late = _frames_until_closed(old, 2.0) or []
        except OSError:
            late = []
        assert not [f for f in late if f.command == "RECEIPT"], late
    finally:
        old.close()
    assert _queue_contents(pair, "backup", queue) == [b"before"]


def _use_early_socket(sock: RawStomp, body: bytes, journal: JournalIndex,
                      missing: list[tuple[str, str]]) -> None:
    """CONNECT and SEND on a socket accepted before the role change; any RECEIPT it gets
    (while the producer keeps the journal moving) must be for a message in the journal."""
    try:
        sock.send_frame("CONNECT", {"accept-version": "1.2", "host": "localhost"})
        sock.send_frame("SEND", {"destination": "/queue/early", "persistent": "true",
                                 "receipt": "early"}, body)
        frames = _frames_for(sock, 2.0)
    except OSError:
        return
    if any(f.command == "RECEIPT" for f in frames) and not journal.contains(body):
        missing.append(("backup", body.decode()))


def test_no_receipt_before_its_record_is_in_the_journal_through_role_changes(pair_factory):
    """A producer sends through failover, failback and a backup crash; after every RECEIPT
    the test reads the journal of the server that sent it: the message must be there."""
    pair = pair_factory(**FAST)
    pair.start(parallel=True)
    pair.wait_formed()
    queue = f"/queue/journal-{uuid.uuid4().hex[:8]}"
    addresses = [_address(pair, name) for name in NAMES]
    name_of = {_address(pair, name): name for name in NAMES}
    journals = {name: JournalIndex(pair.data_dir(name) / "journal") for name in NAMES}
    last_server: list[str] = []
    missing: list[tuple[str, str]] = []

    def check(address: tuple[str, int], dup_id: str, body: bytes) -> None:
        name = name_of[address]
        if last_server != [name]:  # another server: its journal may have been replaced
            journals[name].reset()
            last_server[:] = [name]
        if not journals[name].contains(body):
            missing.append((name, dup_id))

    load = Load(addresses, queue, prefix="j", window=8, receipt_timeout=5.0,
                on_receipt=check).start()
    try:
        time.sleep(1.0)
        # Sockets a client opened to the PASSIVE backup ahead of time (clients retrying every
        # few ms during a failover do this), used once it serves.
        early = [RawStomp(_address(pair, "backup")) for _ in range(3)]
        pair.kill("primary")  # failover
        pair.wait_state("backup", SERVING, 10)
        for i, sock in enumerate(early):
            with sock:
                _use_early_socket(sock, f"early {i}".encode(), journals["backup"], missing)
        time.sleep(1.0)
        pair.restart("primary")  # sync, then failback: both servers change role
        pair.wait_state("primary", "ACTIVE", 30)
        time.sleep(1.0)
        pair.kill("backup")  # the active loses its backup and goes on alone
        pair.wait_state("primary", "STANDALONE", 10)
        time.sleep(0.5)
        pair.restart("backup")
        pair.wait_formed(30)
        time.sleep(0.5)
    finally:
        load.stop_event.set()
    receipted = load.stop()  # raises what the producer met
    assert len(receipted) > 100, "too few receipts to say anything"
    assert not missing, (f"{len(missing)} RECEIPTs came before their record was in the "
                         f"journal of the server that sent them: {missing[:5]}")
    consumed_exactly_once(addresses, queue, receipted)


def test_a_passive_server_refuses_connect_naming_the_active_one(pair_factory):
    """What a refused client is told is what the server does: PASSIVE, and where to go."""
    pair = pair_factory(**FAST)
    pair.start(parallel=True)
    pair.wait_formed()
    try:
        connect(_address(pair, "backup"))
    except StompError as e:
        assert "PASSIVE" in e.frame.headers.get("message", "")
        assert e.frame.headers.get("active-server") == pair.stomp_address("primary")
    else:
        raise AssertionError("the PASSIVE backup accepted a client")


def test_forcing_a_passive_backup_is_refused(pair_factory):
    """`pairmq activate` is for a WAITING server; an in-sync backup says who is active."""
    pair = pair_factory(**FAST)
    pair.start(parallel=True)
    pair.wait_formed()
    result = pair.activate("backup")
    assert result.returncode != 0, result.stdout
    said = result.stdout + result.stderr
    assert "409" in said and "PASSIVE" in said and pair.stomp_address("primary") in said, said
    time.sleep(0.5)
    assert pair.state("backup") == "PASSIVE"
    assert "Forced activation cancelled" not in pair.logs("backup")
