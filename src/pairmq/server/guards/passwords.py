"""Checking passwords without telling who exists and without starving anyone (issue 20).

- **The same work either way.** Every password is checked against an scrypt hash: the
  configuration's plain passwords are hashed when the server starts, and an unknown user
  is checked against a dummy hash made then too. A wrong password for a user who exists
  and a user who does not exist so cost one scrypt each (a plain password compared as it
  was took 0.14 ms, an unknown user 48 ms: two scrypts). The hashing at start is the
  login threads' first job, so it delays no start (30-50 ms a user), and every check
  waits for it.
- **Bounded.** The checks run in LOGIN_THREADS threads of their own (half the cores), so
  the journal's threads and the event loop never wait for them, and at most MAX_WAITING wait their
  turn: past that a login is refused at once (`Busy`) rather than queued without end.
  One check per client address is in the threads' queue at a time: a guesser's crowd of
  attempts waits behind its own, never in front of another address's.
- **Cheap for those who know their password.** A successful check is remembered for
  VERIFIED_TTL_S by (user, the hash checked, a keyed MAC of the password): a client that
  reconnects, or an operator's dashboard polling the management port, is let in without
  an scrypt, ahead of a crowd of wrong passwords. A change of the user's password changes
  the hash, so the entry no longer matches. Failures are never remembered: a guess always
  costs its scrypt (and the address's delay, server/guards/failed_logins.py).
"""

from __future__ import annotations

import asyncio
import hmac
import os
import secrets
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pairmq.server.config import User
from pairmq.server.guards.auth import hash_password, is_hashed, verify_password

# half the cores, at least one: a crowd of logins leaves the event loop a core
LOGIN_THREADS = max(1, (os.cpu_count() or 2) // 2)
MAX_WAITING = 64  # password checks queued or running, at most
VERIFIED_TTL_S = 300.0
VERIFIED_MAX = 10_000


class Busy(Exception):
    """Too many password checks wait already: try again."""


@dataclass
class _Job:
    user: User | None
    login: str
    password: str
    result: asyncio.Future[User | None]
    clock: Callable[[], float]


class PasswordCheck:
    def __init__(self, configured: Mapping[str, User] | None = None) -> None:
        """`configured`: the configuration's users, whose plain passwords are hashed first
        thing in a login thread (`stored`)."""
        self._threads = ThreadPoolExecutor(LOGIN_THREADS, thread_name_prefix="pairmq-login")
        self._dummy = ""  # what an unknown user meets: made with the hashes
        self._hashes: dict[str, str] = {}  # a configured plain password -> its hash
        plain = [user.password for user in (configured or {}).values()
                 if not is_hashed(user.password)]
        self._ready = self._threads.submit(self._hash_at_start, plain)
        self._key = secrets.token_bytes(32)
        self._verified: OrderedDict[tuple[str, str, bytes], float] = OrderedDict()
        self.waiting = 0  # checks queued or running
        self._by_host: dict[str, deque[_Job]] = {}  # a host's checks after its running one

    def known(self, users: Mapping[str, User], login: str, password: str,
              now: float) -> User | None:
        """The user, when this login and password were verified within VERIFIED_TTL_S
        (no scrypt: the caller may let it in at once); None means "check it"."""
        user = users.get(login)
        if user is None:
            return None
        key = (login, user.password, self._mac(password))
        verified = self._verified.get(key)
        if verified is None or now - verified > VERIFIED_TTL_S:
            return None
        return user

    def check(self, users: Mapping[str, User], login: str, password: str,
              clock: Callable[[], float], host: str = "") -> asyncio.Future[User | None]:
        """The user if the password is right, else None, from a login thread; `Busy` when
        MAX_WAITING checks wait already. One check per `host` (the client's address) is
        in the threads' queue at a time, the host's others wait behind it: a guesser's
        crowd never stands between another address and its turn."""
        if self.waiting >= MAX_WAITING:
            raise Busy(f"the server is busy checking {self.waiting} logins: try again")
        self.waiting += 1
        result: asyncio.Future[User | None] = asyncio.get_running_loop().create_future()
        job = _Job(users.get(login), login, password, result, clock)
        waiting = self._by_host.get(host)
        if waiting is None:
            self._by_host[host] = deque()
            self._run(host, job)
        else:
            waiting.append(job)
        return result

    def _hash_at_start(self, plain: list[str]) -> None:
        self._dummy = hash_password(secrets.token_hex(16))
        for password in plain:
            self._hashes[password] = hash_password(password)

    def _verify(self, user: User | None, password: str) -> tuple[bool, str]:
        """In a login thread: (right, the hash checked), one scrypt whoever the user."""
        self._ready.result()  # the hashes made at start
        if user is None:
            stored = self._dummy
        else:
            stored = user.password if is_hashed(user.password) \
                else self._hashes.get(user.password) or hash_password(user.password)
        return verify_password(stored, password), stored

    def _run(self, host: str, job: _Job) -> None:
        user = job.user
        checked = asyncio.get_running_loop().run_in_executor(self._threads, self._verify,
                                                             user, job.password)

        def done(future: asyncio.Future[tuple[bool, str]]) -> None:
            self.waiting -= 1
            ok = not future.cancelled() and future.exception() is None and future.result()[0]
            if ok and user is not None:
                self._remember((job.login, user.password, self._mac(job.password)),
                               job.clock())
            if not job.result.done():
                job.result.set_result(user if ok else None)
            waiting = self._by_host[host]
            while waiting and waiting[0].result.done():  # its connection went meanwhile
                waiting.popleft()
                self.waiting -= 1
            if waiting:
                self._run(host, waiting.popleft())
            else:
                del self._by_host[host]

        checked.add_done_callback(done)

    def _mac(self, password: str) -> bytes:
        return hmac.digest(self._key, password.encode(), "sha256")

    def _remember(self, key: tuple[str, str, bytes], now: float) -> None:
        verified = self._verified
        verified[key] = now
        verified.move_to_end(key)
        while len(verified) > VERIFIED_MAX:
            verified.popitem(last=False)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
