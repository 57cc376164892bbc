"""A TCP proxy that can be partitioned: forwards bytes both ways until told to CUT.

Run as its own process (the wrapper `NetProxy` below does it for tests):

    python tests/netproxy.py --listen 127.0.0.1:7100 --target 127.0.0.1:7001

A CUT is a blackhole, the way a real network partition looks to both ends: nothing
is closed or reset, bytes simply stop arriving. Connections that exist stop being
read on the cut side (what was written piles up in the kernel's buffers, then the
writers block). New connections are accepted but go nowhere: the client sees an
established socket that never answers, and the target never hears of it. A HEAL
resumes forwarding on the connections that lived through the cut (what was held is
delivered late, as TCP retransmission would, and whatever an end closed meanwhile
shows up as its close); the connections born during the cut are closed then (their
client's first bytes were written into the void; a real client would still be
waiting for its SYN to be answered, and connects afresh either way). With
`heal drop` every connection that lived through the cut is closed.

A cut may be one-way: `up` stops client -> target, `down` stops target -> client
(new connections are held either way, since a handshake needs both directions).
A cut may also be armed, to fail the link at a precise point: `arm down` cuts the
`down` direction right after the next bytes from a client went up (the request is
delivered, its answer is lost); `arm down 60` only after the next client chunk of 60
bytes or more (a request of one size, the others passing).

Control: SIGUSR1 = cut both ways, SIGUSR2 = heal; or a line protocol on the control
port (127.0.0.1 only), one command per line, one reply line each:

    cut [both|up|down]  -> "ok cut both"
    arm [both|up|down] [N] -> "ok armed down" (cut right after the next client bytes,
                          or the next chunk of N bytes or more, go up)
    heal [drop]         -> "ok healed"
    status              -> a JSON object (cut directions, connection counts, bytes)

Once listening the proxy prints one line to stdout: `READY <listen port> <control port>`.
It stops on SIGTERM/SIGINT, on the control command `quit`, or when its parent exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HOST = "127.0.0.1"
CHUNK = 65536
PARENT_CHECK_S = 0.5
DIRECTIONS = ("up", "down")


def split_address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host or HOST, int(port)


# ---------------------------------------------------------------------------- the proxy


class Link:
    """One client connection and, once connected, its connection to the target."""

    def __init__(self, proxy: Proxy, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.client = (reader, writer)
        self.target: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.born_in_cut = False
        self.cut_seen = False  # lived through a cut (dropped by `heal drop`)
        self.tasks: list[asyncio.Task] = []
        self.closed = False

    async def run(self) -> None:
        proxy = self.proxy
        if proxy.is_cut() and not await self._hold():
            return
        if self.closed:
            return
        try:
            self.target = await asyncio.wait_for(
                asyncio.open_connection(proxy.target_host, proxy.target_port), 10)
        except (OSError, TimeoutError):
            proxy.stats["refused"] += 1
            self.close()
            return
        tsock = self.target[1].get_extra_info("socket")
        if tsock is not None:
            tsock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        proxy.stats["forwarded_connections"] += 1
        loop = asyncio.get_running_loop()
        self.tasks = [loop.create_task(self._pump(self.client[0], self.target[1], "up")),
                      loop.create_task(self._pump(self.target[0], self.client[1], "down"))]
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.close()

    async def _hold(self) -> bool:
        """Born during a cut: the target never hears of this connection. Closed at the heal
        (or when the client gives up first). Returns whether to go on (never)."""
        self.born_in_cut = self.cut_seen = True
        loop = asyncio.get_running_loop()
        gone = loop.create_task(self._client_gone())
        healed = loop.create_task(self.proxy.open_both.wait())
        try:
            await asyncio.wait({gone, healed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            healed.cancel()
            gone.cancel()
            await asyncio.gather(gone, healed, return_exceptions=True)
        self.proxy.stats["dropped_held"] += 1
        self.close()
        return False

    async def _client_gone(self) -> None:
        reader = self.client[0]
        try:
            while await reader.read(CHUNK):
                pass  # written into the void
        except (OSError, ConnectionError):
            pass

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    direction: str) -> None:
        gate = self.proxy.open[direction]
        try:
            while True:
                await gate.wait()
                data = await reader.read(CHUNK)
                # A cut that came while we were reading holds these bytes too.
                await gate.wait()
                if self.closed:
                    return
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                self.proxy.stats[f"bytes_{direction}"] += len(data)
                writer.write(data)
                if direction == "up" and self.proxy.armed \
                        and len(data) >= self.proxy.armed_min_bytes:
                    # Before the target can answer: its answer meets the cut.
                    self.proxy.cut(self.proxy.armed)
                await writer.drain()
        except (OSError, ConnectionError):
            # One end failed: let the other one see it the way TCP would.
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for _, writer in (self.client, self.target) if self.target else (self.client,):
            writer.close()
        for task in self.tasks:
            task.cancel()
        self.proxy.links.discard(self)


class Proxy:
    def __init__(self, listen: str, target: str, control: str) -> None:
        self.listen_host, self.listen_port = split_address(listen)
        self.target_host, self.target_port = split_address(target)
        self.control_host, self.control_port = split_address(control)
        self.open = {d: asyncio.Event() for d in DIRECTIONS}
        self.open_both = asyncio.Event()
        for event in (*self.open.values(), self.open_both):
            event.set()
        self.links: set[Link] = set()
        self.armed: str | None = None  # cut this way once the next client bytes went up
        self.armed_min_bytes = 0  # ... in a chunk of at least this many bytes
        self.stats = {"accepted": 0, "forwarded_connections": 0, "refused": 0, "dropped_held": 0,
                      "bytes_up": 0, "bytes_down": 0, "cuts": 0, "heals": 0}
        self.stopped = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()

    def is_cut(self) -> bool:
        return not self.open_both.is_set()

    def cut(self, direction: str = "both") -> str:
        if direction not in ("both", *DIRECTIONS):
            raise ValueError(f"cut direction must be both, up or down, got {direction!r}")
        self.armed = None
        for d in DIRECTIONS if direction == "both" else (direction,):
            self.open[d].clear()
        self.open_both.clear()
        for link in self.links:
            link.cut_seen = True
        self.stats["cuts"] += 1
        return f"ok cut {direction}"

    def arm(self, direction: str = "both", min_bytes: int = 0) -> str:
        if direction not in ("both", *DIRECTIONS):
            raise ValueError(f"arm direction must be both, up or down, got {direction!r}")
        self.armed = direction
        self.armed_min_bytes = min_bytes
        return f"ok armed {direction}"

    def heal(self, drop: bool = False) -> str:
        self.armed = None
        if drop:
            for link in list(self.links):
                if link.cut_seen:
                    link.close()
        for event in (*self.open.values(), self.open_both):
            event.set()
        for link in self.links:
            link.cut_seen = False
        self.stats["heals"] += 1
        return "ok healed"

    def status(self) -> str:
        cut = [d for d in DIRECTIONS if not self.open[d].is_set()]
        return json.dumps({"cut": cut, "armed": self.armed, "links": len(self.links),
                           "held": sum(1 for link in self.links if link.target is None),
                           "listen_port": self.listen_port, "control_port": self.control_port,
                           **self.stats})

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.stats["accepted"] += 1
        link = Link(self, reader, writer)
        self.links.add(link)
        await link.run()

    async def _control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                words = line.decode(errors="replace").split()
                if not words:
                    continue
                try:
                    reply = self.command(words)
                except ValueError as e:
                    reply = f"error {e}"
                writer.write(reply.encode() + b"\n")
                await writer.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            writer.close()

    def command(self, words: list[str]) -> str:
        op, args = words[0].lower(), words[1:]
        if op == "cut":
            return self.cut(args[0] if args else "both")
        if op == "arm":
            return self.arm(args[0] if args else "both", int(args[1]) if len(args) > 1 else 0)
        if op == "heal":
            if args and args[0] != "drop":
                raise ValueError(f"heal takes only 'drop', got {args[0]!r}")
            return self.heal(drop=bool(args))
        if op == "status":
            return self.status()
        if op == "quit":
            self.stopped.set()
            return "ok quitting"
        raise ValueError(f"unknown command {op!r}")

    async def _watch_parent(self, parent: int) -> None:
        while not self.stopped.is_set():
            if os.getppid() != parent:
                self.stopped.set()
                return
            await asyncio.sleep(PARENT_CHECK_S)

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        server = await asyncio.start_server(self._accept, self.listen_host, self.listen_port,
                                            reuse_address=True)
        control = await asyncio.start_server(self._control, self.control_host,
                                             self.control_port, reuse_address=True)
        self.listen_port = server.sockets[0].getsockname()[1]
        self.control_port = control.sockets[0].getsockname()[1]
        loop.add_signal_handler(signal.SIGUSR1, self.cut)
        loop.add_signal_handler(signal.SIGUSR2, self.heal)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopped.set)
        self._spawn(self._watch_parent(os.getppid()))
        print(f"READY {self.listen_port} {self.control_port}", flush=True)
        await self.stopped.wait()
        server.close()
        control.close()
        for link in list(self.links):
            link.close()
        for task in list(self._tasks):
            task.cancel()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to accept on (port 0: any)")
    parser.add_argument("--target", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--control", default=f"{HOST}:0",
                        help="HOST:PORT of the control port (default: any free port)")
    args = parser.parse_args(argv)
    proxy = Proxy(args.listen, args.target, args.control)
    asyncio.run(proxy.serve())


# ---------------------------------------------------------------------------- for tests


class NetProxy:
    """A `tests/netproxy.py` subprocess, driven over its control port.

        proxy = NetProxy(target="127.0.0.1:7001").start()
        proxy.address        # "127.0.0.1:PORT": give this to the client instead of the target
        proxy.cut(); proxy.heal(); proxy.stop()

    `cut()` and `heal()` return once the proxy has applied them.
    """

    def __init__(self, target: str, listen_port: int = 0, name: str = "proxy",
                 log_path: Path | None = None) -> None:
        self.target = target
        self.listen_port = listen_port
        self.control_port = 0
        self.name = name
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._buffer = b""
        self.events: list[tuple[float, str]] = []  # (time.monotonic(), "cut both"/"healed")

    @property
    def address(self) -> str:
        return f"{HOST}:{self.listen_port}"

    def start(self, timeout: float = 10.0) -> NetProxy:
        stderr = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--listen",
                 f"{HOST}:{self.listen_port}", "--target", self.target],
                stdout=subprocess.PIPE, stderr=stderr)
        finally:
            if self.log_path:
                stderr.close()
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline().decode() if ready else ""
        words = line.split()
        if len(words) != 3 or words[0] != "READY":
            self.stop()
            raise RuntimeError(f"{self.name}: proxy did not start (got {line!r})")
        self.listen_port, self.control_port = int(words[1]), int(words[2])
        self._control = socket.create_connection((HOST, self.control_port), timeout=timeout)
        return self

    def command(self, line: str, timeout: float = 5.0) -> str:
        if self._control is None:
            raise RuntimeError(f"{self.name}: not started")
        self._control.settimeout(timeout)
        self._control.sendall(line.encode() + b"\n")
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.name}: no answer to {line!r}")
            data = self._control.recv(4096)
            if not data:
                raise ConnectionError(f"{self.name}: control connection closed")
            self._buffer += data
        reply, _, self._buffer = self._buffer.partition(b"\n")
        text = reply.decode()
        if text.startswith("error"):
            raise ValueError(f"{self.name}: {text}")
        return text

    def cut(self, direction: str = "both") -> None:
        self.command(f"cut {direction}")
        self.events.append((time.monotonic(), f"cut {direction}"))

    def arm(self, direction: str = "down", min_bytes: int = 0) -> None:
        """Cut `direction` right after the next bytes from a client were forwarded (with
        `min_bytes`, the next chunk of at least that many)."""
        self.command(f"arm {direction} {min_bytes}")
        self.events.append((time.monotonic(), f"armed {direction}"))

    def heal(self, drop: bool = False) -> None:
        self.command("heal drop" if drop else "heal")
        self.events.append((time.monotonic(), "healed"))

    def status(self) -> dict:
        return json.loads(self.command("status"))

    def stop(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> NetProxy:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
