"""One list of codes (errors.Code, docs/protocol.md#codes): every code the package sends,
stores or prints is a member, and none is written as a bare string."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections.abc import Iterator
from pathlib import Path

import crossintercom
from crossintercom.errors import Code, CrossintercomError, RemoteError
from crossintercom.models import Outcome, State

PACKAGE = Path(crossintercom.__file__).parent
# Where code values are written out on purpose: the list itself, and the migrations' frozen
# copies of it (a migration must not change when the list does).
EXEMPT = (PACKAGE / "codes.py", PACKAGE / "storage/migrations/versions")
# Names that hold a code, wherever they appear: a parameter, a field, a variable, a key. (A
# store row's ``reason`` column holds one too, but ``reason`` is free text elsewhere: a
# ``reason=`` is checked only against the codes' words.)
CODE_NAMES = frozenset({"code"})
# Words that are codes and also an outcome or a store state: bare, they are read as the latter.
SHARED_WORDS = frozenset(Code) & (frozenset(Outcome) | frozenset(State))
ALL_WORDS = frozenset(c.value for c in Code)
CODE_WORDS = ALL_WORDS - SHARED_WORDS
LOGGERS = frozenset({"log", "logger", "logging"})


def _sources() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if not any(path == e or e in path.parents for e in EXEMPT):
            yield path, ast.parse(path.read_text(), str(path))


def _named(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _strings(node: ast.AST | None) -> Iterator[ast.Constant]:
    """String literals that are the value itself, or one of its alternatives (``a or "x"``,
    ``"x" if c else y``, a tuple or set compared against)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, ast.BoolOp):
        for value in node.values:
            yield from _strings(value)
    elif isinstance(node, ast.IfExp):
        yield from _strings(node.body)
        yield from _strings(node.orelse)
    elif isinstance(node, ast.Tuple | ast.Set | ast.List):
        for elt in node.elts:
            yield from _strings(elt)


def _code_positions(trees: list[ast.Module]) -> dict[str, set[int]]:
    """Callable name -> positions of its positional parameter or field named like a code (a
    function's, a class's ``__init__`` or its annotated fields: structs, dataclasses)."""
    positions: dict[str, set[int]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names = [a.arg for a in node.args.posonlyargs + node.args.args]
                names = names[1:] if names[:1] in (["self"], ["cls"]) else names
                key = node.name
            elif isinstance(node, ast.ClassDef):
                key = node.name
                names = [
                    s.target.id
                    for s in node.body
                    if isinstance(s, ast.AnnAssign)
                    and isinstance(s.target, ast.Name)
                    and "ClassVar" not in ast.unparse(s.annotation)
                ]
                init = [
                    s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"
                ]
                if init:
                    names = [a.arg for a in init[0].args.args[1:]]
            else:
                continue
            found = {i for i, n in enumerate(names) if n in CODE_NAMES}
            if found:
                positions.setdefault(key, set()).update(found)
    return positions


def _bare_codes(tree: ast.Module, positions: dict[str, set[int]]) -> Iterator[ast.Constant]:
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and n.body
        and isinstance(n.body[0], ast.Expr)
    }
    keys = {id(k) for n in ast.walk(tree) if isinstance(n, ast.Dict) for k in n.keys}
    slots = {
        id(c)
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and any(_named(t) == "__slots__" for t in n.targets)
        for c in ast.walk(n.value)
    }
    tags = {id(k.value) for n in ast.walk(tree) if isinstance(n, ast.ClassDef) for k in n.keywords}
    not_codes = docstrings | keys | tags | slots
    for node in ast.walk(tree):
        # A code's own word, wherever it stands (not as a key, a docstring or a frame's tag).
        if (
            isinstance(node, ast.Constant)
            and node.value in CODE_WORDS
            and id(node) not in not_codes
        ):
            yield node
        # Any string in a code's place: a code not in the list, or a shared word.
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in CODE_NAMES:
                    yield from _strings(kw.value)
                elif kw.arg == "reason":
                    yield from (s for s in _strings(kw.value) if s.value in ALL_WORDS)
            # ``log.error("...")`` is a logger's, not the MCP result's ``error(code, ...)``.
            logger = isinstance(node.func, ast.Attribute) and _named(node.func.value) in LOGGERS
            if not logger:
                for i in positions.get(_named(node.func) or "", ()):
                    if i < len(node.args):
                        yield from _strings(node.args[i])
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(target.elts, node.value.elts, strict=False))
                else:
                    pairs = [(target, node.value)] if node.value is not None else []
                for name, value in pairs:
                    if _named(name) in CODE_NAMES:
                        yield from _strings(value)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_named(s) in CODE_NAMES for s in sides):
                for side in sides:
                    yield from _strings(side)
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and k.value in CODE_NAMES:
                    yield from _strings(v)
        elif isinstance(node, ast.arguments):
            params = node.posonlyargs + node.args
            defaults: list[ast.expr | None] = [None] * (len(params) - len(node.defaults))
            defaults += node.defaults
            with_defaults = [
                *zip(params, defaults, strict=True),
                *zip(node.kwonlyargs, node.kw_defaults, strict=True),
            ]
            for param, default in with_defaults:
                if param.arg in CODE_NAMES:
                    yield from _strings(default)


def test_no_code_is_written_as_a_bare_string() -> None:
    sources = list(_sources())
    positions = _code_positions([tree for _, tree in sources])
    found = sorted(
        {
            f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.value!r}"
            for path, tree in sources
            for node in _bare_codes(tree, positions)
        }
    )
    assert found == [], "name these with errors.Code (add the code there first):\n" + "\n".join(
        found
    )


def _subclasses(cls: type[CrossintercomError]) -> Iterator[type[CrossintercomError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_error_class_carries_a_listed_code() -> None:
    for module in pkgutil.walk_packages(crossintercom.__path__, "crossintercom."):
        if ".migrations" not in module.name and not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    classes: list[type[CrossintercomError]] = [CrossintercomError]
    classes += _subclasses(CrossintercomError)
    assert len(classes) > 20
    unlisted = [c.__qualname__ for c in classes if not isinstance(c.code, Code)]
    assert unlisted == [], unlisted
    # The one class that holds another's code as it came (a newer broker's, maybe).
    assert RemoteError("relay_fenced", "x").code == Code.RELAY_FENCED


def test_a_code_is_never_an_outcome_or_a_state_by_name() -> None:
    """The words shared with outcomes and states are the few the store and receipts have
    always used; a new code gets a word of its own."""
    assert {str(w) for w in SHARED_WORDS} == {"refused", "expired", "queued"}
