"""`pairmq user add|passwd|remove|list`, `pairmq role grant|revoke|list` and `pairmq
security set|remove|list`: users, roles and permission rules at run time, through the
management API (server/manage/users_api.py), shared by the pair.

A change goes to the pair's serving server: the management addresses given (`--admin`,
repeatable; default `pairmq up`'s two) are tried in turn, and one that does not serve
answers 409, so the next is tried.
"""

from __future__ import annotations

import sys
from urllib.parse import quote

import click

from pairmq.cli.admin import echo_json, json_option, pair_call, pair_targets


def _new_password(given: str | None) -> str:
    if given:
        return given
    if not sys.stdin.isatty():
        raise click.UsageError("give the new user's password with --new-password or "
                               "PAIRMQ_NEW_PASSWORD (no terminal to ask on)")
    return click.prompt("New password", hide_input=True, confirmation_prompt=True)


def _new_password_option(func):
    return click.option("--new-password", envvar="PAIRMQ_NEW_PASSWORD", default=None,
                        help="the user's password (or PAIRMQ_NEW_PASSWORD; asked for on a "
                             "terminal); hashed by the server (prefer HTTPS: admin_tls)"
                        )(func)


@click.group("user")
def user_group() -> None:
    """Users at run time, shared by the pair (journal records; docs/security.md)."""


@user_group.command("add")
@click.argument("name")
@click.option("--role", "roles", multiple=True, help="a role (repeatable)")
@_new_password_option
@pair_targets
def user_add(name: str, roles: tuple[str, ...], new_password: str | None,
             admins: tuple[str, ...], user: str | None, password: str | None) -> None:
    """Add user NAME (or replace it: password and roles)."""
    done = pair_call(admins, user, password, f"/users/{quote(name, safe='')}", "PUT",
                     {"password": _new_password(new_password), "roles": list(roles)})
    click.echo(done["done"])


@user_group.command("passwd")
@click.argument("name")
@_new_password_option
@pair_targets
def user_passwd(name: str, new_password: str | None, admins: tuple[str, ...],
                user: str | None, password: str | None) -> None:
    """Change the password of user NAME."""
    done = pair_call(admins, user, password, f"/users/{quote(name, safe='')}/password", "POST",
                     {"password": _new_password(new_password)})
    click.echo(done["done"])


@user_group.command("remove")
@click.argument("name")
@pair_targets
def user_remove(name: str, admins: tuple[str, ...], user: str | None, password: str | None
                ) -> None:
    """Remove user NAME; its connections are closed."""
    click.echo(pair_call(admins, user, password, f"/users/{quote(name, safe='')}",
                         "DELETE")["done"])


@user_group.command("list")
@pair_targets
@json_option
def user_list(admins: tuple[str, ...], user: str | None, password: str | None,
              as_json: bool) -> None:
    """The users in force: name, roles, and whether the file or a run-time change made
    them."""
    data = pair_call(admins, user, password, "/users")
    if as_json:
        echo_json(data)
        return
    for row in data["users"]:
        click.echo(f"{row['name']}\t{','.join(row['roles']) or '-'}\t{row['source']}")


@click.group("role")
def role_group() -> None:
    """Roles of users at run time, shared by the pair."""


@role_group.command("grant")
@click.argument("role")
@click.argument("name")
@pair_targets
def role_grant(role: str, name: str, admins: tuple[str, ...], user: str | None,
               password: str | None) -> None:
    """Give ROLE to user NAME."""
    click.echo(pair_call(admins, user, password, f"/users/{quote(name, safe='')}/roles", "POST",
                         {"role": role})["done"])


@role_group.command("revoke")
@click.argument("role")
@click.argument("name")
@pair_targets
def role_revoke(role: str, name: str, admins: tuple[str, ...], user: str | None,
                password: str | None) -> None:
    """Take ROLE from user NAME (its connections are closed: they log in again)."""
    click.echo(pair_call(admins, user, password, f"/users/{quote(name, safe='')}/roles/"
                         f"{quote(role, safe='')}", "DELETE")["done"])


@role_group.command("list")
@pair_targets
@json_option
def role_list(admins: tuple[str, ...], user: str | None, password: str | None,
              as_json: bool) -> None:
    """Each role and its users."""
    data = pair_call(admins, user, password, "/roles")
    if as_json:
        echo_json(data)
        return
    for role, names in sorted(data["roles"].items()):
        click.echo(f"{role}\t{','.join(names)}")


@click.group("security")
def security_group() -> None:
    """Permission rules at run time, shared by the pair (docs/security.md)."""


@security_group.command("set")
@click.argument("pattern")
@click.option("--grant", "grants", multiple=True, metavar="PERMISSION=ROLE,ROLE",
              help="e.g. send=producers (repeatable; Artemis' permission names)")
@pair_targets
def security_set(pattern: str, grants: tuple[str, ...], admins: tuple[str, ...],
                 user: str | None, password: str | None) -> None:
    """Set the rule of PATTERN (e.g. 'orders.#'), replacing it if it exists."""
    body: dict[str, list[str]] = {}
    for grant in grants:
        permission, sep, roles = grant.partition("=")
        if not sep or not permission:
            raise click.UsageError(f"--grant {grant!r}: give PERMISSION=ROLE,ROLE")
        body[permission] = [r for r in roles.split(",") if r]
    if not body:
        raise click.UsageError("give at least one --grant PERMISSION=ROLE,ROLE")
    click.echo(pair_call(admins, user, password, f"/security/{quote(pattern, safe='')}", "PUT",
                         body)["done"])


@security_group.command("remove")
@click.argument("pattern")
@pair_targets
def security_remove(pattern: str, admins: tuple[str, ...], user: str | None,
                    password: str | None) -> None:
    """Remove the rule of PATTERN."""
    click.echo(pair_call(admins, user, password, f"/security/{quote(pattern, safe='')}",
                         "DELETE")["done"])


@security_group.command("list")
@pair_targets
@json_option
def security_list(admins: tuple[str, ...], user: str | None, password: str | None,
                  as_json: bool) -> None:
    """The rules in force, most specific first: pattern, grants, "file" or "run time"."""
    data = pair_call(admins, user, password, "/security")
    if as_json:
        echo_json(data)
        return
    for row in data["rules"]:
        grants = " ".join(f"{p}={','.join(roles)}" for p, roles in row["grants"].items())
        click.echo(f"{row['pattern']}\t{grants}\t{row['source']}")
