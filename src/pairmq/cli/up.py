"""`pairmq up`: a whole local pair plus witness, for trying pairmq out."""

from __future__ import annotations

import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from pairmq import __version__
from pairmq.cli.local_ca import Issued, LocalCA
from pairmq.server.guards.auth import hash_password

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
                  certs: dict[str, Issued]) -> list[Path]:
    files = []
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
            f'peer = "{peer}"\nwitness = "{WITNESS}"\nsecret = "{secret}"\ntls = true\n\n'
            "[auth]\nallow_anonymous = false\n\n"
            f'[auth.users.{login}]\npassword = "{hashed}"\nroles = ["admin"]\n')
        path.chmod(0o600)
        files.append(path)
    return files


def run_local_pair(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    login, password, secret = _credentials(root)
    ca, certs = _certificates(root)
    configs = _write_config(root, login, password, secret, ca, certs)
    console = Console(stderr=True)
    python = sys.executable
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    names: dict[int, str] = {}  # pid -> the pairmq command it runs

    def spawn(args: list[str], log_name: str) -> None:
        out = open(logs / log_name, "ab")  # noqa: SIM115 - owned by the child
        procs.append(subprocess.Popen([python, "-m", "pairmq", *args], stdout=out,
                                      stderr=subprocess.STDOUT, env={"PAIRMQ_HA_SECRET": secret,
                                                                    **_env()}))
        names[procs[-1].pid] = args[0] if args else "?"
        out.close()

    spawn(["witness", "--listen", WITNESS, "--state", str(root / "witness-state.json"),
           "--tls-cert", str(certs["witness"].cert), "--tls-key", str(certs["witness"].key),
           "--tls-ca", str(ca)], "witness.log")
    for config in configs:
        spawn(["server", "--config", str(config)], f"{config.stem}.log")
    console.print(f"[bold]pairmq {__version__}[/bold]: a local pair and its witness")
    for name, role, stomp, admin, listen, _ in SERVERS:
        console.print(f"  {name:8} STOMP stomp://{stomp}   stomp+ssl://{STOMP_TLS[name]}   "
                      f"ws://{STOMP_WS[name]}/stomp   console http://{admin}/   "
                      f"HA {listen} ({role}, mutual TLS)")
    console.print(f"  witness  {WITNESS} (mutual TLS)")
    console.print(f"  CA        {ca}   (trust it: trustStorePath, docs/clients.md)")
    console.print(f"  login     {login}")
    console.print(f"  password  {password}   (kept in {root / 'credentials'})")
    console.print(f"  logs      {logs}/")
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
    console.print("  Ctrl-C stops all three.")
    stopping = False

    def stop(*_args: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        while not stopping:
            for proc in procs:
                if proc.poll() is not None:
                    console.print(f"[red]a process exited ({names[proc.pid]}, code "
                                  f"{proc.returncode}); see {logs}/[/red]")
                    stopping = True
            time.sleep(0.5)
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)
