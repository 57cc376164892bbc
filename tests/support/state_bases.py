"""A state base's declared steps (a body that only raises NotImplementedError, as in
ha/machine_state.py) must each be defined by the class built on it: a step renamed in its
part would otherwise leave the stub, which raises only when that path runs."""

from __future__ import annotations

import ast
import inspect
import textwrap


def declared_steps(base: type) -> list[str]:
    """The names of `base`'s methods and properties whose body only raises
    NotImplementedError (after its docstring)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(base)))
    cls = tree.body[0]
    assert isinstance(cls, ast.ClassDef)
    steps = []
    for node in cls.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        body = [stmt for stmt in node.body
                if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))]
        if len(body) == 1 and isinstance(body[0], ast.Raise) and isinstance(
                body[0].exc, ast.Name | ast.Call) and "NotImplementedError" in ast.unparse(
                body[0].exc):
            steps.append(node.name)
    return steps


def undefined_steps(base: type, built: type) -> list[str]:
    """The steps `base` declares that `built` leaves to the stub."""
    return [name for name in declared_steps(base)
            if inspect.getattr_static(built, name) is base.__dict__[name]]
