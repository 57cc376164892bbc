"""The Store's parts share one state base (store/store_state.py): every step one part asks
of another is declared there as a stub, and the part its docstring names defines it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from pairmq.store import store_state
from pairmq.store.store import Store
from pairmq.store.store_state import StoreState


def stubs_of(cls: type) -> list[str]:
    """The methods of `cls` whose whole body (after the docstring) raises
    NotImplementedError."""
    tree = ast.parse(inspect.getsource(cls))
    (node,) = tree.body
    assert isinstance(node, ast.ClassDef)
    names = []
    for item in node.body:
        if not isinstance(item, ast.FunctionDef):
            continue
        body = item.body[1:] if ast.get_docstring(item) is not None else item.body
        if len(body) == 1 and isinstance(body[0], ast.Raise) and isinstance(
                body[0].exc, ast.Name) and body[0].exc.id == "NotImplementedError":
            names.append(item.name)
    return names


def test_the_state_base_declares_the_steps_the_parts_ask_of_one_another() -> None:
    assert stubs_of(StoreState) == [
        "persist", "_open", "_listen", "_notify_full", "_locate", "_release", "_release_all",
        "_forget", "account", "_maybe_compact", "_drop_segment"]


def test_every_step_is_defined_by_the_part_its_docstring_names() -> None:
    for name in stubs_of(StoreState):
        stub = StoreState.__dict__[name]
        owner = next(cls for cls in Store.__mro__ if name in cls.__dict__)
        assert owner is not StoreState, f"{name} is not defined by any part"
        step = owner.__dict__[name]
        assert inspect.signature(step) == inspect.signature(stub), name
        module = Path(inspect.getfile(owner)).name
        assert f"({module})" in (stub.__doc__ or ""), (name, module)


def test_no_module_of_the_store_imports_or_declares_for_type_checking_only() -> None:
    for path in Path(store_state.__file__).parent.glob("*.py"):
        assert "TYPE_CHECKING" not in path.read_text(), path.name
