"""A server names the build it runs in its first line, so an operator (and the compiled
run of `make test`) can tell the compiled build (`make compiled`) from the sources."""

from __future__ import annotations

from tests.serverproc import ServerProcess
from tests.support.build import COMPILED


def test_the_server_says_which_build_it_runs(server: ServerProcess) -> None:
    (line,) = server.log_lines("Starting pairmq server")
    if COMPILED:  # PYTHONPATH=build/compiled reaches the server processes too
        assert "the per-message path compiled by mypyc" in line
    else:
        assert "pure Python" in line
