"""The Engine's parts share one state base (client/engine_state.py): every step one part
asks of another is declared there as a stub, and the part its docstring names defines it."""

from __future__ import annotations

from pathlib import Path

from pairmq.client import engine_state
from pairmq.client.engine import Engine
from pairmq.client.engine_state import EngineState
from tests.support.state_bases import declared_steps, step_problems, type_checking_imports


def test_the_state_base_declares_the_steps_the_parts_ask_of_one_another() -> None:
    assert declared_steps(EngineState) == ["_emit", "_write", "_write_pending", "_done",
                                           "_ack_frame", "_finish_all"]


def test_every_step_is_defined_by_the_part_its_docstring_names() -> None:
    assert step_problems(EngineState, Engine) == []


def test_no_module_of_the_client_imports_or_declares_for_type_checking_only() -> None:
    assert type_checking_imports(Path(engine_state.__file__).parent) == []
