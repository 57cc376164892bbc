"""Password checks (server/passwords.py): the same scrypt whoever the user, bounded, and a
verified password let in at once for a while."""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest

from pairmq.server.auth import is_hashed, verify_password
from pairmq.server.config import User
from pairmq.server.passwords import MAX_WAITING, Busy, PasswordCheck, hash_plain

USERS = hash_plain({"alice": User("alice", "right", ("app",)),
                    "bob": User("bob", "scrypt$16384$8$1$AAAA$BBBB", ())})


def test_plain_passwords_are_hashed_when_loaded_and_hashes_kept() -> None:
    assert is_hashed(USERS["alice"].password) and verify_password(USERS["alice"].password,
                                                                  "right")
    assert USERS["bob"].password == "scrypt$16384$8$1$AAAA$BBBB"
    assert USERS["alice"].roles == ("app",)


def timed(check: PasswordCheck, login: str, password: str) -> tuple[float, object]:
    async def run() -> tuple[float, object]:
        started = time.perf_counter()
        user = await check.check(USERS, login, password, time.monotonic)
        return time.perf_counter() - started, user
    return asyncio.run(run())


def test_a_wrong_password_and_an_unknown_user_cost_the_same() -> None:
    check = PasswordCheck()
    try:
        wrong = [timed(check, "alice", "wrong") for _ in range(5)]
        unknown = [timed(check, "mallory", "wrong") for _ in range(5)]
    finally:
        check.close()
    assert all(user is None for _, user in wrong + unknown)
    ratio = statistics.median(t for t, _ in unknown) / statistics.median(t for t, _ in wrong)
    assert 0.5 < ratio < 2, f"unknown/wrong = {ratio:.2f} (one scrypt each)"


def test_a_verified_password_is_known_until_it_changes() -> None:
    check = PasswordCheck()
    try:
        now = time.monotonic()
        assert check.known(USERS, "alice", "right", now) is None
        _, user = timed(check, "alice", "right")
        assert user is USERS["alice"]
        assert check.known(USERS, "alice", "right", time.monotonic()) is USERS["alice"]
        assert check.known(USERS, "alice", "wrong", time.monotonic()) is None
        assert check.known(USERS, "alice", "right", time.monotonic() + 301) is None
        changed = hash_plain({"alice": User("alice", "right", ("app",))})
        assert check.known(changed, "alice", "right", time.monotonic()) is None, \
            "a new hash (a password change) is checked again"
        timed(check, "alice", "wrong")
        assert check.known(USERS, "alice", "wrong", time.monotonic()) is None, \
            "failures are never remembered"
    finally:
        check.close()


def test_a_crowd_from_one_address_never_stands_before_another() -> None:
    check = PasswordCheck()

    async def crowd() -> None:
        guesses = [check.check(USERS, "mallory", "x", time.monotonic, "10.0.0.66")
                   for _ in range(12)]
        other = check.check(USERS, "alice", "right", time.monotonic, "10.0.0.7")
        assert await other is USERS["alice"]
        assert sum(g.done() for g in guesses) <= 2, "served after one or two guesses"
        assert await asyncio.gather(*guesses) == [None] * 12

    try:
        asyncio.run(crowd())
    finally:
        check.close()


def test_past_max_waiting_checks_a_login_is_refused_at_once() -> None:
    check = PasswordCheck()

    async def flood() -> None:
        futures = [check.check(USERS, "mallory", "x", time.monotonic)
                   for _ in range(MAX_WAITING)]
        with pytest.raises(Busy, match=f"busy checking {MAX_WAITING} logins"):
            check.check(USERS, "alice", "right", time.monotonic)
        await asyncio.gather(*futures)
        assert check.waiting == 0
        assert await check.check(USERS, "alice", "right", time.monotonic) is USERS["alice"]

    try:
        asyncio.run(flood())
    finally:
        check.close()
