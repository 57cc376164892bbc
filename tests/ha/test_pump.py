"""The loop the drivers and the simulator share: an input that arrives while effects are
carried out waits until they all are."""

from __future__ import annotations

import pytest

from pairmq.ha.pump import EffectPump


def test_an_input_fed_by_an_effect_waits_for_the_effects_before_it() -> None:
    done: list[str] = []
    pump: EffectPump[str, str] = EffectPump(
        lambda event: [f"{event}.1", f"{event}.2"],
        lambda effect: (done.append(effect), effect == "a.1" and pump.feed("b")),
        lambda: done.append("after"))
    pump.feed("a")
    assert done == ["a.1", "a.2", "b.1", "b.2", "after"]


def test_effects_applied_from_inside_an_effect_are_refused() -> None:
    calls: list[str] = []

    def carry_out(effect: str) -> None:
        calls.append(effect)
        if effect == "a":
            pump.apply(["again"])

    pump: EffectPump[str, str] = EffectPump(lambda event: [event], carry_out)
    with pytest.raises(RuntimeError, match="re-entrantly"):
        pump.feed("a")
    pump.feed("b")  # the failed input does not leave the pump stuck
    assert calls == ["a", "b"]
