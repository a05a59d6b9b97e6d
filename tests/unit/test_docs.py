"""The docs describe the code as it is: docs/architecture.md's module map lists every module of
the package (and nothing that is gone), and every name in the docs that reads as code (a
``name.py`` file, a dotted module path, a backticked class, call, ``Class.attribute`` or
``module.Name``) names something that exists, and every citation of a doc's section names one
that is there. Read from the source with ``ast``; nothing is imported.

docs/perf-log/ is exempt: it is the dated history of measurements, naming the code of its day.
"""

from __future__ import annotations

import ast
import builtins
import re
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "crossintercom"
DOCS = REPO / "docs"
# Where the docs' file names and dotted paths may point.
SOURCE_ROOTS = ("crossintercom", "tests", "lab")
# Other projects' names the docs write in backticks as code: PostgreSQL's functions, psycopg's,
# tenacity's, the harnesses' (Claude Code, OpenCode), a browser's and /proc's. Every other
# backticked class or call is this project's (or Python's).
FOREIGN = {
    "AsyncRetrying",
    "BaseListDumper",
    "HttpOnly",
    "OPERATOR",
    "VmRSS",
    "WaitForMcpServers",
    "notifies",
    "pg_backend_pid",
    "promptAsync",
    "stringify",
    "to_tsvector",
}


def _doc_files() -> list[Path]:
    return [*sorted(DOCS.glob("*.md")), REPO / "README.md", REPO / "CONTRIBUTING.md"]


def _source_files() -> list[Path]:
    out: list[Path] = []
    for root in SOURCE_ROOTS:
        out += [p for p in (REPO / root).rglob("*.py") if "__pycache__" not in p.parts]
    return out


def _package_modules() -> list[Path]:
    """Every importable module of the package: under a chain of packages (the Alembic scripts,
    data without an ``__init__.py``, are not modules)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if path.name == "__init__.py" or "__pycache__" in rel.parts:
            continue
        parents = [PACKAGE / Path(*rel.parts[:i]) for i in range(1, len(rel.parts))]
        if all((p / "__init__.py").exists() for p in parents):
            found.append(path)
    return found


# --- the module map -------------------------------------------------------------------------


def _module_map() -> list[str]:
    text = (DOCS / "architecture.md").read_text()
    match = re.search(r"^```\n(crossintercom/\n.*?)^```", text, re.S | re.M)
    assert match, "docs/architecture.md opens with the module map, a code block from crossintercom/"
    return match.group(1).splitlines()


def _mapped() -> set[str]:
    """The ``dir/name.py`` paths the map names: each ``*.py`` word on a line, in the directory
    the indentation puts that line in (a description's continuation lines included)."""
    stack: list[tuple[int, str]] = []
    out: set[str] = set()
    for line in _module_map():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        first = line.split()[0]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if first.endswith("/"):
            stack.append((indent, first))
        where = "".join(d for _, d in stack)
        for name in re.findall(r"(?<![\w./])([A-Za-z_]\w*\.py)\b", line):
            out.add(where + name)
    return out


def test_the_module_map_lists_every_module() -> None:
    mapped = _mapped()
    modules = {str(p.relative_to(REPO)) for p in _package_modules()}
    missing = sorted(modules - mapped)
    assert not missing, (
        "docs/architecture.md's module map lacks (one line each, under its folder): "
        + ", ".join(missing)
    )


def test_the_module_map_names_no_module_that_is_gone() -> None:
    gone = sorted(
        p for p in _mapped() if p.startswith("crossintercom/") and not (REPO / p).exists()
    )
    assert not gone, f"docs/architecture.md's module map names modules that do not exist: {gone}"


# --- names in the docs ------------------------------------------------------------------------


class Defined:
    """What the source defines: each module's top-level names and each class's attributes."""

    def __init__(self) -> None:
        self.modules: dict[str, set[str]] = {}  # dotted module -> its top-level names
        self.classes: dict[str, set[str]] = {}  # class name -> its attributes (any module's)
        self.names: set[str] = set()  # every function, class and assigned name anywhere
        for path in _source_files():
            rel = path.relative_to(REPO).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            source = path.read_text()
            tree = ast.parse(source, str(path))
            top: set[str] = set()
            for stmt in tree.body:
                top |= _bound(stmt)
            self.modules[".".join(parts)] = top
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    attrs: set[str] = set()
                    for item in node.body:
                        attrs |= _bound(item)
                    self.classes.setdefault(node.name, set()).update(attrs)
                self.names |= _bound(node) if isinstance(node, ast.stmt) else set()
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    self.names.add(node.attr)  # self.x = ...
            # Functions the schema creates (SECURITY DEFINER helpers of the row policies).
            self.names |= set(SQL_FUNCTION.findall(source))
        # Names the deployment files define (systemd units, Prometheus alerts and dashboards).
        for path in (REPO / "deploy").rglob("*"):
            if path.is_file():
                self.names |= set(re.findall(r"[A-Za-z_]\w*", path.read_text(errors="replace")))

    def dotted(self, name: str) -> bool:
        """``crossintercom.relay.screening`` or ``tests.procs.wait_for``: a module, then names
        defined in it (a class's attribute after a class)."""
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            module = ".".join(parts[:cut])
            if module in self.modules:
                return self._attrs(self.modules[module], parts[cut:])
        return False

    def _attrs(self, scope: set[str], rest: list[str]) -> bool:
        if not rest:
            return True
        if rest[0] not in scope:
            return False
        return (
            len(rest) == 1 or rest[1] in self.classes.get(rest[0], set()) or rest[1] in self.names
        )


def _bound(node: ast.AST) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    names: set[str] = set()
    for target in targets:
        for sub in ast.walk(target):
            if isinstance(sub, ast.Name):
                names.add(sub.id)
    if isinstance(node, ast.If | ast.Try | ast.With):  # definitions under a guard
        for child in ast.iter_child_nodes(node):
            names |= _bound(child)
    return names


@cache
def _defined() -> Defined:
    return Defined()


@cache
def _py_paths() -> frozenset[str]:
    return frozenset(str(p.relative_to(REPO)) for p in _source_files())


@cache
def _stems() -> dict[str, list[str]]:
    """The package's modules by their last name: ``models`` → ``crossintercom.models``."""
    out: dict[str, list[str]] = {}
    for module in _defined().modules:
        if module.startswith("crossintercom."):
            out.setdefault(module.rsplit(".", 1)[-1], []).append(module)
    return out


@cache
def _our_dirs() -> frozenset[str]:
    return frozenset(part for p in _py_paths() for part in Path(p).parts[:-1])


def _file_exists(name: str) -> bool:
    """``service.py``, ``relay/service.py`` or ``tests/relay/conftest.py``: the end of the path
    of a file of the checkout."""
    name = name.removeprefix("./")
    return any(p == name or p.endswith("/" + name) for p in _py_paths())


def _external(root: str) -> bool:
    """The first part of a dotted name names the standard library or an installed package."""
    import importlib.util

    if root in sys.stdlib_module_names or hasattr(builtins, root):
        return True
    try:
        return importlib.util.find_spec(root) is not None
    except (ImportError, ValueError):
        return False


SQL_FUNCTION = re.compile(r"FUNCTION\s+(?:\w+\.)?(\w+)\s*\(", re.I)
QUOTED = re.compile(r'"[^"\n]*"')
CODE_SPAN = re.compile(r"`([^`\n]+)`")
PY_FILE = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[A-Za-z_]\w*\.py)\b")
DOTTED = re.compile(r"(?<![\w./-])((?:crossintercom|tests|lab)(?:\.[A-Za-z_]\w*)+)")
CAMEL = re.compile(r"^[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+$")
CALL = re.compile(r"^([A-Za-z_][\w.]*)\(.*\)$")
CLASS_ATTR = re.compile(r"^([A-Z]\w*)\.([a-z_]\w*)$")
# ``models.PROGRESS``, ``harness.SimHost``: a module of the package by its last name, then a
# class or constant of it (a lower-case second part is as often a column or a file's name).
MODULE_ATTR = re.compile(r"^([a-z_][a-z0-9_]*)\.([A-Z]\w*(?:\.[A-Za-z_]\w*)*)$")


def _problems(text: str) -> Iterator[str]:
    defined = _defined()
    # A file name in a quoted string is an example's (a message's text, an attachment's name).
    for name in PY_FILE.findall(QUOTED.sub("", text)):
        top = name.removeprefix("./").split("/")[0]
        if "/" in name and top not in _our_dirs():
            continue  # another project's path (an example checkout)
        if not _file_exists(name):
            yield f"{name}: no such file"
    for name in DOTTED.findall(text):
        if not defined.dotted(name.rstrip(".")):
            yield f"{name}: no such module or name"
    for raw in CODE_SPAN.findall(text):
        span = raw.strip()
        call = CALL.match(span)
        if call:
            head, *rest = call.group(1).split(".")
            last = (rest or [head])[-1]
            if not (
                last in defined.names
                or last in FOREIGN
                or _external(head)
                or (not rest and hasattr(builtins, head))
            ):
                yield f"`{span}`: no such function"
        elif CAMEL.match(span):
            if span not in defined.names | FOREIGN and not hasattr(builtins, span):
                yield f"`{span}`: no such class or name"
        elif (m := MODULE_ATTR.match(span)) and m.group(1) in _stems():
            head, rest = m.groups()
            if not any(defined.dotted(f"{module}.{rest}") for module in _stems()[head]):
                yield f"`{span}`: no such name in a module {head}"
        elif m := CLASS_ATTR.match(span):
            cls, attr = m.groups()
            known = defined.classes.get(cls, set()) | defined.names
            if cls in defined.classes and attr not in known:
                yield f"`{span}`: {cls} has no {attr}"


@pytest.mark.parametrize("doc", _doc_files(), ids=lambda p: p.name)
def test_every_code_name_in_the_docs_exists(doc: Path) -> None:
    problems = sorted(set(_problems(doc.read_text())))
    assert not problems, f"{doc.relative_to(REPO)} names code that does not exist: " + "; ".join(
        problems
    )


# --- citations of a doc's section -----------------------------------------------------------

CITATION = re.compile(r"docs/([\w./-]+\.md)(?:,\s*(?:#\s*)?\"([^\"]{1,200})\"|#([\w-]+))")


def _headings(doc: Path) -> list[str]:
    """A doc's headings, and its run-in headings: a paragraph or list item that opens with a
    bold title (``**Saved before delivered.** …``, ``- **Hosts** with …``)."""
    text = doc.read_text()
    found = [m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)]
    return found + re.findall(r"^(?:[-*] )?\*\*([^*\n]+?)\.?\*\*", text, re.M)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, blanks to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _citations() -> Iterator[tuple[str, str, str]]:
    """(where, doc, section or #anchor) for every ``docs/X.md, "Section"`` and ``docs/X.md#a``
    in the code, the tests, the lab scripts and the docs (a section's title may wrap across
    comment lines)."""
    places = [p for p in [*_source_files(), *_doc_files()] if p != Path(__file__)]
    for path in places:
        text = path.read_text()
        for m in CITATION.finditer(text):
            doc, section, anchor = m.groups()
            where = f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}"
            if section is not None:
                yield where, doc, " ".join(re.sub(r"\n\s*#?", " ", section).split())
            else:
                yield where, doc, "#" + anchor


def test_every_cited_section_exists() -> None:
    """A citation names a section by its title or the start of it (the dated entries of
    docs/perf-log/ carry a date after theirs), or by its anchor or the start of one."""
    wrong = []
    for where, doc, cited in _citations():
        path = DOCS / doc
        if not path.exists():
            wrong.append(f"{where}: docs/{doc} does not exist")
            continue
        headings = _headings(path)
        if cited.startswith("#"):
            found = any(_anchor(h).startswith(cited[1:]) for h in headings)
        else:
            plain = [h.replace("`", "").lower() for h in headings]
            found = any(h.startswith(cited.replace("`", "").lower()) for h in plain)
        if not found:
            wrong.append(f"{where}: docs/{doc} has no section {cited}")
    assert not wrong, "citations of sections that do not exist:\n" + "\n".join(wrong)


def test_the_checks_catch_names_that_are_gone() -> None:
    """The checks above are not vacuous: names of modules and classes that were merged away,
    and a citation of a section that moved, are each found."""
    text = "`storage/pghot.py`, `crossintercom.storage.hotpath`, `ThreadHotPath`, `hotpath()`"
    assert len(list(_problems(text + ", `models.THE_ORDER`"))) == 5
    good = "`storage/queries.py`, `crossintercom.safetext.neutralise`, `models.PROGRESS`"
    assert not list(_problems(good))
    assert "Byte code" in _headings(DOCS / "performance.md")
