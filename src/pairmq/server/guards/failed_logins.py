"""Failed logins slow down the address they come from, and only it (issue 19).

After a host's n-th failed login in a row, its next CONNECT with credentials waits
`FIRST_DELAY_S * 2**(n-1)` seconds, at most `max_delay_s`, before its password is
checked; a good login from it forgets its failures, and so do `FORGET_AFTER_S` without
one. A password guesser gets one try per delay however many connections it opens, while
every other address is served at once. The wait holds the connection (not the loop, not
a thread), and the answer comes after it, so a refusal never comes sooner than a
success would.

Pure: times are given. At most `MAX_HOSTS` hosts are remembered (the oldest is
forgotten first), so an attack from many addresses costs bounded memory.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

FIRST_DELAY_S = 0.1
FORGET_AFTER_S = 600.0
MAX_HOSTS = 10_000


@dataclass
class _Failures:
    count: int  # failed logins in a row
    delay: float  # what the next attempt waits after the previous one
    retry_at: float  # the next attempt waits until then
    last: float  # the last failure


class LoginThrottle:
    def __init__(self, max_delay_s: float) -> None:
        self.max_delay_s = max_delay_s
        self._hosts: OrderedDict[str, _Failures] = OrderedDict()

    def admit(self, host: str, now: float) -> float:
        """0: check this host's attempt now (it takes the host's turn: the next one waits
        a delay from now); otherwise the seconds to wait before asking again. Attempts on
        parallel connections are so taken one per delay."""
        failures = self._hosts.get(host)
        if failures is None:
            return 0.0
        if now - failures.last > FORGET_AFTER_S:
            del self._hosts[host]
            return 0.0
        if now < failures.retry_at:
            return failures.retry_at - now
        failures.retry_at = now + failures.delay
        return 0.0

    def failed(self, host: str, now: float) -> float:
        """A failed login from `host`: returns the delay its next attempt gets."""
        if self.max_delay_s <= 0:
            return 0.0
        failures = self._hosts.pop(host, None)
        if failures is None or now - failures.last > FORGET_AFTER_S:
            failures = _Failures(0, 0.0, now, now)
        failures.count += 1
        failures.delay = min(FIRST_DELAY_S * 2 ** min(failures.count - 1, 30),
                             self.max_delay_s)
        failures.retry_at = max(failures.retry_at, now + failures.delay)
        failures.last = now
        self._hosts[host] = failures  # the most recent last
        while len(self._hosts) > MAX_HOSTS:
            self._hosts.popitem(last=False)
        return failures.delay

    def succeeded(self, host: str) -> None:
        self._hosts.pop(host, None)

    def __len__(self) -> int:
        return len(self._hosts)
