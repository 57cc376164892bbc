"""The objects every message passes through stay on Python's fast path for attributes.

Python 3.11 keeps an instance's attributes in a table shared with its class while it has
fewer than 30 of them; from the 30th the instance gets a dict of its own, and every
`self.method()` on it is then looked up the slow way (a call about a third longer,
measured here: 34 ns against 48). The connection crossed that line with the hardening
features (37 attributes) and paid for it on every frame (issue 34, docs/benchmarks.md). So
an object on the per-message path either has `__slots__` or fewer than 30 attributes;
these tests count what its class and its bases assign to `self`, so that the next
attribute that would cross the line fails here instead of costing a few per cent unseen.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from pairmq.core.broker.broker import Broker
from pairmq.server.role.role import Role
from pairmq.server.stomp.connection import StompConnection
from pairmq.store.store import Store
from pairmq.store.writer import JournalWriter
from tests.support.build import reads_the_sources

pytestmark = reads_the_sources

SHARED_KEYS_MAX = 30  # CPython 3.11's SHARED_KEYS_MAX_SIZE (Objects/dictobject.c)


def assigned_attributes(cls: type) -> set[str]:
    """Names assigned as `self.NAME` in the methods of `cls` and its pairmq bases."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith(("pairmq.", __name__)):
            continue  # object, asyncio.Protocol...
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) \
                            and sub.value.id == "self":
                        names.add(sub.attr)
    return names


@pytest.mark.parametrize("cls", [Broker, Role, Store, JournalWriter])
def test_a_hot_object_without_slots_stays_under_the_shared_keys_limit(cls: type) -> None:
    names = assigned_attributes(cls)
    assert len(names) < SHARED_KEYS_MAX, (
        f"{cls.__name__} has {len(names)} attributes: from {SHARED_KEYS_MAX} on, every "
        "method call on it takes the slow path in Python 3.11. Give it __slots__ (as "
        "server/stomp/connection_state.py does) or fewer attributes.")


def test_the_connection_has_slots_for_every_attribute_and_no_dict() -> None:
    assert StompConnection.__dictoffset__ == 0, "a class in its bases has no __slots__"
    slots: set[str] = set()
    for klass in StompConnection.__mro__:
        slots.update(klass.__dict__.get("__slots__", ()))
    missing = assigned_attributes(StompConnection) - slots
    assert not missing, f"assigned but not in ConnectionState.__slots__: {sorted(missing)}"


def test_the_count_sees_a_class_over_the_limit() -> None:
    class Crowded:  # what the first test refuses
        def __init__(self) -> None:
            for i in range(3):
                setattr(self, f"dynamic{i}", i)  # not counted: only `self.NAME = ...` is
            self.a = self.b = 0
            self.c: int = 1
            self.a += 1

    assert assigned_attributes(Crowded) == {"a", "b", "c"}
