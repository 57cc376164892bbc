"""`pairmq witness`: the third party that grants the active server its lease."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from pairmq.ha import channel as ch
from pairmq.ha.lease import WitnessLeases, answer
from pairmq.server.pair.ha_link import accept_link, listen, logged_refusals, split_address
from pairmq.server.process import setup_logging, until_stop_signal
from pairmq.server.tls import TlsContexts, TlsError, TlsFiles

log = logging.getLogger("pairmq.witness")

HANDSHAKE_TIMEOUT_S = 5.0


class Witness:
    def __init__(self, listen: str, secret: str, state_file: Path | None,
                 tls: TlsContexts | None = None) -> None:
        self.listen = listen
        self.secret = secret
        self.state_file = state_file
        self.tls = tls  # mutual TLS: the servers' certificates must come from its CA
        self.leases = WitnessLeases()
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    def load(self) -> None:
        """Remember holder, epoch and standby across restarts; sit out the last lease."""
        if self.state_file is None or not self.state_file.exists():
            return
        state = json.loads(self.state_file.read_text())
        self.leases.holder = state.get("holder")
        self.leases.epoch = int(state.get("epoch", 0))
        self.leases.standby = state.get("standby")
        self.leases.last_ms = int(state.get("last_ms", 0))
        # The holder's lease may still be running: nobody else gets one before it could end.
        self.leases.expires = time.monotonic() + self.leases.last_ms / 1000
        log.info("Witness state loaded: %s holds epoch %d (standby %s)", self.leases.holder,
                 self.leases.epoch, self.leases.standby)

    def _save(self) -> None:
        if self.state_file is None:
            return
        state = {"holder": self.leases.holder, "epoch": self.leases.epoch,
                 "standby": self.leases.standby, "last_ms": self.leases.last_ms}
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_file)

    async def start(self) -> None:
        host, port = split_address(self.listen)
        self._server = await listen(
            self._handle, host, port, self.tls.listener("peer_server") if self.tls else None,
            logged_refusals(log, "connection"))
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("pairmq witness ready: listening on %s:%d%s", host, self.port,
                 " (mutual TLS)" if self.tls else "")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            link = await accept_link(reader, writer, self.secret, {"name": "witness"},
                                     HANDSHAKE_TIMEOUT_S)
        except ch.ChannelError as e:
            log.warning("Refused connection from %s: %s", writer.get_extra_info("peername"), e)
            writer.close()
            return
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
            # A port probe or a peer that went away mid-handshake: nothing to worry about.
            log.debug("Connection from %s ended during the handshake: %s",
                      writer.get_extra_info("peername"), e)
            writer.close()
            return
        try:
            while True:
                kind, payload = await link.recv()
                if kind != ch.LEASE:
                    raise ch.ChannelError(f"unexpected {ch.NAMES.get(kind, kind)}")
                link.send_json(ch.LEASE_REPLY, self.answer(ch.decode_json(payload)))
        except (ConnectionError, OSError, ch.ChannelError, asyncio.IncompleteReadError):
            pass
        finally:
            link.close()

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        leases = self.leases
        before = (leases.holder, leases.epoch, leases.standby)
        reply = answer(leases, request, time.monotonic())
        after = (leases.holder, leases.epoch, leases.standby)
        if after != before:
            self._save()
            log.info("Lease: %s holds epoch %d, in-sync backup %s (was %s, epoch %d, backup %s)",
                     after[0], after[1], after[2], before[0], before[1], before[2])
        elif request.get("op") == "activate" and not reply["granted"]:
            log.info("Refused activation of %s with epoch %s: %s", request.get("name"),
                     request.get("epoch"), reply["reason"])
        return reply

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def serve_witness(listen: str, secret: str, state_file: Path | None,
                        tls: TlsFiles | None = None) -> None:
    contexts = TlsContexts(tls, ("peer_server",)) if tls is not None else None
    witness = Witness(listen, secret, state_file, contexts)
    witness.load()
    await witness.start()
    if contexts is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, _reload, contexts)
    await until_stop_signal()
    await witness.stop()


def _reload(contexts: TlsContexts) -> None:
    try:
        contexts.reload()
    except TlsError as e:
        log.error("TLS reload refused, the running certificates stay: %s", e)
    else:
        log.info("TLS certificates reloaded: new connections use them")


def run_witness(listen: str, secret: str, state_file: Path | None, log_level: str,
                tls: TlsFiles | None = None) -> None:
    setup_logging(log_level)
    asyncio.run(serve_witness(listen, secret, state_file, tls))
