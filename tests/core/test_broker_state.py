"""The Broker's parts and the state they share (core/broker/state.py): every step one part
asks of another is declared once in BrokerState, and defined by exactly one part, the one
its declaration names, so that a renamed method can never leave a declaration that raises
at run time."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path
from types import FunctionType

from pairmq.core import Broker
from pairmq.core.broker.state import BrokerState

PACKAGE = Path(inspect.getfile(BrokerState)).parent
PARTS = [k for k in Broker.__mro__ if k.__module__.startswith("pairmq.core.broker.")
         and k is not BrokerState]


def _function(member: object) -> FunctionType | None:
    if isinstance(member, staticmethod | classmethod):
        member = member.__func__
    if isinstance(member, property):
        member = member.fget
    return member if isinstance(member, FunctionType) else None


def _raises_not_implemented(fn: FunctionType) -> bool:
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    assert isinstance(node, ast.FunctionDef)
    body = [s for s in node.body if not (isinstance(s, ast.Expr)
                                         and isinstance(s.value, ast.Constant))]
    return len(body) == 1 and isinstance(body[0], ast.Raise) and isinstance(
        body[0].exc, ast.Name) and body[0].exc.id == "NotImplementedError"


STUBS = {name: fn for name, member in vars(BrokerState).items()
         if (fn := _function(member)) is not None and _raises_not_implemented(fn)}


def _owner(name: str) -> type:
    return next(k for k in Broker.__mro__ if name in vars(k))


def test_the_state_is_the_last_base_of_the_broker():
    assert Broker.__mro__[-2:] == (BrokerState, object)
    assert all(issubclass(part, BrokerState) for part in PARTS)
    assert len(STUBS) > 30  # the stubs are found (a parse that finds none proves nothing)


def test_every_step_declared_in_the_state_is_defined_by_the_part_it_names():
    for name, stub in STUBS.items():
        owner = _owner(name)
        assert owner is not BrokerState, f"BrokerState.{name} is defined by no part"
        named = re.search(r"\((\w+)\.py\)\.?$", (stub.__doc__ or "").strip())
        assert named is not None, f"BrokerState.{name}'s docstring names no part"
        assert owner.__module__ == f"pairmq.core.broker.{named.group(1)}", \
            f"BrokerState.{name} says {named.group(1)}.py, {owner.__module__} defines it"
        assert isinstance(vars(owner)[name], staticmethod) == isinstance(
            vars(BrokerState)[name], staticmethod), f"{name}: static in one place only"


def test_no_method_is_defined_by_two_parts():
    seen: dict[str, type] = {}
    for part in PARTS:
        for name, member in vars(part).items():
            if _function(member) is None or name.startswith("__"):
                continue
            assert name not in seen, f"{name} is defined by {seen[name].__name__} and " \
                                     f"{part.__name__}: one silently shadows the other"
            seen[name] = part


def test_no_part_redefines_what_the_state_defines():
    for name, member in vars(BrokerState).items():
        if _function(member) is not None and name not in STUBS:
            assert _owner(name) is BrokerState, f"{_owner(name).__name__} redefines " \
                                                f"BrokerState.{name}"


def test_every_declared_step_is_asked_for_by_another_part():
    sources = {path.stem: path.read_text() for path in PACKAGE.glob("*.py")}
    for name in STUBS:
        defined_in = _owner(name).__module__.rsplit(".", 1)[1]
        callers = [stem for stem, text in sources.items()
                   if stem not in (defined_in, "state")
                   and re.search(rf"\bself\.{name}\b", text)]
        assert callers, f"BrokerState.{name}: no other part asks for it, so it needs no " \
                        "declaration"
