"""Every step a part of the client connection asks of another, declared once in
server/stomp/connection_state.py, is defined by StompConnection (no stub left to raise)."""

from __future__ import annotations

from pairmq.server.role.role import Client
from pairmq.server.stomp.connection import StompConnection
from pairmq.server.stomp.connection_state import ConnectionState
from tests.support.state_bases import declared_steps, undefined_steps


def test_every_declared_step_is_defined_by_the_connection() -> None:
    steps = declared_steps(ConnectionState)
    assert len(steps) >= 15  # the declarations are read, not an empty list
    assert undefined_steps(ConnectionState, StompConnection) == []


def test_the_state_base_declares_what_a_role_asks_of_a_client() -> None:
    asked = {name for name in vars(Client) if not name.startswith("_")} - {"conn_id"}
    assert asked <= set(declared_steps(ConnectionState))
