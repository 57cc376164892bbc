"""What every client connection of a server shares, so that no one client can take more
than its part (issues 18, 19, 20): the turn's budget for applying frames, failed logins
per address, connections per address, and the password checks."""

from __future__ import annotations

from dataclasses import dataclass

from pairmq.server.guards.connection_limits import ConnectionCount
from pairmq.server.guards.failed_logins import LoginThrottle
from pairmq.server.guards.passwords import PasswordCheck
from pairmq.server.guards.turn_budget import TurnBudget


@dataclass(frozen=True)
class Guards:
    turn: TurnBudget  # frames of every connection, per turn of the loop (turn_budget.py)
    logins: LoginThrottle  # failed logins per address (failed_logins.py)
    counts: ConnectionCount  # connections, overall and per address (connection_limits.py)
    passwords: PasswordCheck  # checked off the loop, bounded (passwords.py)
