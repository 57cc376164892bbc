"""Users, roles and permission rules at run time, through the management API (issue 19,
docs/security.md): what `pairmq user ...`, `pairmq role ...` and `pairmq security ...`
call. Changes are journal records (core/accounts.py), answered once confirmed (on disk and
on the backup), so the pair shares them; only the serving server takes them.

    GET    /users                      the users in force, their roles and where they come from
    PUT    /users/NAME                 {"password": "...", "roles": [...]}: add or replace
    POST   /users/NAME/password        {"password": "..."}
    DELETE /users/NAME                 remove; the user's connections are closed
    POST   /users/NAME/roles           {"role": "..."}: grant
    DELETE /users/NAME/roles/ROLE      revoke
    GET    /roles                      role -> its users
    GET    /security                   the permission rules in force, and their source
    PUT    /security/PATTERN           {"send": [roles], "consume": [...], ...}: set a rule
    DELETE /security/PATTERN           remove a rule

The management middleware lets only users with the `admin` role change anything.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from aiohttp import web

from pairmq.core import Broker
from pairmq.core.permissions import Permission, rule_pattern_problem
from pairmq.server.guards.auth import hash_password, is_hashed
from pairmq.server.manage.httpjson import json_object

log = logging.getLogger("pairmq.admin")
CONFIRM_TIMEOUT_S = 10.0


class UsersHost(Protocol):
    """What the API needs of the server."""

    config: Any

    @property
    def users(self) -> Any: ...

    @property
    def serving(self) -> bool: ...

    @property
    def role(self) -> Any: ...

    @property
    def active_address(self) -> str | None: ...


def user_routes(server: UsersHost, executor: ThreadPoolExecutor) -> list[web.RouteDef]:
    async def change(request: web.Request, what: str,
                     apply: Callable[[Broker], None]) -> web.Response:
        if not server.serving:
            active = server.active_address
            where = f" at {active}" if active else ""
            return web.json_response({"error": "this server does not serve: change users on "
                                               f"the active server{where}",
                                      "active": active}, status=409)
        try:
            await server.role.change_accounts(apply, CONFIRM_TIMEOUT_S)
        except TimeoutError:
            return web.json_response({"error": f"{what}: not confirmed within "
                                               f"{CONFIRM_TIMEOUT_S:.0f} s"}, status=503)
        log.info("User %r (from %s): %s", request["user"], request.remote, what)
        return web.json_response({"done": what})

    async def hashed(password: Any) -> str:
        if not isinstance(password, str) or not password:
            raise web.HTTPBadRequest(text='{"error": "password must be a non-empty string"}',
                                     content_type="application/json")
        if is_hashed(password):
            return password
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, hash_password, password)

    def roles_of(data: dict[str, Any]) -> tuple[str, ...]:
        roles = data.get("roles", [])
        if not isinstance(roles, list) or not all(isinstance(r, str) and r for r in roles):
            raise web.HTTPBadRequest(text='{"error": "roles must be a list of role names"}',
                                     content_type="application/json")
        return tuple(dict.fromkeys(roles))

    def existing(name: str) -> Any:
        user = server.users.get(name)
        if user is None:
            raise web.HTTPNotFound(text=f'{{"error": "no user {name!r}"}}',
                                   content_type="application/json")
        return user

    async def list_users(_request: web.Request) -> web.Response:
        configured = server.config.users
        rows = [{"name": name, "roles": list(user.roles),
                 "source": "file" if configured.get(name) is user else "run time"}
                for name, user in sorted(server.users.items())]
        return web.json_response({"users": rows})

    async def list_roles(_request: web.Request) -> web.Response:
        roles: dict[str, list[str]] = {}
        for name, user in sorted(server.users.items()):
            for role in user.roles:
                roles.setdefault(role, []).append(name)
        return web.json_response({"roles": roles})

    async def put_user(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        data = await json_object(request)
        password, roles = await hashed(data.get("password")), roles_of(data)
        return await change(request, f"user {name!r} set (roles: {', '.join(roles) or 'none'})",
                            lambda broker: broker.set_user(name, password, roles))

    async def set_password(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        user = existing(name)
        password = await hashed((await json_object(request)).get("password"))
        return await change(request, f"password of {name!r} changed",
                            lambda broker: broker.set_user(name, password, user.roles))

    async def remove_user(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        existing(name)
        response = await change(request, f"user {name!r} removed",
                                lambda broker: broker.remove_user(name))
        if response.status == 200:
            for conn in server.role.logged_in(name):
                conn.fail(f"user {name!r} was removed")
        return response

    async def grant(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        user = existing(name)
        role = (await json_object(request)).get("role")
        if not isinstance(role, str) or not role:
            raise web.HTTPBadRequest(text='{"error": "role must be a role name"}',
                                     content_type="application/json")
        roles = tuple(dict.fromkeys((*user.roles, role)))
        return await change(request, f"role {role!r} granted to {name!r}",
                            lambda broker: broker.set_user(name, user.password, roles))

    async def revoke(request: web.Request) -> web.Response:
        name, role = request.match_info["name"], request.match_info["role"]
        user = existing(name)
        roles = tuple(r for r in user.roles if r != role)
        response = await change(request, f"role {role!r} revoked from {name!r}",
                                lambda broker: broker.set_user(name, user.password, roles))
        if response.status == 200:  # its connections had the role: they log in again
            for conn in server.role.logged_in(name):
                conn.fail(f"role {role!r} was revoked from user {name!r}: log in again")
        return response

    async def list_rules(_request: web.Request) -> web.Response:
        configured = server.config.security
        filed = {r.pattern: r for r in (configured.rules if configured else ())}
        rules = server.role.broker.accounts.rules_over(configured)
        rows = [{"pattern": r.pattern,
                 "grants": {str(p): sorted(roles) for p, roles in r.grants.items()},
                 "source": "file" if filed.get(r.pattern) is r else "run time"}
                for r in (rules.rules if rules else ())]
        return web.json_response({"rules": rows})

    async def put_rule(request: web.Request) -> web.Response:
        pattern = request.match_info["pattern"]
        problem = rule_pattern_problem(pattern)
        data = await json_object(request)
        known = {p.value for p in Permission}
        unknown = sorted(set(data) - known)
        if problem or unknown or not data:
            why = f"the pattern {problem}" if problem else \
                f"unknown permission {unknown[0]!r}; known: {', '.join(known)}" if unknown \
                else "give at least one permission"
            raise web.HTTPBadRequest(text=json.dumps({"error": why}),
                                     content_type="application/json")
        grants = tuple((name, roles_of({"roles": roles})) for name, roles in data.items())
        return await change(request, f"rule {pattern!r} set",
                            lambda broker: broker.set_rule(pattern, grants))

    async def remove_rule(request: web.Request) -> web.Response:
        pattern = request.match_info["pattern"]
        rules = server.role.broker.accounts.rules_over(server.config.security)
        if rules is None or all(r.pattern != pattern for r in rules.rules):
            raise web.HTTPNotFound(text=json.dumps({"error": f"no rule {pattern!r}"}),
                                   content_type="application/json")
        return await change(request, f"rule {pattern!r} removed",
                            lambda broker: broker.remove_rule(pattern))

    return [web.get("/users", list_users), web.get("/roles", list_roles),
            web.get("/security", list_rules), web.put("/security/{pattern}", put_rule),
            web.delete("/security/{pattern}", remove_rule),
            web.put("/users/{name}", put_user),
            web.post("/users/{name}/password", set_password),
            web.delete("/users/{name}", remove_user),
            web.post("/users/{name}/roles", grant),
            web.delete("/users/{name}/roles/{role}", revoke)]
