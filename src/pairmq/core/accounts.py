"""Users, their roles and the permission rules changed at run time (`pairmq user ...`,
`pairmq role ...`, `pairmq security ...`): journal records, so the backup of a replication
pair and the next holder of a shared store have them (issue 19, docs/security.md).

They lie over the configuration's `[auth.users]` and `[security]`: a user or a rule added,
changed or removed at run time is what its latest record says, whatever the file says; the
file's others are the file's. A removal is remembered (a tombstone), so a user or rule of
the file that an operator removed does not come back at the next start. Passwords are kept
as `pairmq passwd`'s scrypt hashes, never in plain.

Pure: the broker appends the records; recovery and a backup apply them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pairmq.core.permissions import Permission, Rule, SecurityRules

Grants = tuple[tuple[str, tuple[str, ...]], ...]  # (permission name, roles), as journaled


@dataclass(frozen=True)
class Account:
    name: str
    password: str  # "scrypt$...", as the configuration's hashed passwords
    roles: tuple[str, ...]


class Accounts:
    def __init__(self) -> None:
        # name -> its account, or None: removed at run time
        self.users: dict[str, Account | None] = {}
        self.version = 0  # grows at every change: views built from it know they are stale
        self._view: tuple[int, int, dict[str, Any]] | None = None  # version, id(file), users
        # pattern -> its grants, or None: removed at run time
        self.rules: dict[str, Grants | None] = {}
        self._rules_view: tuple[int, int, SecurityRules | None] | None = None

    def set_user(self, name: str, password: str, roles: tuple[str, ...]) -> None:
        self.users[name] = Account(name, password, tuple(roles))
        self.version += 1

    def remove_user(self, name: str) -> None:
        self.users[name] = None
        self.version += 1

    def set_rule(self, pattern: str, grants: Grants) -> None:
        self.rules[pattern] = tuple((p, tuple(roles)) for p, roles in grants)
        self.version += 1

    def remove_rule(self, pattern: str) -> None:
        self.rules[pattern] = None
        self.version += 1

    def rules_over(self, configured: SecurityRules | None) -> SecurityRules | None:
        """The permission rules in force: the file's, with the run-time changes over them;
        None while there is none at all (everyone who logs in may do everything)."""
        view = self._rules_view
        if view is not None and view[0] == self.version and view[1] == id(configured):
            return view[2]
        by_pattern = {r.pattern: r for r in (configured.rules if configured else ())}
        for pattern, grants in self.rules.items():
            if grants is None:
                by_pattern.pop(pattern, None)
            else:
                by_pattern[pattern] = Rule(pattern, {Permission(p): frozenset(roles)
                                                     for p, roles in grants})
        effective = SecurityRules(by_pattern.values()) if by_pattern or configured \
            else None
        self._rules_view = (self.version, id(configured), effective)
        return effective

    def over(self, configured: Mapping[str, Any]) -> dict[str, Any]:
        """The users in force: the configuration's, with the run-time changes over them
        (kept until the next change: every CONNECT asks)."""
        view = self._view
        if view is not None and view[0] == self.version and view[1] == id(configured):
            return view[2]
        effective = dict(configured)
        for name, account in self.users.items():
            if account is None:
                effective.pop(name, None)
            else:
                effective[name] = account
        self._view = (self.version, id(configured), effective)
        return effective
