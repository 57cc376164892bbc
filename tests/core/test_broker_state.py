"""The Broker's parts and the state they share (core/broker/state.py): every step one part
asks of another is declared once in BrokerState, and defined by exactly one part, the one
its declaration names, so that a renamed method can never leave a declaration that raises
at run time."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from pairmq.core import Broker
from pairmq.core.broker.state import BrokerState
from tests.support.build import reads_the_sources
from tests.support.state_bases import (
    declared_steps,
    defining_class,
    function_of,
    step_problems,
    type_checking_imports,
)

pytestmark = reads_the_sources

PACKAGE = Path(inspect.getfile(BrokerState)).parent
PARTS = [k for k in Broker.__mro__ if k.__module__.startswith("pairmq.core.broker.")
         and k is not BrokerState]
STUBS = declared_steps(BrokerState)


def test_the_state_is_the_last_base_of_the_broker():
    assert Broker.__mro__[-2:] == (BrokerState, object)
    assert all(issubclass(part, BrokerState) for part in PARTS)
    assert len(STUBS) > 30  # the stubs are found (a parse that finds none proves nothing)


def test_every_step_declared_in_the_state_is_defined_by_the_part_it_names():
    assert step_problems(BrokerState, Broker) == []


def test_no_module_of_the_broker_declares_for_type_checking_only():
    assert type_checking_imports(PACKAGE) == []


def test_no_method_is_defined_by_two_parts():
    seen: dict[str, type] = {}
    for part in PARTS:
        for name, member in vars(part).items():
            if function_of(member) is None or name.startswith("__"):
                continue
            assert name not in seen, f"{name} is defined by {seen[name].__name__} and " \
                                     f"{part.__name__}: one silently shadows the other"
            seen[name] = part


def test_no_part_redefines_what_the_state_defines():
    for name, member in vars(BrokerState).items():
        if function_of(member) is not None and name not in STUBS:
            owner = defining_class(Broker, name)
            assert owner is BrokerState, f"{owner.__name__} redefines BrokerState.{name}"


def test_every_declared_step_is_asked_for_by_another_part():
    sources = {path.stem: path.read_text() for path in PACKAGE.glob("*.py")}
    for name in STUBS:
        defined_in = defining_class(Broker, name).__module__.rsplit(".", 1)[1]
        callers = [stem for stem, text in sources.items()
                   if stem not in (defined_in, "state")
                   and re.search(rf"\bself\.{name}\b", text)]
        assert callers, f"BrokerState.{name}: no other part asks for it, so it needs no " \
                        "declaration"
