"""What the Broker tells the server besides its deliveries (`Broker.take_events`): a
destination or the server passing a limit and back, messages expired or dead-lettered, a
round of idle destinations deleted, producers forgotten. The server logs them and acts on
them (releases held producers, resumes reading).
"""

from __future__ import annotations

from typing import NamedTuple

from pairmq.core.queue import Address


class BrokerEvent(NamedTuple):
    # "address-full" | "address-resumed" (a destination passed its limit / is back under
    # it) | "server-full" | "server-resumed" (a server-wide guard; detail is the sentence
    # to log) | "expired" | "dead-lettered" | "destinations-deleted" | "producers-evicted"
    kind: str
    address: Address | None
    detail: str = ""
