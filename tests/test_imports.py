"""The package's import walls (issue 13, "Walls"), enforced by reading the source.

Every ``.py`` file under ``sarcompile/`` is parsed with :mod:`ast` (nothing is imported), and every
import statement in it is collected: module level, and inside functions, methods and classes alike,
since a lazy import ties modules together as surely as a top-level one, only later. From those the
test builds the module dependency graph of the package and asserts

* no import cycle (every strongly connected component, and every module importing itself, is
  reported with the import lines that form it);
* the wall rules in :data:`WALLS` below.

What counts as an edge (the conventions of import-linter / grimp):

* ``import a.b.c`` and ``from a.b import c`` give one edge, to the most specific module named
  (``a.b.c`` when it is a module, else ``a.b``). The packages Python runs on the way
  (``a/__init__``, ``a/b/__init__``) are not edges; in particular a module's implicit import of its
  own parent packages is never an edge.
* Relative imports are resolved against the importing module's package.
* Imports under ``if TYPE_CHECKING:`` are left out: they never run, and exist only for annotations.
* Dynamic imports (``importlib.import_module(name)``) are not seen; the package uses them only for
  the optional front-ends and the CLI's ``module:attr`` argument, neither of which is a wall.
* Imports of anything outside ``sarcompile`` are ignored.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "sarcompile"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

# The layers, bottom first: a module imports only from its own layer and the ones below
# (issue 56). A name covers the module and, for a package, everything under it; the most
# specific name decides (``sarcompile.nn`` sits above ``sarcompile.ir``). The front-ends sit
# above the compiler: they register rules and graph views with ``sarcompile.ir.lowering``,
# and the compiler loads them by name (``sarcompile.compile.libraries``), which is not an edge.
LAYERS: list[tuple[str, ...]] = [
    ("sarcompile.errors", "sarcompile.logs"),  # what every layer may use
    ("sarcompile.graph",),  # Graph, ShardGraph, HeteroGraph, frames, node tables
    ("sarcompile.ir",),  # the ops, their vocabulary and the lowering registry
    ("sarcompile.nn",),  # graph layers written with the IR ops
    ("sarcompile.codegen",),  # kernels, and native code built on first use
    ("sarcompile.dist",),  # process group policy beneath the runtime: failures, memory, restarts
    ("sarcompile.runtime",),  # the exchange rounds, links and each op's shard implementation
    ("sarcompile.data",),  # datasets and all partitioning: typed, out-of-core, DGL's
    ("sarcompile.plan",),  # what a compiled model will do on N workers
    ("sarcompile.compile",),  # distribute, tracing, the passes
    ("sarcompile.frontends",),  # PyG's, DGL's and plain torch's lowering rules
    ("sarcompile.train",),
    ("sarcompile.predict",),
    ("sarcompile.cli",),
    ("sarcompile", "sarcompile.__main__"),  # the public names, re-exported
]

# Walls inside a layer, which the order cannot say.
_PYG_FRONTENDS = ("sarcompile.frontends.pyg",)
_PLAIN_FRONTEND = ("sarcompile.frontends.plain", "sarcompile.frontends.edge_index")
WALLS: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    ("the plain-torch front-end imports no PyG front-end", _PLAIN_FRONTEND, _PYG_FRONTENDS),
]

# The modules that may sit at the top of the package, beside its packages.
TOP_LEVEL_AT_MOST = 6


def layer_of(module: str, layers=None) -> int | None:
    """The index in ``layers`` of the most specific name that covers ``module``."""
    best = None
    for i, names in enumerate(LAYERS if layers is None else layers):
        for n in names:
            covers = module == n or (module.startswith(n + ".") and "." in n)
            if covers and (best is None or len(n) > best[1]):
                best = (i, len(n))
    return None if best is None else best[0]


def layer_report(nodes: set[str], edges: list[Edge], layers=None) -> list[str]:
    """One line per import up the layer order, and one per module no layer covers."""
    layers = LAYERS if layers is None else layers
    report = [f"{m} is in no layer: add it to LAYERS" for m in sorted(nodes) if layer_of(m, layers) is None]
    for e in edges:
        a, b = layer_of(e.src, layers), layer_of(e.dst, layers)
        if a is not None and b is not None and b > a:
            report.append(f"{layers[a][0]} imports from {layers[b][0]}, a layer above it: {e}")
    return report


# ----------------------------------------------------------------------------------- analyser


@dataclass(frozen=True)
class Edge:
    src: str  # importing module
    dst: str  # imported module
    file: str  # path of the importing file, relative to the package's parent
    line: int
    text: str  # the import statement as written (first line)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.text}    ({self.src} -> {self.dst})"


def module_names(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of the package at ``root``."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node anywhere in ``tree``, except under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)  # the `else:` branch does run
            continue
        stack.extend(ast.iter_child_nodes(node))


def import_edges(root: Path) -> tuple[set[str], list[Edge]]:
    """The package's modules, and one edge per (import statement, imported package module)."""
    modules = module_names(root)
    top = root.name

    def known(name: str) -> str | None:
        """The most specific module of the package that ``name`` names (or is inside)."""
        while name:
            if name in modules:
                return name
            name = name.rpartition(".")[0]
        return None

    edges = []
    for src, path in modules.items():
        source = path.read_text()
        lines = source.splitlines()
        is_package = path.name == "__init__.py"
        rel = path.relative_to(root.parent).as_posix()
        for node in _imports(ast.parse(source, filename=str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    package = src.split(".") if is_package else src.split(".")[:-1]
                    if node.level > 1:
                        package = package[: -(node.level - 1)]
                    base = ".".join(package + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    # `from pkg import sub` imports the submodule; `from mod import name` the module.
                    targets.append(full if alias.name != "*" and full in modules else base)
            for target in targets:
                if target != top and not target.startswith(top + "."):
                    continue
                dst = known(target)
                if dst is None:
                    continue
                edges.append(Edge(src, dst, rel, node.lineno, lines[node.lineno - 1].strip()))
    # one edge per (statement, target)
    return set(modules), sorted(set(edges), key=lambda e: (e.file, e.line, e.dst))


def strongly_connected(nodes: set[str], edges: list[Edge]) -> list[list[str]]:
    """Tarjan's algorithm (iterative): the components with more than one module, and the
    modules that import themselves."""
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    for e in edges:
        succ[e.src].append(e.dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out = []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(succ[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(succ[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1 or v in succ[v]:
                        out.append(sorted(comp))
    return sorted(out)


def _within(module: str, names: tuple[str, ...]) -> bool:
    return any(module == n or module.startswith(n + ".") for n in names)


def cycle_report(nodes: set[str], edges: list[Edge], skip_sources: tuple[str, ...] = ()) -> list[str]:
    """One paragraph per import cycle: its modules, then every import line inside it."""
    edges = [e for e in edges if e.src not in skip_sources]
    report = []
    for comp in strongly_connected(nodes, edges):
        members = set(comp)
        inner = [e for e in edges if e.src in members and e.dst in members]
        report.append(
            f"import cycle among {len(comp)} module(s): {', '.join(comp)}\n"
            + "\n".join(f"    {e}" for e in inner)
        )
    return report


def wall_report(edges: list[Edge], walls=WALLS) -> list[str]:
    """One line per import that crosses a wall."""
    return [
        f"{rule}: {e}"
        for rule, sources, forbidden in walls
        for e in edges
        if _within(e.src, sources) and _within(e.dst, forbidden)
    ]


def indirect_wall_report(edges: list[Edge], walls=WALLS) -> list[str]:
    """Per rule and module it applies to: the shortest chain of two or more imports that reaches a
    forbidden module, hop by hop, and every forbidden module so reached."""
    first: dict[tuple[str, str], Edge] = {}
    succ: dict[str, list[str]] = {}
    for e in edges:
        if (e.src, e.dst) not in first:
            first[e.src, e.dst] = e
            succ.setdefault(e.src, []).append(e.dst)
    report = []
    for rule, sources, forbidden in walls:
        for src in sorted({e.src for e in edges if _within(e.src, sources)}):
            parent = {src: None}  # breadth first, so each path found is a shortest one
            queue, reached = [src], []
            for v in queue:
                for w in succ.get(v, []):
                    if w in parent:
                        continue
                    parent[w] = v
                    if _within(w, forbidden):
                        if v != src:
                            reached.append(w)
                        continue  # the chain ends at its first forbidden module
                    queue.append(w)
            if not reached:
                continue
            hops, w = [], reached[0]
            while parent[w] is not None:
                hops.append(first[parent[w], w])
                w = parent[w]
            report.append(
                f"{rule}: {src} reaches {', '.join(reached)}; the shortest chain:\n"
                + "\n".join(f"    {e}" for e in reversed(hops))
            )
    return report


# ------------------------------------------------------------------------- the package itself

# The top-level sarcompile/__init__.py re-exports the public API, so it imports most of the
# package; a submodule that imports a name from `sarcompile` (rather than from its defining
# module) would close a cycle through it. None does today, so its edges are kept; were they to be
# skipped, it would go here.
CYCLE_SKIP_SOURCES: tuple[str, ...] = ()


@pytest.fixture(scope="module")
def graph():
    t0 = time.perf_counter()
    nodes, edges = import_edges(ROOT)
    print(f"import analysis of {len(nodes)} modules, {len(edges)} edges: {time.perf_counter() - t0:.3f}s")
    assert len(nodes) > 20 and len(edges) > 50, "the analyser found next to nothing: is ROOT right?"
    return nodes, edges


def test_no_import_cycle(graph):
    nodes, edges = graph
    report = cycle_report(nodes, edges, CYCLE_SKIP_SOURCES)
    assert not report, "imports inside functions count too\n\n" + "\n\n".join(report)


def test_layers(graph):
    nodes, edges = graph
    report = layer_report(nodes, edges)
    assert not report, f"{len(report)} import(s) against the layer order:\n" + "\n".join(report)


def test_layer_names_are_real(graph):
    nodes, _ = graph
    for names in LAYERS:
        for n in names:
            assert any(m == n or m.startswith(n + ".") for m in nodes), f"layer name {n} names no module"


def test_the_top_of_the_package_is_small():
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(top) <= TOP_LEVEL_AT_MOST, f"{len(top)} modules at the top of sarcompile/: {top}; put them in a layer"


def test_every_package_has_its_tests():
    tests = Path(__file__).resolve().parent
    packages = sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))
    missing = [p for p in packages if not (tests / p).is_dir()]
    assert not missing, f"tests/<package>/ is missing for {missing}: tests mirror the package layout"


def test_importing_the_library_changes_nothing_in_the_process():
    """No environment variable set, no thread started, torch's CPU allocator left alone."""
    code = (
        "import os, sys, threading, torch\n"
        "env = dict(os.environ); threads = threading.active_count()\n"
        "import sarcompile\n"
        "assert dict(os.environ) == env, sorted(set(os.environ.items()) ^ set(env.items()))\n"
        "assert threading.active_count() == threads, threading.enumerate()\n"
        "from sarcompile.dist import cpu_cache\n"
        "assert not cpu_cache.installed(), 'the caching allocator was installed by an import'\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_walls(graph):
    _, edges = graph
    report = wall_report(edges)
    assert not report, f"{len(report)} import(s) cross a wall:\n" + "\n".join(report)


def test_walls_through_other_modules(graph):
    _, edges = graph
    report = indirect_wall_report(edges)
    assert not report, f"{len(report)} module(s) reach across a wall through others:\n\n" + "\n\n".join(report)


def test_wall_names_are_real(graph):
    """Each wall names at least one module that exists, so a rename cannot empty it silently."""
    nodes, _ = graph
    for rule, sources, forbidden in WALLS:
        for names in (sources, forbidden):
            assert any(_within(n, names) for n in nodes), f"{rule}: none of {names} exists"


# ----------------------------------------------------------------------- the analyser, tested

# The analyser is tested on small made-up packages, with walls of their own (these).
# The compiler: the driver, the tracer, the lowering registry (passes.lower today; a module of
# its own if it moves), the plan and the estimate.
_FAKE_COMPILER = (
    "sarcompile.compiler",
    "sarcompile.trace",
    "sarcompile.passes.lower",
    "sarcompile.ir.lowering",
    "sarcompile.plan",
    "sarcompile.estimate",
)
# The IR (the package sarcompile.ir, all of it) and a worker's shard of the graph.
_FAKE_IR = ("sarcompile.ir", "sarcompile.data.shard")

# PyG's front-ends (they import torch_geometric), and the plain-torch one with the markers it
# shares with them, which must work in a program that imports no GNN library. (DGL's are left
# out: the tracer imports one lazily, only where dgl is imported; test_plain.py runs a compile
# and finds neither library imported.)
_FAKE_PYG = ("sarcompile.frontends.pyg",)
_FAKE_PLAIN = ("sarcompile.frontends.plain", "sarcompile.frontends.edge_index")

# (rule, modules it applies to, modules they must not import). A name covers the module and,
# when it is a package, everything under it. Checked twice: direct imports (each violation is one
# line), and chains through other modules (importing the module would load the forbidden one).
_FAKE_WALLS: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    ("the runtime imports no pass", ("sarcompile.runtime",), ("sarcompile.passes",)),
    ("the runtime imports no front-end", ("sarcompile.runtime",), ("sarcompile.frontends",)),
    ("the runtime does not import the compiler", ("sarcompile.runtime",), _FAKE_COMPILER),
    ("codegen does not import the runtime", ("sarcompile.codegen",), ("sarcompile.runtime",)),
    ("the IR does not import the runtime", _FAKE_IR, ("sarcompile.runtime",)),
    ("the plain-torch front-end imports no PyG front-end", _FAKE_PLAIN, _FAKE_PYG),
]





def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "sarcompile"


_CLEAN = {
    "sarcompile/__init__.py": "from .ir.graph import Graph\nfrom . import runtime\n",
    "sarcompile/ir/__init__.py": "",
    "sarcompile/ir/graph.py": "import os\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
    "    from ..runtime.shard import Shard\nclass Graph:\n    pass\n",
    "sarcompile/runtime/__init__.py": "from .shard import Shard\n",
    "sarcompile/runtime/shard.py": "from ..ir.graph import Graph\nimport sarcompile.errors\n",
    "sarcompile/errors.py": "",
    "sarcompile/passes/__init__.py": "",
    "sarcompile/passes/lower.py": "from . import fuse\nfrom ..ir import graph\nfrom sarcompile.runtime import shard\n",
    "sarcompile/passes/fuse.py": "",
}


def test_analyser_passes_a_clean_package(tmp_path):
    nodes, edges = import_edges(_write(tmp_path, _CLEAN))
    assert {(e.src, e.dst) for e in edges} == {
        ("sarcompile", "sarcompile.ir.graph"),
        ("sarcompile", "sarcompile.runtime"),
        ("sarcompile.runtime", "sarcompile.runtime.shard"),
        ("sarcompile.runtime.shard", "sarcompile.ir.graph"),
        ("sarcompile.runtime.shard", "sarcompile.errors"),
        ("sarcompile.passes.lower", "sarcompile.passes.fuse"),  # `from . import fuse`: the submodule
        ("sarcompile.passes.lower", "sarcompile.ir.graph"),
        ("sarcompile.passes.lower", "sarcompile.runtime.shard"),
    }  # and not graph -> runtime.shard: that one is under TYPE_CHECKING
    assert cycle_report(nodes, edges) == []
    assert wall_report(edges, _FAKE_WALLS) == []
    assert indirect_wall_report(edges, _FAKE_WALLS) == []


def test_analyser_catches_an_import_up_the_layers(tmp_path):
    files = {
        "sarcompile/__init__.py": "from .graph import core\n",
        "sarcompile/errors.py": "",
        "sarcompile/graph/__init__.py": "",
        "sarcompile/graph/core.py": "from ..errors import *\ndef f():\n    from ..runtime import rounds\n",
        "sarcompile/runtime/__init__.py": "",
        "sarcompile/runtime/rounds.py": "from ..graph import core\n",
        "sarcompile/stray.py": "",
    }
    layers = [("sarcompile.errors",), ("sarcompile.graph",), ("sarcompile.runtime",), ("sarcompile",)]
    nodes, edges = import_edges(_write(tmp_path, files))
    report = layer_report(nodes, edges, layers)
    assert report == [
        "sarcompile.stray is in no layer: add it to LAYERS",
        "sarcompile.graph imports from sarcompile.runtime, a layer above it: sarcompile/graph/core.py:3: "
        "from ..runtime import rounds    (sarcompile.graph.core -> sarcompile.runtime.rounds)",
    ], report


def test_analyser_catches_a_cycle_through_a_function_level_import(tmp_path):
    files = dict(_CLEAN)
    files["sarcompile/ir/graph.py"] += "    def shard(self):\n        from ..runtime.shard import Shard\n"
    nodes, edges = import_edges(_write(tmp_path, files))
    report = cycle_report(nodes, edges)
    assert len(report) == 1, report
    assert "sarcompile.ir.graph, sarcompile.runtime.shard" in report[0]
    assert "sarcompile/ir/graph.py:8: from ..runtime.shard import Shard" in report[0]
    assert "sarcompile/runtime/shard.py:1: from ..ir.graph import Graph" in report[0]
    walls = wall_report(edges, _FAKE_WALLS)
    assert walls == [
        "the IR does not import the runtime: sarcompile/ir/graph.py:8: from ..runtime.shard import Shard"
        "    (sarcompile.ir.graph -> sarcompile.runtime.shard)"
    ]


def test_analyser_catches_self_imports_and_walls_in_methods(tmp_path):
    files = dict(_CLEAN)
    files["sarcompile/errors.py"] = "import sarcompile.errors\n"
    files["sarcompile/runtime/shard.py"] += (
        "class S:\n    def go(self):\n        from ..passes import lower\n        import sarcompile.frontends.pyg\n"
    )
    files["sarcompile/frontends/__init__.py"] = ""
    files["sarcompile/frontends/pyg.py"] = ""
    nodes, edges = import_edges(_write(tmp_path, files))
    report = cycle_report(nodes, edges)
    assert any(r.startswith("import cycle among 1 module(s): sarcompile.errors") for r in report), report
    walls = wall_report(edges, _FAKE_WALLS)
    assert [w.split(":")[0] for w in walls] == [
        "the runtime imports no pass",
        "the runtime imports no front-end",
        "the runtime does not import the compiler",  # passes.lower is the lowering registry
    ], walls


def test_analyser_catches_a_wall_crossed_through_another_module(tmp_path):
    files = dict(_CLEAN)
    files["sarcompile/ir/graph.py"] += "    def fused(self):\n        from ..passes import fuse\n"
    nodes, edges = import_edges(_write(tmp_path, files))
    assert cycle_report(nodes, edges) == [] and wall_report(edges, _FAKE_WALLS) == []
    report = indirect_wall_report(edges, _FAKE_WALLS)
    assert len(report) == 2, report  # runtime/__init__ (three hops) and runtime.shard (two)
    assert report[1] == (
        "the runtime imports no pass: sarcompile.runtime.shard reaches sarcompile.passes.fuse; the shortest chain:\n"
        "    sarcompile/runtime/shard.py:1: from ..ir.graph import Graph    (sarcompile.runtime.shard -> sarcompile.ir.graph)\n"
        "    sarcompile/ir/graph.py:8: from ..passes import fuse    (sarcompile.ir.graph -> sarcompile.passes.fuse)"
    )
