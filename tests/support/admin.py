"""Talking to a real server's management HTTP with credentials, in one place.

The management port refuses requests without a user that has the right role
(docs/configuration.md, "Management HTTP"). Servers started by the test helpers get
ADMIN_USER (through `admin_user_flags()`), and every helper that reads /status or POSTs
/activate goes through `admin_request` / `admin_status`, or passes `admin_env()` to the
`pairmq` command (tests/support/cli.py).
"""

from __future__ import annotations

import base64
import functools
import http.client
import json
import urllib.error
import urllib.request
from typing import Any

from pairmq.server.guards.auth import hash_password
from tests.support.waiting import wait_until

ADMIN_USER = "pairmq-test-admin"
ADMIN_PASSWORD = "admin-test-password"
ADMIN = (ADMIN_USER, ADMIN_PASSWORD)


@functools.cache
def hashed(password: str) -> str:
    """`password`'s scrypt hash, made once per test process: a server given the hash does
    not hash the password itself at start (server/guards/passwords.py), 30-50 ms of CPU per
    server on this 2-core machine, hundreds of times a run."""
    return hash_password(password)


def admin_user_flags(user: str = ADMIN_USER, password: str = ADMIN_PASSWORD) -> list[str]:
    """Server flags adding a user with the admin role (`--user NAME:PASSWORD` gives it)."""
    return ["--user", f"{user}:{hashed(password)}"]


def admin_env(user: str = ADMIN_USER, password: str = ADMIN_PASSWORD) -> dict[str, str]:
    """Environment for `pairmq status` / `pairmq activate` to log in as `user`."""
    return {"PAIRMQ_USER": user, "PAIRMQ_PASSWORD": password}


def basic_auth(user: str, password: str) -> str:
    """The value of an Authorization header for HTTP basic auth."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def admin_request(address: str, path: str, method: str = "GET",
                  credentials: tuple[str, str] | None = ADMIN, timeout: float = 5.0,
                  headers: dict[str, str] | None = None, data: Any = None
                  ) -> tuple[int, dict[str, str], Any]:
    """(HTTP status, response headers, body: JSON if it parses, else text) of one request
    (`data`, if given, sent as its JSON body); HTTP errors are answers too. OSError when the
    port does not answer."""
    all_headers = dict(headers or {})
    if credentials is not None:
        all_headers["Authorization"] = basic_auth(*credentials)
    payload = None
    if data is not None:
        payload = json.dumps(data).encode()
        all_headers["Content-Type"] = "application/json"
    request = urllib.request.Request(f"http://{address}{path}", method=method,
                                     headers=all_headers, data=payload)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            code, reply_headers, raw = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        code, reply_headers, raw = e.code, dict(e.headers), e.read()
    try:
        body: Any = json.loads(raw)
    except ValueError:
        body = raw.decode(errors="replace")
    return code, reply_headers, body


def admin_status(address: str, timeout: float = 2.0,
                 credentials: tuple[str, str] | None = ADMIN) -> dict[str, Any] | None:
    """GET /status as the test admin, or None while the server does not answer it (not
    listening yet, or killed mid-answer). A refusal (401, 403) is raised: it means the
    server was started without the test admin, which no waiting would fix."""
    try:
        code, _headers, body = admin_request(address, "/status", credentials=credentials,
                                             timeout=timeout)
    except (OSError, ValueError, http.client.HTTPException):
        return None
    if code in (401, 403):
        raise RuntimeError(f"{address} refused GET /status to the test admin ({code}): {body}")
    return body if code == 200 and isinstance(body, dict) else None


def status_when_up(address: str, timeout: float = 10.0) -> dict[str, Any]:
    """GET /status once the management port answers: it opens a moment after the STOMP
    port, which is what starting a server waits for."""
    return wait_until(lambda: admin_status(address), f"{address} to answer GET /status",
                      timeout, interval=0.05)


def metric(address: str, name: str) -> float:
    """The value of one unlabelled series of GET /metrics (as the test admin)."""
    code, _, body = admin_request(address, "/metrics")
    if code != 200:
        raise AssertionError(f"GET /metrics answered {code}: {str(body)[:300]}")
    for line in str(body).splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    raise AssertionError(f"no {name} in /metrics: {str(body)[:300]!r}")


def api(address: str, path: str, data: Any = None, credentials: tuple[str, str] = ADMIN
        ) -> Any:
    """The JSON answer of one management API request (a POST of `data`, or a GET), which
    must succeed (200)."""
    code, _, body = admin_request(address, path, method="GET" if data is None else "POST",
                                  credentials=credentials, data=data)
    assert code == 200, (code, body)
    return body


def metric_samples(address: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every sample of GET /metrics: sample name -> {sorted label pairs: value}, parsed
    by prometheus_client's own text parser (so the text is valid exposition format)."""
    from prometheus_client.parser import text_string_to_metric_families

    code, _, body = admin_request(address, "/metrics")
    if code != 200:
        raise AssertionError(f"GET /metrics answered {code}: {str(body)[:300]}")
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(str(body)):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = \
                sample.value
    return samples


def admin_port() -> tuple[str, list[str]]:
    """(address, server flags) for a server with a management port and the test admin."""
    from tests.serverproc import free_port

    address = f"127.0.0.1:{free_port()}"
    return address, ["--admin", address, *admin_user_flags()]


def managed_server(server_factory: Any, *flags: str, **kwargs: Any) -> tuple[Any, str]:
    """(server, its management address): a standalone server started by the
    `server_factory` fixture with a management port and the test admin, once /status
    answers."""
    address, admin_flags = admin_port()
    srv = server_factory(*flags, *admin_flags, **kwargs)
    status_when_up(address)
    return srv, address


def sample_value(samples: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str,
                 **labels: str) -> float:
    """The value of one series of `metric_samples`, by its name and labels."""
    key = tuple(sorted(labels.items()))
    assert name in samples, f"no {name} in /metrics"
    assert key in samples[name], f"{name}{labels} not in {sorted(samples[name])}"
    return samples[name][key]
