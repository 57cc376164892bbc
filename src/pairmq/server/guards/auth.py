"""Passwords (plain or scrypt hashes) and the roles the management port asks for."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

SCRYPT_PREFIX = "scrypt$"
_N, _R, _P = 2**14, 8, 1


def hash_password(password: str, salt: bytes | None = None) -> str:
    """The form `pairmq passwd` prints: scrypt$N$r$p$salt$hash (base64)."""
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    b64 = base64.b64encode
    return f"{SCRYPT_PREFIX}{_N}${_R}${_P}${b64(salt).decode()}${b64(digest).decode()}"


def is_hashed(stored: str) -> bool:
    return stored.startswith(SCRYPT_PREFIX)


def verify_password(stored: str, given: str) -> bool:
    """Constant-time comparison; slow (tens of ms) for hashes: call it off the event loop."""
    if not is_hashed(stored):
        return hmac.compare_digest(stored.encode(), given.encode())
    try:
        _, n, r, p, salt, digest = stored.split("$")
        expected = base64.b64decode(digest)
        actual = hashlib.scrypt(given.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r),
                                p=int(p), dklen=len(expected), maxmem=256 * 1024 * 1024)
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(expected, actual)


# ------------------------------------------------------------------ management HTTP

ADMIN_ROLE = "admin"
MONITOR_ROLE = "monitor"
READ_METHODS = frozenset({"GET", "HEAD"})


# reads that show what clients sent (message bodies and headers): `admin` only, never
# opened by anonymous_management_reads, as a change is not (RabbitMQ's "get messages")
CONTENT_PATHS = frozenset({"/api/messages"})


def is_management_read(method: str, path: str) -> bool:
    """A request that shows the server's state and changes nothing (GET, HEAD), and is not
    a look at the messages themselves."""
    return method in READ_METHODS and path not in CONTENT_PATHS


def management_roles(method: str, path: str = "") -> tuple[str, ...]:
    """The roles that may make a management request: reads (GET, HEAD) need `admin` or
    `monitor`; anything else may change the server (POST /activate), and a browse shows
    message bodies, so only `admin`."""
    return (ADMIN_ROLE, MONITOR_ROLE) if is_management_read(method, path) else (ADMIN_ROLE,)
