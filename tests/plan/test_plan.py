"""Plans: golden printouts, stages, Graphviz, sources, and no side effects."""

from __future__ import annotations

import os
from pathlib import Path
from unittest.mock import patch

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sarcompile as sc
from sarcompile.graph import graph as graph_module

GOLDEN = Path(__file__).parent / "golden"


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.sage = sc.nn.SAGEConv(8, 16, "max")
        self.drop = sc.nn.NodeDropout(0.5, seed=1)
        self.gat = sc.nn.GATConv(16, 4, heads=2, dropout=0.2, seed=2)
        self.gcn = sc.nn.GCNConv(8, 3)

    def forward(self, g, x):
        h = self.drop(g, F.relu(self.sage(g, x)))
        return self.gcn(g, F.elu(self.gat(g, h)))


def _graph() -> sc.Graph:
    gen = torch.Generator().manual_seed(0)
    return sc.Graph.from_edges(torch.randint(0, 60, (300,), generator=gen), torch.randint(0, 60, (300,), generator=gen), 60)


def _golden(name: str, text: str) -> None:
    """Compare with tests/plan/golden/NAME; SARCOMPILE_UPDATE_GOLDEN=1 rewrites it."""
    path = GOLDEN / name
    if os.environ.get("SARCOMPILE_UPDATE_GOLDEN"):
        path.write_text(text + "\n")
    assert text + "\n" == path.read_text()


@pytest.mark.parametrize("mode", ["sar", "oneshot"])
def test_printed_plan_is_stable(mode):
    plan = sc.distribute(Small(), mode=mode).plan(_graph(), 3, x=torch.zeros(1, 8), method="contiguous")
    _golden(f"plan_small_{mode}.txt", str(plan))


class _LinearThenSum(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, g, x):
        return sc.ops.spmm(g, self.lin(x), "sum")


def test_node_features_a_layer_keeps_count_once_as_node_data():
    """The linear keeps ``x`` for its weight's gradient (the sum keeps nothing): the
    estimate counts ``x`` under node_data, not again as a saved activation."""
    (one,) = sc.distribute(_LinearThenSum()).plan(_graph(), 1, x=torch.zeros(1, 8), method="contiguous").memory_estimate()
    assert one.breakdown["saved_activations"] == 0 and one.breakdown["node_data"] == _graph().num_nodes * 8 * 4


def test_stages_are_readable_python():
    plan = sc.distribute(Small()).plan(_graph(), 2, x=torch.zeros(1, 8), method="contiguous")
    assert [s for s, _ in plan.stages] == ["trace", "lower", "fuse", "linear_first", "residency", "row_reductions",
                                           "dropout", "sar", "strategy", "communication", "kernels", "reuse",
                                           "inplace", "linear_groups", "accumulate", "head_dot"]
    assert "# node" in plan.stage("residency") and "# graph" in plan.stage("residency")
    compile(plan.stage("residency"), "<plan>", "exec")  # still Python: residencies are comments
    assert "self.gat(" in plan.stage("trace")  # layers are leaves before lowering
    assert "sddmm(" in plan.stage("lower") and "edge_softmax(" in plan.stage("lower")
    assert "attention(" in plan.stage("fuse") and "edge_softmax(" not in plan.stage("fuse")
    assert "strategy = Strategy.REMAT" in plan.stage("strategy")
    assert "executor = Executor.AUTO" in plan.stage("kernels")
    compile(plan.stage("kernels"), "<plan>", "exec")  # it is Python
    assert "reuse = True" in plan.stage("reuse") and "reuse = True" not in plan.stage("kernels")  # (sage's max of x)
    with pytest.raises(KeyError, match="stages are"):
        plan.stage("codegen")


def test_a_call_compiles_without_stages_and_asking_for_them_keeps_the_running_program():
    model = sc.distribute(Small().eval())
    g, x = _graph(), torch.randn(60, 8)
    before = model(g, x)
    running = model.program(partitioned=False, stages=False)
    assert running.stages == []  # the call generated the program's code once, after the last pass
    program = model.program(partitioned=False)
    assert program is running and program.module is running.module  # (state it holds stays)
    assert [s for s, _ in program.stages][-1] == "head_dot" and program.stages[-1][1] == program.module.code
    assert list(program.seconds) == [s for s, _ in program.stages]
    torch.testing.assert_close(model(g, x), before, rtol=0, atol=0)


def test_compile_seconds_name_every_stage_and_the_plan():
    plan = sc.distribute(Small()).plan(_graph(), 2, x=torch.zeros(1, 8), method="contiguous")
    assert list(plan.compile_seconds) == [s for s, _ in plan.stages] + ["plan"]
    assert all(t > 0 for t in plan.compile_seconds.values())
    line = plan.compile_summary()
    assert line.startswith(f"compiled in {sum(plan.compile_seconds.values()):.2f} s (")
    slowest = max(plan.compile_seconds, key=plan.compile_seconds.get)
    assert f"{slowest} {plan.compile_seconds[slowest]:.3f} s" in line


def test_to_dot_lists_every_op_in_order():
    plan = sc.distribute(Small()).plan(_graph(), 2, x=torch.zeros(1, 8), method="contiguous")
    dot = plan.to_dot()
    assert dot.startswith("digraph plan {") and dot.endswith("}")
    assert [op.op for op in plan.ops] == ["spmm(max)", "attention", "spmm(sum)"]
    for i in range(len(plan.ops)):
        assert f"op{i} [label=" in dot
    assert "op0 -> op1;" in dot and "op1 -> op2;" in dot


def test_plan_from_partition_directory_equals_plan_from_graph(tmp_path):
    g = _graph()
    x = torch.randn(g.num_nodes, 8)
    sc.partition(g, 3, tmp_path, node_data={"x": x}, method="contiguous")
    model = sc.distribute(Small())
    from_dir = model.plan(tmp_path)
    from_graph = model.plan(g, 3, x=x, method="contiguous")
    assert str(from_dir) == str(from_graph)


def test_planning_leaves_the_model_untouched():
    model = Small()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sc.distribute(model).plan(_graph(), 2, x=torch.zeros(1, 8))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_plan_errors_say_what_is_missing(tmp_path):
    model = sc.distribute(Small())
    with pytest.raises(sc.CompileError, match="num_parts"):
        model.plan(_graph())
    with pytest.raises(sc.CompileError, match="example input"):
        model.plan(_graph(), 2)
    sc.partition(_graph(), 2, tmp_path)
    with pytest.raises(sc.CompileError, match="node_data\\['x'\\]"):
        model.plan(tmp_path)
    shard = sc.load_partition(tmp_path, rank=1, world_size=2).graph  # one worker's piece, not a whole graph
    with pytest.raises(sc.CompileError, match="ShardGraph \\(one worker's shard\\): give the partition directory"):
        model.plan(shard, x=torch.zeros(1, 8))


def test_plan_lists_each_generated_kernel_with_its_source():
    plan = sc.distribute(Small()).plan(_graph(), 2, x=torch.zeros(1, 8, requires_grad=True), method="contiguous")
    by_role = {(k.op.split("_")[0], k.role): k for k in plan.kernels}
    assert set(by_role) == {
        ("sage", "forward"), ("sage", "backward x"),  # max and its gradient
        ("attention", "forward"), ("attention", "backward"),  # fused attention
        ("gcn", "forward"), ("gcn", "backward x"),  # sum, then its transpose
    }
    assert by_role[("sage", "forward")].name.startswith("spmm_max_width8")
    assert "heads2_channels4_dropout" in by_role[("attention", "forward")].name
    for k in plan.kernels:
        compile(k.source, k.name, "exec")  # plain Python
        assert "@triton.jit" in k.source and "@triton.autotune" in k.source  # CUDA: autotuned
    assert "generated kernels on CUDA" in str(plan) and by_role[("gcn", "forward")].name in str(plan)
    # one source per kernel, with the ops that use it
    text = plan.kernel_sources()
    assert text.count("# =====") == len({k.name for k in plan.kernels})


def test_a_manifest_without_block_sizes_is_planned_from_its_part_files(tmp_path):
    """Manifests record each part's self-loops and block sizes, so planning reads no part
    file; one written before they were recorded is planned from the parts, alike."""
    import json

    g = _graph()
    x = torch.randn(g.num_nodes, 8)
    sc.partition(g, 3, tmp_path, node_data={"x": x}, method="contiguous")
    model = sc.distribute(Small())
    new = str(model.plan(tmp_path))
    path = tmp_path / "manifest.json"
    manifest = json.loads(path.read_text())
    for part in manifest["parts"]:
        del part["self_loops"], part["block_edges"]
    path.write_text(json.dumps(manifest))
    assert str(model.plan(tmp_path)) == new


def test_graph_estimate_counts_the_index_tensors_a_step_builds():
    """The plan's ``graph`` term against the bytes of every index tensor a worker's shard
    holds after a training step (its blocks' CSR, destinations, tiles; ids)."""
    from sarcompile.graph.shard import ShardGraph, split_graph

    gen = torch.Generator().manual_seed(3)
    n = 400
    g = sc.Graph.from_edges(torch.randint(0, n, (3000,), generator=gen), torch.randint(0, n, (3000,), generator=gen), n)
    assignment = torch.randint(0, 3, (n,), generator=gen)
    model = sc.distribute(Small())
    for tile_rows in (64, 1 << 14):  # blocks of several tiles, and of one
        with patch.object(graph_module, "TILE_ROWS", tile_rows):
            plan = model.plan(g, 3, x=torch.zeros(1, 8), method=assignment)
            parts = split_graph(g, assignment, 3)
            for r, part in enumerate(parts):
                shard = ShardGraph.from_part(part, r, 3, n, g.num_edges)
                tensors = []
                for graph in (shard, shard.with_self_loops()):  # GAT and GCN add self-loops
                    for b in graph.blocks:  # what spmm, its transpose and the attention read
                        tiles = [b.tiles(), b.tiles(transposed=True, with_order=True)]
                        tensors += [b.row, *(t for tile in tiles for t in tile.tensors())]
                    tensors += [graph.global_ids, graph.edge_ids, *graph.send_index]
                    tensors += [t for b in graph.blocks for t in vars(b).values() if isinstance(t, torch.Tensor)]
                held = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())
                estimated = plan.memory_estimate()[r].breakdown["graph"]
                assert 0.9 * held <= estimated <= 1.1 * held, (tile_rows, r, held, estimated)  # (sent rows are approximated)


def test_round_peak_counts_the_buffers_each_round_holds():
    from sarcompile.plan.memory import _round_peak

    blocks, sends = [10, 30, 20], [1, 2, 3]
    # Fetch: the block visited, the next one arriving and the rows gathered for it.
    assert _round_peak(blocks, sends, fetch=True, push=False) == max(10 + 30 + 2, 30 + 20 + 3, 20)
    assert _round_peak(blocks, [0, 0, 0], fetch=True, push=False) == 50  # the pair of blocks alone
    # Backward that fetches again and pushes: each block's gradient too, with the next
    # block arriving; then the gradient going out, the owner's arriving, the next block
    # (its rows sent are gone by then). The push completes before the next block is posted.
    assert _round_peak(blocks, sends, fetch=True, push=True) == max(20 + 32, 60 + 23, 40)
    assert _round_peak([10, 30, 20], [9, 2, 3], fetch=True, push=True) == max(20 + 32, 10 + 9 + 30, 60 + 23, 40)
    # ... with the gradient written over the block it was computed from: one buffer for both.
    assert _round_peak(blocks, sends, fetch=True, push=True, over_block=True) == max(10 + 32, 30 + 23, 20 + 3)
    # Push only (blocks kept, or forward of a push op): the gradient and the owner's arriving.
    assert _round_peak(blocks, sends, fetch=False, push=True) == max(11, 32 + 11, 23 + 32)
    assert _round_peak([], [], fetch=True, push=True) == 0
    # blocks_in_flight=0: nothing ahead, each push completed before the next block
    assert _round_peak(blocks, sends, fetch=True, push=False, in_flight=0) == max(11, 32, 23)
    assert _round_peak(blocks, sends, fetch=True, push=True, in_flight=0) == max(20, 60, 40)
    assert _round_peak(blocks, sends, fetch=False, push=True, in_flight=0) == max(11, 32, 23)
    # blocks_in_flight=2: two blocks arriving while the first is visited
    assert _round_peak(blocks, sends, fetch=True, push=False, in_flight=2) == max(10 + 32 + 23, 30 + 23, 20)
