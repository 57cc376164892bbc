"""The periodic sweep looks at a bounded slice of the queues a call (issue 20): a server
holding very many queues does not pass over all of them every second (100,000 took 25 ms
a pass), and every expired message still goes, a round later at most."""

from __future__ import annotations

from pairmq.core import Broker, CoreSettings
from pairmq.core.broker.broker import SWEEP_SLICE

NOW = 1_000_000


def test_expiry_goes_round_the_queues_a_slice_a_call() -> None:
    broker = Broker(CoreSettings(expired_policy="drop", auto_delete_delay_ms=-1,
                                 max_destinations=0))
    broker.open_session(1, "1.2")
    count = SWEEP_SLICE + SWEEP_SLICE // 4
    for i in range(count):
        broker.send(1, f"/queue/q{i}", {"expires": str(NOW + 10)}, b"x", NOW)
    first = broker.sweep_expired(NOW + 20)
    assert first == SWEEP_SLICE, "one slice a call"
    assert broker.sweep_expired(NOW + 20) == count - SWEEP_SLICE, "the rest of the round"
    assert sum(q.count for q in broker.queues.values()) == 0
