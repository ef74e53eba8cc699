"""The package's shape, read from its source with :mod:`ast` (nothing of it is imported or run).

No import cycle
    The graph has one node per module of ``fedjax_dp/`` (a package is its ``__init__.py``). Module
    A imports B for EVERY ``import`` statement in A, wherever it stands (module level, inside a
    function or a method), except under ``if TYPE_CHECKING:`` (never run), plus each
    ``importlib.import_module("fedjax_dp....")`` called with a literal name (a computed name, the
    registry's discovery of the family packages, cannot be read statically and is not counted).
    An import names its target as follows (relative imports resolved first):

    - ``import fedjax_dp.a.b`` (with or without ``as``): the module ``fedjax_dp.a.b``.
    - ``from fedjax_dp.a import n``: the submodule ``fedjax_dp.a.n`` when there is one; otherwise
      the module that DEFINES ``n``: a name that ``fedjax_dp/a/__init__.py`` only re-exports
      (``from fedjax_dp.a.y import n``) resolves to ``fedjax_dp.a.y``, followed through further
      re-exports; a name defined in the ``__init__`` itself (or one it cannot trace) is the package
      ``fedjax_dp.a``.
    - A package's ``__init__.py`` that re-exports its submodules imports them (ordinary edges).
    - Python initialises a module's parent packages before the module itself; that implied
      step is not an edge (were it one, every submodule of a package whose ``__init__`` imports
      it would sit in a cycle). What a submodule actually takes from its package is counted,
      resolved to the defining module as above: ``from fedjax_dp.core import StackedData``
      inside ``core/agent_stream.py`` would be an import of ``core/stacked.py`` (a cycle, as
      stacked imports agent_stream), ``from fedjax_dp.core import seed_axis`` is one of
      ``core/seed_axis.py``. (What this leaves out is an ``__init__`` importing its submodules
      in an order under which one of them asks for a name not yet bound: that fails on the first
      import, in every test, not only on some path.)

    A cycle under this rule is a loop of modules each needing the next one's names, at import
    time or when a function runs; a failure prints one loop per tangle, ``a -> b -> ... -> a``,
    with the file and line of each import.

No long function in ``algorithms/`` or ``privacy/``
    A function's or method's length is its lines of code from the ``def`` line to its last line: a
    line counts unless, stripped, it is empty or starts with ``#``, or it belongs to the function's
    docstring (a nested function's lines count toward the enclosing one too, and it is measured
    itself). :data:`ALLOWED_LONG` lists the functions allowed over :data:`MAX_LINES` for now; an
    entry that no longer exists or no longer exceeds the limit fails the test, so the list cannot
    go stale. Offenders are listed as ``path:line name: N lines``.
"""
from __future__ import annotations

import ast
import functools
import gc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fedjax_dp"
MAX_LINES = 80
LONG_CHECKED = ("algorithms", "privacy", "stages")

#: ``path::qualified name`` of the functions allowed over MAX_LINES (none: add one only with the
#: reason it cannot be split yet)
ALLOWED_LONG: set[str] = set()


# ----------------------------------------------------------------------------- the modules

@functools.cache
def _modules() -> dict[str, Path]:
    """``{dotted module name: file}`` of every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_package(name: str) -> bool:
    return _modules()[name].name == "__init__.py"


@functools.cache
def _tree(name: str) -> ast.Module:
    path = _modules()[name]
    gc.disable()              # parsing makes many objects and no garbage: half the time without gc
    try:
        return ast.parse(path.read_text(), filename=str(path))
    finally:
        gc.enable()


_COMPOUND = frozenset(t for t in (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With,
                                   ast.AsyncWith, ast.Try, getattr(ast, "TryStar", ast.Try),
                                   ast.Match, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))


def _children(node: ast.stmt) -> list[ast.stmt]:
    """The statements directly inside ``node`` (its blocks, its handlers' and cases' blocks)."""
    if type(node) not in _COMPOUND:
        return []
    inner = []
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(node, field, ()) or ():
            inner.extend(child.body if isinstance(child, (ast.ExceptHandler, ast.match_case))
                         else [child])
    return inner


def _is_type_checking(node: ast.stmt) -> bool:
    if type(node) is not ast.If:
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(body: list[ast.stmt]):
    """Every statement in ``body``, nested ones too (imports and defs are statements: expressions
    need not be walked), less those under ``if TYPE_CHECKING:`` (its ``else`` is kept)."""
    todo = list(reversed(body))
    while todo:
        node = todo.pop()
        yield node
        todo.extend(reversed(node.orelse if _is_type_checking(node) else _children(node)))


def _absolute(module: str | None, level: int, importer: str) -> str:
    """The absolute module a ``from`` import names (``level`` dots relative to ``importer``)."""
    if level == 0:
        return module or ""
    base = importer.split(".")
    if not _is_package(importer):
        base.pop()                                   # a module's own package
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


@functools.cache
def _reexports(package: str) -> dict[str, tuple[str, str]]:
    """``{name: (module, its name there)}`` of the names that ``package``'s ``__init__`` takes
    with a module-level ``from ... import``."""
    out = {}
    for node in _tree(package).body:
        if isinstance(node, ast.ImportFrom):
            source = _absolute(node.module, node.level, package)
            for alias in node.names:
                out[alias.asname or alias.name] = (source, alias.name)
    return out


def _defining(module: str, name: str) -> str:
    """The module that ``from module import name`` depends on (see the module docstring)."""
    seen = set()
    while (module, name) not in seen:
        seen.add((module, name))
        if f"{module}.{name}" in _modules():
            return f"{module}.{name}"                # a submodule
        if module not in _modules() or not _is_package(module) or name not in _reexports(module):
            return module                            # defined here (or not this package's)
        source, original = _reexports(module)[name]
        if _target(source) is None:
            return module                            # a name from outside the package
        module, name = source, original
    return module


def _target(name: str) -> str | None:
    """``name`` or its nearest enclosing module of the package (None: not the package's)."""
    while name:
        if name in _modules():
            return name
        name = name.rpartition(".")[0]
    return None


def _import_module_calls(name: str):
    """``(module name, line)`` of each ``importlib.import_module`` / ``__import__`` call with a
    literal name (only files that spell one are walked whole)."""
    text = _modules()[name].read_text()
    if "import_module(" not in text and "__import__(" not in text:
        return
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and (
                    (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                    or (isinstance(node.func, ast.Name)
                        and node.func.id in ("import_module", "__import__"))):
            yield node.args[0].value, node.lineno


@functools.cache
def import_edges() -> dict[str, dict[str, int]]:
    """``{module: {module it imports: first line}}`` under the rule of the module docstring."""
    graph: dict[str, dict[str, int]] = {}
    for importer in _modules():
        edges: dict[str, int] = {}

        def add(target: str | None, line: int) -> None:
            if target is not None and target != importer:
                edges.setdefault(target, line)

        for node in _statements(_tree(importer).body):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(_target(alias.name), node.lineno)
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(node.module, node.level, importer)
                if _target(source) is None:
                    continue
                for alias in node.names:
                    add(_target(source if alias.name == "*" else _defining(source, alias.name)),
                        node.lineno)
        for module, line in _import_module_calls(importer):
            add(_target(module), line)
        graph[importer] = dict(sorted(edges.items(), key=lambda kv: kv[1]))
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(v: str) -> None:                       # the package is small: recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(set(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for component in components:                      # a shortest way back to the first module
        start = min(component)
        paths = {start: [start]}
        frontier = [start]
        cycle = None
        while frontier and cycle is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w == start:
                        cycle = paths[v] + [start]
                        break
                    if w in component and w not in paths:
                        paths[w] = paths[v] + [w]
                        nxt.append(w)
                if cycle:
                    break
            frontier = nxt
        cycles.append(cycle)
    return sorted(cycles)


def _describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    steps = [f"  {_modules()[a].relative_to(ROOT)}:{graph[a][b]} imports {b}"
             for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(cycle) + "\n" + "\n".join(steps)


def test_the_import_graph_has_no_cycle():
    graph = import_edges()
    cycles = _cycles(graph)
    assert not cycles, "import cycles (every import counted, function level too):\n" + \
        "\n".join(_describe(c, graph) for c in cycles)


def test_the_graph_reads_function_level_imports_and_reexports():
    """The rule's own check on today's package: imports inside functions only are edges (ops and
    models take core's modules that way), a re-exported name is an edge to its defining module, a
    submodule of the package named in ``from pkg import`` is an edge to it, the parent package
    is none."""
    graph = import_edges()
    assert "fedjax_dp.core.defaults" in graph["fedjax_dp.ops.knn_search"]     # in a function
    assert "fedjax_dp.core.files" in graph["fedjax_dp.models.tasks"]          # in a function
    assert "fedjax_dp.core.stacked" in graph["fedjax_dp.core"]                # __init__ re-exports
    assert "fedjax_dp.core.stacked" in graph["fedjax_dp.data.population"]     # StackedData
    assert "fedjax_dp.core.rng" in graph["fedjax_dp.data.population"]         # a submodule
    assert "fedjax_dp.core" not in graph["fedjax_dp.core.agent_stream"]       # parent: no edge


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b": 1}, "b": {}}) == []
    # the loop this test was written against: agent_stream took StackedData from stacked, whose
    # stack_drawn imported agent_stream inside the function
    graph = {m: dict(e) for m, e in import_edges().items()}
    graph["fedjax_dp.core.agent_stream"]["fedjax_dp.core.stacked"] = 22
    assert ["fedjax_dp.core.agent_stream", "fedjax_dp.core.stacked",
            "fedjax_dp.core.agent_stream"] in _cycles(graph)


# ----------------------------------------------------------------------------- function length

def _code_lines(source: str) -> set[int]:
    """The lines (from 1) that, stripped, are neither empty nor start with ``#``."""
    return {i for i, line in enumerate(source.splitlines(), 1)
            if line.strip() and not line.lstrip().startswith("#")}


def _length(node: ast.FunctionDef | ast.AsyncFunctionDef, code: set[int]) -> int:
    """Lines of code of ``node``: its lines in ``code`` (:func:`_code_lines`) less its docstring."""
    lines = set(range(node.lineno, node.end_lineno + 1)) & code
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
            and isinstance(first.value.value, str):
        lines -= set(range(first.lineno, first.end_lineno + 1))
    return len(lines)


def _defs(body: list[ast.stmt]):
    """The defs and classes in ``body`` (inside its ``if``, ``try``, ... blocks too), not those
    nested in them."""
    todo = list(reversed(body))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node
        else:
            todo.extend(reversed(_children(node)))


def _qualified(body: list[ast.stmt], prefix: str = ""):
    """``(qualified name, node)`` of every function and method in ``body``, nested ones too."""
    for node in _defs(body):
        if not isinstance(node, ast.ClassDef):
            yield prefix + node.name, node
        yield from _qualified(node.body, prefix + node.name + ".")


def function_lengths(top: Path) -> dict[str, tuple[int, int]]:
    """``{"path::qualified name": (lines of code, def line)}`` of every function under ``top``."""
    out = {}
    for name, path in _modules().items():
        if top not in path.parents:
            continue
        code = _code_lines(path.read_text())
        for qualified, node in _qualified(_tree(name).body):
            out[f"{path.relative_to(ROOT).as_posix()}::{qualified}"] = (_length(node, code),
                                                                        node.lineno)
    return out


@functools.cache
def _checked_lengths() -> dict[str, tuple[int, int]]:
    out = {}
    for folder in LONG_CHECKED:
        out.update(function_lengths(PACKAGE / folder))
    return out


def test_no_function_in_algorithms_or_privacy_is_over_80_lines():
    long = {k: v for k, v in _checked_lengths().items()
            if v[0] > MAX_LINES and k not in ALLOWED_LONG}
    assert not long, f"functions over {MAX_LINES} lines of code (split them):\n" + "\n".join(
        f"  {k.split('::')[0]}:{line} {k.split('::')[1]}: {n} lines"
        for k, (n, line) in sorted(long.items()))


def test_the_allow_list_is_not_stale():
    lengths = _checked_lengths()
    gone = sorted(k for k in ALLOWED_LONG if k not in lengths)
    short = sorted(f"{k} ({lengths[k][0]} lines)" for k in ALLOWED_LONG
                   if k in lengths and lengths[k][0] <= MAX_LINES)
    assert not gone, f"allowed long functions that no longer exist (drop them): {gone}"
    assert not short, f"allowed long functions now within {MAX_LINES} lines (drop them): {short}"


def test_the_line_count_skips_blanks_comments_and_the_docstring():
    source = ('def f(x):\n    """Doc\n\n    more."""\n    # a comment\n\n    y = (x +\n'
              '         1)\n    s = """a\n\nb"""\n    return y\n')
    # def, y (2 lines), s (2: the string's empty line is blank), return
    assert _length(ast.parse(source).body[0], _code_lines(source)) == 6
