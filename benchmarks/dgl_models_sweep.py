"""The DGL models sweep: do whole models, written as DGL's examples write them, train unchanged
on N workers?

The DGL twin of ``benchmarks/models_sweep.py`` (whose harness it uses: read its docstring for
what is compared and how a case ends). The models are in ``benchmarks/models_dgl.py``,
written as DGL's examples and tutorials write them: ``nn.Dropout``, ``feat_drop`` /
``attn_drop``, APPNP's ``edge_drop``, the graph kept on the module (``self.g``), a ``blocks``
list, a list of metapath graphs, features in the graph's frames (``g.ndata['feat']``,
``G.nodes[t].data['inp']``, ``g.edata[dgl.ETYPE]``), a ``training`` flag, a target type named
by a string, ``torch.stack(hs).mean(0)``, learnable tables of featureless types.

Graphs: the citation graph of the PyG sweep with one self-loop per node (as the examples
prepare it: ``dgl.add_self_loop(dgl.remove_self_loop(g))``); a second graph on its nodes (a
metapath graph, for HAN); the ogbn-mag-shaped heterograph and its ``dgl.to_homogeneous``
form; float64. On a worker, frames are written to ``part.graph`` as the script writes them
to the ``DGLGraph``.

Usage (DGL runs in the torch 2.2 environment of ``scripts/dgl_env.sh``)::

    DGLBACKEND=pytorch python benchmarks/dgl_models_sweep.py     # -> benchmarks/results/dgl_models_sweep.json, .md
    python benchmarks/dgl_models_sweep.py --only "GCN (gcn/train.py) [train]" --table   # some cases (not saved)
    python benchmarks/dgl_models_sweep.py --load --summary       # the README's form of the saved results
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The harness, shared with the PyG sweep (and the outcomes: tests read them).
from models_sweep import (  # noqa: E402, F401
    CITATION, CRASH, DT, EXACT, HANG, MAG_CLASSES, MAG_NODES, NA, REFUSED, W_COLS, WRONG, Kind, Model, Sweep,
    citation_features, citation_graph, mag_graph,
)
from zoo_pool import in_server  # noqa: E402

FRONTEND = "dgl"
RESULTS = Path(__file__).resolve().parent / "results" / "dgl_models_sweep.json"
METAPATH_LINKS = 500
HGT_INPUT = 16  # width of every type's input frame for HGT (the example's random 'inp' per type)


def _with_self_loops(src: torch.Tensor, dst: torch.Tensor):
    import dgl

    return dgl.add_self_loop(dgl.remove_self_loop(dgl.graph((src, dst), num_nodes=CITATION["nodes"])))


def metapath_graph() -> tuple[torch.Tensor, torch.Tensor]:
    """A second graph on the citation nodes (a metapath's, e.g. paper-author-paper), both ways."""
    gen = torch.Generator().manual_seed(2054)
    n = CITATION["nodes"]
    src, dst = torch.randint(0, n, (METAPATH_LINKS,), generator=gen), torch.randint(0, n, (METAPATH_LINKS,),
                                                                                     generator=gen)
    return torch.cat([src, dst]), torch.cat([dst, src])


def heterograph():
    import dgl

    return dgl.heterograph(mag_graph(), num_nodes_dict=MAG_NODES)


def homogeneous():
    """The heterograph as ``dgl.to_homogeneous`` makes it, with entity.py's normaliser per edge
    (one over the in-degree of its destination within its relation) in ``edata['norm']``."""
    import dgl

    hg = heterograph()
    for rel in hg.canonical_etypes:
        hg.edges[rel].data["norm"] = dgl.norm_by_dst(hg, rel).unsqueeze(1).to(DT)
    return dgl.to_homogeneous(hg, edata=["norm"])


def _kinds() -> dict[str, Kind]:
    import dgl

    import sarcompile as sc

    x, w = citation_features()
    n = CITATION["nodes"]
    src, dst = citation_graph()
    cit = _with_self_loops(src, dst)
    meta = _with_self_loops(*metapath_graph())
    hg = heterograph()
    gen = torch.Generator().manual_seed(11)
    px = {"paper": torch.randn(MAG_NODES["paper"], CITATION["features"], generator=gen, dtype=DT),
          "author": torch.randn(MAG_NODES["author"], CITATION["features"], generator=gen, dtype=DT)}
    inp = {t: torch.randn(c, HGT_INPUT, generator=gen, dtype=DT) for t, c in MAG_NODES.items()}
    mw = {t: torch.randn(c, W_COLS, generator=gen, dtype=DT) for t, c in MAG_NODES.items()}
    gh = homogeneous()
    hx = torch.randn(gh.num_nodes(), HGT_INPUT, generator=gen, dtype=DT)
    hw = torch.randn(gh.num_nodes(), W_COLS, generator=gen, dtype=DT)
    return {
        "citation": Kind(eager=lambda: _with_self_loops(src, dst), graphs=(sc.Graph.from_dgl(cit),), inputs={"x": x},
                         w={"": w}, num_nodes=n),
        "citation + metapath": Kind(eager=lambda: [_with_self_loops(src, dst), _with_self_loops(*metapath_graph())],
                                    graphs=(sc.Graph.from_dgl(cit), sc.Graph.from_dgl(meta)), inputs={"x": x},
                                    w={"": w}, num_nodes=n),
        "mag": Kind(eager=heterograph, graphs=(sc.HeteroGraph.from_dgl(hg),), inputs={"x": px, "inp": inp}, w=mw,
                    num_nodes=dict(MAG_NODES)),
        "mag (homogeneous)": Kind(eager=homogeneous, graphs=(sc.Graph.from_dgl(gh),),
                                  inputs={"x": hx, "ntype": gh.ndata[dgl.NTYPE], "etype": gh.edata[dgl.ETYPE],
                                          "norm": gh.edata["norm"]},
                                  w={"": hw}, num_nodes=gh.num_nodes(), edge_inputs=frozenset({"etype", "norm"})),
    }


def _set_frames(g, i: dict) -> None:
    """What a script does before calling a model that reads frames: the features into
    ``g.ndata['feat']``."""
    g.ndata["feat"] = i["x"]


def _hgt_call(m, g, i, training):
    """The HGT example's script: every type's input into the frame ``inp``, then
    ``model(G, "paper")``."""
    for t, inp in i["inp"].items():
        g.nodes[t].data["inp"] = inp
    return m(g, "paper")


def _entity_call(m, g, i, training):
    """entity.py's script: relation types and normalisers into the edge frames, then ``model(g)``."""
    import dgl

    g.edata[dgl.ETYPE] = i["etype"]
    g.edata["norm"] = i["norm"]
    return m(g)


def _models() -> list[Model]:
    import models_dgl as D
    import torch.nn.functional as F

    f, h, c = CITATION["features"], 16, CITATION["classes"]
    std = lambda m, g, i, t: m(g, i["x"])  # noqa: E731  (forward(g, features))

    def example(name, build, has, **kw):
        return Model(name, "example", "citation", build, kw.pop("call", std), has, **kw)

    rels = len(mag_graph())
    return [
        example("GCN (gcn/train.py)", lambda g: D.GCN(f, h, c), "nn.Dropout between layers"),
        example("GAT (gat/train.py)", lambda g: D.GAT(f, 8, c), "feat_drop, attn_drop, flatten / mean heads"),
        example("GraphSAGE (graphsage/train_full.py)", lambda g: D.SAGE(f, h, c), "nn.Dropout, SAGEConv('gcn')"),
        example("APPNP (appnp.py)", lambda g: D.APPNP(g, f, [32], c, F.relu, 0.5, 0.5, 0.1, 10),
                "self.g, feat_drop, APPNPConv(edge_drop)", call=lambda m, g, i, t: m(i["x"]), keeps="g"),
        example("TAGCN (tagcn.py)", lambda g: D.TAGCN(g, f, h, c, 1, F.relu, 0.5), "self.g, nn.Dropout",
                call=lambda m, g, i, t: m(i["x"]), keeps="g"),
        example("SGC (sgc.py)", lambda g: D.SGC(f, c), "SGConv(cached=True), no dropout"),
        example("GIN (node-level)", lambda g: D.GIN(f, h, c), "BatchNorm1d, learn_eps, nn.Dropout"),
        example("GATv2 (gatv2.py)", lambda g: D.GATv2(f, 8, c), "feat_drop, attn_drop, residual, share_weights"),
        example("GCNII (gcnii)", lambda g: D.GCNII(f, h, c), "GCN2Conv, nn.Dropout throughout"),
        example("own SAGEConv (user guide)", lambda g: D.MyModel(f, h, c), "update_all in local_scope, F.dropout"),
        Model("SAGE over blocks [g, g]", "convention", "citation", lambda g: D.BlockSAGE(f, h, c),
              lambda m, g, i, t: m([g, g], i["x"]), "forward(blocks, x), nn.Dropout"),
        Model("GCN reading g.ndata['feat']", "convention", "citation", lambda g: D.FrameGCN(f, h, c),
              lambda m, g, i, t: (_set_frames(g, i), m(g))[1], "forward(g), features in frames"),
        Model("GCN with a training flag", "convention", "citation", lambda g: D.FlagGCN(f, h, c),
              lambda m, g, i, t: m(g, i["x"], t), "forward(g, x, training)"),
        Model("JK stack-mean", "convention", "citation", lambda g: D.JKMean(f, h, c), std,
              "torch.stack(hs).mean(0), x.dim(), nn.Dropout"),
        Model("Lightning GraphSAGE", "wrapper", "citation", lambda g: D.SAGELightning(f, h, c), std,
              "LightningModule-like, forward calls self.module"),
        Model("RGCN hetero (rgcn-hetero)", "typed", "mag",
              lambda g: D.EntityClassify(g, h, MAG_CLASSES, num_bases=2, category="paper"),
              lambda m, g, i, t: m(), "self.g, ParameterDict tables, WeightBasis, dropout", keeps="g",
              out_type="paper"),
        Model("HeteroRGCN (tutorial)", "typed", "mag", lambda g: D.HeteroRGCN(g, h, h, MAG_CLASSES),
              lambda m, g, i, t: m(g), "forward(G), frames, multi_update_all, tables", out_type="paper"),
        Model("HGT (hgt/model.py)", "typed", "mag", lambda g: D.HGT(g, HGT_INPUT, h, MAG_CLASSES, 2, 2), _hgt_call,
              "frames 'inp', forward(G, 'paper'), einsum, nn.Dropout", out_type="paper"),
        Model("HAN (han/model.py)", "typed", "citation + metapath", lambda g: D.HAN(2, f, 8, c), std,
              "list of metapath graphs, feat_drop/attn_drop, stack(dim=1), mean over nodes"),
        Model("HGTConv (to_homogeneous)", "typed", "mag (homogeneous)",
              lambda g: D.TypedHGT(HGT_INPUT, 4, 2, len(MAG_NODES), rels, MAG_CLASSES),
              lambda m, g, i, t: m(g, i["x"], i["ntype"], i["etype"]), "HGTConv(dropout=0.2)"),
        Model("RGCN entity (rgcn/entity.py)", "typed", "mag (homogeneous)",
              lambda g: D.EntityRGCN(sum(MAG_NODES.values()), h, MAG_CLASSES, rels), _entity_call,
              "self.emb.weight, g.edata[dgl.ETYPE] / ['norm'], RelGraphConv(dropout)"),
    ]


def _describe() -> dict:
    hg = heterograph()
    return {"graphs": [f"citation {CITATION['nodes']} nodes, {_with_self_loops(*citation_graph()).num_edges()} "
                       f"edges with self-loops; metapath graph {_with_self_loops(*metapath_graph()).num_edges()} edges",
                       "mag " + ", ".join(f"{t} {n}" for t, n in MAG_NODES.items()) + f", {hg.num_edges()} edges"]}


def _worker_case(part, payload: dict) -> dict:
    return SWEEP.worker_case(part, payload)


SWEEP = Sweep(_models, _kinds, frontend=FRONTEND, library="DGL", title="Models sweep (DGL)", results=RESULTS,
              worker=_worker_case, doc=__doc__, script=__file__)

if in_server(__name__):  # the workers fork with every model built once
    SWEEP.build_each()

if __name__ == "__main__":
    sys.exit(SWEEP.main(None, _describe))
