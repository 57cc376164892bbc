"""Talking to servers' management ports from the `pairmq` command: one request, the
credentials to use, and the options that give them (shared by every command that does)."""

from __future__ import annotations

import os
import sys

import click


class AdminRefused(Exception):
    """The management port answered with an HTTP error; the message is one line for users."""


def admin_call(address: str, path: str, credentials: tuple[str, str] | None,
               method: str = "GET", body: dict | None = None) -> dict:
    """One management request (`body` sent as JSON); AdminRefused for an HTTP error,
    OSError if unreachable."""
    import base64
    import json
    import urllib.error
    import urllib.request

    headers = {}
    if credentials is not None:
        token = base64.b64encode(":".join(credentials).encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    url = address if address.startswith(("http://", "https://")) else f"http://{address}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(f"{url.rstrip('/')}{path}", method=method,
                                     headers=headers, data=data)
    tls = None
    if url.startswith("https://"):
        import ssl

        # [server] admin_tls: trust the CA in PAIRMQ_CA (`pairmq up` prints it), or the system's
        tls = ssl.create_default_context(cafile=os.environ.get("PAIRMQ_CA") or None)
    try:
        with urllib.request.urlopen(request, timeout=5, context=tls) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:  # before OSError: HTTPError is one
        try:
            problem = json.loads(e.read()).get("error") or e.reason
        except ValueError:
            problem = e.reason
        hint = " (give --user and --password, or set PAIRMQ_USER and PAIRMQ_PASSWORD)" \
            if e.code == 401 else ""
        raise AdminRefused(f"{address}: {problem} [HTTP {e.code}]{hint}") from None


def is_loopback(address: str) -> bool:
    import ipaddress

    host = address.partition("://")[2] or address
    host = host.rstrip("/").rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def admin_credentials(user: str | None, password: str | None,
                       addresses: tuple[str, ...]) -> tuple[str, str] | None:
    """--user/--password (or PAIRMQ_USER/PAIRMQ_PASSWORD, or a prompt on a terminal); without
    a user, the credentials `pairmq up` wrote, but only for servers on this machine."""
    from pairmq.cli.up import LOCAL_DIR, local_login

    if user is None:
        if password is not None:
            raise click.UsageError("a password was given (--password or PAIRMQ_PASSWORD) "
                                   "without a user: add --user NAME or PAIRMQ_USER")
        return local_login(LOCAL_DIR) if all(is_loopback(a) for a in addresses) else None
    if password is None:
        if not sys.stdin.isatty():
            raise click.UsageError(f"--user {user} needs a password: give --password or set "
                                   "PAIRMQ_PASSWORD (no terminal to ask on)")
        password = click.prompt(f"Password for {user}", hide_input=True)
    return user, password


def admin_options(func):
    func = click.option("--password", envvar="PAIRMQ_PASSWORD", default=None,
                        help="its password (or PAIRMQ_PASSWORD; asked for on a terminal)")(func)
    func = click.option("--user", envvar="PAIRMQ_USER", default=None, metavar="NAME",
                        help="management user (or PAIRMQ_USER); default on loopback: the one "
                             "`pairmq up` wrote to .pairmq-local/credentials")(func)
    return func


def pair_targets(func):
    """--admin (repeatable) and the credentials' options, for commands that talk to the pair."""
    func = click.option("--admin", "admins", multiple=True, metavar="HOST:PORT",
                        help="management address of a server of the pair (repeatable; "
                             "default: `pairmq up`'s)")(func)
    return admin_options(func)


def pair_addresses(admins: tuple[str, ...]) -> tuple[str, ...]:
    from pairmq.cli.up import ADMIN_ADDRESSES

    return admins or ADMIN_ADDRESSES


def pair_call(admins: tuple[str, ...], user: str | None, password: str | None, path: str,
              method: str = "GET", body: dict | None = None) -> dict:
    """The first server that takes the request; exit 1 naming each refusal otherwise."""
    addresses = pair_addresses(admins)
    credentials = admin_credentials(user, password, addresses)
    problems = []
    for address in addresses:
        try:
            return admin_call(address, path, credentials, method, body)
        except AdminRefused as e:
            problems.append(str(e))
            if "[HTTP 409]" not in str(e):  # anything but "not the serving server"
                break
        except OSError as e:
            problems.append(f"{address}: unreachable ({e})")
    for problem in problems:
        click.echo(problem, err=True)
    sys.exit(1)


def json_option(func):
    """--json: print the API's answer as JSON, for scripts."""
    return click.option("--json", "as_json", is_flag=True,
                        help="print the API's JSON answer (for scripts)")(func)


def echo_json(data: object) -> None:
    import json

    click.echo(json.dumps(data, indent=2))
