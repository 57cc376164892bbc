"""The backups this member hosts for other lives (docs/cluster.md, "Colocated backups"):
one child process each, a pairmq server of its own (a Python process has one core's worth
of GIL), supervised here. A child that fails is started again; one that ends by itself
(a backup that scaled down) is not. Each dies with this process (cli/hosted_backup.py
asks the kernel to kill it then): a kill -9 of the member takes its hosted backups with
it, as the machine's death would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import signal
import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from pairmq.server.config import ServerConfig

log = logging.getLogger("pairmq.cluster")
RESTART_DELAY_S = 1.0
STOP_TIMEOUT_S = 30.0
SPEC_NAME = "hosted-backup.config"  # the child's configuration, in its data directory
LOG_NAME = "server.log"


class HostedState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"  # it failed: started again in a moment
    STOPPING = "stopping"  # asked to end (SIGTERM): not started again, whatever its exit
    STOPPED = "stopped"


@dataclass
class HostedBackup:
    live: str  # the live's member name
    slot: int  # its ports are this member's plus backup_port_offset times this
    config: ServerConfig
    state: HostedState = HostedState.STARTING
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    watcher: asyncio.Task[None] | None = None

    @property
    def stopping(self) -> bool:
        """Asked to end (read again after every wait: `stop` may have come meanwhile)."""
        return self.state is HostedState.STOPPING

    def status(self) -> dict[str, Any]:
        c = self.config
        return {"live": self.live, "name": c.name, "stomp": c.client_listener, "ha": c.listen,
                "admin": c.admin, "pid": self.process.pid if self.process else None,
                "state": self.state.value, "restarts": self.restarts, "data_dir": c.data_dir}


class HostedBackups:
    def __init__(self) -> None:
        self.backups: dict[str, HostedBackup] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    @property
    def lives(self) -> frozenset[str]:
        """The lives this member hosts a backup for (a stopped one no longer counts)."""
        return frozenset(live for live, b in self.backups.items()
                         if b.state is not HostedState.STOPPED)

    def free_slot(self) -> int:
        taken = {b.slot for b in self.backups.values() if b.state is not HostedState.STOPPED}
        slot = 1
        while slot in taken:
            slot += 1
        return slot

    def start(self, live: str, slot: int, config: ServerConfig) -> None:
        backup = HostedBackup(live, slot, config)
        self.backups[live] = backup
        backup.watcher = asyncio.get_running_loop().create_task(self._supervise(backup))

    async def _spawn(self, b: HostedBackup) -> asyncio.subprocess.Process:
        home = Path(b.config.data_dir)
        home.mkdir(parents=True, exist_ok=True)
        spec = home / SPEC_NAME
        spec.unlink(missing_ok=True)
        # it holds the users' and the pair's secrets: readable by this user only
        fd = os.open(spec, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pickle.dumps(b.config))
        with open(home / LOG_NAME, "ab") as out:
            return await asyncio.create_subprocess_exec(
                sys.executable, "-m", "pairmq.cli.hosted_backup", str(spec),
                str(os.getpid()), stdin=asyncio.subprocess.DEVNULL, stdout=out,
                stderr=asyncio.subprocess.STDOUT)

    async def _supervise(self, b: HostedBackup) -> None:
        while not b.stopping:
            try:
                process = await self._spawn(b)
            except OSError as e:
                log.error("Cannot start the backup of live %s here: %s", b.live, e)
                b.state = HostedState.RESTARTING
                await asyncio.sleep(RESTART_DELAY_S)
                continue
            b.process = process
            if b.stopping:  # asked to end while it was being started
                process.terminate()
                break
            b.state = HostedState.RUNNING
            log.info("Hosting the backup of live %s (pid %d, STOMP %s, HA %s, log %s)",
                     b.live, process.pid, b.config.client_listener, b.config.listen,
                     Path(b.config.data_dir) / LOG_NAME)
            code = await process.wait()
            if b.stopping:
                break
            if code == 0:  # it ended by itself: a backup that scaled down, or was stopped
                log.info("The backup of live %s hosted here ended (exit 0): not restarted",
                         b.live)
                break
            b.restarts += 1
            b.state = HostedState.RESTARTING
            log.warning("The backup of live %s hosted here exited with %s: restarting it",
                        b.live, code if code >= 0 else f"signal {-code}")
            await asyncio.sleep(RESTART_DELAY_S)
        b.state = HostedState.STOPPED

    def stop_soon(self, live: str, why: str) -> None:
        task = asyncio.get_running_loop().create_task(self.stop(live, why))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def stop(self, live: str, why: str) -> None:
        b = self.backups.pop(live, None)
        if b is None:
            return
        log.info("Stopping the backup of live %s hosted here: %s", live, why)
        b.state = HostedState.STOPPING
        process = b.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                log.warning("The backup of live %s did not stop within %g s: killed", live,
                            STOP_TIMEOUT_S)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        if b.watcher is not None:
            b.watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await b.watcher
        b.state = HostedState.STOPPED

    async def close(self) -> None:
        await asyncio.gather(*self._stopping, *(self.stop(live, "this member stops")
                                                for live in list(self.backups)))

    def status(self) -> list[dict[str, Any]]:
        return [b.status() for b in sorted(self.backups.values(), key=lambda b: b.live)]
