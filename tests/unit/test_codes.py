"""One list of codes (errors.Code, docs/protocol.md#codes): every code the package sends,
stores or prints is a member, and none is written as a bare string."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path

import crossintercom
from crossintercom.errors import Code, CrossintercomError, RemoteError
from crossintercom.models import Outcome, State

PACKAGE = Path(crossintercom.__file__).parent
# Where code values are written out on purpose: the list itself, and the migrations' frozen
# copies of it (a migration must not change when the list does).
EXEMPT = (PACKAGE / "codes.py", PACKAGE / "storage/migrations/versions")
# Names that hold a code, wherever they appear: a parameter, a field, a variable, a key; and
# any name ending in ``_code`` (``error_code``, ``code_``) but an exit code's. (A store row's
# ``reason`` column holds one too, but ``reason`` is free text elsewhere: a ``reason=`` is
# checked only against the codes' words.)
CODE_NAMES = frozenset({"code"})
EXIT_CODES = frozenset({"exit_code", "returncode"})
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
    """The name a value is read from: a variable, an attribute, a constant key (``r["code"]``,
    ``r.get("code")``)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ):
        return str(node.args[0].value)
    return None


def _is_code_name(name: str | None) -> bool:
    if name is None or name.endswith(tuple(EXIT_CODES)):
        return False
    return name.rstrip("_") in CODE_NAMES or name.endswith("_code")


def _strings(node: ast.AST | None) -> Iterator[ast.Constant]:
    """String literals that are the value itself, or one of its alternatives (``a or "x"``,
    ``"x" if c else y``, a tuple or set compared against)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, ast.JoinedStr):  # a code made up at run time is not in the list
        yield from (v for v in node.values if isinstance(v, ast.Constant))
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
                if node.name == "__init__":
                    # Called by its class's name (below); ``super().__init__`` is any class's.
                    continue
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
            found = {i for i, n in enumerate(names) if _is_code_name(n)}
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
    # A key names a field (``{"error": ...}``) or an outcome; a table keyed by code words is
    # reported below.
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
                if _is_code_name(kw.arg):
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
                    if _is_code_name(_named(name)):
                        yield from _strings(value)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_code_name(_named(s)) for s in sides):
                for side in sides:
                    yield from _strings(side)
        elif isinstance(node, ast.Match) and _is_code_name(_named(node.subject)):
            for case in node.cases:
                yield from (
                    c
                    for c in ast.walk(case.pattern)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                )
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and _is_code_name(str(k.value)):
                    yield from _strings(v)
                elif isinstance(k, ast.Constant) and k.value in CODE_WORDS - {Code.ERROR}:
                    yield k  # a table keyed by codes: key it by Code members
        elif isinstance(node, ast.arguments):
            params = node.posonlyargs + node.args
            defaults: list[ast.expr | None] = [None] * (len(params) - len(node.defaults))
            defaults += node.defaults
            with_defaults = [
                *zip(params, defaults, strict=True),
                *zip(node.kwonlyargs, node.kw_defaults, strict=True),
            ]
            for param, default in with_defaults:
                if _is_code_name(param.arg):
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


# Where the page's scripts and the harness plugins (which cannot import the list) name a code:
# compared with ``code`` or given as one (``code === "x"``, ``"x" !== e.code``, ``code: "x"``).
_SCRIPT_CODE = re.compile(
    r"""\bcode\s*(?:===?|!==?|:)\s*(["'`])([^"'`]*)\1"""
    r"""|(["'`])([^"'`]*)\3\s*(?:===?|!==?)\s*[\w.?\[\]"']*\bcode\b"""
)
SCRIPTS = (".js", ".ts", ".html")


def test_scripts_name_only_codes_of_the_list() -> None:
    """The overseer page (web/static, web/templates) and the harness plugins (agents/) read
    codes off the wire in JavaScript: every code they compare with is one of the list."""
    found = []
    scripts = [p for p in sorted(PACKAGE.rglob("*")) if p.suffix in SCRIPTS]
    assert len(scripts) >= 5, scripts  # the scan reads the files it is meant to
    for path in scripts:
        text = path.read_text()
        for m in _SCRIPT_CODE.finditer(text):
            value = m.group(2) if m.group(2) is not None else m.group(4)
            if value not in ALL_WORDS:
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {value!r}")
    assert found == [], "not a code of errors.Code:\n" + "\n".join(found)


def test_the_scan_finds_codes_however_they_are_written() -> None:
    """Every way a bare code has been written finds it (a regression guard for the scan)."""
    bare = {
        "keyword": 'f(code="not_found")',
        "shared word as a keyword": 'f(code="expired")',
        "read from a dict": 'ok = r["code"] == "bogus_code"',
        "read with get": 'ok = r.get("code") in ("bogus_code", "other")',
        "a name ending in _code": 'error_code = "bogus_code"',
        "stored under a key": 'd["code"] = "bogus_code"',
        "made up at run time": 'f(code=f"relay_{x}")',
        "matched": 'match r.code:\n    case "bogus_code":\n        pass',
        "a table keyed by codes": 'advice = {"not_found": "check the name"}',
        "a code's own word": 'x = "broker_unavailable"',
    }
    for what, src in bare.items():
        tree = ast.parse(src)
        assert list(_bare_codes(tree, _code_positions([tree]))), what
    fine = [
        "f(code=Code.NOT_FOUND)",
        'out = {"error": {"code": Code.INTERNAL}}',
        'exit_code = "0"',
        'log.error("not found")',
        'if r["outcome"] == "expired": pass',
    ]
    for src in fine:
        tree = ast.parse(src)
        assert not list(_bare_codes(tree, _code_positions([tree]))), src
    assert _SCRIPT_CODE.search('if (out.error.code === "bogus") {}')
    assert _SCRIPT_CODE.search('if ("bogus" !== e.code) {}')


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
