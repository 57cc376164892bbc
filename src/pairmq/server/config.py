"""The server's configuration: one table of keys drives the TOML file and the flags alike."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pairmq.core.permissions import Permission, Rule, SecurityRules, rule_pattern_problem
from pairmq.core.settings import (
    ADDRESS_FULL_POLICIES,
    EXPIRED_POLICIES,
    AddressFullPolicy,
    CoreSettings,
    DestinationOverride,
    Retention,
    pattern_problem,
    sorted_overrides,
)
from pairmq.protocol.limits import HEADERS_ADDED
from pairmq.server.tls import CLIENT_AUTH, TlsError, TlsFiles, build
from pairmq.store.settings import FULL_POLICIES, StoreSettings

LOG_LEVELS = ("debug", "info", "warning", "error")
HA_POLICIES = ("none", "replication", "shared-store")


class ConfigError(Exception):
    """A configuration the server refuses to start with; the message names the key."""


def _address(value: str) -> str | None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        return f'must be HOST:PORT, got "{value}"'
    return None


def _optional_address(value: str) -> str | None:
    return None if value == "" else _address(value)


def _at_least(n: int) -> Callable[[int], str | None]:
    return lambda v: None if v >= n else f"must be an integer >= {n}, got {v}"


def _between(low: int, high: int) -> Callable[[int], str | None]:
    return lambda v: None if low <= v <= high else \
        f"must be an integer from {low} to {high}, got {v}"


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str | None]:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}, got \"{v}\""


@dataclass(frozen=True)
class Key:
    section: str
    name: str
    type: type
    default: Any
    help: str
    check: Callable[[Any], str | None] | None = None
    flag_name: str | None = None  # when the key's name alone would be unclear as a flag

    @property
    def flag(self) -> str:
        return "--" + (self.flag_name or self.name).replace("_", "-")


KEYS: tuple[Key, ...] = (
    Key("server", "name", str, "standalone", "server name, used in message ids and logs"),
    Key("server", "data_dir", str, "data/standalone", "directory for this server's data"),
    Key("server", "stomp", str, "127.0.0.1:61613",
        "STOMP listener HOST:PORT (plaintext); empty = off", _optional_address),
    Key("server", "stomp_tls", str, "",
        "STOMP over TLS listener HOST:PORT, with [tls]; empty = off", _optional_address),
    Key("server", "stomp_ws", str, "",
        "STOMP over WebSocket listener HOST:PORT (ws://HOST:PORT/stomp, for browsers and "
        "JavaScript clients); empty = off", _optional_address),
    Key("server", "stomp_ws_tls", bool, False,
        "the WebSocket listener speaks wss://, with [tls] (client certificates as on "
        "stomp_tls)"),
    Key("server", "heartbeat_ms", int, 10000, "heart-beat offered to clients (ms, 0 = none)",
        _at_least(0)),
    Key("server", "log_level", str, "info", "debug, info, warning or error", _one_of(LOG_LEVELS)),
    Key("server", "deliver_unconfirmed", bool, False,
        "hand persistent messages to consumers before their record is confirmed (on disk "
        "and, in a pair, on the backup): less latency, but after a failover a consumer may "
        "get a message twice"),
    Key("server", "admin", str, "", "management HTTP HOST:PORT (status, metrics); empty = off",
        _optional_address),
    Key("server", "admin_tls", bool, False, "the management port speaks HTTPS, with [tls]"),
    Key("server", "max_destination_metrics", int, 10_000,
        "/metrics has per-destination series while the server holds at most this many "
        "destinations (0 = never)", _at_least(0)),
    Key("server", "connection_ttl_max_ms", int, 60000,
        "longest a client may ask (CONNECT header connection-ttl) that its session be kept "
        "after its connection breaks, to resume it on reconnecting (ms, 0 = never kept)",
        _at_least(0)),
    Key("tls", "cert", str, "", "PEM file: this server's certificate, then its chain",
        flag_name="tls_cert"),
    Key("tls", "key", str, "", "PEM file: the certificate's private key", flag_name="tls_key"),
    Key("tls", "ca", str, "", "PEM file: the CA(s) that sign client certificates (when "
        "asked) and the pair's and the witness's certificates", flag_name="tls_ca"),
    Key("tls", "client_auth", str, "none",
        "client certificates on stomp_tls and stomp_ws_tls: none, optional or required (a client "
        "certificate may then stand in for login: its CN is the user)",
        _one_of(CLIENT_AUTH), flag_name="tls_client_auth"),
    Key("limits", "max_frame_bytes", int, 16 * 1024 * 1024, "largest frame accepted (bytes)",
        _at_least(256)),
    Key("limits", "max_headers", int, 1000, "most headers in one frame (a message keeps "
        f"{HEADERS_ADDED} fewer: the server's own go with it when it is delivered)",
        _at_least(HEADERS_ADDED + 2)),
    Key("limits", "max_header_bytes", int, 10240, "longest header line (bytes)", _at_least(16)),
    Key("limits", "pre_login_frame_bytes", int, 8192,
        "largest frame accepted before the client has logged in (bytes; RabbitMQ's smaller "
        "pre-authentication limit): its CONNECT and what it sends before CONNECTED",
        _at_least(512)),
    Key("limits", "frame_timeout_ms", int, 60000,
        "a frame begun must be complete within this (ms, 0 = no deadline)", _at_least(0)),
    Key("limits", "max_connections", int, -1,
        "client connections held at once; past it new ones get an ERROR and are closed "
        "(-1 = the open-files limit less 256)", _at_least(-1)),
    Key("limits", "max_connections_per_address", int, 1000,
        "client connections from one address at once (0 = no limit)", _at_least(0)),
    Key("destinations", "default_prefetch", int, 1000,
        "unacknowledged messages per client-ack subscription", _at_least(1)),
    Key("destinations", "max_delivery_attempts", int, 10,
        "deliveries before a message is dead-lettered (0 = unlimited)", _at_least(0)),
    Key("destinations", "dead_letter_prefix", str, "DLQ.", "dead-letter queue name prefix",
        lambda v: None if v else "must not be empty"),
    Key("destinations", "expired_policy", str, "dead-letter", "dead-letter or drop",
        _one_of(EXPIRED_POLICIES)),
    Key("destinations", "max_size_bytes", int, 64 * 1024 * 1024,
        "bytes a destination holds before its address_full_policy applies (0 = unlimited)",
        _at_least(0)),
    Key("destinations", "address_full_policy", str, "page",
        "past max_size_bytes: page (persistent bodies on disk only), block, fail or drop",
        _one_of(ADDRESS_FULL_POLICIES)),
    Key("destinations", "global_max_size_bytes", int, -1,
        "bytes of messages held in memory, all destinations; past it new messages are held "
        "or refused per [store] full_policy (-1 = half of this machine's memory, 0 = no "
        "limit)", _at_least(-1)),
    Key("destinations", "max_destinations", int, 100_000,
        "destinations clients' SENDs and SUBSCRIBEs may make; past it they get an ERROR "
        "(temporary queues included; 0 = no limit)", _at_least(0)),
    Key("limits", "max_subscriptions_per_connection", int, 10_000,
        "subscriptions one connection may hold (ending a connection ends them all in one "
        "turn of the server; 0 = no limit)", _at_least(0)),
    Key("destinations", "auto_delete_queues", bool, True,
        "a queue or topic that is empty and unused for auto_delete_delay_ms is deleted "
        "(Artemis' auto-delete-queues); one that remembers dup-ids or producer sequences "
        "stays until they expire"),
    Key("destinations", "auto_delete_delay_ms", int, 60_000,
        "how long a destination is empty and unused before it is deleted", _at_least(0)),
    Key("destinations", "max_transaction_messages", int, 100_000,
        "messages one transaction may hold until its COMMIT, sent or acknowledged (one "
        "of more than 1,000 SENDs is applied in slices of about 10 ms, a slice per turn of "
        "the server)", _at_least(1)),
    Key("destinations", "max_transaction_bytes", int, 64 * 1024 * 1024,
        "bytes of messages one transaction may hold until its COMMIT (they count in "
        "global_max_size_bytes meanwhile)", _at_least(1024)),
    Key("destinations", "max_browse_messages", int, 400,
        "messages a queue browser (SUBSCRIBE browser:true) is shown, from the head of the "
        "queue (ActiveMQ's maxBrowsePageSize)", _at_least(1)),
    Key("destinations", "dup_cache_size", int, 20000,
        "dup-ids remembered per destination (advertised on CONNECTED)", _at_least(1)),
    Key("destinations", "producer_expiry_ms", int, 7 * 24 * 3600 * 1000,
        "a producer's sequence is forgotten once it stored nothing for this long (ms, 0 = "
        "never)", _at_least(0)),
    Key("destinations", "max_producers", int, 100_000,
        "producer sequences remembered per destination; past it the least recently active "
        "is forgotten (0 = no limit)", _at_least(0)),
    Key("streams", "max_bytes", int, 1024 * 1024 * 1024,
        "bytes each stream keeps (bodies, headers, 64 per message); past it the oldest "
        "messages are removed (0 = unlimited)", _at_least(0)),
    Key("streams", "max_age_ms", int, 0,
        "age past which a stream's messages are removed (ms, 0 = kept forever)",
        _at_least(0)),
    Key("store", "segment_bytes", int, 64 * 1024 * 1024, "journal segment file size",
        _at_least(64 * 1024)),
    Key("store", "max_journal_bytes", int, 0,
        "journal size at which new persistent messages are refused (0 = disk size)",
        _at_least(0)),
    Key("store", "full_policy", str, "fail",
        "when the journal, the disk (max_disk_usage) or memory (global_max_size_bytes) is "
        "full: fail (ERROR to the sender) or block (stop reading)", _one_of(FULL_POLICIES)),
    Key("store", "max_disk_usage", int, 90,
        "percent of the data directory's file system in use at which new persistent "
        "messages are held or refused per full_policy (100 = no check)", _between(1, 100)),
    Key("store", "paging_bytes", int, 256 * 1024 * 1024,
        "persistent message bodies held in memory; beyond it they stay on disk",
        _at_least(0)),
    Key("auth", "allow_anonymous", bool, False, "accept clients without a login"),
    Key("auth", "failed_login_delay_max_ms", int, 10000,
        "failed logins from one address delay its next attempts, 100 ms doubling up to "
        "this (ms, 0 = no delay); other addresses are not slowed", _at_least(0)),
    Key("auth", "anonymous_management_reads", bool, False,
        "GET /status and /metrics without credentials (writes always need an admin)"),
    Key("ha", "policy", str, "none", "none, replication or shared-store",
        _one_of(HA_POLICIES)),
    Key("ha", "shared_dir", str, "",
        "shared-store: the directory both servers mount (SAN, GFS2, NFSv4) holding the "
        "journal and its lock file"),
    Key("ha", "role", str, "primary", "primary or backup", _one_of(("primary", "backup"))),
    Key("ha", "listen", str, "", "HA channel HOST:PORT of this server", _optional_address),
    Key("ha", "peer", str, "", "HA channel HOST:PORT of the other server", _optional_address),
    Key("ha", "witness", str, "", "witness HOST:PORT; empty = none (split brain possible)",
        _optional_address),
    Key("ha", "secret", str, "", "shared secret of the pair and the witness"),
    Key("ha", "tls", bool, False, "HA channel and witness over mutual TLS with [tls] (the "
        "peer's and the witness's certificates must come from its ca)", flag_name="ha_tls"),
    Key("ha", "heartbeat_interval_ms", int, 500, "heartbeats on the HA channel", _at_least(10)),
    Key("ha", "activation_interval_ms", int, 2000,
        "silence after which the peer is taken for dead (>= 2 heartbeats)", _at_least(20)),
    Key("ha", "allow_failback", bool, True, "the primary takes its place back once in sync"),
    Key("ha", "failover_on_shutdown", bool, False,
        "a clean stop of the active hands over to the backup"),
    Key("ha", "backup_ack", str, "fsync",
        "the backup acknowledges after its own fsync, or on receipt (write)",
        _one_of(("fsync", "write"))),
    Key("ha", "replication_mode", str, "sync",
        "sync (receipts wait for the backup) or async (may lose the last records)",
        _one_of(("sync", "async"))),
    Key("ha", "initial_replication_sync_timeout_ms", int, 300000,
        "how long one initial synchronisation may take before it is restarted", _at_least(100)),
)

HA_KEYS = tuple(key.name for key in KEYS if key.section == "ha")

KEYS_BY_SECTION: dict[str, dict[str, Key]] = {}
for _key in KEYS:
    KEYS_BY_SECTION.setdefault(_key.section, {})[_key.name] = _key


@dataclass(frozen=True)
class User:
    name: str
    password: str  # plain, or "scrypt$..." from `pairmq passwd`
    roles: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServerConfig:
    values: Mapping[str, Any]  # key name -> value, for every key in KEYS
    users: Mapping[str, User] = field(default_factory=dict)
    source: str = "defaults"
    overrides: tuple[DestinationOverride, ...] = ()  # [destinations.overrides."PATTERN"]
    retention: tuple[tuple[str, Retention], ...] = ()  # [streams.retention.NAME]
    security: SecurityRules | None = None  # [security."PATTERN"]; None: no rules

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    def core_settings(self) -> CoreSettings:
        v = self.values
        return CoreSettings(
            default_prefetch=v["default_prefetch"],
            max_delivery_attempts=v["max_delivery_attempts"],
            dead_letter_prefix=v["dead_letter_prefix"],
            expired_policy=v["expired_policy"],
            max_size_bytes=v["max_size_bytes"],
            dup_cache_size=v["dup_cache_size"],
            producer_expiry_ms=v["producer_expiry_ms"],
            max_producers=v["max_producers"],
            max_destinations=v["max_destinations"],
            max_subscriptions_per_connection=v["max_subscriptions_per_connection"],
            auto_delete_delay_ms=v["auto_delete_delay_ms"] if v["auto_delete_queues"] else -1,
            max_transaction_messages=v["max_transaction_messages"],
            max_transaction_bytes=v["max_transaction_bytes"],
            address_full_policy=AddressFullPolicy(v["address_full_policy"]),
            overrides=self.overrides,
            global_max_size_bytes=memory_budget(v["global_max_size_bytes"]),
            max_disk_usage=v["max_disk_usage"],
            full_policy=v["full_policy"],
            stream_retention=Retention(v["max_bytes"], v["max_age_ms"]),
            stream_overrides=self.retention,
        )

    def store_settings(self) -> StoreSettings:
        v = self.values
        return StoreSettings(
            segment_bytes=v["segment_bytes"],
            max_journal_bytes=v["max_journal_bytes"],
            full_policy=v["full_policy"],
            paging_bytes=v["paging_bytes"],
            paged_beyond=self.core_settings().paged_beyond,
        )

    @property
    def client_listener(self) -> str:
        """The STOMP address clients are told about: plaintext, or TLS when it is off."""
        return self.values["stomp"] or self.values["stomp_tls"]

    @property
    def stomp_host(self) -> str:
        return self.client_listener.rpartition(":")[0]

    @property
    def stomp_port(self) -> int:
        return int(self.client_listener.rpartition(":")[2])

    @property
    def tls_files(self) -> TlsFiles:
        v = self.values
        return TlsFiles(v["cert"], v["key"], v["ca"], v["client_auth"])

    @property
    def tls_purposes(self) -> tuple[str, ...]:
        """The TLS contexts this configuration needs (server/tls.py)."""
        v = self.values
        return tuple(["stomp"] * bool(v["stomp_tls"] or v["stomp_ws_tls"])
                     + ["admin"] * bool(v["admin_tls"])
                     + ["peer_server", "peer_client"] * bool(v["tls"]))

    @property
    def tls_used(self) -> bool:
        v = self.values
        return bool(v["stomp_tls"] or v["stomp_ws_tls"] or v["admin_tls"] or v["tls"])


def _typed(key: Key, value: Any, where: str) -> Any:
    if key.type is bool:
        ok = isinstance(value, bool)
    elif key.type is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, key.type)
    if not ok:
        raise ConfigError(f"{where} must be {_type_name(key.type)}, got {value!r}")
    if key.check is not None:
        problem = key.check(value)
        if problem:
            raise ConfigError(f"{where} {problem}")
    return value


def _type_name(t: type) -> str:
    return {bool: "true or false", int: "an integer", str: "a string"}[t]


def _users(table: Any, source: str) -> dict[str, User]:
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [auth.users] must be a table of users")
    users = {}
    for name, spec in table.items():
        where = f"{source}: [auth.users.{name}]"
        if not isinstance(spec, dict):
            raise ConfigError(f"{where} must be a table with password and roles")
        unknown = set(spec) - {"password", "roles"}
        if unknown:
            raise ConfigError(f"{where} has unknown key {sorted(unknown)[0]!r}")
        password = spec.get("password")
        if not isinstance(password, str) or not password:
            raise ConfigError(f"{where} password must be a non-empty string")
        roles = spec.get("roles", [])
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise ConfigError(f"{where} roles must be a list of strings")
        users[name] = User(name, password, tuple(roles))
    return users


def memory_budget(configured: int) -> int:
    """global_max_size_bytes in bytes: -1 is half of the physical memory (as Artemis' -1 is
    half of the JVM's heap)."""
    if configured != -1:
        return configured
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2


# keys an override may set
OVERRIDABLE = ("address_full_policy", "max_size_bytes", "dup_cache_size")


def _overrides(table: Any, source: str) -> list[DestinationOverride]:
    """`[destinations.overrides."PATTERN"]` tables, each checked like the keys it sets."""
    where = f"{source}: [destinations.overrides]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table of destination patterns, e.g. "
                          '[destinations.overrides."/queue/orders.*"]')
    found = []
    for pattern, spec in table.items():
        here = f"{source}: [destinations.overrides.\"{pattern}\"]"
        problem = pattern_problem(pattern)
        if problem:
            raise ConfigError(f"{here}: the pattern {problem}")
        if not isinstance(spec, dict):
            raise ConfigError(f"{here} must be a table setting {', '.join(OVERRIDABLE)}")
        unknown = sorted(set(spec) - set(OVERRIDABLE))
        if unknown:
            raise ConfigError(f"{here} has unknown key {unknown[0]!r}: an override may set "
                              f"{', '.join(OVERRIDABLE)}")
        if not spec:
            raise ConfigError(f"{here} sets nothing: give {', '.join(OVERRIDABLE)}")
        keys = KEYS_BY_SECTION["destinations"]
        values = {name: _typed(keys[name], value, f"{here} {name}")
                  for name, value in spec.items()}
        policy = values.get("address_full_policy")
        found.append(DestinationOverride(
            pattern, AddressFullPolicy(policy) if policy is not None else None,
            values.get("max_size_bytes"), values.get("dup_cache_size")))
    return found


RETENTION_KEYS = ("max_bytes", "max_age_ms", "group")  # what [streams.retention.NAME] sets


def _retention(table: Any, source: str) -> dict[str, dict[str, Any]]:
    """`[streams.retention.NAME]` tables (or `retention = {NAME = {...}}`), checked like the
    keys they set; applied over [streams] defaults once all flags are in."""
    where = f"{source}: [streams.retention]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table of stream names, e.g. "
                          "[streams.retention.orders] max_bytes = 1073741824")
    found: dict[str, dict[str, Any]] = {}
    for name, spec in table.items():
        here = f"{source}: [streams.retention.{name}]"
        if not name or "/" in name:
            raise ConfigError(f"{here}: name the stream without /stream/, got {name!r}")
        if not isinstance(spec, dict) or not spec:
            raise ConfigError(f"{here} must be a table setting {', '.join(RETENTION_KEYS)}")
        unknown = sorted(set(spec) - set(RETENTION_KEYS))
        if unknown:
            raise ConfigError(f"{here} has unknown key {unknown[0]!r}: a stream's retention "
                              f"may set {', '.join(RETENTION_KEYS)}")
        keys = KEYS_BY_SECTION["streams"]
        values: dict[str, Any] = {}
        for key, value in spec.items():
            if key == "group":
                if not isinstance(value, str) or not value:
                    raise ConfigError(f"{here} group must be a non-empty string (the consumer "
                                      f"group whose offset protects the stream), got {value!r}")
                values[key] = value
            else:
                values[key] = _typed(keys[key], value, f"{here} {key}")
        found[name] = values
    return found


def load_config(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None,
                extra_users: Mapping[str, str] | None = None) -> ServerConfig:
    """Read the TOML file (if any), apply flag overrides, validate everything."""
    values = {key.name: key.default for key in KEYS}
    users: dict[str, User] = {}
    patterns: list[DestinationOverride] = []  # [destinations.overrides."PATTERN"]
    retention: dict[str, dict[str, Any]] = {}  # [streams.retention.NAME]
    security: SecurityRules | None = None  # [security."PATTERN"]
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"config file {source} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{source} is not valid TOML: {e}") from None
        for section, table in doc.items():
            if section == "security":
                security = _security(table, source)
                continue
            known = KEYS_BY_SECTION.get(section)
            if known is None:
                raise ConfigError(f"{source}: unknown section [{section}]")
            if not isinstance(table, dict):
                raise ConfigError(f"{source}: [{section}] must be a table")
            for name, value in table.items():
                if section == "auth" and name == "users":
                    users.update(_users(value, source))
                    continue
                if section == "destinations" and name == "overrides":
                    patterns = _overrides(value, source)
                    continue
                if section == "streams" and name == "retention":
                    retention = _retention(value, source)
                    continue
                key = known.get(name)
                if key is None:
                    raise ConfigError(f"{source}: unknown key {name!r} in [{section}]")
                values[name] = _typed(key, value, f"{source}: [{section}] {name}")
    by_name = {key.name: key for key in KEYS}
    for name, value in (overrides or {}).items():
        if value is None:
            continue
        key = by_name[name]
        values[name] = _typed(key, value, f"{key.flag}")
    for name, password in (extra_users or {}).items():
        users[name] = User(name, password, ("admin",))
    _check_ha(values, source)
    _check_tls(values, source)
    streams = tuple((name, Retention(spec.get("max_bytes", values["max_bytes"]),
                                     spec.get("max_age_ms", values["max_age_ms"]),
                                     spec.get("group")))
                    for name, spec in retention.items())
    return ServerConfig(values, users, source, sorted_overrides(patterns), streams, security)


def _security(table: Any, source: str) -> SecurityRules:
    """`[security."PATTERN"]` tables: each permission (Artemis' names) a list of roles."""
    example = '[security."orders.#"] send = ["producers"]'
    if not isinstance(table, dict) or not table:
        raise ConfigError(f"{source}: [security] must be tables of destination patterns, "
                          f"e.g. {example}")
    known = {p.value: p for p in Permission}
    rules = []
    for pattern, spec in table.items():
        here = f"{source}: [security.\"{pattern}\"]"
        problem = rule_pattern_problem(pattern)
        if problem:
            raise ConfigError(f"{here}: the pattern {problem}")
        if not isinstance(spec, dict):
            raise ConfigError(f"{here} must be a table of permissions, e.g. {example}")
        grants = {}
        for name, roles in spec.items():
            permission = known.get(name)
            if permission is None:
                raise ConfigError(f"{here} has unknown permission {name!r}; known: "
                                  f"{', '.join(known)}")
            if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
                raise ConfigError(f"{here} {name} must be a list of role names")
            grants[permission] = frozenset(roles)
        rules.append(Rule(pattern, grants))
    return SecurityRules(rules)


def _check_ha(v: dict[str, Any], source: str) -> None:
    """Rules across keys of [ha], refused at start with a message that says what to change."""
    if v["policy"] == "none":
        return
    where = f"{source}: [ha]"
    heartbeat, activation = v["heartbeat_interval_ms"], v["activation_interval_ms"]
    if activation < 2 * heartbeat:
        raise ConfigError(f"{where} activation_interval_ms ({activation}) must be at least twice "
                          f"heartbeat_interval_ms ({heartbeat}), or one late heartbeat would "
                          "look like a dead server")
    for name in ("listen", "peer"):
        if not v[name]:
            raise ConfigError(f"{where} {name} is required with policy = \"{v['policy']}\"")
    if not v["secret"]:
        raise ConfigError(f"{where} secret is required: the pair and the witness authenticate "
                          "each other with it")
    if v["listen"] == v["peer"]:
        raise ConfigError(f"{where} listen and peer are the same address ({v['listen']})")
    if v["policy"] == "shared-store":
        _check_shared(v, where)
    elif v["shared_dir"]:
        raise ConfigError(f"{where} shared_dir is only used with policy = \"shared-store\"")


def _check_shared(v: dict[str, Any], where: str) -> None:
    shared = v["shared_dir"]
    if not shared:
        raise ConfigError(f"{where} shared_dir is required with policy = \"shared-store\": the "
                          "directory both servers mount, holding the journal")
    path = Path(shared)
    if not path.is_dir():
        raise ConfigError(f"{where} shared_dir {shared} is not a directory (create it on the "
                          "shared file system, then start the servers)")
    if path.resolve() == Path(v["data_dir"]).resolve():
        raise ConfigError(f"{where} shared_dir must not be this server's data_dir "
                          f"({shared}): data_dir keeps files of this server alone")
    if v["witness"]:
        raise ConfigError(f"{where} witness is not used with policy = \"shared-store\": the "
                          "lock on the shared directory decides who is active")


LISTENERS = ("stomp", "stomp_tls", "stomp_ws", "admin")  # [server]: no two on one address


def _check_tls(v: dict[str, Any], source: str) -> None:
    """A listener needs one of stomp and stomp_tls, no two listeners share an address;
    TLS anywhere needs a usable [tls] (every context it will need is built once here, so a
    bad file stops the start)."""
    if not v["stomp"] and not v["stomp_tls"]:
        raise ConfigError(f"{source}: [server] stomp and stomp_tls are both empty: give at "
                          "least one STOMP listener")
    listeners = [name for name in LISTENERS if v[name] and not v[name].endswith(":0")]
    for i, name in enumerate(listeners):
        for other in listeners[i + 1:]:
            if v[name] == v[other]:
                raise ConfigError(f"{source}: [server] {name} and {other} are the same "
                                  f"address ({v[name]})")
    if v["stomp_ws_tls"] and not v["stomp_ws"]:
        raise ConfigError(f"{source}: [server] stomp_ws_tls is set but stomp_ws is empty: "
                          "give the WebSocket listener's HOST:PORT")
    used = [name for name in ("stomp_tls", "stomp_ws_tls", "admin_tls", "tls") if v[name]]
    files = TlsFiles(v["cert"], v["key"], v["ca"], v["client_auth"])
    if not used:
        return
    if not files.configured:
        raise ConfigError(f"{source}: [tls] cert and key are required by "
                          f"{', '.join(used)}")
    if v["tls"] and v["policy"] == "none":
        raise ConfigError(f"{source}: [ha] tls is set but [ha] policy is \"none\"")
    try:
        for purpose in ServerConfig(v).tls_purposes:
            build(files, purpose)
    except TlsError as e:
        raise ConfigError(f"{source}: {e}") from None
