"""`pairmq up`: a whole local pair plus witness, for trying pairmq out; or, with
`--arbiter etcd`, the pair on a local 3-member etcd cluster instead of the witness."""

from __future__ import annotations

import ctypes
import json
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import click
from rich.console import Console

from pairmq import __version__
from pairmq.cli.local_ca import Issued, LocalCA
from pairmq.server.guards.auth import hash_password
from pairmq.server.process import build_kind

SERVERS = (
    # name, role, STOMP, admin, HA listen, HA peer
    ("primary", "primary", "127.0.0.1:61613", "127.0.0.1:8161", "127.0.0.1:7001",
     "127.0.0.1:7002"),
    ("backup", "backup", "127.0.0.1:61614", "127.0.0.1:8162", "127.0.0.1:7002",
     "127.0.0.1:7001"),
)
STOMP_TLS = {"primary": "127.0.0.1:61617", "backup": "127.0.0.1:61618"}  # beside plaintext
STOMP_WS = {"primary": "127.0.0.1:61623", "backup": "127.0.0.1:61624"}  # STOMP over WebSocket
WITNESS = "127.0.0.1:7000"
# `--arbiter etcd`: three etcd members (name, client, peer address). Not etcd's usual
# 2379/2380, which a system etcd may hold (Debian's etcd-server starts one where it can);
# above the tests' ports (tests/serverproc.py: 12000-32000) and below the kernel's
# ephemeral ports (32768 and up), so nothing else is likely to hold them.
ETCD_MEMBERS = (
    ("e1", "127.0.0.1:32379", "127.0.0.1:32380"),
    ("e2", "127.0.0.1:32479", "127.0.0.1:32480"),
    ("e3", "127.0.0.1:32579", "127.0.0.1:32580"),
)
ETCD_WITNESS = "etcd://" + ",".join(client for _name, client, _peer in ETCD_MEMBERS)
ETCD_GROUP = "local"  # [ha] group: the pair's keys live under /pairmq/pairs/local/
ETCD_DEBIAN_PACKAGE = "etcd-server"
ETCD_START_TIMEOUT = 30.0
ARBITERS = ("witness", "etcd")
ADMIN_ADDRESSES = tuple(admin for _name, _role, _stomp, admin, _listen, _peer in SERVERS)
LOCAL_DIR = Path(".pairmq-local")  # `pairmq up`'s default --dir


def local_login(root: Path) -> tuple[str, str] | None:
    """The login and password `pairmq up` generated in `root`, if it ran there: `pairmq
    status` and `pairmq activate` use them for the local pair when given no user."""
    try:
        login, password, _secret = (root / "credentials").read_text().split()
    except (OSError, ValueError):
        return None
    return login, password


def _credentials(root: Path) -> tuple[str, str, str]:
    creds = root / "credentials"
    if creds.exists():
        login, password, secret = creds.read_text().split()
        return login, password, secret
    login, password, secret = "admin", secrets.token_urlsafe(12), secrets.token_urlsafe(24)
    creds.write_text(f"{login}\n{password}\n{secret}\n")
    creds.chmod(0o600)
    return login, password, secret


def _certificates(root: Path) -> tuple[Path, dict[str, Issued]]:
    """A local CA in root/tls and a certificate for each server and the witness (made once;
    kept across runs, like the credentials)."""
    ca = LocalCA(root / "tls", "pairmq up local CA")
    issued = {}
    for name in ("primary", "backup", "witness"):
        cert, key = root / "tls" / f"{name}.pem", root / "tls" / f"{name}.key"
        issued[name] = Issued(cert, key) if cert.exists() and key.exists() \
            else ca.issue(name)
    return ca.cert_path, issued


def _write_config(root: Path, login: str, password: str, secret: str, ca: Path,
                  certs: dict[str, Issued], witness: str = WITNESS, group: str = ""
                  ) -> list[Path]:
    files = []
    group_line = f'group = "{group}"\n' if group else ""
    hashed = hash_password(password)
    for name, role, stomp, admin, listen, peer in SERVERS:
        path = root / f"{name}.toml"
        path.write_text(
            "# Written by `pairmq up`; credentials are in ./credentials\n"
            f'[server]\nname = "{name}"\ndata_dir = "{(root / "data" / name).as_posix()}"\n'
            f'stomp = "{stomp}"\nstomp_tls = "{STOMP_TLS[name]}"\nadmin = "{admin}"\n'
            f'stomp_ws = "{STOMP_WS[name]}"\n\n'
            f'[tls]\ncert = "{certs[name].cert.resolve()}"\n'
            f'key = "{certs[name].key.resolve()}"\nca = "{ca.resolve()}"\n\n'
            f'[ha]\npolicy = "replication"\nrole = "{role}"\nlisten = "{listen}"\n'
            f'peer = "{peer}"\nwitness = "{witness}"\n{group_line}secret = "{secret}"\n'
            "tls = true\n\n"
            "[auth]\nallow_anonymous = false\n\n"
            f'[auth.users.{login}]\npassword = "{hashed}"\nroles = ["admin"]\n')
        path.chmod(0o600)
        files.append(path)
    return files


def etcd_binary() -> str:
    """The etcd to run; ClickException naming the package to install when there is none."""
    found = shutil.which("etcd") or shutil.which("etcd", path="/usr/bin:/usr/local/bin")
    if found is None:
        raise click.ClickException(
            "--arbiter etcd needs etcd, which is not installed: `make etcd-deps` installs "
            f"Debian's {ETCD_DEBIAN_PACKAGE} (and etcd-client for etcdctl), or run "
            f"`sudo apt-get install {ETCD_DEBIAN_PACKAGE} etcd-client`")
    return found


def _etcd_args(etcd: str, root: Path, name: str, client: str, peer: str) -> list[str]:
    """One member's command line. Its data dir kept from an earlier run, etcd ignores the
    --initial-* flags and rejoins the same cluster (the pair's lease and epoch with it)."""
    cluster = ",".join(f"{n}=http://{p}" for n, _c, p in ETCD_MEMBERS)
    return [etcd, "--name", name, "--data-dir", str(root / "etcd" / name),
            "--listen-client-urls", f"http://{client}", "--advertise-client-urls",
            f"http://{client}", "--listen-peer-urls", f"http://{peer}",
            "--initial-advertise-peer-urls", f"http://{peer}", "--initial-cluster", cluster,
            "--initial-cluster-state", "new", "--initial-cluster-token", "pairmq-up",
            "--logger", "zap", "--log-outputs", "stderr"]


def _death_signal() -> Callable[[], None] | None:
    """What an etcd member runs before exec (Linux): it is killed when `pairmq up` dies,
    even by SIGKILL. (The members run in their own session, so that Ctrl-C reaches the
    servers only, and `pairmq up` stops etcd after them.)"""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork

    def set_parent_death_signal() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    return set_parent_death_signal


def _etcd_leader(client: str) -> str | None:
    """The leader member `client` knows of (its id), None if it has none or is down."""
    request = urllib.request.Request(f"http://{client}/v3/maintenance/status", data=b"{}",
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=1.0) as response:
            leader = json.loads(response.read()).get("leader", "0")
    except (OSError, ValueError):
        return None
    return None if leader in ("", "0") else str(leader)


def _wait_etcd(procs: dict[str, subprocess.Popen[bytes]], logs: Path) -> None:
    """Until every member answers and all name the same leader: the servers then find
    their arbiter at once. ClickException if a member exits or it takes too long."""
    deadline = time.monotonic() + ETCD_START_TIMEOUT
    while True:
        for name, proc in procs.items():
            if proc.poll() is not None:
                log = logs / f"etcd-{name}.log"
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-5:])
                raise click.ClickException(f"etcd {name} exited (code {proc.returncode}); "
                                           f"see {log}:\n{tail}")
        leaders = {_etcd_leader(client) for _name, client, _peer in ETCD_MEMBERS}
        if len(leaders) == 1 and None not in leaders:
            return
        if time.monotonic() > deadline:
            raise click.ClickException(f"etcd elected no leader within {ETCD_START_TIMEOUT:.0f}"
                                       f" s; see {logs}/etcd-*.log")
        time.sleep(0.1)


def _start_etcd(root: Path, logs: Path) -> list[subprocess.Popen[bytes]]:
    """The three members, started and agreed on a leader (stopped again on failure)."""
    etcd = etcd_binary()
    before_exec = _death_signal()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, client, peer in ETCD_MEMBERS:
            (root / "etcd").mkdir(exist_ok=True)
            with open(logs / f"etcd-{name}.log", "ab") as out:
                procs[name] = subprocess.Popen(
                    _etcd_args(etcd, root, name, client, peer), stdin=subprocess.DEVNULL,
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=before_exec)
        _wait_etcd(procs, logs)
    except BaseException:
        for member in procs.values():
            _stop([member])
        raise
    return list(procs.values())


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each, last started first; SIGKILL to any still running after 10 s.

    etcd members are stopped one at a time: a leader told to stop hands its leadership
    over to a member still connected (in milliseconds), or skips that when none is; but
    all stopped at once, it waits 7 s for a transfer to a member that is going away."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def run_local_pair(root: Path, arbiter: str = "witness") -> None:
    """`arbiter`: "witness" (`pairmq witness`) or "etcd" (three local etcd members)."""
    if arbiter not in ARBITERS:
        raise ValueError(f"arbiter {arbiter!r} is not one of {ARBITERS}")
    on_etcd = arbiter == "etcd"
    if on_etcd:
        etcd_binary()  # before anything is written or started
    root.mkdir(parents=True, exist_ok=True)
    login, password, secret = _credentials(root)
    ca, certs = _certificates(root)
    witness, group = (ETCD_WITNESS, ETCD_GROUP) if on_etcd else (WITNESS, "")
    configs = _write_config(root, login, password, secret, ca, certs, witness, group)
    console = Console(stderr=True)
    python = sys.executable
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    names: dict[int, str] = {}  # pid -> the pairmq command it runs (or "etcd eN")

    def spawn(args: list[str], log_name: str) -> None:
        out = open(logs / log_name, "ab")  # noqa: SIM115 - owned by the child
        procs.append(subprocess.Popen([python, "-m", "pairmq", *args], stdout=out,
                                      stderr=subprocess.STDOUT, env={"PAIRMQ_HA_SECRET": secret,
                                                                    **_env()}))
        names[procs[-1].pid] = args[0] if args else "?"
        out.close()

    etcd_procs: list[subprocess.Popen[bytes]] = []  # stopped after the servers
    if on_etcd:
        etcd_procs = _start_etcd(root, logs)
        names.update({proc.pid: f"etcd {name}" for proc, (name, _c, _p)
                      in zip(etcd_procs, ETCD_MEMBERS, strict=True)})
    else:
        spawn(["witness", "--listen", WITNESS, "--state", str(root / "witness-state.json"),
               "--tls-cert", str(certs["witness"].cert), "--tls-key",
               str(certs["witness"].key), "--tls-ca", str(ca)], "witness.log")
    try:
        for config in configs:
            spawn(["server", "--config", str(config)], f"{config.stem}.log")
        _serve(root, console, ca, certs, login, password, logs, procs, names, etcd_procs)
    finally:
        _stop(procs)
        for member in etcd_procs:
            _stop([member])


def _serve(root: Path, console: Console, ca: Path, certs: dict[str, Issued], login: str,
           password: str, logs: Path, procs: list[subprocess.Popen[bytes]],
           names: dict[int, str], etcd_procs: list[subprocess.Popen[bytes]]) -> None:
    """Print what runs where, then watch the processes until Ctrl-C or SIGTERM (or one of
    them exits)."""
    arbiter = "a 3-member etcd" if etcd_procs else "its witness"
    console.print(f"[bold]pairmq {__version__}[/bold]: a local pair and {arbiter}")
    for name, role, stomp, admin, listen, _ in SERVERS:
        console.print(f"  {name:8} STOMP stomp://{stomp}   stomp+ssl://{STOMP_TLS[name]}   "
                      f"ws://{STOMP_WS[name]}/stomp   console http://{admin}/   "
                      f"HA {listen} ({role}, mutual TLS)")
    if etcd_procs:
        console.print(f"  etcd     {ETCD_WITNESS} (group \"{ETCD_GROUP}\": keys under "
                      f"/pairmq/pairs/{ETCD_GROUP}/; data in {root / 'etcd'}/)")
    else:
        console.print(f"  witness  {WITNESS} (mutual TLS)")
    console.print(f"  CA        {ca}   (trust it: trustStorePath, docs/clients.md)")
    console.print(f"  login     {login}")
    console.print(f"  password  {password}   (kept in {root / 'credentials'})")
    console.print(f"  logs      {logs}/")
    console.print(f"  build     {build_kind()}")
    console.print("  try it    ", end="")
    pair = "127.0.0.1:61613,127.0.0.1:61614"  # the client finds the active one
    print(f".venv/bin/pairmq send -s {pair} -u {login} -p {password} /queue/hello hi "
          f"&& .venv/bin/pairmq receive -s {pair} -u {login} -p {password} "
          "/queue/hello", file=sys.stderr, flush=True)
    tls = (f"failover:(stomp+ssl://{STOMP_TLS['primary']},stomp+ssl://{STOMP_TLS['backup']})"
           f"?trustStorePath={ca}")
    console.print("  over TLS  ", end="")
    print(f".venv/bin/pairmq send -s '{tls}' -u {login} -p {password} /queue/hello hi",
          file=sys.stderr, flush=True)
    state = ".venv/bin/pairmq status"
    if root.resolve() != LOCAL_DIR.resolve():  # status finds only the default dir by itself
        state += f" --user {login} --password {password}"
    console.print(f"  state     {state}")
    if etcd_procs:
        console.print("  in etcd   ", end="")
        endpoints = ETCD_WITNESS.removeprefix("etcd://")
        print(f"etcdctl --endpoints {endpoints} get --prefix /pairmq/pairs/{ETCD_GROUP}/",
              file=sys.stderr, flush=True)
        console.print("  Ctrl-C stops the pair, then etcd.")
    else:
        console.print("  Ctrl-C stops all three.")
    stopping = False

    def stop(*_args: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    while not stopping:
        for proc in [*procs, *etcd_procs]:
            if proc.poll() is not None:
                console.print(f"[red]a process exited ({names[proc.pid]}, code "
                              f"{proc.returncode}); see {logs}/[/red]")
                stopping = True
        time.sleep(0.5)


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)
