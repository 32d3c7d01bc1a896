"""The package's import structure: no module imports itself back, and no layer reaches up.

Every ``import`` and ``from ... import`` of every module under ``src/parsearch`` is read
with :mod:`ast` (module level, inside functions and under ``if TYPE_CHECKING``: a lazy or
type-only import is still a dependency), and two things are checked:

* no cycle: the modules and the imports between them form a directed acyclic graph
  (importing ``a.b.c`` also runs the packages ``a.b`` and ``a``, so an edge goes to
  each package above the imported module, except the importer's own packages), but
  for the few edges of :data:`KNOWN_CYCLE_EDGES`, which must stay type-only or lazy;
* layering: each top-level subpackage (or module) sits in a layer of :data:`LAYERS`,
  and imports only from its own package and from lower layers.  Two packages of the
  same layer do not import each other.  ``validation`` has the same rule among its own
  subpackages (:data:`VALIDATION_LAYERS`).

The order is the one the import graph had when the test was written, made strict
(issue 36): the foundations, then the workload (``model``), the hardware (``topology``:
placement reads a layout through a protocol, so it needs nothing from ``layout``),
the layout space, the cost model, launch settings, the query object, search, the three
users of search (serving, sweeps, validation), and the command line on top.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "parsearch"

#: Lowest first.  A module may import from its own package and from any earlier layer.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"<root>", "errors"}),  # parsearch/__init__ (the version), the error types
    frozenset({"files", "strict_json", "resources", "data"}),  # safe reading, data paths
    frozenset({"model"}),  # model and training specs, presets, parameter counts
    frozenset({"topology"}),  # GPUs, clusters, the fabric, process-group placement
    frozenset({"layout"}),  # the layout type, its rules and enumeration
    frozenset({"cost"}),  # the analytic cost model
    frozenset({"launch"}),  # Megatron-LM / Megatron-Bridge launch settings
    frozenset({"query"}),  # the question search, pareto, serve and sweep answer
    frozenset({"search"}),  # exhaustive and optuna search, Pareto fronts
    frozenset({"serve", "sweep", "validation"}),  # users of search, independent of each other
    frozenset({"cli"}),  # the command line
    frozenset({"__main__"}),  # ``python -m parsearch``
)

#: ``validation``'s subpackages, lowest first (its ``__init__`` is a docstring).
VALIDATION_LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"<validation>"}),
    frozenset({"published"}),  # the bundled runs, reading them, predictions against them
    frozenset({"fit"}),  # the shipped fit and its cross-validation
    frozenset({"user"}),  # the user's measurements and calibrate
    frozenset({"planning"}),  # plan-profiling
)

#: Imports that may close a cycle, with the kind each must stay: ``type`` (under ``if
#: TYPE_CHECKING``: never runs) or ``lazy`` (inside a function, never at module level).
#: The cycle check leaves these edges out; any other cycle fails it, and so does one of
#: these edges changing kind or going away (then delete it here).  None today: the GPU
#: variants sit between the profile and cluster types below them
#: (``topology.gpu_profile``, ``topology.cluster_spec``) and the loaders above them
#: (``topology.hardware``, ``topology.cluster``); the scorer's inputs
#: (``cost.cost_model.CostModel``) sit below the modules that price for the scorer, and
#: ``cost.routing`` reads the options through a protocol of its own.
KNOWN_CYCLE_EDGES: dict[tuple[str, str], str] = {}


def module_files() -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (path, is a package __init__)}`` of every module of the package."""
    modules = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        modules[".".join(parts)] = (path, is_package)
    return modules


MODULES = module_files()


def _known(name: str) -> str | None:
    """``name`` or the closest package above it that is a module of ours."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST, kind: str = "module"
                  ) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement under ``node`` with where it runs: ``module`` (on import),
    ``lazy`` (inside a function) or ``type`` (under ``if TYPE_CHECKING``: never)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, kind
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield from _import_nodes(ast.Module(body=[stmt], type_ignores=[]), "type")
            for stmt in child.orelse:
                yield from _import_nodes(ast.Module(body=[stmt], type_ignores=[]), kind)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _import_nodes(child, "type" if kind == "type" else "lazy")
        else:
            yield from _import_nodes(child, kind)


def imports_of(name: str) -> dict[str, dict[str, int]]:
    """``{imported module: {kind: first line}}`` of every import of ``name`` into the
    package (kinds as in :func:`_import_nodes`)."""
    path, is_package = MODULES[name]
    tree = ast.parse(path.read_text(), filename=str(path))
    found: dict[str, dict[str, int]] = {}
    for node, kind in _import_nodes(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # ``from pkg import sub`` imports the module ``pkg.sub`` when there is one
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES
                       else module for alias in node.names]
        for target in targets:
            if target.split(".")[0] != PACKAGE:
                continue
            known = _known(target)
            if known is None or known == name:
                continue
            found.setdefault(known, {}).setdefault(kind, node.lineno)
            # running ``a.b.c`` runs the packages ``a.b`` (and ``a``) first
            parent = known.rpartition(".")[0]
            while parent and parent != PACKAGE:
                if not name.startswith(parent + ".") and parent in MODULES:
                    found.setdefault(parent, {}).setdefault(kind, node.lineno)
                parent = parent.rpartition(".")[0]
    return found


IMPORTS = {name: imports_of(name) for name in MODULES}
#: ``{module: {imported module: first line}}``, every kind of import together.
GRAPH = {name: {target: min(kinds.values()) for target, kinds in targets.items()}
         for name, targets in IMPORTS.items()}


def cycles(graph: dict[str, dict[str, int]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def package_of(name: str) -> str:
    """The top-level subpackage or module ``name`` belongs to (``<root>`` for the package)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "<root>"


def validation_part(name: str) -> str:
    parts = name.split(".")
    return parts[2] if len(parts) > 2 else "<validation>"


def layer_of(layers: tuple[frozenset[str], ...], part: str) -> int:
    for i, members in enumerate(layers):
        if part in members:
            return i
    raise AssertionError(f"{part!r} is in no layer: add it to the layer list of this test")


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """Every import of a module from a higher layer, or from a same-layer neighbour."""
    bad = []
    for name, targets in graph.items():
        for target, line in targets.items():
            mine, theirs = package_of(name), package_of(target)
            layers = LAYERS
            if mine == theirs == "validation":
                mine, theirs = validation_part(name), validation_part(target)
                layers = VALIDATION_LAYERS
            if mine == theirs:
                continue
            if layer_of(layers, theirs) >= layer_of(layers, mine):
                bad.append(f"{MODULES[name][0].relative_to(SRC)}:{line} imports {target} "
                           f"({theirs} is not below {mine})")
    return bad


def test_every_package_has_a_layer() -> None:
    for name in MODULES:
        layer_of(LAYERS, package_of(name))
        if package_of(name) == "validation":
            layer_of(VALIDATION_LAYERS, validation_part(name))


def test_no_import_cycles() -> None:
    graph = {name: {target: line for target, line in targets.items()
                    if (name, target) not in KNOWN_CYCLE_EDGES}
             for name, targets in GRAPH.items()}
    found = [sorted(c) for c in cycles(graph)]
    assert not found, f"import cycles: {found}"


def test_known_cycle_edges_stay_type_only_or_lazy() -> None:
    for (importer, imported), kind in KNOWN_CYCLE_EDGES.items():
        kinds = IMPORTS[importer].get(imported)
        assert kinds, f"{importer} no longer imports {imported}: delete it from KNOWN_CYCLE_EDGES"
        allowed = {"type"} if kind == "type" else {"type", "lazy"}
        assert set(kinds) <= allowed, (
            f"{importer} imports {imported} {sorted(kinds)} (line {min(kinds.values())}); "
            f"it closes a cycle and must stay {kind}")


def test_no_layer_imports_a_higher_one() -> None:
    bad = upward_imports(GRAPH)
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


# --- the checks themselves catch what they should -----------------------------------------


def test_cycle_finder_sees_a_cycle_and_a_dag() -> None:
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [
        frozenset({"a", "b", "c"})]
    assert cycles({"a": {"b": 1}, "b": {}, "c": {"a": 1, "b": 1}}) == []


@pytest.mark.parametrize(("importer", "imported", "allowed"), [
    ("parsearch.topology.placement", "parsearch.layout.spec", False),
    ("parsearch.model.specs", "parsearch.layout.spec", False),
    ("parsearch.serve.api", "parsearch.sweep.cells", False),
    ("parsearch.validation.published.runs", "parsearch.validation.fit.calibration", False),
    ("parsearch.validation.planning.plan_profiling", "parsearch.validation.user.measurements",
     True),
    ("parsearch.layout.soft_rules", "parsearch.topology.placement", True),
    ("parsearch.cli.common", "parsearch.search.api", True),
])
def test_layer_check_flags_an_upward_import(importer: str, imported: str,
                                            allowed: bool) -> None:
    graph: dict[str, dict[str, int]] = defaultdict(dict)
    graph[importer][imported] = 1
    assert (upward_imports(graph) == []) is allowed


def test_import_kinds_are_told_apart() -> None:
    tree = ast.parse("import parsearch.a\nif TYPE_CHECKING:\n    import parsearch.b\n"
                     "def f():\n    import parsearch.c\n")
    assert [(n.names[0].name, kind) for n, kind in _import_nodes(tree)] == [
        ("parsearch.a", "module"), ("parsearch.b", "type"), ("parsearch.c", "lazy")]
