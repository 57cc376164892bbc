"""What a scaling-down server tells clients (core/scale_down.py decides when): one value
the connections read, not flags spread over them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from pairmq.core.cluster import is_bridge
from pairmq.protocol.redirect import SCALED_DOWN_TO


class Gate(StrEnum):
    PRODUCERS_REFUSED = "producers_refused"  # SEND, BEGIN, COMMIT end their connection
    REDIRECTING = "redirecting"  # every client is sent to the member named


@dataclass(frozen=True)
class Leaving:
    gate: Gate
    message: str
    member_url: str | None = None  # where clients go (REDIRECTING)

    @property
    def extra(self) -> dict[str, str] | None:
        return {SCALED_DOWN_TO: self.member_url} if self.member_url else None

    def refuses_connect(self, client_id: str | None) -> bool:
        """New clients are not let in (the other members' bridges are: they drain what
        this server moves)."""
        return not is_bridge(client_id)


PRODUCER_COMMANDS: Final = frozenset({"SEND", "BEGIN", "COMMIT"})
