"""The `pairmq` command."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import click

from pairmq import __version__
from pairmq.cli.admin import (
    AdminRefused,
    admin_call,
    admin_credentials,
    admin_options,
    echo_json,
    json_option,
)
from pairmq.server.config import ConfigError, ServerConfig, load_config
from pairmq.server.settings import KEYS


def _config_options(func):
    """One flag per configuration key, generated from the same table as the TOML file."""
    for key in reversed(KEYS):
        if key.type is bool:
            opt = click.option(f"{key.flag}/--no-{key.flag[2:]}", key.field, default=None,
                               help=f"[{key.section}] {key.name}: {key.help}")
        else:
            opt = click.option(key.flag, key.field, type=str if key.type is tuple else key.type,
                               default=None,
                               help=f"[{key.section}] {key.name}: {key.help} "
                                    f"(default {key.default})")
        func = opt(func)
    return func


def _parse_users(users: tuple[str, ...]) -> dict[str, str]:
    parsed = {}
    for spec in users:
        name, sep, password = spec.partition(":")
        if not sep or not name or not password:
            raise click.BadParameter(f"--user must be NAME:PASSWORD, got {spec!r}")
        parsed[name] = password
    return parsed


def _load(config_path: str | None, values: dict[str, Any], users: tuple[str, ...]
          ) -> ServerConfig:
    try:
        return load_config(config_path, values, _parse_users(users))
    except ConfigError as e:
        click.echo(f"config error: {e}", err=True)
        sys.exit(2)


# Commands whose modules load Rich or the client, imported when they are run (or listed by
# --help): `pairmq server` starts without them (start-up time, docs/benchmarks.md).
LAZY_COMMANDS = {
    **{name: f"pairmq.cli.ops:{name}"
       for name in ("destinations", "connections", "browse", "purge", "move", "status")},
    "user": "pairmq.cli.users:user_group",
    "role": "pairmq.cli.users:role_group",
    "security": "pairmq.cli.users:security_group",
}


class LazyGroup(click.Group):
    """click's pattern for subcommands loaded on use (its docs: "Lazily Loading
    Subcommands")."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS:
            module, _, attribute = LAZY_COMMANDS[cmd_name].partition(":")
            command = getattr(importlib.import_module(module), attribute)
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="pairmq")
def main() -> None:
    """pairmq: a highly available STOMP message broker."""


@main.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="TOML configuration file; flags win over it")
@click.option("--user", "users", multiple=True, metavar="NAME:PASSWORD",
              help="add a user (repeatable)")
@_config_options
def server(config_path: str | None, users: tuple[str, ...], **values: Any) -> None:
    """Run one pairmq server."""
    from pairmq.server.run import run

    run(_load(config_path, values, users))


@main.command()
@click.argument("password", required=False)
def passwd(password: str | None) -> None:
    """Print the scrypt hash of PASSWORD for [auth.users.NAME] password (asks if omitted)."""
    from pairmq.server.guards.auth import hash_password

    if password is None:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    click.echo(hash_password(password))


@main.command()
@click.option("--listen", default="127.0.0.1:7000", show_default=True, help="HOST:PORT")
@click.option("--secret", envvar="PAIRMQ_HA_SECRET", required=True,
              help="the pair's shared secret (or PAIRMQ_HA_SECRET)")
@click.option("--state", "state_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="file remembering the lease holder and epoch across restarts")
@click.option("--log-level", default="info", show_default=True)
@click.option("--tls-cert", default=None, metavar="PEM",
              help="mutual TLS (the pair's [ha] tls): the witness's certificate and chain")
@click.option("--tls-key", default=None, metavar="PEM", help="... its private key")
@click.option("--tls-ca", default=None, metavar="PEM",
              help="... the CA that signs the servers' certificates")
def witness(listen: str, secret: str, state_file: Path | None, log_level: str,
            tls_cert: str | None, tls_key: str | None, tls_ca: str | None) -> None:
    """Run the witness that grants the active server its lease (prevents split brain).
    SIGHUP reloads the TLS files."""
    from pairmq.server.pair.witness_server import run_witness
    from pairmq.server.tls import TlsError, TlsFiles, build

    tls = None
    given = [f for f in (tls_cert, tls_key, tls_ca) if f]
    if given:
        if len(given) != 3:
            raise click.UsageError("--tls-cert, --tls-key and --tls-ca go together")
        tls = TlsFiles(tls_cert or "", tls_key or "", tls_ca or "")
        try:
            build(tls, "peer_server")
        except TlsError as e:
            raise click.UsageError(str(e)) from None
    run_witness(listen, secret, state_file, log_level, tls)


@main.command()
@click.argument("admin")
@click.confirmation_option(prompt="Serve this server's journal even if the other server may "
                                  "hold newer data?")
@admin_options
def activate(admin: str, user: str | None, password: str | None) -> None:
    """Force a WAITING server (by its management address) to become active (needs a user
    with the admin role)."""
    credentials = admin_credentials(user, password, (admin,))
    try:
        echo_json(admin_call(admin, "/activate", credentials, method="POST"))
    except AdminRefused as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        raise click.ClickException(f"{admin}: unreachable ({e})") from None


@main.command()
@click.argument("admin", nargs=-1)
@admin_options
def reload(admin: tuple[str, ...], user: str | None, password: str | None) -> None:
    """Reload the TLS certificates of servers (by their management addresses; default:
    `pairmq up`'s), as SIGHUP does: new connections use them. https://HOST:PORT for a
    management port with admin_tls (PAIRMQ_CA names the CA file to trust)."""
    from pairmq.cli.up import ADMIN_ADDRESSES

    addresses = admin or ADMIN_ADDRESSES
    credentials = admin_credentials(user, password, addresses)
    failed = False
    for address in addresses:
        try:
            click.echo(f"{address}: {admin_call(address, '/reload', credentials, 'POST')}")
        except AdminRefused as e:
            click.echo(str(e), err=True)
            failed = True
        except OSError as e:
            click.echo(f"{address}: unreachable ({e})", err=True)
            failed = True
    if failed:
        sys.exit(1)


@main.command()
@click.option("--dir", "workdir", default=".pairmq-local", show_default=True,
              type=click.Path(file_okay=False), help="where the local setup keeps its files")
@click.option("--arbiter", type=click.Choice(["witness", "etcd"]), default="witness",
              show_default=True,
              help="what grants the active server its lease: `pairmq witness`, or a local "
                   "3-member etcd cluster (Debian's etcd-server; `make etcd-deps`)")
def up(workdir: str, arbiter: str) -> None:
    """Start a local pair (primary, backup) and a witness (or etcd) on loopback; Ctrl-C
    stops them."""
    from pairmq.cli.up import run_local_pair

    run_local_pair(Path(workdir), arbiter)


@main.group()
def journal() -> None:
    """Inspect or repair a server's journal (the server must be stopped)."""


@journal.command("check")
@click.argument("directory", required=False,
                type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--url", default="", help="check the journal kept in this PostgreSQL database "
              "([store] url; the password may come from PAIRMQ_STORE_PASSWORD) instead")
@click.option("--group", default="", help="with --url: the pair's [ha] group (or the server's "
              "name), which names the schema")
@json_option
def journal_check(directory: Path | None, url: str, group: str, as_json: bool) -> None:
    """Check every record of the journal in DIRECTORY (a data_dir or its journal/), or of
    the one kept in a database (--url, --group)."""
    if url:
        from pairmq.cli.database_check import check_database_journal

        sys.exit(check_database_journal(url, group, as_json))
    if directory is None:
        raise click.UsageError("give a DIRECTORY, or --url and --group")
    from rich.console import Console
    from rich.progress import Progress

    from pairmq.store.check import check_journal, describe_summaries, summaries_as_json

    # a bar on a terminal (a large journal takes a while); nothing through a pipe
    with Progress(console=Console(stderr=True), transient=True,
                  disable=not sys.stderr.isatty()) as progress:
        task = progress.add_task("checking", total=None)
        report = check_journal(directory, lambda done, total: progress.update(
            task, completed=done, total=total))
    if as_json:
        echo_json({"directory": str(report.directory), "ok": report.ok,
                   "intact": report.damage is None, "torn_tail_only": report.torn_tail_only,
                   "segments": [{"file": scan.path.name, "records": scan.records,
                                 "first_seq": scan.first_seq, "last_seq": scan.last_seq,
                                 "bytes": scan.size, "problem": scan.problem,
                                 "valid_end": scan.valid_end} for scan in report.scans],
                   "summaries": summaries_as_json(report)})
        if not report.ok:
            sys.exit(1)
        return
    for scan in report.scans:
        state = "ok" if scan.problem is None else f"DAMAGED at offset {scan.valid_end}: " \
            f"{scan.problem}"
        click.echo(f"{scan.path.name}: {scan.records} records, seq {scan.first_seq}-"
                   f"{scan.last_seq}, {scan.size} bytes: {state}")
    if not report.scans:
        click.echo(f"{report.directory}: no journal segments")
    for line in describe_summaries(report):  # a cache a start checks: never damage
        click.echo(line)
    if report.damage is None:
        click.echo("journal is intact")
    elif report.torn_tail_only:
        click.echo("only a torn write at the end: the server cuts it by itself on start")
    else:
        click.echo("the journal is damaged in the middle: the server will not start. "
                   "`pairmq journal repair` cuts it at the damage (later data is moved aside)")
        sys.exit(1)


@journal.command("repair")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
def journal_repair(directory: Path, yes: bool) -> None:
    """Cut the journal at its first damage; what follows is moved aside, not deleted.
    Segment summaries that do not match their segments are removed."""
    from pairmq.store.check import check_journal, repair_journal

    report = check_journal(directory)
    if report.damage is None and not report.summaries:
        click.echo("nothing to repair: every segment checks out")
        return
    if report.damage is not None and not yes:
        click.confirm(f"Cut {report.damage.path.name} at offset {report.damage.valid_end} and "
                      "move later segments aside? Messages recorded after that point will be "
                      "lost", abort=True)
    for action in repair_journal(directory):
        click.echo(action)


def _client_options(func):
    func = click.option("-p", "--passcode", default=None, help="passcode")(func)
    func = click.option("-u", "--login", default=None, help="login")(func)
    func = click.option("-s", "--server", "url", default="127.0.0.1:61613", show_default=True,
                        help="HOST:PORT, a list HOST:PORT,HOST:PORT, or a failover URL "
                             "failover:(stomp://H1:P1,stomp://H2:P2)?...")(func)
    return func


def _connect(url: str, login: str | None, passcode: str | None):
    import pairmq.client

    try:
        return pairmq.client.connect(url, login=login, passcode=passcode,
                                     initial_connect_attempts=2, retry_interval=200,
                                     connection_ttl=0)
    except pairmq.client.ClientError as e:
        raise click.ClickException(str(e)) from None


@main.command()
@_client_options
@click.option("--persistent/--no-persistent", default=True, show_default=True)
@click.argument("destination")
@click.argument("body")
def send(url: str, login: str | None, passcode: str | None, persistent: bool,
         destination: str, body: str) -> None:
    """Send BODY to DESTINATION; a persistent message waits for the server's confirmation
    (through a failover of the pair if one happens meanwhile)."""
    import pairmq.client

    client = _connect(url, login, passcode)
    try:
        client.send(destination, body.encode(), persistent=persistent)
    except pairmq.client.ClientError as e:
        raise click.ClickException(str(e)) from None
    finally:
        client.close(timeout=5)
    click.echo(f"sent to {destination} ({'confirmed' if persistent else 'not persistent'} "
               f"by {client.server})")


@main.command()
@_client_options
@click.option("-n", "--count", default=1, show_default=True, help="messages to receive")
@click.option("--timeout", default=10.0, show_default=True, help="seconds to wait for each")
@click.argument("destination")
def receive(url: str, login: str | None, passcode: str | None, count: int, timeout: float,
            destination: str) -> None:
    """Receive COUNT messages from DESTINATION (each acknowledged once printed)."""
    import pairmq.client

    client = _connect(url, login, passcode)
    try:
        sub = client.subscribe(destination, ack="client-individual")
        for _ in range(count):
            message = sub.receive(timeout)
            if message is None:
                raise click.ClickException(f"no message on {destination} within {timeout} s")
            click.echo(message.body.decode(errors="replace"))
            client.ack(message)
    except pairmq.client.ClientError as e:
        raise click.ClickException(str(e)) from None
    finally:
        client.close(timeout=5)


if __name__ == "__main__":
    main()
