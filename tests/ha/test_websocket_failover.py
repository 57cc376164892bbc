"""STOMP over WebSocket and the pair (issue 22): a PASSIVE backup refuses WebSocket clients
naming the active server, as on TCP; stompjs (Node) sends and receives through a kill -9
of the active server with its own reconnect, nothing receipted lost, nothing doubled."""

from __future__ import annotations

import asyncio
import collections
import json
import subprocess
import threading

import pytest

from tests.ha.pair import HOST, NAMES, Pair
from tests.serverproc import free_port
from tests.support.jsclient import start_script
from tests.support.wsstomp import WsStomp

pytestmark = pytest.mark.timeout(90)


def ws_pair(pair_factory) -> tuple[Pair, dict[str, str]]:
    """A formed pair whose servers both listen for WebSocket clients; returns their URLs."""
    ports = {name: free_port() for name in NAMES}
    pair = pair_factory(flags=["--allow-anonymous"],
                        flags_for={n: ["--stomp-ws", f"{HOST}:{ports[n]}"] for n in NAMES})
    pair.start(parallel=True)
    pair.wait_formed()
    return pair, {name: f"ws://{HOST}:{ports[name]}/stomp" for name in NAMES}


def test_passive_refuses_websocket_clients_naming_the_active_one(pair_factory) -> None:
    pair, urls = ws_pair(pair_factory)
    primary, backup = pair.stomp_address("primary"), pair.stomp_address("backup")

    async def scenario() -> None:
        async with await WsStomp.open(urls["backup"]) as refused:
            error = await refused.connect(expect="ERROR")
            assert error.headers["message"] == \
                f"this server is PASSIVE: connect to the active server at {primary}"
            assert error.headers["active-server"] == primary
            await refused.closed()
        async with await WsStomp.open(urls["primary"]) as served:
            connected = await served.connect()
            assert connected.headers["topology"].split(",") == [primary, backup]

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_stompjs_through_a_kill_9_failover(pair_factory) -> None:
    pair, urls = ws_pair(pair_factory)
    queue = "/queue/stompjs-failover"
    script = start_script("failover.cjs", {
        "urls": [urls["primary"], urls["backup"]], "queue": queue, "login": "", "passcode": "",
        "before": 150, "after": 150, "window": 20, "timeout_ms": 45000})
    assert script.stdout is not None
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(script.stderr or ()), daemon=True).start()
    lines: list[str] = []
    try:
        for line in script.stdout:
            lines.append(line)
            event = json.loads(line)["event"]
            if event == "kill":
                pair.kill("primary")
                pair.wait_active(15, "backup")
            else:
                break
        script.wait(20)
    except (subprocess.TimeoutExpired, TimeoutError):
        script.kill()
        raise
    finally:
        if script.poll() is None:
            script.kill()
    assert script.returncode == 0, f"{lines[-1:]}\n{''.join(stderr)[-3000:]}"
    report = json.loads(lines[-1])
    assert [json.loads(line)["event"] for line in lines] == ["kill", "done"]

    # both clients reconnected to the backup (stompjs' reconnect, beforeConnect's URL)
    for client in ("producer", "consumer"):
        assert report["connects"][client][0] == urls["primary"]
        assert report["connects"][client][-1] == urls["backup"], report["connects"]
    assert report["resent"] > 0  # unreceipted at the kill: sent again, same dup-id
    receipted = report["receipted"]
    assert len(receipted) >= 300 and len(set(receipted)) == len(receipted)
    delivered = collections.Counter(dup_id for dup_id, _ in report["deliveries"])
    missing = set(receipted) - set(delivered)
    assert not missing, f"receipted, never delivered: {sorted(missing)[:10]}"
    # a message comes again only when its ACK was not confirmed (lost with the primary):
    # once an ACK is receipted the message is gone for good, and a dup-id is stored once
    again = [dup_id for dup_id, after_ack_receipt in report["deliveries"] if after_ack_receipt]
    assert not again, f"delivered again after a receipted ACK: {again[:10]}"
    assert set(delivered) == set(receipted)  # every message sent was receipted in the end
    print(f"{len(receipted)} receipted, {report['resent']} sent again, "
          f"{len(report['deliveries'])} deliveries of {len(delivered)} messages, "
          f"{len(report['errors'])} refusals")
    status = pair.status("backup")
    assert status is not None
    assert status["destinations"].get(queue, {}).get("messages", 0) == 0
