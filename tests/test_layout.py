"""The tests mirror the package (issue 56, "a test file for each module that has logic").

A module of ``sarcompile/`` has logic when it defines a function or a class. Each such module
``sarcompile/<path>/<name>.py`` has its own test file ``tests/<path>/test_<name>.py``, or is
listed in exactly one of two tables below:

* :data:`COVERED_BY` names the test files that exercise it. An entry is checked, so it cannot
  rot: every file named exists, and reaches the module -- imports it or a name defined in it
  (also through a package that re-exports the name, e.g. ``sc.distribute``), or names its
  dotted path or file path.
* :data:`UNTESTED` holds a module no test reaches by name, with the reason. Writing its test
  file makes this test fail until the entry is removed, so the list only shrinks.

Three folders keep the prefix their tests already had, because test basenames must be unique
across ``tests/`` (there is no ``__init__.py``; pytest imports each test file by its basename):
``frontends/pyg/<name>.py`` is tested by ``tests/frontends/test_pyg_<name>.py``, and so on, see
:data:`PREFIXED`. Nothing is imported: the modules and tests are read with :mod:`ast`.
"""

from __future__ import annotations

import ast
import collections
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "sarcompile"
TESTS = REPO / "tests"

# Package folders whose tests sit under another folder with a basename prefix, because the
# plain names would collide (tests/graph/test_hetero.py and frontends/pyg/hetero.py).
PREFIXED: dict[str, str] = {
    "frontends/pyg": "frontends/test_pyg_",
    "frontends/dgl": "frontends/test_dgl_",
    "data/outofcore": "data/outofcore/test_ooc_",
}

# Module (path under sarcompile/) -> test files that exercise it without being its own test file:
# the mirrored test file (tests/<path>/test_<name>.py) is not written, and these import the module
# or a name from it. Found by what the test files import, checked by the test below.
COVERED_BY: dict[str, tuple[str, ...]] = {
    "errors.py": ("tests/test_nn.py", "tests/cli/test_cli.py", "tests/data/test_partition.py"),
    "cli/edge_files.py": ("tests/cli/test_cli.py",),
    "cli/main.py": ("tests/cli/test_cli.py", "tests/data/outofcore/test_ooc_ogb.py"),
    "codegen/__init__.py": ("tests/codegen/test_executor.py", "tests/codegen/test_cpu_spmm.py"),
    "codegen/attention_gen.py": ("tests/codegen/test_attention_kernels.py", "tests/codegen/test_gpu_compile.py"),
    "codegen/quantize_gen.py": ("tests/codegen/test_gpu_compile.py",),
    "codegen/spmm_gen.py": ("tests/codegen/test_gpu_compile.py", "tests/codegen/test_kernel_cache.py"),
    "codegen/torch_kernels.py": ("tests/codegen/test_spmm_kernels.py", "tests/codegen/test_torch_tiles.py"),
    "codegen/triton_kernels.py": ("tests/codegen/test_spmm_kernels.py", "tests/codegen/test_attention_kernels.py"),
    "codegen/triton_quantize.py": ("tests/codegen/test_quantize.py",),
    "compile/distribute.py": ("tests/compile/test_trace.py", "tests/compile/test_call_arguments.py"),
    "compile/libraries.py": ("tests/frontends/test_plain.py",),
    "compile/passes/__init__.py": ("tests/compile/test_pipeline.py",),
    "compile/passes/context.py": ("tests/compile/test_pipeline.py", "tests/compile/passes/test_kernels.py"),
    "compile/passes/sar.py": ("tests/compile/passes/test_sar_strategy.py", "tests/compile/passes/test_kernels.py"),
    "compile/passes/strategy.py": ("tests/compile/passes/test_sar_strategy.py", "tests/compile/passes/test_kernels.py"),
    "data/assign.py": ("tests/data/test_partition.py", "tests/data/outofcore/test_ooc_multilevel.py"),
    "data/checkpoint.py": ("tests/data/test_rundir.py", "tests/test_faults.py", "tests/train/test_train.py"),
    "data/dgl_import.py": ("tests/frontends/test_dgl_partition.py",),
    "data/loading.py": ("tests/data/test_partition.py", "tests/data/test_rundir.py"),
    "data/outofcore/adjacency.py": ("tests/data/outofcore/test_ooc_multilevel.py",),
    "data/part_files.py": ("tests/data/test_partition.py", "tests/data/outofcore/test_ooc_partition.py"),
    "data/partitioning.py": ("tests/data/test_partition.py",),
    "data/synthetic.py": ("tests/data/test_hetero_datasets.py", "tests/data/test_synthetic_stream.py"),
    "data/typed_partition.py": ("tests/graph/test_hetero.py",),
    "dist/failure.py": ("tests/dist/test_failures.py", "tests/test_faults.py"),
    "dist/failure_protocol.py": ("tests/dist/test_failures.py",),
    "graph/shard.py": ("tests/graph/test_graph.py",),
    "graph/stats.py": ("tests/data/outofcore/test_ooc_stats.py",),
    "graph/tables.py": ("tests/train/test_table_shards.py", "tests/train/test_train_hetero.py"),
    "ir/aggregation.py": ("tests/ir/test_ops.py", "tests/ir/test_gat.py"),
    "ir/attention.py": ("tests/ir/test_gat.py", "tests/compile/passes/test_fuse.py"),
    "ir/dropout.py": ("tests/compile/passes/test_dropout.py", "tests/ir/test_gat.py"),
    "ir/edge_ops.py": ("tests/ir/test_ops.py", "tests/ir/test_gat.py"),
    "ir/global_ops.py": ("tests/compile/passes/test_row_reductions.py",),
    "ir/lowering.py": ("tests/compile/passes/test_lower.py", "tests/compile/passes/test_residency.py"),
    "ir/probe.py": ("tests/compile/test_trace.py", "tests/compile/passes/test_dropout.py"),
    "ir/vocab.py": ("tests/compile/passes/test_residency.py", "tests/runtime/test_link.py"),
    "frontends/pyg/assign.py": ("tests/frontends/test_pyg_utils.py",),
    "plan/memory.py": ("tests/plan/test_plan.py",),
    "plan/traffic.py": ("tests/plan/test_plan_traffic.py",),  # its own; test_traffic.py is dist/traffic's
    "plan/sizes.py": ("tests/compile/test_estimate.py",),
    "predict/files.py": ("tests/predict/test_predict.py", "tests/predict/test_predict_own_ids.py"),
    "predict/layer.py": ("tests/predict/test_predict.py",),
    "predict/run.py": ("tests/predict/test_predict.py",),
    "runtime/ops/halo.py": ("tests/runtime/test_halo.py",),
    "runtime/ops/spmm.py": ("tests/compile/passes/test_reuse.py",),
    "runtime/reuse.py": ("tests/compile/passes/test_reuse.py",),
    "train/checkpoints.py": ("tests/train/test_train.py", "tests/train/test_train_hetero.py"),
    "train/config.py": ("tests/train/test_train.py",),
    "train/evaluation.py": ("tests/train/test_train.py", "tests/train/test_train_hetero.py"),
    "train/loop.py": ("tests/train/test_train_hetero.py", "tests/train/test_table_shards.py"),
    "train/model.py": ("tests/train/test_train.py", "tests/train/test_train_own_model.py"),
    "train/tasks.py": ("tests/train/test_train_own_model.py",),
    "train/typed_models.py": ("tests/train/test_train_hetero.py", "tests/train/test_rgcn_vs_dgl.py"),
}

# Module -> why no test reaches it by name, and what runs it end to end. A gap made visible:
# "end to end" means a wrong result there shows up only as some model's failure elsewhere.
E2E = "only end to end, through sc.distribute"
UNTESTED: dict[str, str] = {
    "cli/model_commands.py": "only end to end, as `sarcompile plan/explain/estimate` in tests/cli and tests/plan",
    "cli/partition.py": "only end to end, as `sarcompile partition` in tests/frontends/test_dgl_partition.py",
    "codegen/native.py": "only through dist/cpu_cache.py (tests/dist/test_cpu_cache.py), which builds with it",
    "compile/assignments.py": f"{E2E} on models that assign into a tensor, h[mask] = v (tests/compile/test_trace.py)",
    "compile/residency_check.py": f"{E2E} (the checker: tests/compile/passes/test_residency*.py)",
    "compile/residency_dims.py": f"{E2E} (the checker: tests/compile/passes/test_residency_axes.py)",
    "compile/residency_rules.py": f"{E2E} (the checker: tests/compile/passes/test_residency.py)",
    "compile/residency_values.py": f"{E2E} (the checker: tests/compile/passes/test_residency.py)",
    "compile/sar_tracer.py": f"{E2E} (tests/compile/test_trace.py)",
    "data/outofcore/convert.py": "only end to end, through sc.partition_files (tests/data/outofcore)",
    "data/outofcore/writer.py": "only end to end, through sc.partition_files (tests/data/outofcore)",
    "frontends/dgl/graph.py": "only end to end: DGL models traced in tests/frontends/test_dgl*.py",
    "frontends/dgl/layers.py": "only end to end: dgl.nn layers traced in tests/frontends/test_dgl*.py",
    "frontends/dgl/messages.py": "only end to end: tests/frontends/test_dgl_update_all.py",
    "frontends/edge_index.py": "only end to end: edge_index models in tests/frontends/test_plain.py, test_pyg_plain.py",
    "frontends/pyg/attention.py": "only end to end: GATConv/GATv2Conv models in tests/frontends/test_pyg.py",
    "frontends/pyg/convs.py": "only end to end: SAGE/GCN/GIN models in tests/frontends/test_pyg.py",
    "frontends/pyg/hetero_convs.py": "only end to end: HGTConv/HANConv in tests/frontends/test_pyg_hetero.py",
    "frontends/pyg/message_passing.py": "only end to end: own MessagePassing layers in tests/frontends/test_pyg.py",
    "frontends/pyg/reversible.py": "only end to end: GroupAddRev in tests/frontends/test_pyg_wrapped.py",
    "frontends/pyg/standin.py": "only end to end, under every PyG rule (tests/frontends/test_pyg*.py)",
    "frontends/pyg/typed_rows.py": "only end to end: HeteroLinear in tests/frontends/test_pyg_hetero.py",
    "plan/build.py": "only end to end, through DistributedModule.plan (tests/plan/test_plan.py)",
    "predict/cli.py": "only end to end, as `python -m sarcompile.predict` in tests/predict",
    "runtime/ops/attention.py": "only end to end: multi-worker attention in tests/runtime/test_distributed.py",
    "runtime/ops/collective.py": "only end to end: node_mean/edge_max/batch_norm on workers (tests/runtime)",
    "runtime/ops/edges.py": "only end to end: sddmm and gathers on workers (tests/runtime/test_distributed.py)",
    "runtime/ops/message.py": "only end to end: message_passing on workers (tests/runtime/test_distributed.py)",
    "runtime/rounds.py": "only end to end: every multi-worker test (test_halo.py stubs it out)",
    "train/cli.py": "only end to end, as `python -m sarcompile.train` in tests/train",
    "train/log.py": "only end to end: the JSONL log read back in tests/train/test_train.py",
}


def _has_logic(tree: ast.Module) -> bool:
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in ast.walk(tree))


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(_text(path), filename=str(path))


@cache
def _text(path: Path) -> str:
    return path.read_text()


def _modules_with_logic() -> list[str]:
    return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if _has_logic(_tree(p)))


def _own_test(module: str) -> Path:
    """Where the module's own test file goes: tests/<path>/test_<name>.py, or the prefixed name."""
    rel = Path(module)
    folder = str(rel.parent)
    if folder in PREFIXED:
        return TESTS / f"{PREFIXED[folder]}{rel.stem}.py"
    return TESTS / rel.parent / f"test_{rel.stem}.py"


def _dotted(module: str) -> str:
    parts = Path(module).with_suffix("").parts
    return ".".join(("sarcompile",) + (parts[:-1] if parts[-1] == "__init__" else parts))


@cache
def _module_file(dotted: str) -> Path | None:
    base = REPO / Path(*dotted.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


@cache
def _origin(dotted: str, name: str, depth: int = 0) -> str | None:
    """The module that defines ``name`` as seen from module ``dotted``: a submodule of that name,
    the module a top-level ``from sarcompile... import name`` takes it from, followed on, or
    ``dotted`` itself when it defines it."""
    if _module_file(f"{dotted}.{name}"):
        return f"{dotted}.{name}"
    path = _module_file(dotted)
    if path is None or depth > 8:
        return None
    if "from sarcompile" not in _text(path):  # nothing re-exported: a cheap answer, no parse
        return dotted
    for node in _tree(path).body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("sarcompile"):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return _origin(node.module, alias.name, depth + 1)
    return dotted


@cache
def _reached(test: Path) -> frozenset[str]:
    """Every sarcompile module the test file imports, or uses a name of (``sc.x.y`` resolved)."""
    nodes = list(ast.walk(_tree(test)))
    bound: dict[str, str] = {}  # local name -> sarcompile module it is bound to
    reached: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("sarcompile"):
                    reached.add(alias.name)
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else "sarcompile"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("sarcompile"):
            reached.add(node.module)
            for alias in node.names:
                origin = _origin(node.module, alias.name)
                if origin:
                    reached.add(origin)
                    if _module_file(origin) and origin.endswith("." + alias.name):
                        bound[alias.asname or alias.name] = origin

    def resolve(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Attribute):
            owner = resolve(node.value)
            if owner and _module_file(owner):
                origin = _origin(owner, node.attr)
                if origin:
                    reached.add(origin)
                return origin
        return None

    for node in nodes:
        if isinstance(node, ast.Attribute):
            resolve(node)
    return frozenset(reached)


def _reaches(test: Path, module: str) -> bool:
    dotted = _dotted(module)
    text = _text(test)
    return dotted in _reached(test) or dotted in text or f"sarcompile/{module}" in text


def test_every_module_with_logic_has_its_tests():
    missing = [
        f"{m}: write {_own_test(m).relative_to(REPO)}"
        for m in _modules_with_logic()
        if not _own_test(m).exists() and m not in COVERED_BY and m not in UNTESTED
    ]
    assert not missing, (
        "modules with logic and no test file of their own; write the test file, or name the tests that "
        "exercise the module in COVERED_BY (or say why none does in UNTESTED):\n" + "\n".join(missing)
    )


def test_covered_by_names_tests_that_reach_the_module():
    wrong = []
    for module, tests in COVERED_BY.items():
        if not (PACKAGE / module).exists():
            wrong.append(f"{module}: no such module; remove the entry")
        elif _own_test(module).exists():
            wrong.append(f"{module}: has its own test file now; remove the entry")
        elif module in UNTESTED:
            wrong.append(f"{module}: also listed in UNTESTED; keep one")
        for t in tests:
            path = REPO / t
            if not path.is_file():
                wrong.append(f"{module}: {t} does not exist")
            elif not _reaches(path, module):
                wrong.append(f"{module}: {t} neither imports it, nor uses a name from it, nor names it")
    assert not wrong, "\n".join(wrong)


def test_untested_modules_are_still_untested():
    wrong = []
    for module in UNTESTED:
        if not (PACKAGE / module).exists():
            wrong.append(f"{module}: no such module; remove the entry")
        elif _own_test(module).exists():
            wrong.append(f"{module}: {_own_test(module).relative_to(REPO)} exists now; remove it from UNTESTED")
    assert not wrong, "\n".join(wrong)


def test_test_basenames_are_unique_and_tests_is_no_package():
    names = collections.defaultdict(list)
    for p in TESTS.rglob("*.py"):
        names[p.name].append(str(p.relative_to(REPO)))
    clashes = {n: ps for n, ps in names.items() if len(ps) > 1 and n != "conftest.py"}
    assert not clashes, f"pytest imports test files by basename; rename one of each: {clashes}"
    inits = sorted(str(p.relative_to(REPO)) for p in TESTS.rglob("__init__.py"))
    assert not inits, f"tests/ is not a package (rootdir imports by basename): remove {inits}"


def test_the_reach_check_follows_re_exports():
    """The check itself: ``sc.distribute`` reaches compile/distribute.py through sarcompile/__init__,
    ``sc.ops.spmm`` reaches the op family module ir/ops.py re-exports it from."""
    assert _origin("sarcompile", "distribute") == "sarcompile.compile.distribute"
    assert _origin("sarcompile.ir.ops", "spmm") == "sarcompile.ir.aggregation"
    assert _origin("sarcompile", "ops") == "sarcompile.ir.ops"


def test_the_reach_check_is_not_fooled_by_a_test_of_something_else(tmp_path):
    other = tmp_path / "test_other.py"
    other.write_text("import sarcompile as sc\nfrom sarcompile.graph.graph import Graph\n"
                     "def test_it():\n    sc.partition(Graph(), 2)  # residency_rules: a word, not the module\n")
    assert _reaches(other, "data/partitioning.py") and _reaches(other, "graph/graph.py")
    assert not _reaches(other, "compile/residency_rules.py") and not _reaches(other, "compile/distribute.py")
