"""Objects written in parts over one state base (core/broker/state.py,
server/stomp/connection_state.py, client/engine_state.py, store/store_state.py,
ha/machine_state.py): a step one part asks of another is declared in the base, a body that
only raises NotImplementedError and a docstring ending with the file of the part that
defines it. These checks keep that true: a step renamed in its part would otherwise leave
the stub, which raises only when that path runs."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path
from types import FunctionType


def function_of(member: object) -> FunctionType | None:
    """The function behind a method, static or class method, or property."""
    if isinstance(member, staticmethod | classmethod):
        member = member.__func__
    if isinstance(member, property):
        member = member.fget
    return member if isinstance(member, FunctionType) else None


def _only_raises_not_implemented(fn: FunctionType) -> bool:
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    assert isinstance(node, ast.FunctionDef)
    body = [stmt for stmt in node.body if not (isinstance(stmt, ast.Expr)
                                               and isinstance(stmt.value, ast.Constant))]
    return len(body) == 1 and isinstance(body[0], ast.Raise) and isinstance(
        body[0].exc, ast.Name) and body[0].exc.id == "NotImplementedError"


def declared_steps(base: type) -> list[str]:
    """The steps `base` declares, in the order it declares them."""
    return [name for name, member in vars(base).items()
            if (fn := function_of(member)) is not None and _only_raises_not_implemented(fn)]


def defining_class(built: type, name: str) -> type:
    """The first class of `built`'s MRO that holds `name`."""
    return next(cls for cls in built.__mro__ if name in vars(cls))


def step_problems(base: type, built: type) -> list[str]:
    """What is wrong with how `built` defines the steps `base` declares: a step no part
    defines, one whose docstring names another file than the part's, one whose signature
    or kind (static, property) differs from its declaration."""
    problems = []
    for name in declared_steps(base):
        declared = vars(base)[name]
        owner = defining_class(built, name)
        if owner is base:
            problems.append(f"{base.__name__}.{name} is defined by no part")
            continue
        defined = vars(owner)[name]
        if type(defined) is not type(declared):
            problems.append(f"{name}: a {type(declared).__name__} in {base.__name__}, a "
                            f"{type(defined).__name__} in {owner.__name__}")
            continue
        stub, step = function_of(declared), function_of(defined)
        assert stub is not None and step is not None
        if inspect.signature(step) != inspect.signature(stub):
            problems.append(f"{name}: {owner.__name__}{inspect.signature(step)} is not "
                            f"{base.__name__}{inspect.signature(stub)}")
        named = re.search(r"\((\w+\.py)\)\.?$", (stub.__doc__ or "").strip())
        where = Path(inspect.getfile(owner)).name
        if named is None or named.group(1) != where:
            problems.append(f"{base.__name__}.{name}'s docstring names "
                            f"{named.group(1) if named else 'no file'}; {where} defines it")
    return problems


def type_checking_imports(package: Path) -> list[str]:
    """The modules of a package that import anything for type checking only."""
    return [path.name for path in sorted(package.glob("*.py"))
            if "TYPE_CHECKING" in path.read_text()]
