"""Every step a part of the client connection asks of another, declared once in
server/stomp/connection_state.py, is defined by the part its docstring names (no stub left
to raise)."""

from __future__ import annotations

from pathlib import Path

from pairmq.server.role.role import Client
from pairmq.server.stomp import connection_state
from pairmq.server.stomp.connection import StompConnection
from pairmq.server.stomp.connection_state import ConnectionState
from tests.support.build import reads_the_sources
from tests.support.state_bases import declared_steps, step_problems, type_checking_imports

pytestmark = reads_the_sources


def test_every_declared_step_is_defined_by_the_part_it_names() -> None:
    assert len(declared_steps(ConnectionState)) >= 15  # the declarations are read
    assert step_problems(ConnectionState, StompConnection) == []


def test_the_state_base_declares_what_a_role_asks_of_a_client() -> None:
    asked = {name for name in vars(Client) if not name.startswith("_")} - {"conn_id"}
    assert asked <= set(declared_steps(ConnectionState))


def test_no_module_of_the_connection_declares_for_type_checking_only() -> None:
    assert type_checking_imports(Path(connection_state.__file__).parent) == []
