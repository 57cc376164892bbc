"""Management HTTP(S): /status (JSON), /metrics (Prometheus), POST /activate and POST
/reload (operator; [server] admin_tls serves HTTPS).

Every request is checked against [auth.users] with HTTP basic auth (docs/configuration.md,
"Management HTTP"): writes need the `admin` role, reads `admin` or `monitor` unless
`anonymous_management_reads` opens them. `allow_anonymous` (STOMP) never opens this port.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import BasicAuth, hdrs, web
from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric

from pairmq.core.permissions import MANAGEMENT, Permission
from pairmq.server.config import User
from pairmq.server.guards.auth import ADMIN_ROLE, is_management_read, management_roles
from pairmq.server.guards.passwords import Busy
from pairmq.server.manage.console import console_routes
from pairmq.server.manage.managed_server import ManagedServer
from pairmq.server.manage.metrics import Collector
from pairmq.server.manage.operator_api import operator_routes
from pairmq.server.manage.status import server_status
from pairmq.server.manage.users_api import user_routes
from pairmq.server.tls import TlsError

log = logging.getLogger("pairmq.admin")
audit = logging.getLogger("pairmq.audit")  # management changes and refusals

REALM = 'Basic realm="pairmq"'
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _Snapshot:
    """Metric families already read, for generate_latest to write out in a thread."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def _refused(status: int, problem: str) -> web.Response:
    """401 asks for credentials (with the challenge a browser or curl understands); 403 says
    the user is known but lacks the role."""
    headers = {hdrs.WWW_AUTHENTICATE: REALM} if status == 401 else None
    return web.json_response({"error": problem}, status=status, headers=headers)


def _basic_credentials(header: str | None) -> tuple[str, str] | None:
    """(login, password) from an Authorization header; ValueError when it is not basic auth."""
    if header is None:
        return None
    credentials = BasicAuth.decode(header, encoding="utf-8")
    return credentials.login, credentials.password


def _granted(server: ManagedServer, read: bool, roles: tuple[str, ...]) -> bool:
    """The [security] rules' say beside the admin and monitor roles: `manage` on
    pairmq.management for changes and message browsing, `browse` on it for reads
    (docs/security.md)."""
    rules = server.role.broker.accounts.rules_over(server.config.security)
    if rules is None:
        return False
    permission = Permission.BROWSE if read else Permission.MANAGE
    return rules.allows(roles, permission, MANAGEMENT)


def _cross_site(request: web.Request) -> str | None:
    """Why a change (or a look at messages) comes from another site's page, or None.

    A browser sends a logged-in operator's basic-auth login with any request to this
    port, a form another site's page submits included (cross-site request forgery): such a
    request names its page in `Origin`, and modern browsers say `Sec-Fetch-Site:
    cross-site`. The console's own requests are same-origin; the CLI, curl and scripts
    send neither header, and are let through to the login as before."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        return f"a request from another site's page (Sec-Fetch-Site: {site})"
    origin = request.headers.get(hdrs.ORIGIN)
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        return f"a request from another site's page (Origin: {origin})"
    return None


def _auth_middleware(server: ManagedServer) -> Any:
    open_reads: bool = server.config.anonymous_management_reads

    @web.middleware
    async def require_role(request: web.Request, handler: Handler) -> web.StreamResponse:
        method, path = request.method, request.path
        read = is_management_read(method, path)
        if not read and (forged := _cross_site(request)) is not None:
            log.warning("Management HTTP refused %s %s from %s: %s", method, path,
                        request.remote, forged)
            audit.warning("management refused a cross-site request: %s %s from %s (%s)",
                          method, path, request.remote, forged)
            return _refused(403, f"forbidden: {forged}")
        if open_reads and read:
            return await handler(request)
        roles = management_roles(method, path)
        needs = " or ".join(roles)
        where = f"{method} {path} from {request.remote}"
        try:
            credentials = _basic_credentials(request.headers.get(hdrs.AUTHORIZATION))
        except ValueError as e:
            log.warning("Management HTTP refused %s: malformed Authorization header (%s)",
                        where, e)
            return _refused(401, f"authentication failed: the Authorization header is not "
                                 f"valid HTTP basic auth ({e})")
        if credentials is None:
            log.warning("Management HTTP refused %s: no credentials", where)
            return _refused(401, f"authentication required: {method} {path} needs a user "
                                 f"with role {needs} (HTTP basic auth)")
        login, password = credentials
        user = await _checked(server, request.remote or "?", login, password)
        if user is None:
            log.warning("Management HTTP refused %s: unknown user or wrong password for %r",
                        where, login)
            audit.warning("management login refused: %r, %s", login, where)
            return _refused(401, "authentication failed: unknown user or wrong password")
        if not set(roles) & set(user.roles) and not _granted(server, read, user.roles):
            has = ", ".join(user.roles) or "none"
            if server.role.broker.accounts.rules_over(server.config.security) is not None:
                needs += f", or permission {'browse' if read else 'manage'} on {MANAGEMENT}"
            log.warning("Management HTTP refused %s: user %r lacks role %s", where, login, needs)
            audit.warning("management denied: user %r lacks role %s for %s", login, needs,
                          where)
            return _refused(403, f"forbidden: {method} {path} needs role {needs}; user "
                                 f"{login!r} has: {has}")
        request["user"] = user.name
        response = await handler(request)
        if not read:  # a change or a look at messages: who, from where, what, the answer
            audit.info("management: user %r, %s: HTTP %d", user.name, where, response.status)
        return response

    return require_role


async def _checked(server: ManagedServer, host: str, login: str, password: str) -> User | None:
    """The user, if the password is right: at once if it was verified a moment ago, else
    after the address's delay for its failed logins (server/guards/failed_logins.py) and an
    scrypt in a login thread (server/guards/passwords.py), as a STOMP login is checked."""
    loop = asyncio.get_running_loop()
    users = server.users
    passwords, logins = server.passwords, server.logins
    user = passwords.known(users, login, password, loop.time())
    if user is not None:
        return user
    while (wait := logins.admit(host, loop.time())) > 0:
        await asyncio.sleep(wait)
    try:
        user = await passwords.check(users, login, password, loop.time, host)
    except Busy as e:
        raise web.HTTPServiceUnavailable(text=json.dumps({"error": str(e)}),
                                         content_type="application/json") from None
    if user is None:
        logins.failed(host, loop.time())
    else:
        logins.succeeded(host)
    return user


async def start_admin(server: ManagedServer, address: str) -> web.AppRunner:
    collector = Collector(server)

    async def status(_request: web.Request) -> web.Response:
        return web.json_response(server_status(server))

    async def metrics(_request: web.Request) -> web.Response:
        # The figures are read on the loop (they change there), bounded by
        # max_destination_metrics; the text is written in a thread (25 MB took 2 s).
        families = _Snapshot(await collector.snapshot())
        body = await asyncio.get_running_loop().run_in_executor(
            executor, generate_latest, families)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})

    async def activate(request: web.Request) -> web.Response:
        pair = server.pair
        if server.config.policy == "none":
            return web.json_response({"error": "not part of a pair"}, status=400)
        if server.serving:
            return web.json_response({"state": pair.state.value})
        refused = pair.force()
        if refused is not None:
            log.warning("Refused an operator's forced activation (user %s): %s",
                        request["user"], refused)
            return web.json_response({"state": pair.state.value, "error": refused},
                                     status=409)
        log.warning("An operator forced this server to activate (user %s)", request["user"])
        return web.json_response({"state": pair.state.value, "forced": True})

    async def reload(request: web.Request) -> web.Response:
        try:
            done = server.reload_tls()
        except TlsError as e:
            return web.json_response({"error": str(e)}, status=409)
        log.info("TLS reload asked by user %s: %s", request["user"], done)
        return web.json_response({"tls": done})

    # a thread for the management port's slow work: new passwords' hashes, /metrics' text
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pairmq-admin")
    app = web.Application(middlewares=[_auth_middleware(server)])
    app.add_routes([web.get("/status", status), web.get("/metrics", metrics),
                    web.post("/activate", activate), web.post("/reload", reload)])
    app.add_routes(user_routes(server, executor))  # server/manage/users_api.py
    app.add_routes(operator_routes(server))  # server/manage/operator_api.py
    app.add_routes(console_routes())  # server/manage/console.py: the web console at /

    async def shutdown_executor(_app: web.Application) -> None:
        executor.shutdown(wait=False, cancel_futures=True)

    app.on_cleanup.append(shutdown_executor)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, _, port = address.rpartition(":")
    tls = server.tls.listener("admin") if server.config.admin_tls and server.tls else None
    await web.TCPSite(runner, host, int(port), ssl_context=tls).start()
    if not any(ADMIN_ROLE in user.roles for user in server.config.users.values()):
        log.warning("No user has the admin role: the management port refuses POST /activate. "
                    "Add one to [auth.users] (roles = [\"admin\"]).")
    reads = "open to anyone" if server.config.anonymous_management_reads else \
        "for users with role admin or monitor"
    log.info("Management HTTP on %s://%s/status and /metrics (%s)",
             "https" if tls else "http", address, reads)
    return runner
