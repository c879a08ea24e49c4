"""The shape of the package: no module over 500 lines, no import cycle (imports inside functions
count), no module that imports pytest (the runtime check is tests/test_package_imports.py), and
the core free of Airflow and SSH."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "airflow_hetero_gpu"
NAME = PACKAGE.name
MAX_LINES = 500


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def imports(path: Path, module: str, known: set[str]) -> set[str]:
    """The package modules ``module`` imports anywhere in its body (functions included), leaving
    out ``if TYPE_CHECKING:`` blocks (annotations only, never executed)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking_only(node):
            for child in getattr(node, "orelse", []):
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == NAME:
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                base = ".".join(pkg + ([base] if base else []))
            if base.split(".")[0] == NAME:
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.add(sub if sub in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return {m for m in found if m in known}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    import sys

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports(path, name, known) for name, path in mods.items()}


def test_the_cycle_finder_finds_a_cycle_through_a_lazy_import(tmp_path):
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from airflow_hetero_gpu.core import model\n"
                   "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import airflow_hetero_gpu.ledger\n")
    assert imports(src, "airflow_hetero_gpu.x", {"airflow_hetero_gpu.core.model", "airflow_hetero_gpu.ledger"}) == {
        "airflow_hetero_gpu.core.model"}


def test_no_import_cycles():
    found = cycles(graph())
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_module_is_over_500_lines():
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


def test_no_module_imports_pytest():
    offenders = []
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.split(".")[0] in ("pytest", "_pytest") for n in names):
                offenders.append(name)
    assert offenders == []


def test_the_core_imports_neither_airflow_nor_ssh():
    offenders = {}
    for name, path in modules().items():
        if not name.startswith(f"{NAME}.core"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad = [n for n in names if n.split(".")[0] in ("airflow", "paramiko", "asyncssh", "sqlalchemy")
                   or n.startswith(f"{NAME}.") and n.split(".")[1] in (
                       "hooks", "operators", "sensors", "triggers", "plugins", "collect", "ledger", "launch")]
            if bad:
                offenders.setdefault(name, []).extend(bad)
    assert offenders == {}


def room(module: str) -> str:
    """The subpackage a module lives in (``ledger``, ``core``), or the module itself at the top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def rooms() -> dict[str, set[str]]:
    """The import graph between subpackages (and top-level modules): an edge for every import of a
    module of one by a module of another, imports inside functions included."""
    out: dict[str, set[str]] = {}
    for name, targets in graph().items():
        here = room(name)
        out.setdefault(here, set())
        for target in targets:
            there = room(target)
            out.setdefault(there, set())
            if there != here:
                out[here].add(there)
    return out


def test_the_subpackage_graph_finder_sees_an_edge_through_a_module():
    assert room("airflow_hetero_gpu.ledger.queue") == "ledger"
    assert room("airflow_hetero_gpu.settings") == "settings"
    assert cycles({"ledger": {"settings"}, "settings": {"ledger"}}) == [["ledger", "settings"]]


def test_no_import_cycle_between_subpackages():
    found = cycles(rooms())
    assert found == [], "cycles between subpackages: " + "; ".join(" <-> ".join(c) for c in found)


def test_only_the_command_line_imports_the_command_line():
    """The command line (``cli/``) sits on top: operators, hooks and the rest render through
    :mod:`airflow_hetero_gpu.text` and never import a command's module."""
    offenders = sorted(f"{name} -> {t}" for name, targets in graph().items() if room(name) != "cli"
                       for t in targets if room(t) == "cli")
    assert offenders == []
    assert not any((PACKAGE / sub / "cli.py").exists() for sub in ("collect", "healthcheck", "ledger", "sim"))


#: ``x._name`` allowed in the ledger's modules on an object other than ``self`` / ``cls`` (none yet:
#: a third party's private attribute would be listed here with the reason).
LEDGER_PRIVATE_WHITELIST: frozenset[str] = frozenset()


def private_reaches(source: str, where: str = "<text>") -> list[str]:
    """Where ``source`` (one module of the ledger) reaches into another part's private names:

    * ``x._name`` on anything but ``self`` / ``cls`` (another repository, another module, the
      unit of work);
    * ``self._name`` inside a class that neither defines ``_name`` (in its body, or by assigning
      ``self._name`` in a method) nor inherits from a class of the same module defining it: a
      name another part (a mixin's sibling) provides;
    * ``from ... import _name`` of another module's private name.
    """
    tree = ast.parse(source)
    found: list[str] = []
    classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}

    def defined(cls: ast.ClassDef, seen: set[str]) -> set[str]:
        names: set[str] = set()
        for item in cls.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(item.name)
            elif isinstance(item, ast.Assign):
                names.update(t.id for t in item.targets if isinstance(t, ast.Name))
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                names.add(item.target.id)
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id in classes and base.id not in seen:
                names |= defined(classes[base.id], seen | {base.id})
        return names

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found += [f"{where}:{node.lineno}: imports {a.name} from {node.module}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        owner = node.value
        if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")) and node.attr not in LEDGER_PRIVATE_WHITELIST:
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    for cls in classes.values():
        own = defined(cls, {cls.name})
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                    and node.attr.startswith("_") and not node.attr.startswith("__") and node.attr not in own:
                found.append(f"{where}:{node.lineno}: {cls.name} uses self.{node.attr}, defined elsewhere")
    return found


def test_the_private_reach_finder_finds_each_kind():
    assert private_reaches("def f(ledger):\n    return ledger._admit()\n") == ["<text>:2: ledger._admit"]
    assert private_reaches("from airflow_hetero_gpu.ledger.admission import _admit\n") == [
        "<text>:1: imports _admit from airflow_hetero_gpu.ledger.admission"]
    mixin = "class QueueMixin:\n    def enqueue(self):\n        return self._expire()\n"
    assert private_reaches(mixin) == ["<text>:3: QueueMixin uses self._expire, defined elsewhere"]
    own = ("class Base:\n    def _x(self):\n        self._y = 1\n"
           "class Queue(Base):\n    _z = 0\n    def enqueue(self):\n        return self._x(), self._y, self._z\n")
    assert private_reaches(own) == []


def test_no_part_of_the_ledger_reaches_into_another_parts_private_names():
    """The ledger's repositories, its unit of work and its admission pass call one another's public
    methods only (docs/ledger.md)."""
    found = []
    for name, path in modules().items():
        if name.startswith(f"{NAME}.ledger"):
            found += private_reaches(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))
    assert found == []
