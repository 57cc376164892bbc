"""What `[ha] witness` names: `pairmq witness` at HOST:PORT, or an etcd cluster.

    witness = "10.0.0.5:7000"                          # pairmq witness
    witness = "etcd://10.0.0.7:2379,10.0.0.8:2379"     # etcd, plain HTTP
    witness = "etcds://10.0.0.7:2379,10.0.0.8:2379"    # etcd over mutual TLS
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SCHEMES = {"etcd": False, "etcds": True}  # scheme: over TLS
GROUP = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


@dataclass(frozen=True)
class EtcdCluster:
    endpoints: tuple[str, ...]  # HOST:PORT of each member's client URL
    tls: bool

    def urls(self) -> tuple[str, ...]:
        scheme = "https" if self.tls else "http"
        return tuple(f"{scheme}://{e}" for e in self.endpoints)


def host_port_problem(value: str) -> str | None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        return f'"{value}" is not HOST:PORT'
    return None


def etcd_cluster(value: str) -> EtcdCluster | None:
    """The etcd cluster `value` names, or None for `pairmq witness`'s HOST:PORT. ValueError:
    an etcd URL that says nothing usable (the message names what)."""
    scheme, sep, rest = value.partition("://")
    if not sep:
        return None
    if scheme not in SCHEMES:
        raise ValueError(f'scheme "{scheme}://" is not etcd:// or etcds:// (or give the '
                         "witness as HOST:PORT)")
    endpoints = tuple(e.strip() for e in rest.split(","))
    if not rest or not all(endpoints):
        raise ValueError(f'"{value}" names no etcd member: etcd://HOST:PORT[,HOST:PORT...]')
    for endpoint in endpoints:
        if "/" in endpoint:
            raise ValueError(f'"{endpoint}" in "{value}" has a path: give members as '
                             "HOST:PORT only (pairmq keeps its keys under /pairmq/pairs/GROUP/)")
        problem = host_port_problem(endpoint)
        if problem:
            raise ValueError(f"{problem} in \"{value}\"")
    if len(set(endpoints)) != len(endpoints):
        raise ValueError(f'"{value}" names a member twice')
    return EtcdCluster(endpoints, SCHEMES[scheme])


def witness_problem(value: str) -> str | None:
    """The check of `[ha] witness` (server/settings.py)."""
    if value == "":
        return None
    try:
        cluster = etcd_cluster(value)
    except ValueError as e:
        return str(e)
    if cluster is None:
        problem = host_port_problem(value)
        return f"must be HOST:PORT or etcd://HOST:PORT,...: {problem}" if problem else None
    return None


def group_problem(value: str) -> str | None:
    if value == "" or GROUP.fullmatch(value):
        return None
    return (f'"{value}" must be letters, digits, ".", "_" or "-" (up to 100, starting with a '
            "letter or digit): it becomes part of etcd keys")
