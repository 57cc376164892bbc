"""Per-broker messaging settings (the `[destinations]` section of the configuration)."""

from __future__ import annotations

from dataclasses import dataclass

EXPIRED_POLICIES = ("dead-letter", "drop")


@dataclass(frozen=True, slots=True)
class CoreSettings:
    default_prefetch: int = 1000
    max_delivery_attempts: int = 10  # 0 = unlimited
    dead_letter_prefix: str = "DLQ."
    expired_policy: str = "dead-letter"
    max_size_bytes: int = 64 * 1024 * 1024
    dup_cache_size: int = 20000  # dup-ids remembered per destination, as Artemis
    resume_ratio: float = 0.9  # a full destination unblocks below this share of its limit
