"""STOMP over WebSocket ([server] stomp_ws, issue 22): real servers, aiohttp's WebSocket
client, stomp.py on TCP beside it, and stompjs under Node. One STOMP frame per WebSocket
message; login, limits, heart-beats and flow control as on TCP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import stomp

from pairmq.server.config import ConfigError, load_config
from tests.integration.clients import Collector
from tests.serverproc import ServerProcess, free_port
from tests.support.admin import (
    admin_request,
    admin_status,
    admin_user_flags,
    hashed,
    status_when_up,
)
from tests.support.certs import make_pki
from tests.support.jsclient import start_script
from tests.support.waiting import wait_until
from tests.support.wsstomp import Closed, WsStomp

HOST = "127.0.0.1"
TEXT, BINARY = aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY

pytestmark = pytest.mark.timeout(60)


def ws_server(server_factory: Callable[..., ServerProcess], *flags: str,
              anonymous: bool = False, tls: bool = False) -> tuple[ServerProcess, str]:
    """A server with a WebSocket listener (and alice/secret); returns it and its URL."""
    port = free_port()
    srv = server_factory("--user", f"alice:{hashed('secret')}", "--stomp-ws", f"{HOST}:{port}",
                         *(["--stomp-ws-tls"] if tls else []), *flags, anonymous=anonymous)
    # the helper waited for the TCP listener; the WebSocket one opens just after it
    wait_until(lambda: " ready: " in srv.logs(), "the server ready")
    url = f"{'wss' if tls else 'ws'}://{HOST}:{port}/stomp"
    assert f"STOMP over WebSocket on {url}" in srv.logs()
    return srv, url


def run(coroutine: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 45))  # type: ignore[arg-type]


def connection_protocols(admin: str) -> list[str]:
    """The protocol of each connection, as the operator's connection list shows it."""
    status_when_up(admin)
    code, _headers, body = admin_request(admin, "/api/connections")
    assert code == 200, body
    return [row["protocol"] for row in body["connections"]]


def test_send_subscribe_receipt_one_frame_per_message(server_factory) -> None:
    admin = f"{HOST}:{free_port()}"
    srv, url = ws_server(server_factory, "--admin", admin, *admin_user_flags())

    async def scenario() -> None:
        async with await WsStomp.open(url) as client:
            assert client.protocol == "v12.stomp"
            connected = await client.connect("alice", "secret")
            assert connected.headers["version"] == "1.2"
            # three frames in one (binary) WebSocket message: the server reads them all
            await client.send_raw(
                b"SUBSCRIBE\nid:s1\ndestination:/queue/ws\nreceipt:sub\n\n\0"
                b"SEND\ndestination:/queue/ws\nreceipt:r1\n\nhello \xc3\xa9\0"
                b"SEND\ndestination:/queue/ws\nreceipt:r2\ncontent-length:5\n\n\0\xff\0\x01\0\0",
                binary=True)
            frames = [await client.frame() for _ in range(5)]
            # each message held one frame (WsStomp.frame checks it), heart-beats apart
            by_command: dict[str, list] = {}
            for frame in frames:
                by_command.setdefault(frame.command, []).append(frame)
            assert [f.headers["receipt-id"] for f in by_command["RECEIPT"]] == \
                ["sub", "r1", "r2"]
            text, binary = by_command["MESSAGE"]
            assert text.body == "hello é".encode() and text.headers["subscription"] == "s1"
            assert binary.body == b"\0\xff\0\x01\0"  # NULs and a non-UTF-8 byte intact
            kinds = {got.data: got.kind for got in client.received}
            messages = [data for data in kinds if data.startswith(b"MESSAGE")]
            # text when the frame is UTF-8, binary when it is not
            assert [kinds[m] for m in messages] == [TEXT, BINARY]
            assert all(kinds[d] is TEXT for d in kinds if not d.startswith(b"MESSAGE"))
            listed = await asyncio.get_running_loop().run_in_executor(
                None, connection_protocols, admin)
            assert listed == ["stomp+ws"]  # the operator's connection list

    run(scenario())
    assert " is stomp+ws (WebSocket subprotocol v12.stomp)" in srv.logs()


def test_subprotocols_negotiated_and_none_accepted(server_factory) -> None:
    _srv, url = ws_server(server_factory)

    async def scenario() -> None:
        for offered, chosen in ((("v11.stomp", "v12.stomp"), "v11.stomp"),
                                (("v10.stomp",), "v10.stomp"), ((), None), (("mqtt",), None)):
            async with await WsStomp.open(url, protocols=offered) as client:
                assert client.protocol == chosen, offered
                # the CONNECT decides the STOMP version, whatever the subprotocol
                connected = await client.connect("alice", "secret",
                                                 {"accept-version": "1.0,1.1"})
                assert connected.headers["version"] == "1.1"

    run(scenario())


def test_binary_messages_from_the_client_and_frames_split_across_messages(
        server_factory) -> None:
    _srv, url = ws_server(server_factory, "--max-frame-bytes", "65536")

    async def scenario() -> None:
        async with await WsStomp.open(url) as client:
            await client.connect("alice", "secret")
            await client.send("SUBSCRIBE", {"id": "1", "destination": "/queue/parts"},
                              binary=True)
            frame = b"SEND\ndestination:/queue/parts\nreceipt:r\ncontent-length:3\n\nabc\0"
            for i in range(0, len(frame), 7):  # a frame in pieces: the parser waits
                await client.send_raw(frame[i:i + 7], binary=True)
            got = [await client.frame(), await client.frame()]
            assert sorted(f.command for f in got) == ["MESSAGE", "RECEIPT"]
            assert next(f for f in got if f.command == "MESSAGE").body == b"abc"
            # a message larger than max_frame_bytes + 64 KiB ends the WebSocket (1009)
            await client.send_raw(b"x" * (2 * 65536 + 1), binary=True)
            with pytest.raises(Closed):
                await client.frame()
            assert client.ws.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG

    run(scenario())


def test_wrong_password_refused_with_an_error_then_closed(server_factory) -> None:
    _srv, url = ws_server(server_factory)

    async def scenario() -> None:
        async with await WsStomp.open(url) as client:
            error = await client.connect("alice", "wrong", expect="ERROR")
            assert error.headers["message"] == "authentication failed"
            await client.closed()
        async with await WsStomp.open(url) as client:  # anonymous: refused too
            error = await client.connect(expect="ERROR")
            assert error.headers["message"] == "authentication failed"
            await client.closed()

    run(scenario())


def test_heart_beats_each_in_its_own_message_and_a_silent_client_dropped(
        server_factory) -> None:
    _srv, url = ws_server(server_factory, "--heartbeat-ms", "200")

    async def scenario() -> None:
        async with await WsStomp.open(url) as client:
            connected = await client.connect("alice", "secret", {"heart-beat": "200,200"})
            assert connected.headers["heart-beat"] == "200,200"
            started = time.monotonic()
            while time.monotonic() - started < 1.2:  # we beat, the server beats
                await client.send_raw(b"\n")
                with contextlib.suppress(TimeoutError):
                    await client.receive(0.1)
            beats = [got for got in client.received if got.heartbeat]
            assert len(beats) >= 3 and all(got.data == b"\n" for got in beats)
            # silent now: the server drops us after 2 x 200 ms without a byte
            silent = time.monotonic()
            await client.closed(5)
            assert time.monotonic() - silent < 3

    run(scenario())


def test_pre_login_limit_and_connections_counted_per_address(server_factory) -> None:
    _srv, url = ws_server(server_factory, "--max-connections-per-address", "2")

    # a third connection from one address is refused; once one leaves, one more is let in
    async def attempt(url: str) -> bool:
        async with await WsStomp.open(url) as client:
            frame = await client.connect("alice", "secret", expect="")
            if frame.command == "ERROR":
                assert "too many connections from" in frame.headers["message"]
            return frame.command == "CONNECTED"

    async def counted() -> None:
        async with await WsStomp.open(url) as big:
            error = await big.connect("alice", "secret", {"padding": "x" * 10_000},
                                      expect="ERROR")
            assert "before login" in error.headers["message"], error.headers
            await big.closed()
        first, second = await WsStomp.open(url), await WsStomp.open(url)
        try:
            await first.connect("alice", "secret")
            await second.connect("alice", "secret")
            assert not await attempt(url)
            await first.close()
            deadline = time.monotonic() + 5
            while not await attempt(url):
                assert time.monotonic() < deadline, "a connection that left still counted"
                await asyncio.sleep(0.05)
        finally:
            await first.close()
            await second.close()

    run(counted())


def test_stomp_py_on_tcp_and_websocket_clients_interoperate(server_factory) -> None:
    srv, url = ws_server(server_factory)
    conn = stomp.Connection12([srv.address], reconnect_attempts_max=1, timeout=5)
    listener = Collector()
    conn.set_listener("collector", listener)
    conn.connect("alice", "secret", wait=True)
    try:
        conn.subscribe("/queue/to-tcp", id="1", ack="auto", headers={"receipt": "sub"})
        listener.wait_for(lambda: "sub" in listener.receipts, what="the subscription")

        async def scenario() -> None:
            async with await WsStomp.open(url) as client:
                await client.connect("alice", "secret")
                await client.send("SEND", {"destination": "/queue/to-tcp", "receipt": "r",
                                           "content-type": "text/plain"}, b"from websocket")
                assert (await client.expect("RECEIPT")).headers["receipt-id"] == "r"
                await client.send("SUBSCRIBE", {"id": "w", "destination": "/queue/to-ws",
                                                "receipt": "s"})
                await client.expect("RECEIPT")
                conn.send("/queue/to-ws", "from tcp \u2713", headers={"x-from": "stomp.py"})
                message = await client.expect("MESSAGE")
                assert message.body == "from tcp \u2713".encode()
                assert message.headers["x-from"] == "stomp.py"

        run(scenario())
        listener.wait_for(lambda: listener.messages, what="the WebSocket producer's message")
        assert listener.messages[0].body == "from websocket"
    finally:
        conn.disconnect()


def test_a_slow_websocket_consumer_stalls_delivery_and_loses_nothing(server_factory) -> None:
    admin = f"{HOST}:{free_port()}"
    _srv, url = ws_server(server_factory, "--admin", admin, *admin_user_flags())
    # 32 MB: the server hands a consumer 512 messages a turn (8 MB here), and more only
    # once the WebSocket's queue is back under its low-water mark
    queue, count, size = "/queue/slow", 2000, 16 * 1024

    def depth() -> int:
        status = admin_status(admin)
        assert status is not None
        return status["destinations"].get(queue, {}).get("messages", 0)

    async def scenario() -> None:
        async with await WsStomp.open(url) as producer:
            await producer.connect("alice", "secret")
            for i in range(count):
                await producer.send("SEND", {"destination": queue, "seq": str(i)},
                                    bytes([i % 256]) * size)
            await producer.send("DISCONNECT", {"receipt": "all"})
            await producer.expect("RECEIPT")
        status_when_up(admin)
        async with await WsStomp.open(url) as consumer:
            consumer.receive_buffer(64 * 1024)  # the kernel's would take all of it
            await consumer.connect("alice", "secret")
            await consumer.send("SUBSCRIBE", {"id": "1", "destination": queue})
            await asyncio.sleep(1.5)  # not reading: the server stops at its high-water mark
            waiting = depth()
            assert waiting > count // 4, f"{waiting} of {count} left: delivery did not stall"
            for i in range(count):
                message = await consumer.expect("MESSAGE")
                assert message.headers["seq"] == str(i)
                assert message.body == bytes([i % 256]) * size
        assert depth() == 0

    run(scenario())


def test_wss_with_the_tls_certificates(server_factory, tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    admin = f"{HOST}:{free_port()}"
    srv, url = ws_server(server_factory, *pki.server_flags(), "--admin", admin,
                         *admin_user_flags(), tls=True)
    context = ssl.create_default_context(cafile=pki.ca_file)

    async def scenario() -> None:
        async with await WsStomp.open(url, ssl_context=context) as client:
            await client.connect("alice", "secret")
            await client.send("SUBSCRIBE", {"id": "1", "destination": "/queue/wss"})
            await client.send("SEND", {"destination": "/queue/wss"}, b"secret stuff")
            assert (await client.expect("MESSAGE")).body == b"secret stuff"
            listed = await asyncio.get_running_loop().run_in_executor(
                None, connection_protocols, admin)
            assert listed == ["stomp+wss"]
        with pytest.raises(aiohttp.ClientError):  # plain ws:// to the wss:// port
            await WsStomp.open(url.replace("wss://", "ws://"))
        with pytest.raises(aiohttp.ClientError):  # a certificate it does not trust
            await WsStomp.open(url, ssl_context=ssl.create_default_context(
                cafile=str(pki.foreign.cert_path)))

    run(scenario())
    assert " is stomp+wss (WebSocket subprotocol v12.stomp)" in srv.logs()


def test_server_stop_tells_websocket_clients_why(server_factory) -> None:
    srv, url = ws_server(server_factory)

    async def scenario() -> None:
        async with await WsStomp.open(url) as client:
            await client.connect("alice", "secret")
            stopping = asyncio.get_running_loop().run_in_executor(None, srv.stop)
            error = await client.expect("ERROR")
            assert "stopping" in error.headers["message"]
            await client.closed()
            assert await stopping == 0

    started = time.monotonic()
    run(scenario())
    assert time.monotonic() - started < 8


def test_plain_http_gets_a_hint(server_factory) -> None:
    _srv, url = ws_server(server_factory)
    http = url.replace("ws://", "http://")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(http, timeout=5)
    assert refused.value.code == 426 and b"WebSocket" in refused.value.read()
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(http.replace("/stomp", "/other"), timeout=5)
    assert missing.value.code == 404


def test_stompjs_sends_and_receives(server_factory) -> None:
    _srv, url = ws_server(server_factory)
    script = start_script("roundtrip.cjs", {"url": url, "login": "alice", "passcode": "secret",
                                            "queue": "/queue/js", "count": 50})
    try:
        out, err = script.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        script.kill()
        out, err = script.communicate()
    assert script.returncode == 0, f"{out}\n{err}"
    result = json.loads(out.splitlines()[-1])
    assert result["bodies"] == [f"message {i} \u2713" for i in range(50)]
    assert result["binary"] == list(range(256))  # a body of every byte, intact
    assert result["receipts"] == 50


# ------------------------------------------------------------ configuration


@pytest.mark.parametrize(("overrides", "message"), [
    ({"stomp": "127.0.0.1:61613", "stomp_ws": "127.0.0.1:61613"},
     "[server] stomp and stomp_ws are the same address (127.0.0.1:61613)"),
    ({"stomp_tls": "127.0.0.1:61617", "stomp_ws": "127.0.0.1:61617", "cert": "c", "key": "k"},
     "[server] stomp_tls and stomp_ws are the same address"),
    ({"stomp_ws": "127.0.0.1:8161", "admin": "127.0.0.1:8161"},
     "[server] stomp_ws and admin are the same address"),
    ({"stomp_ws_tls": True}, "stomp_ws_tls is set but stomp_ws is empty"),
    ({"stomp_ws": "127.0.0.1:61623", "stomp_ws_tls": True},
     "[tls] cert and key are required by stomp_ws_tls"),
    ({"stomp_ws": "nowhere"}, "--stomp-ws must be HOST:PORT"),
])
def test_configuration_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(overrides=overrides)
    assert message in str(refused.value)


def test_configuration_accepted() -> None:
    config = load_config(overrides={"stomp": "127.0.0.1:0", "stomp_ws": "127.0.0.1:0"})
    assert config.stomp_ws == "127.0.0.1:0" and not config.stomp_ws_tls
    assert not config.tls_used
    assert load_config().stomp_ws == ""  # off unless asked

