"""The Engine's parts share one state base (client/engine_state.py): every step one part
asks of another is declared there as a stub, and the part its docstring names defines it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from pairmq.client import engine_state
from pairmq.client.engine import Engine
from pairmq.client.engine_state import EngineState


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
    assert stubs_of(EngineState) == ["_emit", "_write", "_write_pending", "_done",
                                     "_ack_frame", "_finish_all"]


def test_every_step_is_defined_by_the_part_its_docstring_names() -> None:
    for name in stubs_of(EngineState):
        stub = EngineState.__dict__[name]
        owner = next(cls for cls in Engine.__mro__ if name in cls.__dict__)
        assert owner is not EngineState, f"{name} is not defined by any part"
        step = owner.__dict__[name]
        assert inspect.signature(step) == inspect.signature(stub), name
        module = Path(inspect.getfile(owner)).name
        assert f"({module})" in (stub.__doc__ or ""), (name, module)


def test_no_module_of_the_client_imports_or_declares_for_type_checking_only() -> None:
    for path in Path(engine_state.__file__).parent.glob("*.py"):
        assert "TYPE_CHECKING" not in path.read_text(), path.name
