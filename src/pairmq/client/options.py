"""The client's options: one table drives the keyword arguments, the URL parameters (the
Artemis names, in camelCase) and the error messages, as the server's `KEYS` table does for
its configuration.

    failover:(stomp://h1:61613,stomp://h2:61614)?reconnectAttempts=-1&retryInterval=100
    stomp://h1:61613            h1:61613,h2:61614            (no failover: prefix needed)
    failover:(stomp+ssl://h1:61617,stomp+ssl://h2:61618)?trustStorePath=ca.pem  (TLS)
    cluster:(failover:(stomp://a1:1,stomp://a2:2),stomp://b:3)?clusterMember=0  (members:
        pairs or standalone servers; client/members.py)
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import parse_qsl

from pairmq.client.errors import ConfigurationError
from pairmq.client.members import TLS_SCHEMES as TLS_SCHEMES
from pairmq.client.members import Address as Address
from pairmq.client.members import Member, is_cluster_url, parse_cluster_url
from pairmq.client.members import parse_address as parse_address


def _at_least(n: int) -> Callable[[Any], str | None]:
    return lambda v: None if v >= n else f"must be >= {n}, got {v}"


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}, got {v!r}"


@dataclass(frozen=True)
class Option:
    name: str  # the keyword argument
    url_name: str  # the URL parameter (Artemis' name where Artemis has one)
    type: type
    default: Any
    help: str
    check: Callable[[Any], str | None] | None = None


OPTIONS: tuple[Option, ...] = (
    Option("reconnect_attempts", "reconnectAttempts", int, -1,
           "rounds over the servers after a connection failed before giving up "
           "(-1: for ever, 0: do not reconnect)", _at_least(-1)),
    Option("initial_connect_attempts", "initialConnectAttempts", int, 1,
           "rounds over the servers at connect() before it raises ConnectionFailed "
           "(-1: for ever)", _at_least(-1)),
    Option("retry_interval", "retryInterval", int, 100,
           "ms to wait after a round in which every server refused", _at_least(0)),
    Option("retry_interval_multiplier", "retryIntervalMultiplier", float, 1.5,
           "each further wait is the last one times this", _at_least(1)),
    Option("max_retry_interval", "maxRetryInterval", int, 500,
           "longest wait between two rounds (ms)", _at_least(0)),
    Option("client_failure_check_period", "clientFailureCheckPeriod", int, 10000,
           "ms of silence from the server after which the connection counts as failed "
           "(heart-beats are asked for every half of it; 0: no heart-beats)", _at_least(0)),
    Option("connection_ttl", "connectionTTL", int, 10000,
           "ms the server keeps this client's session after the connection breaks, so a "
           "reconnection to the same server resumes it (0: no resuming)", _at_least(0)),
    Option("call_timeout", "callTimeout", int, 30000,
           "ms a blocking call waits for the server while connected", _at_least(1)),
    Option("call_failover_timeout", "callFailoverTimeout", int, 30000,
           "ms a blocking call waits for a failover to finish before it raises "
           "FailoverError (-1: for ever)", _at_least(-1)),
    Option("connect_timeout", "connectTimeout", int, 5000,
           "ms for one TCP connection and its CONNECTED", _at_least(1)),
    Option("send_window", "sendWindow", int, 1000,
           "persistent sends waiting for their confirmation, at most (send_async blocks "
           "past it)", _at_least(1)),
    Option("client_id", "clientID", str, None,
           "client-id sent on CONNECT (ActiveMQ-style durable subscriptions)"),
    Option("outbox", "outbox", str, None,
           "path of a SQLite file: a durable connection that keeps sending while no "
           "server is reachable"),
    Option("outbox_max_messages", "outboxMaxMessages", int, 100000,
           "messages the outbox holds at most (a batch counts as one)", _at_least(1)),
    Option("outbox_max_bytes", "outboxMaxBytes", int, 64 * 1024 * 1024,
           "bytes of bodies the outbox holds at most", _at_least(1)),
    Option("outbox_full_policy", "outboxFullPolicy", str, "fail",
           "when the outbox is full: fail (OutboxFull) or block (wait for room)",
           _one_of("fail", "block")),
    Option("ssl_enabled", "sslEnabled", bool, False,
           "connect over TLS (stomp+ssl:// addresses turn it on)"),
    Option("trust_store_path", "trustStorePath", str, None,
           "PEM file of the CA(s) that sign the servers' certificates (default: the "
           "system's); implies TLS"),
    Option("key_store_path", "keyStorePath", str, None,
           "PEM file holding this client's certificate and its private key, for a server "
           "that asks for one ([tls] client_auth); implies TLS"),
    Option("verify_host", "verifyHost", bool, True,
           "check that the server's certificate names the host connected to"),
    Option("cluster_member", "clusterMember", int, -1,
           "with a cluster: URL, the member to start with (0: the URL's first); -1: one at "
           "random, so that clients spread over the members", _at_least(-1)),
)

_BY_URL = {o.url_name.lower(): o for o in OPTIONS}
_BY_NAME = {o.name: o for o in OPTIONS}


@dataclass(frozen=True, kw_only=True)
class ClientOptions:
    """Every option, resolved: the defaults are in OPTIONS (one place), not here."""

    servers: tuple[Address, ...]
    login: str | None
    passcode: str | None
    reconnect_attempts: int
    initial_connect_attempts: int
    retry_interval: int
    retry_interval_multiplier: float
    max_retry_interval: int
    client_failure_check_period: int
    connection_ttl: int
    call_timeout: int
    call_failover_timeout: int
    connect_timeout: int
    send_window: int
    client_id: str | None
    outbox: str | None
    outbox_max_messages: int
    outbox_max_bytes: int
    outbox_full_policy: str
    ssl_enabled: bool
    trust_store_path: str | None
    key_store_path: str | None
    verify_host: bool
    cluster_member: int
    # the members of a cluster: URL (client/members.py); () for any other URL, whose
    # servers are one pair (or one server) and which never moves elsewhere
    members: tuple[Member, ...] = ()

    @property
    def tls(self) -> bool:
        return self.ssl_enabled or bool(self.trust_store_path or self.key_store_path)

    @property
    def heart_beat(self) -> tuple[int, int]:
        """What CONNECT offers: beats every half of the failure check period, both ways."""
        half = self.client_failure_check_period // 2
        return half, half


assert {f.name for f in fields(ClientOptions)} - {"servers", "login", "passcode", "members"} \
    == set(_BY_NAME), "ClientOptions and OPTIONS must name the same options"

_FAILOVER = re.compile(r"^failover:\((?P<inner>[^)]*)\)(?:\?(?P<query>.*))?$", re.DOTALL)



def _convert(option: Option, value: Any, where: str) -> Any:
    if value is None:
        if option.default is None:
            return None
        raise ConfigurationError(f"{where} must not be empty")
    try:
        if option.type is bool and isinstance(value, str):
            lowered = value.lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            converted: Any = lowered in ("true", "1", "yes")
        elif option.type is str:
            converted = os.fspath(value) if not isinstance(value, str) else value
        elif option.type is int and isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        else:
            converted = option.type(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"{where} must be {option.type.__name__}, got {value!r}"
                                 ) from None
    if option.check is not None:
        problem = option.check(converted)
        if problem:
            raise ConfigurationError(f"{where} {problem}")
    return converted


def _url_parameters(query: str, values: dict[str, Any]) -> None:
    """A URL's `?name=value&...` into `values`, by the options' URL names."""
    for name, value in parse_qsl(query, keep_blank_values=True):
        option = _BY_URL.get(name.lower())
        if option is None:
            raise ConfigurationError(f"unknown URL parameter {name!r}; known: "
                                     + ", ".join(o.url_name for o in OPTIONS))
        values[option.name] = _convert(option, value, f"URL parameter {name}")


def parse_options(url: str | list[str] | tuple[str, ...], keywords: Mapping[str, Any]
                  ) -> ClientOptions:
    """The URL's servers and parameters, then the keyword arguments (which win)."""
    values: dict[str, Any] = {o.name: o.default for o in OPTIONS}
    members: tuple[Member, ...] = ()
    if isinstance(url, str) and is_cluster_url(url):
        cluster = parse_cluster_url(url)
        _url_parameters(cluster.query, values)
        members = cluster.members
        addresses = list(cluster.addresses)
    elif isinstance(url, str):
        match = _FAILOVER.match(url.strip())
        if match:
            inner = match.group("inner")
            _url_parameters(match.group("query") or "", values)
        else:
            inner = url
        addresses = [part for part in inner.split(",") if part.strip()]
    else:
        addresses = list(url)
    if not addresses:
        raise ConfigurationError(f"no server address in {url!r}")
    servers = tuple(dict.fromkeys(parse_address(a) for a in addresses))
    over_tls = [a.strip().startswith(TLS_SCHEMES) for a in addresses]
    if any(over_tls):
        if not all(over_tls):
            raise ConfigurationError(f"servers of one client all use TLS or none does: "
                                     f"{url!r} mixes stomp+ssl:// with plaintext addresses")
        values["ssl_enabled"] = True
    login = keywords.get("login")
    passcode = keywords.get("passcode")
    for name, value in keywords.items():
        if name in ("login", "passcode"):
            continue
        option = _BY_NAME.get(name)
        if option is None:
            raise ConfigurationError(f"unknown option {name!r}; known: login, passcode, "
                                     + ", ".join(_BY_NAME))
        values[name] = _convert(option, value, f"option {name}")
    if values["cluster_member"] >= max(len(members), 1):
        raise ConfigurationError(
            f"option cluster_member is {values['cluster_member']}, but "
            + (f"the cluster URL names {len(members)} members (0 to {len(members) - 1}; "
               "-1: one at random)" if members else "the URL is not a cluster: URL"))
    return ClientOptions(servers=servers, login=login, passcode=passcode, members=members,
                         **values)
