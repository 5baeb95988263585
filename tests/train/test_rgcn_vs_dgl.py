"""The trainer's RGCN (:class:`sarcompile.train.typed_models.RGCN`) computes what DGL's ogbn-mag
RGCN example computes for the same weights: per relation ``HeteroGraphConv`` over
``GraphConv(norm="right", weight=False, bias=False)`` given the relation's weight, summed
over the relations into a type, plus a self-loop ``Linear`` with bias, ReLU between the
layers. Runs where DGL is installed (the DGL environment)."""

from __future__ import annotations

import pytest
import torch

from sarcompile.train.typed_models import RGCN
from sarcompile.data.synthetic import mag_like

dgl = pytest.importorskip("dgl")
dglnn = pytest.importorskip("dgl.nn")


def _dgl_layer(g, x: dict, weights: dict, loops: dict, relu: bool) -> dict:
    """One layer of the example: relation weights passed to GraphConv as ``weight``."""
    conv = dglnn.HeteroGraphConv({rel: dglnn.GraphConv(1, 1, norm="right", weight=False, bias=False,
                                                       allow_zero_in_degree=True) for rel in weights})
    hs = conv(g, x, mod_kwargs={rel: {"weight": w.weight.T} for rel, w in weights.items()})
    out = {t: h + loops[t](x[t]) for t, h in hs.items()}
    return {t: torch.relu(h) for t, h in out.items()} if relu else out


def test_rgcn_equals_dgls_ogbn_mag_example():
    ds = mag_like(60, 50, 4, 12, features=5, num_classes=3, seed=1)
    g = ds.graph
    torch.manual_seed(0)
    ours = RGCN({t: g.num_nodes(t) for t in g.node_types}, g.edge_types, {"paper": 5}, "paper", 3, hidden=4,
                layers=2, embed_dim=5).double().eval()
    hg = dgl.heterograph({rel: (rg.src, rg.dst) for rel, rg in g.items()},
                         num_nodes_dict={t: g.num_nodes(t) for t in g.node_types})
    x = {"paper": ds.node_data["paper"]["x"].double()}
    h = {**x, **{t: e.weight for t, e in ours.embed.items()}}
    for i, layer in enumerate(ours.layers):
        # ours computes only what the target's logits need: the relations into those types
        weights = {rel[1]: layer.weight["__".join(rel)] for rel in layer.edge_types}
        sub = hg.edge_type_subgraph(list(layer.edge_types))
        h = _dgl_layer(sub, {t: h[t] for t in sub.ntypes}, weights, layer.loop, relu=i < len(ours.layers) - 1)
    torch.testing.assert_close(ours(g, x), h["paper"], rtol=1e-12, atol=1e-12)
