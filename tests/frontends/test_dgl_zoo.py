"""benchmarks/dgl_zoo.py judges DGL layers as it says: one exact, one refused, one not
applicable, on one machine and on 1 and 2 gloo workers. Runs only where DGL is installed
(``scripts/test.sh`` runs it in the torch 2.2 environment of ``scripts/dgl_env.sh``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("dgl")

ZOO_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "dgl_zoo.py"


def _zoo():
    # Imported under its own module name so that the spawned workers can import it too.
    if "dgl_zoo" not in sys.modules:
        sys.path.insert(0, str(ZOO_PATH.parent))
        spec = importlib.util.spec_from_file_location("dgl_zoo", ZOO_PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules["dgl_zoo"] = module
        spec.loader.exec_module(module)
    return sys.modules["dgl_zoo"]


def test_sweep_judges_exact_refused_and_not_applicable():
    zoo = _zoo()
    records = {r.name: r for r in zoo.sweep(["GraphConv", "ChebConv", "DenseGraphConv"], world_sizes=(1, 2),
                                            log=lambda s: None)}

    gc = records["GraphConv"]
    assert gc.outcome == zoo.EXACT, gc
    assert set(gc.diffs) == {"local", "1w", "2w"} and all(d <= 1e-9 for d in gc.diffs.values()), gc.diffs

    cheb = records["ChebConv"]
    assert cheb.outcome == zoo.REFUSED, cheb
    assert cheb.detail.startswith("CompileError:") and "ChebConv" in cheb.detail, cheb.detail

    dense = records["DenseGraphConv"]
    assert dense.outcome == zoo.NA and "dense adjacency" in dense.detail, dense


def test_every_dgl_conv_class_is_swept():
    import dgl.nn.pytorch.conv as c

    zoo = _zoo()
    swept = {name.split("(")[0] for name in zoo.cases()}
    assert set(c.__all__) <= swept, sorted(set(c.__all__) - swept)


def test_layers_that_ask_is_block_or_is_homogeneous_are_exact_on_one_to_three_workers():
    """DGL's GINConv, GINEConv and NNConv call expand_as_pair, which asks ``g.is_block``:
    the traced graph answers it (and ``is_homogeneous``, ``batch_size``) as a constant."""
    zoo = _zoo()
    names = ["GINConv", "GINEConv", "NNConv", "GINConv(max)"]
    for r in zoo.sweep(names, world_sizes=(1, 2, 3), log=lambda s: None):
        assert r.outcome == zoo.EXACT, r
        assert set(r.diffs) == {"local", "1w", "2w", "3w"} and all(d <= 1e-9 for d in r.diffs.values()), r.diffs


def _exact_on_one_to_three_workers(names: list[str]) -> None:
    zoo = _zoo()
    for r in zoo.sweep(names, world_sizes=(1, 2, 3), log=lambda s: None):
        assert r.outcome == zoo.EXACT, r
        assert set(r.diffs) == {"local", "1w", "2w", "3w"} and all(d <= 1e-9 for d in r.diffs.values()), r.diffs


def test_layers_calling_dgl_edge_softmax_are_exact():
    """dgl.nn.functional.edge_softmax is traced as the IR's edge_softmax (a function rule);
    DotGatConv also takes g.local_var()."""
    _exact_on_one_to_three_workers(["GATv2Conv", "AGNNConv", "DotGatConv"])


def test_layers_using_apply_edges_row_counts_and_self_loops_are_exact():
    """v_sub_u and edge builtins (EdgeConv), torch.ones(g.num_edges()) (GMMConv, TWIRLS),
    g.remove_self_loop().add_self_loop() (TWIRLSConv), g.out_degrees() and x.shape + (1,)
    (APPNPConv, TAGConv)."""
    _exact_on_one_to_three_workers(["EdgeConv", "GMMConv", "TWIRLSConv", "TWIRLSUnfoldingAndAttention",
                                    "APPNPConv", "TAGConv"])


def test_edge_weight_norm_and_the_layers_making_one_in_forward_are_exact():
    """EdgeWeightNorm: weighted out-degrees pushed to the sources' workers, differentiable in
    the weights; SGConv, APPNPConv and TAGConv make one inside forward."""
    _exact_on_one_to_three_workers(["EdgeWeightNorm", "SGConv(edge_weight)", "APPNPConv(edge_weight)",
                                    "TAGConv(edge_weight)"])


def test_rnn_cells_typed_linear_and_in_degree_checks_are_exact():
    """GatedGraphConv's GRUCell on rows; RelGraphConv's message (TypedLinear, two edge fields)
    computed on the edges; GCN2Conv's feat_0[: feat.size(0)]; EGATConv's in-degree check."""
    _exact_on_one_to_three_workers(["GatedGraphConv", "RelGraphConv", "RelGraphConv(bdd)", "GCN2Conv",
                                    "EGATConv"])
