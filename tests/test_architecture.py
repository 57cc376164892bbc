"""The arrows of docs/architecture.md, checked on every import in src/pairmq (those under
`if TYPE_CHECKING:` and inside functions included): layers only import layers below them,
server/'s rooms only rooms above them in their stack, and no module imports one that
imports it back, but for the core objects that point at each other."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS = {
    "protocol": set(),
    "core": {"protocol"},
    "store": {"core", "protocol"},
    "ha": {"core", "store", "protocol"},
    "client": {"protocol"},
    "server": {"protocol", "core", "store", "ha", "client"},
    "spark": {"client", "protocol"},
    "cli": {"server", "client", "store", "core", "protocol"},
}
# server/'s rooms, top to bottom: each imports only rooms before it (and itself)
SERVER_ROOMS = ["foundations", "guards", "pair", "role", "cluster", "stomp", "manage", "app",
                "run"]
SIBLINGS = {("stomp", "manage"), ("manage", "stomp")}
FOUNDATIONS = {"config", "settings", "tls", "clock", "process", "loop_lag", "arbiter_url",
               "etcd_gateway"}
# objects that truly point at each other (docs/architecture.md, "Arrows")
MUTUAL = {"pairmq.core.queue", "pairmq.core.subscription", "pairmq.core.session",
          "pairmq.core.stream_log"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(module: str, path: Path) -> set[str]:
    """The pairmq modules `module` imports, resolved to modules that exist."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            # `from package import module` depends on that module; any other name, on the
            # module (or package) that holds it
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                     for alias in node.names]
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name.startswith("pairmq.") and name != module:
                found.add(name)
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def _server_room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 3:
        return parts[2] if parts[2] in ("app", "run") else "foundations" \
            if parts[2] in FOUNDATIONS else parts[2]
    return parts[2]


def test_layers_import_only_layers_below() -> None:
    wrong = [f"{m} -> {d}" for m, deps in GRAPH.items() for d in deps
             if (lm := _layer(m)) and (ld := _layer(d)) and lm != ld
             and ld not in LAYERS[lm]]
    assert wrong == []


def test_every_module_of_server_sits_in_a_known_room() -> None:
    rooms = {_server_room(m) for m in MODULES if m.startswith("pairmq.server.")}
    assert rooms <= set(SERVER_ROOMS), rooms - set(SERVER_ROOMS)


def test_server_rooms_import_only_rooms_above() -> None:
    wrong = []
    for m, deps in GRAPH.items():
        if not m.startswith("pairmq.server."):
            continue
        mine = _server_room(m)
        for d in deps:
            if not d.startswith("pairmq.server.") or (other := _server_room(d)) == mine:
                continue
            if (mine, other) in SIBLINGS or \
                    SERVER_ROOMS.index(other) > SERVER_ROOMS.index(mine):
                wrong.append(f"{m} ({mine}) -> {d} ({other})")
    assert wrong == []


def _cycles() -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in GRAPH:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_but_between_objects_that_point_at_each_other() -> None:
    assert [c for c in _cycles() if not c <= MUTUAL] == []


def test_the_checks_read_the_imports() -> None:
    assert "pairmq.core.broker.broker" in GRAPH["pairmq.core"]  # a real edge is seen
    assert len(GRAPH) > 150
