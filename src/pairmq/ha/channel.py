"""HA channel messages, sans-IO: bytes in, (type, payload) out.

Every message is `u32 length | u8 type | payload`. Control messages carry JSON;
RECORDS carries journal records exactly as they are on disk (each with its own
sequence number and CRC), so the backup appends the very bytes the active wrote.
Peers prove they know the shared secret with HMAC challenges in both
directions; the secret never crosses the wire.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import struct
from typing import Any

HEADER = struct.Struct("<IB")
MAX_MESSAGE = 256 * 1024 * 1024

CHALLENGE = 1  # {"nonce": hex}                       listener -> connector
PROOF = 2  # {"proof": hex, "nonce": hex, "hello": {...}}  connector -> listener
WELCOME = 3  # {"proof": hex, "hello": {...}}         listener -> connector
REFUSED = 4  # {"reason": str}
HEARTBEAT = 5  # {...state...}
RECORDS = 6  # raw journal records
ACK = 7  # {"seq": int}  the backup has these records (written or fsynced, per backup_ack)
SYNC = 8  # {"mode": "full"|"incremental", "from": seq, ...}  start of a synchronisation
SYNC_DONE = 9  # {"seq": int}  everything up to seq was sent: the live stream follows
LEASE = 10  # witness: {"name", "epoch", "ms", "activate": bool} -> {"granted", ...}
LEASE_REPLY = 11
FAILBACK = 12  # {"phase": ...}  the original primary takes its place back
HORIZON = 13  # {"seq": int}  records below seq are superseded: the backup may drop them

NAMES = {v: k for k, v in dict(globals()).items() if isinstance(v, int) and k.isupper()
         and k not in ("MAX_MESSAGE",)}


class ChannelError(Exception):
    """The peer broke the channel protocol or failed authentication."""


def encode(kind: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload), kind) + payload


def header(kind: int, length: int) -> bytes:
    """A message's header alone: its payload follows in pieces (`Link.send_parts`)."""
    return HEADER.pack(length, kind)


def encode_json(kind: int, obj: dict[str, Any]) -> bytes:
    return encode(kind, json.dumps(obj, separators=(",", ":")).encode())


def decode_json(payload: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(payload)
    except ValueError as e:
        raise ChannelError(f"malformed control message: {e}") from None
    if not isinstance(obj, dict):
        raise ChannelError("control message is not an object")
    return obj


class MessageReader:
    """Incremental reader of channel messages."""

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self._buffer = bytearray()
        self._max = max_message

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._buffer
        buf += data
        out = []
        pos = 0
        size = HEADER.size
        with memoryview(buf) as view:  # a payload is copied once, not sliced then copied
            while len(buf) - pos >= size:
                length, kind = HEADER.unpack_from(buf, pos)
                if length > self._max:
                    raise ChannelError(f"message of {length} bytes exceeds {self._max}")
                end = pos + size + length
                if end > len(buf):
                    break
                out.append((kind, bytes(view[pos + size:end])))
                pos = end
        if pos:
            del buf[:pos]
        return out


def new_nonce() -> str:
    return secrets.token_hex(16)


def proof(secret: str, nonce: str, side: str) -> str:
    """HMAC of the other side's nonce; `side` stops a proof being reflected back."""
    return hmac.new(secret.encode(), f"{side}:{nonce}".encode(), hashlib.sha256).hexdigest()


def check_proof(secret: str, nonce: str, side: str, given: object) -> bool:
    return isinstance(given, str) and hmac.compare_digest(proof(secret, nonce, side), given)


def pair_mismatch(ours: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """Why two servers that proved the same secret still cannot form a pair, if they cannot:
    both configured with the same role (each role opens its own epoch numbers, and the
    primary is the one that takes back over, so a pair needs one of each)."""
    role = ours.get("role")
    if role and role == theirs.get("role"):
        return (f"both servers are configured with [ha] role = \"{role}\" ({ours.get('name')} "
                f"and {theirs.get('name')}): one must be the primary, the other the backup")
    return None
