"""A real etcd cluster on loopback, for the tests of the etcd arbiter (`[ha] witness =
"etcd://..."`). Debian's etcd-server (`make test-deps` installs it).

    cluster = EtcdCluster(tmp_path / "etcd")   # picks ports, starts nothing yet
    cluster.start()                            # every member, then waits for a leader
    cluster.url                                # "etcd://127.0.0.1:P1,127.0.0.1:P2,..."
    cluster.kill(cluster.leader())             # SIGKILL; stop() is SIGTERM
    cluster.wait_leader()                      # the index of the member that leads now
    cluster.restart(0)                         # same ports and data dir: it rejoins
    with cluster.paused(1): ...                # SIGSTOP for the block, SIGCONT after
    cluster.close()                            # every member killed (the fixture does it)

Members are addressed by index (0, 1, 2: named e1, e2, e3), stable for the cluster's life.
Each member's output goes to `workdir/etcd-eN.log` (tests/conftest.py shows the tail of
every *.log on a failure).

No member outlives the test process: each is killed when the thread that started it
exits (Linux's parent-death signal; every member is started from one thread that lives
as long as the process), which covers a pytest killed without running its fixtures' ends.

Cutting one member from the others (a partition among members) is not offered: etcd has
no way to bind its outgoing peer connections, so a proxy cannot tell who is calling.
`paused` makes a member unreachable for everyone instead.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.serverproc import free_port
from tests.support.requirements import require

ETCD = "/usr/bin/etcd"
HOST = "127.0.0.1"
# etcd's own defaults, kept: the arbiter is tested against the timing it meets in use
HEARTBEAT_MS = 100
ELECTION_MS = 1000
START_TIMEOUT = 20.0
CALL_TIMEOUT = 2.0  # one JSON gateway request

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
# Every member is forked from this one thread: the parent-death signal fires when the
# *thread* that forked a child ends, and this one ends only with the process.
_launcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="etcd-launcher")


def missing() -> str | None:
    """Why etcd cannot run here (None when it can)."""
    if not os.access(ETCD, os.X_OK):
        return (f"{ETCD} missing: `make test-deps` (or `make etcd-deps`) installs Debian's "
                "etcd-server and etcd-client")
    return None


def require_etcd() -> None:
    """Skip the test where etcd is missing (fail it in CI: tests/support/requirements.py)."""
    require(missing())


class EtcdError(Exception):
    """The JSON gateway refused a request, or did not answer in time."""


def call(endpoint: str, path: str, body: dict[str, Any] | None = None,
         timeout: float = CALL_TIMEOUT, context: ssl.SSLContext | None = None
         ) -> dict[str, Any]:
    """POST `body` to etcd's JSON gateway (`path` like "/v3/kv/put") at HOST:PORT (over
    TLS with `context`)."""
    scheme = "https" if context is not None else "http"
    request = urllib.request.Request(
        f"{scheme}://{endpoint}{path}", data=json.dumps(body or {}).encode(),
        headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            answer: dict[str, Any] = json.loads(response.read())
    except urllib.error.HTTPError as e:
        raise EtcdError(f"{endpoint}{path}: HTTP {e.code} {e.read()[:300]!r}") from None
    except (OSError, TimeoutError, ValueError) as e:  # URLError is an OSError
        raise EtcdError(f"{endpoint}{path}: {e}") from None
    return answer


def b64(text: str | bytes) -> str:
    """The gateway's encoding of keys and values."""
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def put(endpoint: str, key: str, value: str | bytes, timeout: float = CALL_TIMEOUT,
        context: ssl.SSLContext | None = None) -> dict[str, Any]:
    """Write `key` through the member at `endpoint`; EtcdError if it is not committed in
    time (no majority) or refused."""
    return call(endpoint, "/v3/kv/put", {"key": b64(key), "value": b64(value)}, timeout,
                context)


def get(endpoint: str, key: str, timeout: float = CALL_TIMEOUT,
        context: ssl.SSLContext | None = None) -> bytes | None:
    """The value of `key` (a linearizable read: it needs a majority too), None if absent."""
    kvs = call(endpoint, "/v3/kv/range", {"key": b64(key)}, timeout, context).get("kvs", [])
    return base64.b64decode(kvs[0].get("value", "")) if kvs else None


def get_prefix(endpoint: str, prefix: str, timeout: float = CALL_TIMEOUT,
               context: ssl.SSLContext | None = None) -> dict[str, bytes]:
    """Every key under `prefix` and its value (e.g. a pair's, /pairmq/pairs/GROUP/)."""
    raw = prefix.encode()
    end = raw[:-1] + bytes([raw[-1] + 1])  # etcd's range end for "every key with prefix"
    answer = call(endpoint, "/v3/kv/range", {"key": b64(raw), "range_end": b64(end)}, timeout,
                  context)
    return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", ""))
            for kv in answer.get("kvs", [])}


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the launcher thread (the process) dies."""
    if _libc is not None:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _wait_stopped(pid: int, stopped: bool, timeout: float = 5.0) -> None:
    """Until process `pid` is stopped by a signal (state T in /proc), or no longer is."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            # the state follows the command name in parentheses, which may hold spaces
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            return  # gone, or no /proc: nothing to wait for
        if (state == "T") == stopped:
            return
        time.sleep(0.005)
    raise TimeoutError(f"process {pid} not {'stopped' if stopped else 'running'} "
                       f"within {timeout} s")


@dataclass
class EtcdMember:
    """One etcd process: its addresses and data dir are fixed for the cluster's life."""

    name: str  # e1, e2, ...
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False
    member_id: str | None = None  # etcd's id, as its status reports it (a decimal string)
    scheme: str = "http"  # of its client URL: https for a cluster with TLS

    @property
    def endpoint(self) -> str:
        """HOST:PORT of its client URL, as `[ha] witness = "etcd://..."` lists it."""
        return f"{HOST}:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://{self.endpoint}"

    @property
    def peer_url(self) -> str:
        return f"http://{HOST}:{self.peer_port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass(frozen=True)
class EtcdTls:
    """Certificates of a cluster over TLS: `cert`/`key` serve etcd's client port and are
    also the certificate its clients show (`--client-cert-auth`); `ca` signs them."""

    ca: str
    cert: str
    key: str

    def member_flags(self) -> list[str]:
        return ["--cert-file", self.cert, "--key-file", self.key,
                "--trusted-ca-file", self.ca, "--client-cert-auth"]

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca)
        context.load_cert_chain(self.cert, self.key)
        return context


class EtcdCluster:
    """`members` etcd processes forming one cluster on loopback, under `workdir`."""

    def __init__(self, workdir: Path, members: int = 3, *, heartbeat_ms: int = HEARTBEAT_MS,
                 election_ms: int = ELECTION_MS, tls: EtcdTls | None = None) -> None:
        self.workdir = Path(workdir)
        # client URLs over TLS, client certificates required (`etcds://`); peers plain
        self.tls = tls
        self.context = tls.client_context() if tls is not None else None
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        # unique: a member of another test's cluster that took a port of this one once is
        # refused instead of joining
        self.token = f"pairmq-test-{uuid.uuid4().hex}"
        self.members = [
            EtcdMember(f"e{i + 1}", free_port(), free_port(), self.workdir / f"e{i + 1}.data",
                       self.workdir / f"etcd-e{i + 1}.log",
                       scheme="https" if tls is not None else "http")
            for i in range(members)]

    # ------------------------------------------------------------ addresses

    @property
    def endpoints(self) -> list[str]:
        """Every member's HOST:PORT (client URL), by index."""
        return [m.endpoint for m in self.members]

    @property
    def url(self) -> str:
        """What `[ha] witness` / `--witness` takes: etcd://HOST:PORT,HOST:PORT,..."""
        return ("etcds://" if self.tls is not None else "etcd://") + ",".join(self.endpoints)

    def _initial_cluster(self) -> str:
        return ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    def args(self, index: int) -> list[str]:
        """The command line of member `index`. With its data dir present, etcd ignores the
        --initial-* flags and rejoins as the member it was."""
        m = self.members[index]
        return [
            ETCD, "--name", m.name, "--data-dir", str(m.data_dir),
            "--listen-client-urls", m.client_url, "--advertise-client-urls", m.client_url,
            "--listen-peer-urls", m.peer_url, "--initial-advertise-peer-urls", m.peer_url,
            "--initial-cluster", self._initial_cluster(), "--initial-cluster-state", "new",
            "--initial-cluster-token", self.token,
            "--heartbeat-interval", str(self.heartbeat_ms),
            "--election-timeout", str(self.election_ms),
            "--logger", "zap", "--log-outputs", "stderr",
            *(self.tls.member_flags() if self.tls is not None else []),
        ]

    # ------------------------------------------------------------ processes

    def start(self, timeout: float = START_TIMEOUT) -> EtcdCluster:
        """Start every member not running, then wait until each answers and one leads."""
        for index, member in enumerate(self.members):
            if not member.alive():
                self._launch(index)
        self.wait_healthy(timeout)
        return self

    def _launch(self, index: int) -> None:
        member = self.members[index]
        with open(member.log_path, "ab") as log:  # the child keeps its own copy
            log.write(f"----- {member.name} started: {' '.join(self.args(index))}\n".encode())
            log.flush()
            member.proc = _launcher.submit(
                subprocess.Popen, self.args(index), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
                start_new_session=True).result()
        member.paused = False

    def kill(self, index: int) -> None:
        """SIGKILL: a crash (a paused member dies too)."""
        member = self.members[index]
        if member.proc is not None and member.proc.poll() is None:
            member.proc.kill()
            member.proc.wait(10)
        member.paused = False

    def stop(self, index: int, timeout: float = 10.0) -> None:
        """SIGTERM and wait (SIGKILL after `timeout`): a clean stop."""
        member = self.members[index]
        if member.proc is None or member.proc.poll() is not None:
            return
        if member.paused:
            self.resume(index)
        member.proc.terminate()
        try:
            member.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(index)

    def restart(self, index: int, timeout: float = START_TIMEOUT) -> None:
        """Start member `index` again (stopped first if running), with its data dir, and
        wait until it answers (not for a leader: it may be the only one up)."""
        self.stop(index)
        self._launch(index)
        self._wait_answers([index], timeout)

    def pause(self, index: int) -> None:
        """SIGSTOP: alive for the kernel, its sockets open, but it answers nothing. Returns
        once the process is stopped (the signal is delivered after kill() returns: a
        request sent at once could still be answered)."""
        member = self.members[index]
        if member.proc is not None and member.alive() and not member.paused:
            os.kill(member.proc.pid, signal.SIGSTOP)
            member.paused = True
            _wait_stopped(member.proc.pid, True)

    def resume(self, index: int) -> None:
        """SIGCONT after `pause`; returns once the process runs again."""
        member = self.members[index]
        if member.proc is not None and member.alive() and member.paused:
            os.kill(member.proc.pid, signal.SIGCONT)
            _wait_stopped(member.proc.pid, False)
        member.paused = False

    @contextmanager
    def paused(self, index: int) -> Iterator[None]:
        """Member `index` paused for the block, resumed after it whatever happens."""
        self.pause(index)
        try:
            yield
        finally:
            self.resume(index)

    def alive(self, index: int) -> bool:
        return self.members[index].alive()

    def stop_all(self, timeout: float = 10.0) -> None:
        """SIGTERM every member (those paused resumed first) and wait for each."""
        for index in range(len(self.members)):
            self.stop(index, timeout)

    def close(self) -> None:
        """Kill every member: the end of a test, whatever state it left them in."""
        for index in range(len(self.members)):
            self.kill(index)

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------ state

    def status(self, index: int, timeout: float = 1.0) -> dict[str, Any] | None:
        """Member `index`'s /v3/maintenance/status, or None when it does not answer."""
        member = self.members[index]
        if not member.alive() or member.paused:
            return None
        try:
            answer = call(member.endpoint, "/v3/maintenance/status", {}, timeout, self.context)
        except EtcdError:
            return None
        member.member_id = answer.get("header", {}).get("member_id", member.member_id)
        return answer

    def leader(self) -> int | None:
        """The index of the member that leads: it says so itself and a majority of the
        cluster agrees (a stale view of a dead leader does not count). None if none."""
        statuses = {i: s for i in range(len(self.members))
                    if (s := self.status(i)) is not None}
        for index, st in statuses.items():
            own = st.get("header", {}).get("member_id")
            if not own or st.get("leader") != own:
                continue
            agreeing = sum(1 for s in statuses.values() if s.get("leader") == own)
            if agreeing > len(self.members) // 2:
                return index
        return None

    def wait_leader(self, timeout: float = 10.0) -> int:
        """Wait until a member leads (leader()); returns its index."""
        deadline = time.monotonic() + timeout
        while True:
            index = self.leader()
            if index is not None:
                return index
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no etcd leader within {timeout} s\n{self.describe()}")
            time.sleep(0.05)

    def wait_healthy(self, timeout: float = START_TIMEOUT) -> int:
        """Every running member answers, and one leads; returns the leader's index."""
        started = time.monotonic()
        running = [i for i, m in enumerate(self.members) if m.alive()]
        self._wait_answers(running, timeout)
        return self.wait_leader(max(0.1, timeout - (time.monotonic() - started)))

    def _wait_answers(self, indices: list[int], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        waiting = list(indices)
        while waiting:
            for index in list(waiting):
                member = self.members[index]
                if member.proc is not None and member.proc.poll() is not None:
                    raise RuntimeError(f"etcd {member.name} exited with code "
                                       f"{member.proc.returncode}:\n{self.log_tail(index)}")
                if self.status(index, timeout=0.5) is not None:
                    waiting.remove(index)
            if not waiting:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"etcd {', '.join(self.members[i].name for i in waiting)} "
                                   f"did not answer within {timeout} s\n{self.describe()}")
            time.sleep(0.05)

    # ------------------------------------------------------------ data

    def endpoint_of(self, index: int | None) -> str:
        """Member `index`'s endpoint, or the first running one's for None."""
        if index is not None:
            return self.members[index].endpoint
        for member in self.members:
            if member.alive() and not member.paused:
                return member.endpoint
        raise EtcdError("no etcd member is running")

    def put(self, key: str, value: str | bytes, member: int | None = None,
            timeout: float = CALL_TIMEOUT) -> dict[str, Any]:
        """Write through member `member` (default: the first running one)."""
        return put(self.endpoint_of(member), key, value, timeout, self.context)

    def get(self, key: str, member: int | None = None, timeout: float = CALL_TIMEOUT
            ) -> bytes | None:
        return get(self.endpoint_of(member), key, timeout, self.context)

    def get_prefix(self, prefix: str, member: int | None = None,
                   timeout: float = CALL_TIMEOUT) -> dict[str, bytes]:
        return get_prefix(self.endpoint_of(member), prefix, timeout, self.context)

    # ------------------------------------------------------------ logs

    def log_tail(self, index: int, lines: int = 20) -> str:
        path = self.members[index].log_path
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def describe(self, lines: int = 8) -> str:
        """Each member's state and last log lines, for assertion messages."""
        out = []
        for index, member in enumerate(self.members):
            st = self.status(index, timeout=0.5)
            state = ("down" if not member.alive() else "paused" if member.paused
                     else "not answering" if st is None
                     else f"id {st['header']['member_id']}, leader {st.get('leader', '0')}")
            out.append(f"----- etcd {member.name} ({member.endpoint}): {state}\n"
                       f"{self.log_tail(index, lines)}")
        return "\n".join(out)
