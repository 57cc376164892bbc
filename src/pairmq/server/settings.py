"""Every key of a server's configuration, typed: one table drives the TOML file, the
command-line flags, the errors that name a bad value, and the attributes the server reads.

`Settings` is that table: each field is one key, declared with `setting(section, default,
help, check)`; `KEYS` is read off its fields, so a key is written once and read everywhere
with its type (`config.heartbeat_ms` is an int to mypy, not Any). Loading and the rules
across keys are in config.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from pairmq.core.settings import ADDRESS_FULL_POLICIES, EXPIRED_POLICIES
from pairmq.protocol.limits import HEADERS_ADDED
from pairmq.server.arbiter_url import group_problem, witness_problem
from pairmq.server.tls import CLIENT_AUTH
from pairmq.store.settings import FULL_POLICIES

LOG_LEVELS = ("debug", "info", "warning", "error")
LOAD_BALANCING = ("off", "strict", "on_demand", "off_with_redistribution")  # Artemis' names
HA_POLICIES = ("none", "replication", "shared-store", "colocated")

T = TypeVar("T")
Check = Callable[[Any], "str | None"]  # None: the value is fine; else what is wrong with it


def _address(value: str) -> str | None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        return f'must be HOST:PORT, got "{value}"'
    return None


def _member_urls(value: tuple[str, ...]) -> str | None:
    for url in value:
        if not url.startswith(("failover:(", "stomp://", "stomp+ssl://")) or \
                (url.startswith("failover:(") and not url.endswith(")")):
            return (f'must list members as "failover:(stomp://HOST:PORT,stomp://HOST:PORT)" '
                    f'(a pair) or "stomp://HOST:PORT" (a standalone server), got "{url}"')
    return None


def _member_name(value: str) -> str | None:
    if value and (len(value) > 64 or not all(c.isalnum() or c in "-_." for c in value)):
        return f"must be 1 to 64 letters, digits, '-', '_' or '.', got \"{value}\""
    return None


def _optional_address(value: str) -> str | None:
    return None if value == "" else _address(value)


def _database_url(value: str) -> str | None:
    if value and not value.startswith(("postgresql://", "postgres://")):
        return 'must be "postgresql://USER:PASSWORD@HOST:PORT/DATABASE" or empty'
    return None


def _at_least(n: int) -> Callable[[int], str | None]:
    return lambda v: None if v >= n else f"must be an integer >= {n}, got {v}"


def _between(low: int, high: int) -> Callable[[int], str | None]:
    return lambda v: None if low <= v <= high else \
        f"must be an integer from {low} to {high}, got {v}"


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str | None]:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}, got \"{v}\""


@dataclass(frozen=True)
class Key:
    """One key: where it goes in the TOML file, its flag, its type, its default and help."""

    section: str
    name: str
    type: type
    default: Any
    help: str
    check: Check | None = None
    flag_name: str | None = None  # when the key's name alone would be unclear as a flag
    attr: str = ""  # the attribute of `Settings` (the name, unless two sections share it)

    @property
    def flag(self) -> str:
        return "--" + (self.flag_name or self.attr or self.name).replace("_", "-")

    @property
    def field(self) -> str:
        """The attribute of `Settings` that holds this key's value."""
        return self.attr or self.name


@dataclass(frozen=True)
class _Declared:
    section: str
    help: str
    check: Check | None
    flag_name: str | None
    toml: str | None  # the key's name in its section, when not the attribute's


def setting(section: str, default: T, help: str, check: Check | None = None, *,
            flag_name: str | None = None, toml: str | None = None) -> T:
    """A field of `Settings`: its default, and what KEYS says of it. `toml` names the key
    in its section when the attribute cannot ([cluster] name is `cluster_name`)."""
    declared = _Declared(section, help, check, flag_name, toml)
    return field(default=default, metadata={"key": declared})


@dataclass(frozen=True)
class Settings:
    """The value of every key (the order is the flags' order in `pairmq server --help`)."""
    # [server]
    name: str = setting("server", "standalone", "server name, used in message ids and logs")
    data_dir: str = setting("server", "data/standalone", "directory for this server's data")
    stomp: str = setting("server", "127.0.0.1:61613",
        "STOMP listener HOST:PORT (plaintext); empty = off", _optional_address)
    stomp_tls: str = setting("server", "",
        "STOMP over TLS listener HOST:PORT, with [tls]; empty = off", _optional_address)
    stomp_ws: str = setting("server", "",
        "STOMP over WebSocket listener HOST:PORT (ws://HOST:PORT/stomp, for browsers and "
        "JavaScript clients); empty = off", _optional_address)
    stomp_ws_tls: bool = setting("server", False,
        "the WebSocket listener speaks wss://, with [tls] (client certificates as on stomp_tls)")
    heartbeat_ms: int = setting("server", 10000, "heart-beat offered to clients (ms, 0 = none)",
        _at_least(0))
    log_level: str = setting("server", "info", "debug, info, warning or error", _one_of(LOG_LEVELS))
    deliver_unconfirmed: bool = setting("server", False,
        "hand persistent messages to consumers before their record is confirmed (on disk and, in "
        "a pair, on the backup): less latency, but after a failover a consumer may get a message "
        "twice")
    admin: str = setting("server", "", "management HTTP HOST:PORT (status, metrics); empty = off",
        _optional_address)
    admin_tls: bool = setting("server", False, "the management port speaks HTTPS, with [tls]")
    max_destination_metrics: int = setting("server", 10_000,
        "/metrics has per-destination series while the server holds at most this many "
        "destinations (0 = never)", _at_least(0))
    connection_ttl_max_ms: int = setting("server", 60000,
        "longest a client may ask (CONNECT header connection-ttl) that its session be kept after "
        "its connection breaks, to resume it on reconnecting (ms, 0 = never kept)", _at_least(0))

    # [tls]
    cert: str = setting("tls", "", "PEM file: this server's certificate, then its chain",
        flag_name="tls_cert")
    key: str = setting("tls", "", "PEM file: the certificate's private key", flag_name="tls_key")
    ca: str = setting("tls", "",
        "PEM file: the CA(s) that sign client certificates (when asked) and the pair's and the "
        "witness's certificates", flag_name="tls_ca")
    client_auth: str = setting("tls", "none",
        "client certificates on stomp_tls and stomp_ws_tls: none, optional or required (a client "
        "certificate may then stand in for login: its CN is the user)", _one_of(CLIENT_AUTH),
        flag_name="tls_client_auth")

    # [limits]
    max_frame_bytes: int = setting("limits", 16 * 1024 * 1024, "largest frame accepted (bytes)",
        _at_least(256))
    max_headers: int = setting("limits", 1000,
        "most headers in one frame (a message keeps "
        f"{HEADERS_ADDED} fewer: the server's own go with it when it is delivered)",
        _at_least(HEADERS_ADDED + 2))
    max_header_bytes: int = setting("limits", 10240, "longest header line (bytes)", _at_least(16))
    pre_login_frame_bytes: int = setting("limits", 8192,
        "largest frame accepted before the client has logged in (bytes; RabbitMQ's smaller "
        "pre-authentication limit): its CONNECT and what it sends before CONNECTED", _at_least(512))
    frame_timeout_ms: int = setting("limits", 60000,
        "a frame begun must be complete within this (ms, 0 = no deadline)", _at_least(0))
    max_connections: int = setting("limits", -1,
        "client connections held at once; past it new ones get an ERROR and are closed (-1 = the "
        "open-files limit less 256)", _at_least(-1))
    max_connections_per_address: int = setting("limits", 1000,
        "client connections from one address at once (0 = no limit)", _at_least(0))

    # [destinations]
    default_prefetch: int = setting("destinations", 1000,
        "unacknowledged messages per client-ack subscription", _at_least(1))
    max_delivery_attempts: int = setting("destinations", 10,
        "deliveries before a message is dead-lettered (0 = unlimited)", _at_least(0))
    dead_letter_prefix: str = setting("destinations", "DLQ.", "dead-letter queue name prefix",
        lambda v: None if v else "must not be empty")
    expired_policy: str = setting("destinations", "dead-letter", "dead-letter or drop",
        _one_of(EXPIRED_POLICIES))
    max_size_bytes: int = setting("destinations", 64 * 1024 * 1024,
        "bytes a destination holds before its address_full_policy applies (0 = unlimited)",
        _at_least(0))
    address_full_policy: str = setting("destinations", "page",
        "past max_size_bytes: page (persistent bodies on disk only), block, fail or drop",
        _one_of(ADDRESS_FULL_POLICIES))
    global_max_size_bytes: int = setting("destinations", -1,
        "bytes of messages held in memory, all destinations; past it new messages are held or "
        "refused per [store] full_policy (-1 = half of this machine's memory, 0 = no limit)",
        _at_least(-1))
    max_destinations: int = setting("destinations", 100_000,
        "destinations clients' SENDs and SUBSCRIBEs may make; past it they get an ERROR "
        "(temporary queues included; 0 = no limit)", _at_least(0))

    # [limits]
    max_subscriptions_per_connection: int = setting("limits", 10_000,
        "subscriptions one connection may hold (ending a connection ends them all in one turn of "
        "the server; 0 = no limit)", _at_least(0))

    # [destinations]
    auto_delete_queues: bool = setting("destinations", True,
        "a queue or topic that is empty and unused for auto_delete_delay_ms is deleted (Artemis' "
        "auto-delete-queues); one that remembers dup-ids or producer sequences stays until they "
        "expire")
    auto_delete_delay_ms: int = setting("destinations", 60_000,
        "how long a destination is empty and unused before it is deleted", _at_least(0))
    max_transaction_messages: int = setting("destinations", 100_000,
        "messages one transaction may hold until its COMMIT, sent or acknowledged (one of more "
        "than 1,000 SENDs is applied in slices of about 10 ms, a slice per turn of the server)",
        _at_least(1))
    max_transaction_bytes: int = setting("destinations", 64 * 1024 * 1024,
        "bytes of messages one transaction may hold until its COMMIT (they count in "
        "global_max_size_bytes meanwhile)", _at_least(1024))
    max_browse_messages: int = setting("destinations", 400,
        "messages a queue browser (SUBSCRIBE browser:true) is shown, from the head of the queue "
        "(ActiveMQ's maxBrowsePageSize)", _at_least(1))
    dup_cache_size: int = setting("destinations", 20000,
        "dup-ids remembered per destination (advertised on CONNECTED)", _at_least(1))
    producer_expiry_ms: int = setting("destinations", 7 * 24 * 3600 * 1000,
        "a producer's sequence is forgotten once it stored nothing for this long (ms, 0 = never)",
        _at_least(0))
    max_producers: int = setting("destinations", 100_000,
        "producer sequences remembered per destination; past it the least recently active is "
        "forgotten (0 = no limit)", _at_least(0))

    # [streams]
    max_bytes: int = setting("streams", 1024 * 1024 * 1024,
        "bytes each stream keeps (bodies, headers, 64 per message); past it the oldest messages "
        "are removed (0 = unlimited)", _at_least(0))
    max_age_ms: int = setting("streams", 0,
        "age past which a stream's messages are removed (ms, 0 = kept forever)", _at_least(0))

    # [store]
    segment_bytes: int = setting("store", 64 * 1024 * 1024, "journal segment file size",
        _at_least(64 * 1024))
    max_journal_bytes: int = setting("store", 0,
        "journal size at which new persistent messages are refused (0 = disk size)", _at_least(0))
    full_policy: str = setting("store", "fail",
        "when the journal, the disk (max_disk_usage) or memory (global_max_size_bytes) is full: "
        "fail (ERROR to the sender) or block (stop reading)", _one_of(FULL_POLICIES))
    max_disk_usage: int = setting("store", 90,
        "percent of the data directory's file system in use at which new persistent messages are "
        "held or refused per full_policy (100 = no check)", _between(1, 100))
    paging_bytes: int = setting("store", 256 * 1024 * 1024,
        "persistent message bodies held in memory; beyond it they stay on disk", _at_least(0))
    recovery_in_memory_bytes: int = setting("store", 4 * 1024 * 1024,
        "bytes of a paging destination's waiting messages a start brings into memory (at most "
        "its max_size_bytes); the rest are read from the journal as consumers reach them, as "
        "paged messages are (0 = up to max_size_bytes, which starts a million waiting 1 KiB "
        "messages in about 2 s rather than under 1, docs/durability.md)", _at_least(0))
    stall_timeout_ms: int = setting("store", 5000,
        "a journal write not completed within this is a stalled disk: an active server with an "
        "in-sync backup hands over to it, a backup is dropped from synchronous replication "
        "(ms, 0 = never)", _at_least(0))

    url: str = setting("store", "",
        "postgresql://USER:PASSWORD@HOST:PORT/DB: the journal is kept in this PostgreSQL "
        "database (DATA_DIR/journal is then a copy of it), and the lease in it decides which "
        "server writes it; empty = the file journal (docs/database.md)", _database_url)
    password_file: str = setting("store", "",
        "a file holding the database's password (else the URL's, or the environment's "
        "PAIRMQ_STORE_PASSWORD); never logged")
    lease_timeout_ms: int = setting("store", 4000,
        "the database lease's length, on the database's clock: a server that stops renewing "
        "it (dead, paused, cut off) is replaced after this (ms)", _at_least(500))

    # [auth]
    allow_anonymous: bool = setting("auth", False, "accept clients without a login")
    failed_login_delay_max_ms: int = setting("auth", 10000,
        "failed logins from one address delay its next attempts, 100 ms doubling up to this (ms, "
        "0 = no delay); other addresses are not slowed", _at_least(0))
    anonymous_management_reads: bool = setting("auth", False,
        "GET /status and /metrics without credentials (writes always need an admin)")

    # [ha]
    policy: str = setting("ha", "none",
        "none, replication, shared-store or colocated (a live that asks the cluster for a "
        "backup, on a member that hosts backups of other lives: docs/cluster.md)",
        _one_of(HA_POLICIES))
    shared_dir: str = setting("ha", "",
        "shared-store: the directory both servers mount (SAN, GFS2, NFSv4) holding the journal "
        "and its lock file")
    role: str = setting("ha", "primary", "primary or backup", _one_of(("primary", "backup")))
    listen: str = setting("ha", "", "HA channel HOST:PORT of this server", _optional_address)
    peer: str = setting("ha", "", "HA channel HOST:PORT of the other server", _optional_address)
    witness: str = setting("ha", "",
        "the arbiter: `pairmq witness` at HOST:PORT, or an etcd cluster as etcd://HOST:PORT,... "
        "(etcds:// over mutual TLS); empty = none (split brain possible)", witness_problem)
    group: str = setting("ha", "",
        "the pair's name (Artemis' group-name): with an etcd witness its keys live under "
        "/pairmq/pairs/GROUP/, so several pairs share one etcd cluster", group_problem)
    etcd_cert: str = setting("ha", "",
        "etcds://: PEM file of this server's client certificate for etcd (empty: [tls] cert)")
    etcd_key: str = setting("ha", "",
        "etcds://: PEM file of that certificate's private key (empty: [tls] key)")
    etcd_ca: str = setting("ha", "",
        "etcds://: PEM file of the CA that signs etcd's certificates (empty: [tls] ca)")
    secret: str = setting("ha", "", "shared secret of the pair and the witness")
    tls: bool = setting("ha", False,
        "HA channel and witness over mutual TLS with [tls] (the peer's and the witness's "
        "certificates must come from its ca)", flag_name="ha_tls")
    heartbeat_interval_ms: int = setting("ha", 500, "heartbeats on the HA channel", _at_least(10))
    activation_interval_ms: int = setting("ha", 2000,
        "silence after which the peer is taken for dead (>= 2 heartbeats)", _at_least(20))
    allow_failback: bool = setting("ha", True, "the primary takes its place back once in sync")
    failover_on_shutdown: bool = setting("ha", False,
        "a clean stop of the active hands over to the backup")
    backup_ack: str = setting("ha", "fsync",
        "the backup acknowledges after its own fsync, or on receipt (write)",
        _one_of(("fsync", "write")))
    replication_mode: str = setting("ha", "sync",
        "sync (receipts wait for the backup) or async (may lose the last records)",
        _one_of(("sync", "async")))
    initial_replication_sync_timeout_ms: int = setting("ha", 300000,
        "how long one initial synchronisation may take before it is restarted", _at_least(100))

    # [cluster] (docs/cluster.md)
    cluster_name: str = setting("cluster", "",
        "the cluster this member belongs to; empty = no cluster. Members of other names are "
        "refused", _member_name, toml="name")
    cluster_members: tuple[str, ...] = setting("cluster", (),
        "the other members, each a failover URL of its pair or a stomp:// address (a flag "
        "takes them space-separated); empty with an etcd witness = found in etcd",
        _member_urls, toml="members")
    cluster_member: str = setting("cluster", "",
        "this member's name, the same on both servers of a pair (empty: [ha] group, or "
        "[server] name when standalone)", _member_name, toml="member")
    cluster_user: str = setting("cluster", "",
        "the login bridges use on the other members and on this one (Artemis' cluster-user; "
        "empty: anonymous)", toml="user")
    cluster_password: str = setting("cluster", "", "that login's passcode", toml="password")
    message_load_balancing: str = setting("cluster", "on_demand",
        "off, strict, on_demand or off_with_redistribution (Artemis' meanings, "
        "docs/cluster.md)", _one_of(LOAD_BALANCING))
    redistribution_delay_ms: int = setting("cluster", 1000,
        "a queue with messages and no consumers for this long gives them to members that "
        "have consumers (-1: never)", _at_least(-1))
    bridge_window: int = setting("cluster", 1000,
        "messages a bridge holds unconfirmed, and a queue's depth here past which its "
        "bridges stop taking more from other members", _at_least(1))
    scale_down: bool = setting("ha", False,
        "a member of a cluster: when this server stops (SIGTERM), or serves after its live "
        "died (a backup), it moves its messages, producer sequences and dup-ids to another "
        "member and redirects its clients there, then stops (docs/cluster.md, Scale-down)")
    request_backup: bool = setting("ha", False,
        "colocated: this live asks another member of the cluster to host its backup")
    max_backups: int = setting("ha", 1,
        "colocated: backups of other lives this member hosts at most, each a child process",
        _at_least(0))
    backup_request_retries: int = setting("ha", -1,
        "colocated: asks for a backup before this live gives up and serves without one "
        "(-1: never gives up)", _at_least(-1))
    backup_request_retry_interval_ms: int = setting("ha", 5000,
        "colocated: how long an ask waits for its answer before the next member is asked",
        _at_least(100))
    backup_port_offset: int = setting("ha", 100,
        "colocated: a hosted backup listens on this member's ports plus this offset (plus it "
        "again for each further backup hosted)", _at_least(1))
    scale_down_group: str = setting("ha", "",
        "scale down only to a member whose [ha] scale_down_group is this (empty: any member)")


def _key(f: Any) -> Key:
    declared: _Declared = f.metadata["key"]
    name = declared.toml or f.name
    return Key(declared.section, name, type(f.default), f.default, declared.help,
               declared.check, declared.flag_name, "" if name == f.name else f.name)


KEYS: tuple[Key, ...] = tuple(_key(f) for f in fields(Settings))

KEYS_BY_SECTION: dict[str, dict[str, Key]] = {}
for _k in KEYS:
    KEYS_BY_SECTION.setdefault(_k.section, {})[_k.name] = _k
