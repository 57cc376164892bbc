"""How many client connections the server holds, overall and per source address (issue
20): past `max_connections` or `max_connections_per_address` a new connection gets an
ERROR naming the limit and is closed, so that no client, or crowd of sockets from one
address, can take every file descriptor or the memory their buffers hold. Pure: the
connection reports opening and closing.

`max_connections` of -1 takes it from the process's limit on open files (RLIMIT_NOFILE),
less DESCRIPTORS_KEPT for the journal's segments, the HA channel, the witness, the
management port and the listeners: new connections are refused before descriptors run
out, rather than a journal segment failing to open for want of one.
"""

from __future__ import annotations

import resource
from collections import Counter

DESCRIPTORS_KEPT = 256  # file descriptors kept for everything but client connections


def default_max_connections() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return max(16, soft - DESCRIPTORS_KEPT)


class ConnectionCount:
    """Open client connections, in all and per host (the address without its port)."""

    def __init__(self, most: int, most_per_address: int) -> None:
        self.most = most if most >= 0 else default_max_connections()
        self.most_per_address = most_per_address  # 0 = no limit
        self.open = 0
        self._by_host: Counter[str] = Counter()

    def refusal(self, host: str) -> str | None:
        """Why a new connection from `host` is refused, or None: then it is counted."""
        if self.open >= self.most:
            return (f"too many connections: the server holds max_connections ({self.most}); "
                    "try again later")
        if self.most_per_address and self._by_host[host] >= self.most_per_address:
            return (f"too many connections from {host}: max_connections_per_address "
                    f"({self.most_per_address})")
        self.open += 1
        self._by_host[host] += 1
        return None

    def closed(self, host: str) -> None:
        """A connection `refusal` let in has closed."""
        self.open -= 1
        left = self._by_host[host] - 1
        if left > 0:
            self._by_host[host] = left
        else:
            del self._by_host[host]
