"""The server's configuration: the TOML file and the flags read into one `ServerConfig`,
checked key by key (the keys, typed, are `Settings` in settings.py) and across keys."""

from __future__ import annotations

import os
import ssl
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pairmq.core.permissions import Permission, Rule, SecurityRules, rule_pattern_problem
from pairmq.core.settings import (
    AddressFullPolicy,
    CoreSettings,
    DestinationOverride,
    Retention,
    pattern_problem,
    sorted_overrides,
)
from pairmq.server.arbiter_url import EtcdCluster, etcd_cluster
from pairmq.server.settings import KEYS, KEYS_BY_SECTION, Key, Settings
from pairmq.server.tls import TlsError, TlsFiles, build, etcd_tls_context
from pairmq.store.settings import StoreSettings


class ConfigError(Exception):
    """A configuration the server refuses to start with; the message names the key."""




@dataclass(frozen=True)
class User:
    name: str
    password: str  # plain, or "scrypt$..." from `pairmq passwd`
    roles: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServerConfig(Settings):
    """Every key's value (`Settings`, typed), and the tables that are not single keys."""

    users: Mapping[str, User] = field(default_factory=dict)
    source: str = "defaults"
    overrides: tuple[DestinationOverride, ...] = ()  # [destinations.overrides."PATTERN"]
    retention: tuple[tuple[str, Retention], ...] = ()  # [streams.retention.NAME]
    security: SecurityRules | None = None  # [security."PATTERN"]; None: no rules

    def core_settings(self) -> CoreSettings:
        return CoreSettings(
            default_prefetch=self.default_prefetch,
            max_delivery_attempts=self.max_delivery_attempts,
            dead_letter_prefix=self.dead_letter_prefix,
            expired_policy=self.expired_policy,
            max_size_bytes=self.max_size_bytes,
            dup_cache_size=self.dup_cache_size,
            producer_expiry_ms=self.producer_expiry_ms,
            max_producers=self.max_producers,
            max_destinations=self.max_destinations,
            max_subscriptions_per_connection=self.max_subscriptions_per_connection,
            auto_delete_delay_ms=self.auto_delete_delay_ms if self.auto_delete_queues else -1,
            max_transaction_messages=self.max_transaction_messages,
            max_transaction_bytes=self.max_transaction_bytes,
            address_full_policy=AddressFullPolicy(self.address_full_policy),
            overrides=self.overrides,
            global_max_size_bytes=memory_budget(self.global_max_size_bytes),
            max_disk_usage=self.max_disk_usage,
            full_policy=self.full_policy,
            stream_retention=Retention(self.max_bytes, self.max_age_ms),
            stream_overrides=self.retention,
        )

    def store_settings(self) -> StoreSettings:
        return StoreSettings(
            segment_bytes=self.segment_bytes,
            max_journal_bytes=self.max_journal_bytes,
            full_policy=self.full_policy,
            paging_bytes=self.paging_bytes,
            paged_beyond=recovery_cap(self.core_settings().paged_beyond,
                                      self.recovery_in_memory_bytes),
            stall_timeout_s=self.stall_timeout_ms / 1000,
        )

    @property
    def client_listener(self) -> str:
        """The STOMP address clients are told about: plaintext, or TLS when it is off."""
        return self.stomp or self.stomp_tls

    @property
    def stomp_host(self) -> str:
        return self.client_listener.rpartition(":")[0]

    @property
    def stomp_port(self) -> int:
        return int(self.client_listener.rpartition(":")[2])

    @property
    def tls_files(self) -> TlsFiles:
        return TlsFiles(self.cert, self.key, self.ca, self.client_auth)

    @property
    def tls_purposes(self) -> tuple[str, ...]:
        """The TLS contexts this configuration needs (server/tls.py)."""
        return tuple(["stomp"] * bool(self.stomp_tls or self.stomp_ws_tls)
                     + ["admin"] * bool(self.admin_tls)
                     + ["peer_server", "peer_client"] * bool(self.tls))

    @property
    def etcd(self) -> EtcdCluster | None:
        """The etcd cluster `[ha] witness` names (None: `pairmq witness`, or no witness)."""
        return etcd_cluster(self.witness) if self.witness else None

    @property
    def etcd_tls_files(self) -> tuple[str, str, str]:
        """etcds://: (certificate, key, CA), each `[ha] etcd_*` or else `[tls]`'s."""
        return (self.etcd_cert or self.cert, self.etcd_key or self.key, self.etcd_ca or self.ca)

    @property
    def member_name(self) -> str:
        """This server's member of [cluster]: the same on both servers of a pair."""
        return self.cluster_member or self.group or self.name

    @property
    def tls_used(self) -> bool:
        return bool(self.stomp_tls or self.stomp_ws_tls or self.admin_tls or self.tls)


def _typed(key: Key, value: Any, where: str) -> Any:
    if key.type is tuple:  # a list of strings (a flag's are space-separated: load_config)
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where} must be a list of strings, got {value!r}")
        value = tuple(value)
        ok = True
    elif key.type is bool:
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
    return {bool: "true or false", int: "an integer", str: "a string",
            tuple: "a list of strings"}[t]


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


def recovery_cap(paged_beyond: Callable[[str], int], most: int) -> Callable[[str], int]:
    """What a start keeps in memory of a paging destination: its limit, or `most` when that
    is less (recovery_in_memory_bytes; 0 = its limit). A destination that does not page
    (0) still does not."""
    if not most:
        return paged_beyond

    def capped(destination: str) -> int:
        limit = paged_beyond(destination)
        return min(limit, most) if limit else 0

    return capped


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
    values = {key.field: key.default for key in KEYS}
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
                values[key.field] = _typed(key, value, f"{source}: [{section}] {name}")
    by_name = {key.field: key for key in KEYS}
    for name, value in (overrides or {}).items():
        if value is None:
            continue
        key = by_name[name]
        if key.type is tuple and isinstance(value, str):
            value = value.split()
        values[name] = _typed(key, value, f"{key.flag}")
    for name, password in (extra_users or {}).items():
        users[name] = User(name, password, ("admin",))
    streams = tuple((name, Retention(spec.get("max_bytes", values["max_bytes"]),
                                     spec.get("max_age_ms", values["max_age_ms"]),
                                     spec.get("group")))
                    for name, spec in retention.items())
    config = ServerConfig(**values, users=users, source=source,
                          overrides=sorted_overrides(patterns), retention=streams,
                          security=security)
    _check_ha(config, source)
    _check_database(config, source)
    _check_cluster(config, source)
    _check_tls(config, source)
    return config


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


def _check_ha(v: ServerConfig, source: str) -> None:
    """Rules across keys of [ha], refused at start with a message that says what to change."""
    if v.policy == "none":
        return
    where = f"{source}: [ha]"
    heartbeat, activation = v.heartbeat_interval_ms, v.activation_interval_ms
    if activation < 2 * heartbeat:
        raise ConfigError(f"{where} activation_interval_ms ({activation}) must be at least twice "
                          f"heartbeat_interval_ms ({heartbeat}), or one late heartbeat would "
                          "look like a dead server")
    # colocated: the backup is found in the cluster and dials this live; it has no peer
    required = (("listen", v.listen),) if v.policy == "colocated" else \
        (("listen", v.listen), ("peer", v.peer))
    for name, address in required:
        if not address:
            raise ConfigError(f"{where} {name} is required with policy = \"{v.policy}\"")
    if not v.secret:
        raise ConfigError(f"{where} secret is required: the pair and the witness authenticate "
                          "each other with it")
    if v.policy == "colocated":
        _check_colocated(v, where)
    if v.listen == v.peer:
        raise ConfigError(f"{where} listen and peer are the same address ({v.listen})")
    if v.policy == "shared-store":
        _check_shared(v, where)
    elif v.shared_dir:
        raise ConfigError(f"{where} shared_dir is only used with policy = \"shared-store\"")
    elif v.etcd is not None:
        _check_etcd(v, v.etcd, where)


def _check_database(v: ServerConfig, source: str) -> None:
    """[store] url: a server alone, or a shared-store pair, keeps its journal in the database
    (docs/database.md)."""
    where = f"{source}: [store]"
    if not v.url:
        if v.password_file:
            raise ConfigError(f"{where} password_file is only used with url")
        return
    if v.policy not in ("none", "shared-store"):
        raise ConfigError(f"{where} url is used with [ha] policy = \"none\" or "
                          f"\"shared-store\" (this server has \"{v.policy}\"): a replicated "
                          "pair keeps a journal on each server (docs/database.md)")
    if v.password_file and not Path(v.password_file).is_file():
        raise ConfigError(f"{where} password_file {v.password_file}: no such file")


def _check_colocated(v: ServerConfig, where: str) -> None:
    if not v.cluster_name:
        raise ConfigError(f"{where} policy = \"colocated\" needs a [cluster]: the backups are "
                          "hosted by its members")
    if v.peer:
        raise ConfigError(f"{where} peer is not used with policy = \"colocated\": the backup "
                          "is hosted by a member of the cluster, which starts it and dials "
                          "this live")
    if v.witness and v.etcd is None:
        raise ConfigError(f"{where} witness {v.witness}: a `pairmq witness` arbitrates one "
                          "pair; colocated lives and backups are many pairs, so their arbiter "
                          "is an etcd cluster (witness = \"etcd://HOST:PORT,...\", one [ha] "
                          "group per live), or none")
    if v.role != "primary":
        raise ConfigError(f"{where} role must be primary with policy = \"colocated\": a "
                          "member runs its own live, and the backups it hosts are started for "
                          "it")
    ports = [a for a in (v.stomp, v.stomp_tls, v.stomp_ws, v.admin, v.listen) if a]
    highest = max(int(a.rpartition(":")[2]) for a in ports)
    top = highest + v.backup_port_offset * v.max_backups
    if top > 65535:
        raise ConfigError(f"{where} backup_port_offset = {v.backup_port_offset} with "
                          f"max_backups = {v.max_backups} puts a hosted backup's port at "
                          f"{top}, past 65535")


def _check_cluster(v: ServerConfig, source: str) -> None:
    """Rules across keys of [cluster] (docs/cluster.md)."""
    where = f"{source}: [cluster]"
    if not v.cluster_name:
        if v.scale_down:
            raise ConfigError(f"{source}: [ha] scale_down needs a [cluster]: it moves this "
                              "server's messages to another member")
        if v.cluster_members or v.cluster_member:
            raise ConfigError(f"{where} name is required: members and member belong to a "
                              "named cluster")
        return
    if not v.cluster_members and v.etcd is None:
        raise ConfigError(f"{where} members is required (the other members' URLs), unless "
                          "[ha] witness is an etcd cluster, where members find each other")
    if v.policy != "none" and not (v.cluster_member or v.group):
        raise ConfigError(f"{where} member (or [ha] group) is required on a pair: both "
                          "servers of a pair are one member and must give it one name")
    if v.cluster_password and not v.cluster_user:
        raise ConfigError(f"{where} password is set without user")
    if len(set(v.cluster_members)) != len(v.cluster_members):
        raise ConfigError(f"{where} members lists one URL twice")


def _check_etcd(v: ServerConfig, cluster: EtcdCluster, where: str) -> None:
    if not v.group:
        raise ConfigError(f"{where} group is required with an etcd witness ({v.witness}): it "
                          "names the pair's keys in etcd, the same on both servers")
    if not cluster.tls:
        return
    cert, key, ca = v.etcd_tls_files
    files = (("etcd_cert (or [tls] cert)", cert), ("etcd_key (or [tls] key)", key),
             ("etcd_ca (or [tls] ca)", ca))
    missing = [name for name, value in files if not value]
    if missing:
        raise ConfigError(f"{where} witness {v.witness} is etcd over mutual TLS: "
                          f"{', '.join(missing)} required")
    for name, value in files:
        if not Path(value).is_file():
            raise ConfigError(f"{where} {name} {value}: no such file (etcd over mutual TLS)")
    try:
        etcd_tls_context(cert, key, ca)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"{where} etcd TLS files ({cert}, {key}, {ca}): {e}") from None


def _check_shared(v: ServerConfig, where: str) -> None:
    shared = v.shared_dir
    if v.url:  # the pair's journal and lock are in the database
        if shared:
            raise ConfigError(f"{where} shared_dir is not used with [store] url: both servers "
                              "keep the journal in the database, and the lease there decides "
                              "who writes it")
        if v.witness:
            raise ConfigError(f"{where} witness is not used with policy = \"shared-store\": "
                              "the database's lease decides who is active")
        return
    if not shared:
        raise ConfigError(f"{where} shared_dir is required with policy = \"shared-store\": the "
                          "directory both servers mount, holding the journal")
    path = Path(shared)
    if not path.is_dir():
        raise ConfigError(f"{where} shared_dir {shared} is not a directory (create it on the "
                          "shared file system, then start the servers)")
    if path.resolve() == Path(v.data_dir).resolve():
        raise ConfigError(f"{where} shared_dir must not be this server's data_dir "
                          f"({shared}): data_dir keeps files of this server alone")
    if v.witness:
        raise ConfigError(f"{where} witness is not used with policy = \"shared-store\": the "
                          "lock on the shared directory decides who is active")


def _check_tls(v: ServerConfig, source: str) -> None:
    """A listener needs one of stomp and stomp_tls, no two listeners share an address;
    TLS anywhere needs a usable [tls] (every context it will need is built once here, so a
    bad file stops the start)."""
    if not v.stomp and not v.stomp_tls:
        raise ConfigError(f"{source}: [server] stomp and stomp_tls are both empty: give at "
                          "least one STOMP listener")
    addresses = {"stomp": v.stomp, "stomp_tls": v.stomp_tls, "stomp_ws": v.stomp_ws,
                 "admin": v.admin}  # [server]: no two on one address
    listeners = [name for name, at in addresses.items() if at and not at.endswith(":0")]
    for i, name in enumerate(listeners):
        for other in listeners[i + 1:]:
            if addresses[name] == addresses[other]:
                raise ConfigError(f"{source}: [server] {name} and {other} are the same "
                                  f"address ({addresses[name]})")
    if v.stomp_ws_tls and not v.stomp_ws:
        raise ConfigError(f"{source}: [server] stomp_ws_tls is set but stomp_ws is empty: "
                          "give the WebSocket listener's HOST:PORT")
    used = [name for name, on in (("stomp_tls", v.stomp_tls), ("stomp_ws_tls", v.stomp_ws_tls),
                                  ("admin_tls", v.admin_tls), ("tls", v.tls)) if on]
    files = v.tls_files
    if not used:
        return
    if not files.configured:
        raise ConfigError(f"{source}: [tls] cert and key are required by "
                          f"{', '.join(used)}")
    if v.tls and v.policy == "none":
        raise ConfigError(f"{source}: [ha] tls is set but [ha] policy is \"none\"")
    try:
        for purpose in v.tls_purposes:
            build(files, purpose)
    except TlsError as e:
        raise ConfigError(f"{source}: {e}") from None
