"""Password checks (server/guards/passwords.py): the same scrypt whoever the user, the
configuration's plain passwords hashed at start in the login thread, bounded, fair
between addresses, and a verified password let in at once for a while."""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest

from pairmq.server.config import User
from pairmq.server.guards.auth import hash_password
from pairmq.server.guards.passwords import MAX_WAITING, Busy, PasswordCheck

USERS = {"alice": User("alice", "right", ("app",)),
         "bob": User("bob", hash_password("bobs"), ())}


def timed(check: PasswordCheck, login: str, password: str,
          users=USERS) -> tuple[float, object]:
    async def run() -> tuple[float, object]:
        started = time.perf_counter()
        user = await check.check(users, login, password, time.monotonic)
        return time.perf_counter() - started, user
    return asyncio.run(run())


def test_plain_and_hashed_passwords_are_both_checked() -> None:
    check = PasswordCheck(USERS)
    try:
        assert timed(check, "alice", "right")[1] is USERS["alice"]
        assert timed(check, "bob", "bobs")[1] is USERS["bob"]
        assert timed(check, "alice", "bobs")[1] is None
    finally:
        check.close()


def test_a_wrong_password_and_an_unknown_user_cost_the_same() -> None:
    check = PasswordCheck(USERS)
    try:
        timed(check, "alice", "warm-up")  # the hashes made at start
        wrong = [timed(check, "alice", "wrong") for _ in range(5)]
        hashed = [timed(check, "bob", "wrong") for _ in range(5)]
        unknown = [timed(check, "mallory", "wrong") for _ in range(5)]
    finally:
        check.close()
    assert all(user is None for _, user in wrong + hashed + unknown)
    for times in (wrong, hashed):
        ratio = statistics.median(t for t, _ in unknown) / statistics.median(t for t, _ in times)
        assert 0.5 < ratio < 2, f"unknown/known = {ratio:.2f} (one scrypt each)"


def test_a_verified_password_is_known_until_it_changes() -> None:
    check = PasswordCheck(USERS)
    try:
        now = time.monotonic()
        assert check.known(USERS, "alice", "right", now) is None
        assert timed(check, "alice", "right")[1] is USERS["alice"]
        assert check.known(USERS, "alice", "right", time.monotonic()) is USERS["alice"]
        assert check.known(USERS, "alice", "wrong", time.monotonic()) is None
        assert check.known(USERS, "alice", "right", time.monotonic() + 301) is None
        changed = {"alice": User("alice", hash_password("right"), ("app",))}
        assert check.known(changed, "alice", "right", time.monotonic()) is None, \
            "a new hash (a password change) is checked again"
        timed(check, "alice", "wrong")
        assert check.known(USERS, "alice", "wrong", time.monotonic()) is None, \
            "failures are never remembered"
    finally:
        check.close()


def test_a_crowd_from_one_address_never_stands_before_another() -> None:
    check = PasswordCheck(USERS)

    async def crowd() -> None:
        guesses = [check.check(USERS, "mallory", "x", time.monotonic, "10.0.0.66")
                   for _ in range(12)]
        other = check.check(USERS, "alice", "right", time.monotonic, "10.0.0.7")
        assert await other is USERS["alice"]
        assert sum(g.done() for g in guesses) <= 2, "served after one or two guesses"
        guesses[5].cancel()  # its connection went: dropped from the queue
        done = await asyncio.gather(*guesses, return_exceptions=True)
        assert done[:5] + done[6:] == [None] * 11
        assert check.waiting == 0

    try:
        asyncio.run(crowd())
    finally:
        check.close()


def test_past_max_waiting_checks_a_login_is_refused_at_once() -> None:
    check = PasswordCheck(USERS)

    async def flood() -> None:
        futures = [check.check(USERS, "mallory", "x", time.monotonic, f"10.0.0.{i}")
                   for i in range(MAX_WAITING)]
        with pytest.raises(Busy, match=f"busy checking {MAX_WAITING} logins"):
            check.check(USERS, "alice", "right", time.monotonic)
        await asyncio.gather(*futures)
        assert check.waiting == 0
        assert await check.check(USERS, "alice", "right", time.monotonic) is USERS["alice"]

    try:
        asyncio.run(flood())
    finally:
        check.close()
