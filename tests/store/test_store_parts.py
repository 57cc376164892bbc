"""The Store's parts share one state base (store/store_state.py): every step one part asks
of another is declared there as a stub, and the part its docstring names defines it."""

from __future__ import annotations

from pathlib import Path

from pairmq.store import store_state
from pairmq.store.store import Store
from pairmq.store.store_state import StoreState
from tests.support.build import reads_the_sources
from tests.support.state_bases import declared_steps, step_problems, type_checking_imports

pytestmark = reads_the_sources


def test_the_state_base_declares_the_steps_the_parts_ask_of_one_another() -> None:
    assert declared_steps(StoreState) == [
        "persist", "_open", "_listen", "_notify_full", "_locate", "_release", "_release_all",
        "_forget", "account", "_maybe_compact", "_drop_segment"]


def test_every_step_is_defined_by_the_part_its_docstring_names() -> None:
    assert step_problems(StoreState, Store) == []


def test_no_module_of_the_store_imports_or_declares_for_type_checking_only() -> None:
    assert type_checking_imports(Path(store_state.__file__).parent) == []
