"""The package import graph of ``petals_chain``, built from the source: layered and free of cycles.

Every top-level package or module of ``petals_chain`` is placed in one layer: the LIBRARY (pure algorithms,
simulators, formats), the LIVE side (processes that talk over the network) or the TOP (experiments, benchmarks and
command lines that may use both). A library never imports a live package nor an experiment or benchmark, and no
two top-level packages import each other, directly or through others. The graph is read with :mod:`ast`, so an
import inside a function counts (it runs as soon as the function does); an import only under
``if TYPE_CHECKING:`` does not (it never runs). The root package's lazy ``_LAZY`` map counts as an import of each
module it names, since ``from petals_chain import X`` imports that module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import networkx as nx

ROOT_PACKAGE = "petals_chain"
SOURCE = Path(__file__).resolve().parents[1] / ROOT_PACKAGE
ROOT_NODE = "<root>"  # petals_chain/__init__.py itself

LIBRARY = frozenset({
    "model", "units", "schema", "defaults", "declared", "service_time", "device_profile", "model_shapes", "cli_args",
    "compose", "dispatch", "analysis", "sim", "mell", "moldable", "torta", "data", "checkpoint", "kernels",
})
LIVE = frozenset({"orchestrator", "server", "client", "loopback", "launch", "protocol"})
TOP = frozenset({"experiments", "bench", "cli", "__main__", ROOT_NODE})
LAYERS = {**dict.fromkeys(LIBRARY, "library"), **dict.fromkeys(LIVE, "live"), **dict.fromkeys(TOP, "top")}


@dataclass(frozen=True)
class Arrow:
    """One import statement that makes top-level unit ``source`` import top-level unit ``target``."""

    source: str
    target: str
    where: str  # "petals_chain/x/y.py:12: from petals_chain.z import w"

    def __str__(self) -> str:
        return f"{self.source} -> {self.target}  ({self.where})"


def _module_name(path: Path) -> str:
    """``petals_chain/a/b.py`` -> ``petals_chain.a.b``; a package's ``__init__.py`` -> the package's name."""
    parts = list(path.relative_to(SOURCE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _unit(module: str) -> str:
    """The top-level unit a dotted module name belongs to (``petals_chain.sim.engine`` -> ``sim``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT_NODE


@cache
def _modules() -> frozenset[str]:
    """Every module and package name under the source tree."""
    return frozenset(_module_name(path) for path in SOURCE.rglob("*.py"))


def _is_type_checking(test: ast.expr) -> bool:
    """True for ``if TYPE_CHECKING:`` and ``if typing.TYPE_CHECKING:``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, at any depth, except those only under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]))
        else:
            yield from _imports(node)


def _targets(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool) -> Iterator[str]:
    """The ``petals_chain`` modules an import statement loads (``from P import M`` loads submodule ``P.M``)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        package = importer.split(".")
        if not is_package:
            package = package[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        yield submodule if submodule in _modules() else base


def _lazy_targets(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """The modules named by the root package's ``_LAZY = {name: module}`` map, with their line numbers."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
            for value in ast.literal_eval(node.value).values():
                yield node.lineno, value


@cache
def arrows() -> tuple[Arrow, ...]:
    """Every import from one top-level unit of ``petals_chain`` to another, with the line that makes it."""
    found: list[Arrow] = []
    for path in sorted(SOURCE.rglob("*.py")):
        importer = _module_name(path)
        source = _unit(importer)
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
        lines = text.splitlines()
        relative = path.relative_to(SOURCE.parent)
        is_package = path.name == "__init__.py"
        pairs = [(node.lineno, t) for node in _imports(tree) for t in _targets(node, importer, is_package)]
        if importer == ROOT_PACKAGE:
            pairs += list(_lazy_targets(tree))
        for lineno, target in pairs:
            if target != ROOT_PACKAGE and not target.startswith(ROOT_PACKAGE + "."):
                continue
            unit = _unit(target)
            if unit != source:
                found.append(Arrow(source, unit, f"{relative}:{lineno}: {lines[lineno - 1].strip()}"))
    return tuple(found)


def _graph() -> nx.DiGraph:
    """The unit graph; each edge keeps the first import line that makes it."""
    graph = nx.DiGraph()
    graph.add_nodes_from(_unit(module) for module in _modules())
    for arrow in arrows():
        if not graph.has_edge(arrow.source, arrow.target):
            graph.add_edge(arrow.source, arrow.target, arrow=arrow)
    return graph


def _cycles(graph: nx.DiGraph, units: frozenset[str] | None = None) -> list[str]:
    """One line per strongly connected component (restricted to ``units`` if given): its members and one cycle."""
    reports = []
    for component in nx.strongly_connected_components(graph):
        if len(component) < 2 or (units is not None and not component & units):
            continue
        cycle = nx.find_cycle(graph.subgraph(component))
        shown = "\n    ".join(str(graph.edges[edge]["arrow"]) for edge in cycle)
        reports.append(f"cycle among {sorted(component)}, e.g.:\n    {shown}")
    return reports


def test_every_top_level_unit_has_a_layer() -> None:
    """A new top-level package or module must be placed in a layer before it is merged."""
    unplaced = sorted({_unit(module) for module in _modules()} - set(LAYERS))
    assert not unplaced, f"place these in LIBRARY, LIVE or TOP of {__name__}: {unplaced}"


def test_library_imports_nothing_live_nor_experiments() -> None:
    """A library package imports only library packages."""
    bad = [str(a) for a in arrows() if LAYERS.get(a.source) == "library" and LAYERS.get(a.target) != "library"]
    assert not bad, "library package imports a live or top-level one:\n  " + "\n  ".join(bad)


def test_live_imports_no_experiments_nor_bench() -> None:
    """The live side imports no experiment, benchmark or command line (the library and the root package's public
    names, e.g. the demo's ``from petals_chain import AutoDistributedModelForCausalLM``, it may)."""
    bad = [str(a) for a in arrows()
           if LAYERS.get(a.source) == "live" and LAYERS.get(a.target) == "top" and a.target != ROOT_NODE]
    assert not bad, "live package imports an experiment, benchmark or command line:\n  " + "\n  ".join(bad)


def test_no_cycle_among_library_packages() -> None:
    """The library packages import each other without cycles."""
    reports = _cycles(_graph(), LIBRARY)
    assert not reports, "\n".join(reports)


def test_no_cycle_among_top_level_packages() -> None:
    """No two top-level packages import each other, directly or through others."""
    reports = _cycles(_graph())
    assert not reports, "\n".join(reports)


MEET_ONLY_IN_PROTOCOL = frozenset({"client", "server", "orchestrator"})


def test_client_server_and_orchestrator_meet_only_in_protocol() -> None:
    """The three live processes share wire types through ``protocol/`` alone: none imports another's package."""
    bad = [str(a) for a in arrows() if a.source in MEET_ONLY_IN_PROTOCOL and a.target in MEET_ONLY_IN_PROTOCOL]
    assert not bad, "client, server and orchestrator import each other (share it through protocol/):\n  " + \
        "\n  ".join(bad)


def test_nothing_live_imports_the_simulator() -> None:
    """The live side runs the policies the simulator runs (dispatch/, kernels/, mell/, torta/), never the simulator."""
    bad = [str(a) for a in arrows() if LAYERS.get(a.source) == "live" and a.target == "sim"]
    assert not bad, "live package imports the simulator:\n  " + "\n  ".join(bad)


def _every_import(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, ``if TYPE_CHECKING:`` ones included (a type-only import back into a
    module is still a circle in the design: helpers are handed what they need, typed by a Protocol of their own)."""
    yield from (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


@cache
def module_graph() -> nx.DiGraph:
    """Module → module imports inside ``petals_chain`` (a package's own ``__init__`` not counted as a target of its
    submodules), each edge keeping the first line that makes it."""
    graph = nx.DiGraph()
    for path in sorted(SOURCE.rglob("*.py")):
        importer = _module_name(path)
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in _every_import(ast.parse(text, filename=str(path))):
            for target in _targets(node, importer, path.name == "__init__.py"):
                if target == importer or target not in _modules() or importer.startswith(target + "."):
                    continue
                if not graph.has_edge(importer, target):
                    where = f"{path.relative_to(SOURCE.parent)}:{node.lineno}: {lines[node.lineno - 1].strip()}"
                    graph.add_edge(importer, target, where=where)
    return graph


def test_no_file_level_circle() -> None:
    """No two modules import each other, directly or through others, type-only imports included."""
    graph = module_graph()
    reports = []
    for component in nx.strongly_connected_components(graph):
        if len(component) > 1:
            cycle = nx.find_cycle(graph.subgraph(component))
            shown = "\n    ".join(f"{a} -> {b}  ({graph.edges[a, b]['where']})" for a, b in cycle)
            reports.append(f"circle among {sorted(component)}, e.g.:\n    {shown}")
    assert not reports, "\n".join(reports)


def test_module_graph_is_read() -> None:
    """The module graph sees the engine's imports (a reader that found none would pass the circle test vacuously)."""
    graph = module_graph()
    assert graph.has_edge("petals_chain.orchestrator.engine.core", "petals_chain.orchestrator.leasing.leases")
    assert graph.has_edge("petals_chain.orchestrator.http.api", "petals_chain.orchestrator.engine.core")
