"""What every client connection of a server shares, so that no one client can take more
than its part (issues 18, 19, 20): the turn's budget for applying frames, failed logins
per address, connections per address, and the password checks."""

from __future__ import annotations

from dataclasses import dataclass

from pairmq.server.connlimits import ConnectionCount
from pairmq.server.logins import LoginThrottle
from pairmq.server.passwords import PasswordCheck
from pairmq.server.turns import TurnBudget


@dataclass(frozen=True)
class Guards:
    turn: TurnBudget  # frames of every connection, per turn of the loop (server/turns.py)
    logins: LoginThrottle  # failed logins per address (server/logins.py)
    counts: ConnectionCount  # connections, overall and per address (server/connlimits.py)
    passwords: PasswordCheck  # checked off the loop, bounded (server/passwords.py)
