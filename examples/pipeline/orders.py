"""The order events of the pipeline example, and what the job must make of them.

Orders are generated from a seed, so the expected output (revenue per product per minute,
and the alerts) is computed here from the same list the generator published: the check
compares the job's Parquet output and the alerts it published with it, exactly.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from dataclasses import dataclass

PRODUCTS = ("apples", "bread", "cheese", "dates", "eggs")
ALERT_AMOUNT = 900  # an order of at least this much is published to the alerts topic
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: event times are fixed, not "now"
MINUTE_MS = 60_000
# The last event: far enough past every order to move the job's watermark (1 minute)
# beyond the last window, so that every window is final and written.
CLOSING_GAP_MS = 10 * MINUTE_MS


@dataclass(frozen=True)
class Order:
    order_id: str
    product: str
    amount: int  # whole currency units: exact sums
    event_ms: int

    def to_json(self) -> str:
        return json.dumps({"order_id": self.order_id, "product": self.product,
                           "amount": self.amount, "event_ms": self.event_ms})


def generate(count: int, minutes: int, seed: int = 7) -> list[Order]:
    """`count` orders spread over `minutes` minutes of event time, in time order, then one
    closing order of amount 0 long after (it only advances the watermark)."""
    rng = random.Random(seed)
    span = minutes * MINUTE_MS
    times = sorted(START_MS + rng.randrange(span) for _ in range(count))
    orders = [Order(f"o-{i}", rng.choice(PRODUCTS), rng.randint(1, 1000), t)
              for i, t in enumerate(times)]
    orders.append(Order("closing", PRODUCTS[0], 0, START_MS + span + CLOSING_GAP_MS))
    return orders


def expected_revenue(orders: list[Order]) -> dict[tuple[int, str], int]:
    """(window start ms, product) -> revenue, for every window the job must finalise (the
    closing order's own window is still open when the job ends)."""
    closing = orders[-1]
    revenue: dict[tuple[int, str], int] = defaultdict(int)
    for order in orders[:-1]:
        revenue[(order.event_ms - order.event_ms % MINUTE_MS, order.product)] += order.amount
    assert all(start < closing.event_ms - MINUTE_MS for start, _ in revenue)
    return dict(revenue)


def expected_alerts(orders: list[Order]) -> Counter[str]:
    return Counter(o.order_id for o in orders if o.amount >= ALERT_AMOUNT)
