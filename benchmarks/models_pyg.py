"""Whole PyG and plain-torch node models for ``benchmarks/models_sweep.py``, written the way
PyG's examples and tutorials write them (``examples/gcn.py``, ``gat.py``, ``citation/*.py``,
``ogbn_*``, ``gcn2_cora.py``, ``hetero/*.py``, the "Creating message passing networks"
tutorial, the PyTorch Lightning examples), in our own code: dropout as they use it
(``F.dropout(x, p, training=self.training)``, ``nn.Dropout``, a layer's own ``dropout=``,
``dropout_edge``), the graph passed as they pass it (``edge_index``, ``data``, stored on the
module, a ``training`` flag next to it), ``torch.stack(outs).mean(0)``, ``x.dim()`` tests,
learnable embeddings of featureless node types under any name.

Nothing here knows about sarcompile but :class:`ScSAGE` (a model written with
``sarcompile.nn``, as the README writes one).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch import nn
from torch.nn import BatchNorm1d, Dropout, Linear, ModuleList, ReLU
from torch_geometric.nn import (
    APPNP, AGNNConv, ChebConv, ClusterGCNConv, DeepGCNLayer, GATConv, GATv2Conv, GCN2Conv, GCNConv, GENConv, GINConv,
    HANConv, HeteroConv, HGTConv, JumpingKnowledge, MessagePassing, RGCNConv, SAGEConv, Sequential, SGConv, TAGConv,
    to_hetero,
)
from torch_geometric.utils import add_self_loops, degree, dropout_edge, scatter


# --- citation-network examples (Cora-shaped) -----------------------------------------------
class GCN(nn.Module):
    """examples/gcn.py: cached normalisation, dropout on the input and the hidden layer."""

    def __init__(self, in_channels, hidden_channels, out_channels, cached=True):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden_channels, cached=cached, normalize=True)
        self.conv2 = GCNConv(hidden_channels, out_channels, cached=cached, normalize=True)

    def forward(self, x, edge_index, edge_weight=None):
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, edge_index, edge_weight).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index, edge_weight)


class GAT(nn.Module):
    """examples/gat.py: dropout 0.6 on the features and inside both attention layers."""

    def __init__(self, in_channels, hidden_channels, out_channels, heads):
        super().__init__()
        self.conv1 = GATConv(in_channels, hidden_channels, heads, dropout=0.6)
        self.conv2 = GATConv(hidden_channels * heads, out_channels, heads=1, concat=False, dropout=0.6)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.6, training=self.training)
        x = F.elu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.6, training=self.training)
        return self.conv2(x, edge_index)


class GATv2(nn.Module):
    """GATv2 with shared weights and a residual, an ``nn.Dropout`` module between layers and
    the attention's own dropout."""

    def __init__(self, in_channels, hidden_channels, out_channels, heads=4, dropout=0.5):
        super().__init__()
        self.conv1 = GATv2Conv(in_channels, hidden_channels, heads=heads, dropout=dropout, residual=True)
        self.conv2 = GATv2Conv(hidden_channels * heads, out_channels, heads=1, share_weights=True)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, edge_index):
        x = self.dropout(x)
        x = F.elu(self.conv1(x, edge_index))
        return self.conv2(self.dropout(x), edge_index)


class APPNPNet(nn.Module):
    """examples/citation/appnp.py: an MLP, then personalised-PageRank propagation."""

    def __init__(self, in_channels, hidden_channels, out_channels, K=10, alpha=0.1, dropout=0.5):
        super().__init__()
        self.lin1 = Linear(in_channels, hidden_channels)
        self.lin2 = Linear(hidden_channels, out_channels)
        self.prop = APPNP(K, alpha)
        self.dropout = dropout

    def forward(self, x, edge_index):
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = F.relu(self.lin1(x))
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = self.lin2(x)
        x = self.prop(x, edge_index)
        return F.log_softmax(x, dim=1)


class SGC(nn.Module):
    """examples/sgc.py: one SGConv (K=2, cached), log-softmax; no dropout."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv1 = SGConv(in_channels, out_channels, K=2, cached=True)

    def forward(self, x, edge_index):
        return F.log_softmax(self.conv1(x, edge_index), dim=1)


class TAGCN(nn.Module):
    """examples/tagcn.py."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.conv1 = TAGConv(in_channels, hidden_channels)
        self.conv2 = TAGConv(hidden_channels, out_channels)

    def forward(self, x, edge_index):
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.conv2(x, edge_index), dim=1)


class ChebNet(nn.Module):
    """examples/citation/cheb.py: Chebyshev filters of order 2."""

    def __init__(self, in_channels, hidden_channels, out_channels, K=2):
        super().__init__()
        self.conv1 = ChebConv(in_channels, hidden_channels, K)
        self.conv2 = ChebConv(hidden_channels, out_channels, K)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.5, training=self.training)
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.5, training=self.training)
        return F.log_softmax(self.conv2(x, edge_index), dim=1)


class ClusterGCN(nn.Module):
    """Cluster-GCN's layers (``ClusterGCNConv``) in a ModuleList, trained full-batch."""

    def __init__(self, in_channels, hidden_channels, out_channels, num_layers=3):
        super().__init__()
        self.convs = ModuleList([ClusterGCNConv(in_channels, hidden_channels)])
        for _ in range(num_layers - 2):
            self.convs.append(ClusterGCNConv(hidden_channels, hidden_channels))
        self.convs.append(ClusterGCNConv(hidden_channels, out_channels))

    def forward(self, x, edge_index):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = F.relu(x)
                x = F.dropout(x, p=0.5, training=self.training)
        return F.log_softmax(x, dim=-1)


class GCNII(nn.Module):
    """examples/gcn2_cora.py: initial residual (``x_0``) and identity mapping, deep."""

    def __init__(self, in_channels, hidden_channels, out_channels, num_layers=4, alpha=0.1, theta=0.5,
                 shared_weights=True, dropout=0.6):
        super().__init__()
        self.lins = ModuleList([Linear(in_channels, hidden_channels), Linear(hidden_channels, out_channels)])
        self.convs = ModuleList([GCN2Conv(hidden_channels, alpha, theta, layer + 1, shared_weights)
                                 for layer in range(num_layers)])
        self.dropout = dropout

    def forward(self, x, edge_index):
        x = F.dropout(x, self.dropout, training=self.training)
        x = x_0 = self.lins[0](x).relu()
        for conv in self.convs:
            x = F.dropout(x, self.dropout, training=self.training)
            x = conv(x, x_0, edge_index)
            x = x.relu()
        x = F.dropout(x, self.dropout, training=self.training)
        x = self.lins[1](x)
        return x.log_softmax(dim=-1)


class JKNet(nn.Module):
    """A jumping-knowledge network: GCN layers, every layer's output combined by
    ``JumpingKnowledge(mode)`` ("cat", "max" or "lstm"), a Linear on top."""

    def __init__(self, in_channels, hidden_channels, out_channels, mode="cat", num_layers=3):
        super().__init__()
        self.convs = ModuleList([GCNConv(in_channels, hidden_channels)])
        self.convs.extend(GCNConv(hidden_channels, hidden_channels) for _ in range(num_layers - 1))
        self.jump = JumpingKnowledge(mode, hidden_channels, num_layers)
        self.lin = Linear(num_layers * hidden_channels if mode == "cat" else hidden_channels, out_channels)

    def forward(self, x, edge_index):
        xs = []
        for conv in self.convs:
            x = F.relu(conv(x, edge_index))
            x = F.dropout(x, p=0.5, training=self.training)
            xs += [x]
        return F.log_softmax(self.lin(self.jump(xs)), dim=-1)


class AGNN(nn.Module):
    """examples/agnn.py: a fixed and a learned propagation between two Linears."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.lin1 = Linear(in_channels, hidden_channels)
        self.prop1 = AGNNConv(requires_grad=False)
        self.prop2 = AGNNConv(requires_grad=True)
        self.lin2 = Linear(hidden_channels, out_channels)

    def forward(self, x, edge_index):
        x = F.dropout(x, training=self.training)
        x = F.relu(self.lin1(x))
        x = self.prop1(x, edge_index)
        x = self.prop2(x, edge_index)
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.lin2(x), dim=1)


class DeeperGCN(nn.Module):
    """examples/ogbn_proteins_deepgcn.py without edge features: an encoder, ``DeepGCNLayer``
    blocks (res+, GENConv with a learned softmax aggregation, LayerNorm, the layer's own
    dropout), a Linear on the last layer's norm."""

    def __init__(self, in_channels, hidden_channels, out_channels, num_layers=3):
        super().__init__()
        self.node_encoder = Linear(in_channels, hidden_channels)
        self.layers = ModuleList()
        for i in range(1, num_layers + 1):
            conv = GENConv(hidden_channels, hidden_channels, aggr="softmax", t=1.0, learn_t=True, num_layers=2,
                           norm="layer")
            norm = nn.LayerNorm(hidden_channels, elementwise_affine=True)
            act = ReLU(inplace=True)
            self.layers.append(DeepGCNLayer(conv, norm, act, block="res+", dropout=0.1))
        self.lin = Linear(hidden_channels, out_channels)

    def forward(self, x, edge_index):
        x = self.node_encoder(x)
        x = self.layers[0].conv(x, edge_index)
        for layer in self.layers[1:]:
            x = layer(x, edge_index)
        x = self.layers[0].act(self.layers[0].norm(x))
        x = F.dropout(x, p=0.1, training=self.training)
        return self.lin(x)


def sequential_jk(in_channels, hidden_channels, out_channels):
    """The ``torch_geometric.nn.Sequential`` model of PyG's documentation (dropout, two GCN
    layers, jumping knowledge), ending in a node-level Linear."""
    return Sequential("x, edge_index", [
        (Dropout(p=0.5), "x -> x"),
        (GCNConv(in_channels, hidden_channels), "x, edge_index -> x1"),
        ReLU(inplace=True),
        (GCNConv(hidden_channels, hidden_channels), "x1, edge_index -> x2"),
        ReLU(inplace=True),
        (lambda x1, x2: [x1, x2], "x1, x2 -> xs"),
        (JumpingKnowledge("cat", hidden_channels, num_layers=2), "xs -> x"),
        (Linear(2 * hidden_channels, out_channels), "x -> x"),
    ])


# --- ogbn-arxiv / products-shaped examples -------------------------------------------------
class SAGE(nn.Module):
    """examples/ogbn_arxiv / ogb's arxiv gnn.py: SAGEConv, BatchNorm1d, ReLU, dropout."""

    def __init__(self, in_channels, hidden_channels, out_channels, num_layers=3, dropout=0.5):
        super().__init__()
        self.convs = ModuleList([SAGEConv(in_channels, hidden_channels)])
        self.bns = ModuleList([BatchNorm1d(hidden_channels)])
        for _ in range(num_layers - 2):
            self.convs.append(SAGEConv(hidden_channels, hidden_channels))
            self.bns.append(BatchNorm1d(hidden_channels))
        self.convs.append(SAGEConv(hidden_channels, out_channels))
        self.dropout = dropout

    def forward(self, x, adj_t):
        for i, conv in enumerate(self.convs[:-1]):
            x = conv(x, adj_t)
            x = self.bns[i](x)
            x = F.relu(x)
            x = F.dropout(x, p=self.dropout, training=self.training)
        x = self.convs[-1](x, adj_t)
        return x.log_softmax(dim=-1)


class ArxivGCN(nn.Module):
    """ogb's arxiv gnn.py GCN: ``GCNConv(cached=True)`` on the adjacency the script normalises
    itself beforehand (``D^-1/2 (A+I) D^-1/2``, so the layers normalise it once more, as
    there), BatchNorm1d, ReLU, dropout; ``forward(x, adj_t)``."""

    def __init__(self, in_channels, hidden_channels, out_channels, num_layers=3, dropout=0.5):
        super().__init__()
        sizes = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.convs = ModuleList([GCNConv(a, b, cached=True) for a, b in zip(sizes, sizes[1:])])
        self.bns = ModuleList([BatchNorm1d(hidden_channels) for _ in range(num_layers - 1)])
        self.dropout = dropout

    def forward(self, x, adj_t):
        for conv, bn in zip(self.convs[:-1], self.bns):
            x = F.dropout(F.relu(bn(conv(x, adj_t))), p=self.dropout, training=self.training)
        return self.convs[-1](x, adj_t).log_softmax(dim=-1)


class ProductsGCN(nn.Module):
    """ogb's products full-batch GCN: ``GCNConv(normalize=False)`` on the normalised ``adj_t``
    (the normalisation done once, outside the model), dropout between layers."""

    def __init__(self, in_channels, hidden_channels, out_channels, num_layers=3, dropout=0.5):
        super().__init__()
        sizes = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.convs = ModuleList([GCNConv(a, b, normalize=False) for a, b in zip(sizes, sizes[1:])])
        self.dropout = dropout

    def forward(self, x, adj_t):
        for conv in self.convs[:-1]:
            x = F.dropout(conv(x, adj_t).relu(), p=self.dropout, training=self.training)
        return self.convs[-1](x, adj_t).log_softmax(dim=-1)


class GIN(nn.Module):
    """Node-level GIN: GINConv over an MLP with BatchNorm, every layer's output concatenated,
    dropout, a Linear."""

    def __init__(self, in_channels, hidden_channels, out_channels, num_layers=2):
        super().__init__()
        self.convs = ModuleList()
        for i in range(num_layers):
            mlp = nn.Sequential(Linear(in_channels if i == 0 else hidden_channels, hidden_channels),
                                BatchNorm1d(hidden_channels), ReLU(), Linear(hidden_channels, hidden_channels))
            self.convs.append(GINConv(mlp, train_eps=True))
        self.lin = Linear(num_layers * hidden_channels, out_channels)

    def forward(self, x, edge_index):
        xs = []
        for conv in self.convs:
            x = conv(x, edge_index).relu()
            xs.append(x)
        x = torch.cat(xs, dim=-1)
        x = F.dropout(x, p=0.5, training=self.training)
        return self.lin(x)


# --- the ways a graph and flags reach a model ---------------------------------------------
class DropEdgeGCN(nn.Module):
    """DropEdge: ``dropout_edge`` on the graph in training, then GCN layers."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden_channels)
        self.conv2 = GCNConv(hidden_channels, out_channels)

    def forward(self, x, edge_index):
        edge_index, _ = dropout_edge(edge_index, p=0.2, training=self.training)
        x = self.conv1(x, edge_index).relu()
        return self.conv2(x, edge_index)


class FlagSAGE(nn.Module):
    """A ``training`` flag passed next to the graph, used in place of ``self.training``."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.conv1 = SAGEConv(in_channels, hidden_channels)
        self.conv2 = SAGEConv(hidden_channels, out_channels)

    def forward(self, x, edge_index, training=True):
        x = F.dropout(x, p=0.5, training=training)
        x = self.conv1(x, edge_index).relu()
        x = F.dropout(x, p=0.5, training=training)
        return self.conv2(x, edge_index)


class DataGCN(nn.Module):
    """``forward(self, data)``: the features and the graph read from a ``Data``."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden_channels)
        self.conv2 = GCNConv(hidden_channels, out_channels)

    def forward(self, data):
        x, edge_index = data.x, data.edge_index
        x = F.dropout(x, p=0.5, training=self.training)
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.5, training=self.training)
        return F.log_softmax(self.conv2(x, edge_index), dim=1)


class StoredGraphSAGE(nn.Module):
    """The graph given to the constructor and kept on the module; ``forward(x)``."""

    def __init__(self, edge_index, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.edge_index = edge_index
        self.conv1 = SAGEConv(in_channels, hidden_channels)
        self.conv2 = SAGEConv(hidden_channels, out_channels)

    def forward(self, x):
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, self.edge_index).relu()
        return self.conv2(x, self.edge_index)


class HeadEnsemble(nn.Module):
    """Several SAGE heads averaged with ``torch.stack(outs).mean(0)``; a ``x.dim()`` test on the
    input, as code that takes [N] or [N, F] features writes it."""

    def __init__(self, in_channels, hidden_channels, out_channels, heads=3):
        super().__init__()
        self.heads = ModuleList([SAGEConv(in_channels, out_channels) for _ in range(heads)])
        self.dropout = nn.Dropout(0.3)

    def forward(self, x, edge_index):
        if x.dim() == 1:
            x = x.unsqueeze(-1)
        outs = [head(self.dropout(x), edge_index) for head in self.heads]
        return torch.stack(outs).mean(0)


class TutorialGCNConv(MessagePassing):
    """The "Creating message passing networks" tutorial's GCNConv, written from scratch."""

    def __init__(self, in_channels, out_channels):
        super().__init__(aggr="add")
        self.lin = Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.empty(out_channels))
        self.reset_parameters()

    def reset_parameters(self):
        self.lin.reset_parameters()
        self.bias.data.zero_()

    def forward(self, x, edge_index):
        edge_index, _ = add_self_loops(edge_index, num_nodes=x.size(0))
        x = self.lin(x)
        row, col = edge_index
        deg = degree(col, x.size(0), dtype=x.dtype)
        deg_inv_sqrt = deg.pow(-0.5)
        deg_inv_sqrt[deg_inv_sqrt == float("inf")] = 0
        norm = deg_inv_sqrt[row] * deg_inv_sqrt[col]
        out = self.propagate(edge_index, x=x, norm=norm)
        return out + self.bias

    def message(self, x_j, norm):
        return norm.view(-1, 1) * x_j


class TutorialNet(nn.Module):
    """Two of the tutorial's layers with dropout between them."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.conv1 = TutorialGCNConv(in_channels, hidden_channels)
        self.conv2 = TutorialGCNConv(hidden_channels, out_channels)

    def forward(self, x, edge_index):
        x = F.dropout(self.conv1(x, edge_index).relu(), p=0.5, training=self.training)
        return self.conv2(x, edge_index)


# --- plain torch ---------------------------------------------------------------------------
class IndexAddGCN(nn.Module):
    """Message passing in plain torch: mean of the neighbours' rows with ``index_add_`` over
    ``edge_index``, as code without a GNN library writes it."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.lin1 = Linear(2 * in_channels, hidden_channels)
        self.lin2 = Linear(hidden_channels, out_channels)

    def aggregate(self, x, edge_index):
        src, dst = edge_index
        total = torch.zeros_like(x).index_add_(0, dst, x[src])
        count = torch.zeros(x.size(0), dtype=x.dtype).index_add_(0, dst, torch.ones_like(dst, dtype=x.dtype))
        return total / count.clamp(min=1).unsqueeze(-1)

    def forward(self, x, edge_index):
        h = torch.cat([x, self.aggregate(x, edge_index)], dim=-1)
        h = F.dropout(F.relu(self.lin1(h)), p=0.5, training=self.training)
        return self.lin2(h)


class ScatterMeanGNN(nn.Module):
    """Neighbour mean with ``scatter_add_`` over an index expanded to the messages' shape,
    the in-degree counted with ``index_add_`` of ones, and a root weight."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.lin_rel, self.lin_root = Linear(in_channels, hidden_channels), Linear(in_channels, hidden_channels)
        self.lin2 = Linear(hidden_channels, out_channels)

    def forward(self, x, edge_index):
        row, col = edge_index
        msg = x[row]
        total = x.new_zeros(x.size(0), x.size(1))
        total.scatter_add_(0, col.unsqueeze(-1).expand_as(msg), msg)
        deg = torch.zeros(x.size(0), dtype=x.dtype).index_add_(0, col, torch.ones_like(col, dtype=x.dtype))
        h = self.lin_rel(total / deg.clamp(min=1).view(-1, 1)) + self.lin_root(x)
        h = F.dropout(F.relu(h), p=0.5, training=self.training)
        return self.lin2(h)


class EdgeMaxNet(nn.Module):
    """Edge MLP messages ``[x_i, x_j - x_i]`` gathered with ``index_select``, the largest per
    node with PyG's ``scatter(..., reduce="max")`` in the model's own forward (EdgeConv
    written by hand)."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.mlp = nn.Sequential(Linear(2 * in_channels, hidden_channels), ReLU(), Linear(hidden_channels, hidden_channels))
        self.lin = Linear(hidden_channels, out_channels)

    def forward(self, x, edge_index):
        x_j, x_i = x.index_select(0, edge_index[0]), x.index_select(0, edge_index[1])
        msg = self.mlp(torch.cat([x_i, x_j - x_i], dim=-1))
        h = scatter(msg, edge_index[1], dim=0, dim_size=x.size(0), reduce="max")
        return self.lin(F.dropout(h, p=0.5, training=self.training))


class DegreeNormGCN(nn.Module):
    """GCN by hand: ``D^-1/2 A D^-1/2`` weights from ``degree``, a weighted sum with
    ``index_add_``, the nodes' own rows added (a self-loop's share), two layers."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.lin1, self.lin2 = Linear(in_channels, hidden_channels), Linear(hidden_channels, out_channels)

    def propagate(self, h, edge_index):
        src, dst = edge_index
        deg = degree(dst, h.size(0), dtype=h.dtype) + 1
        norm = deg.pow(-0.5)
        w = (norm[src] * norm[dst]).unsqueeze(-1)
        return torch.zeros_like(h).index_add_(0, dst, w * h[src]) + h / deg.unsqueeze(-1)

    def forward(self, x, edge_index):
        h = F.relu(self.propagate(self.lin1(x), edge_index))
        h = F.dropout(h, p=0.5, training=self.training)
        return self.propagate(self.lin2(h), edge_index)


class MLP(nn.Module):
    """The MLP baseline of the OGB examples: ``forward(x, edge_index)`` ignores the graph."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.lins = ModuleList([Linear(in_channels, hidden_channels), Linear(hidden_channels, out_channels)])
        self.bn = BatchNorm1d(hidden_channels)

    def forward(self, x, edge_index):
        x = F.relu(self.bn(self.lins[0](x)))
        x = F.dropout(x, p=0.5, training=self.training)
        return self.lins[1](x).log_softmax(dim=-1)


class ScSAGE(nn.Module):
    """The README's model (``sarcompile.nn`` layers, ``forward(g, x)``) with an ``nn.Dropout``."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        import sarcompile as sc

        self.conv1 = sc.nn.SAGEConv(in_channels, hidden_channels, aggr="mean")
        self.conv2 = sc.nn.SAGEConv(hidden_channels, out_channels, aggr="max")
        self.dropout = nn.Dropout(0.5)

    def forward(self, g, x):
        return self.conv2(g, self.dropout(torch.relu(self.conv1(g, x))))


# --- Lightning-style wrappers --------------------------------------------------------------
class LightningModule(nn.Module):
    """What the wrappers below need of ``pytorch_lightning.LightningModule``: a Module with
    ``training_step`` and ``configure_optimizers`` (lightning itself is not installed)."""

    def training_step(self, batch, batch_idx):
        out = self(batch.x, batch.edge_index)
        return F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


class LitGraphSAGE(LightningModule):
    """PyG's examples/pytorch_lightning/graph_sage.py model: ``GraphSAGE`` with dropout and a
    BatchNorm norm, called from ``forward``."""

    def __init__(self, in_channels, hidden_channels, out_channels, dropout=0.5):
        super().__init__()
        from torch_geometric.nn.models import GraphSAGE

        self.gnn = GraphSAGE(in_channels, hidden_channels, num_layers=2, out_channels=out_channels, dropout=dropout,
                             norm=BatchNorm1d(hidden_channels))

    def forward(self, x, edge_index):
        return self.gnn(x, edge_index)


class LitNodeClassifier(LightningModule):
    """A LightningModule around a user's model, passing its arguments on."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x, edge_index):
        return F.log_softmax(self.model(x, edge_index), dim=-1)


# --- typed graphs (ogbn-mag / DBLP-shaped) -------------------------------------------------
class HeteroSAGE(nn.Module):
    """The homogeneous model to_hetero transforms (PyG's to_hetero docs), with dropout as a
    module: to_hetero traces ``forward`` once, so ``F.dropout(training=self.training)`` would
    keep the flag it had then (PyG warns so)."""

    def __init__(self, hidden_channels, out_channels):
        super().__init__()
        self.conv1 = SAGEConv((-1, -1), hidden_channels)
        self.dropout = nn.Dropout(0.5)
        self.conv2 = SAGEConv((-1, -1), out_channels)

    def forward(self, x, edge_index):
        x = self.dropout(self.conv1(x, edge_index).relu())
        return self.conv2(x, edge_index)


class MagToHetero(nn.Module):
    """to_hetero of :class:`HeteroSAGE` on ogbn-mag: the featureless field and institution
    nodes get learnable embeddings under names of the model's own (``field_emb``,
    ``inst_table``); the paper rows are the output."""

    def __init__(self, metadata, num_nodes, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.field_emb = nn.Embedding(num_nodes["field"], in_channels)
        self.inst_table = nn.Embedding(num_nodes["institution"], in_channels)
        self.gnn = to_hetero(HeteroSAGE(hidden_channels, out_channels), metadata, aggr="sum")

    def forward(self, x_dict, edge_index_dict):
        x_dict = dict(x_dict)
        x_dict["field"] = self.field_emb.weight
        x_dict["institution"] = self.inst_table.weight
        return self.gnn(x_dict, edge_index_dict)["paper"]


class HGT(nn.Module):
    """examples/hetero/hgt_dblp.py: a lazy Linear per type, HGTConv layers, a Linear on the
    target type; the featureless types' inputs are rows of a ``ParameterDict`` keyed by type."""

    def __init__(self, metadata, num_nodes, hidden_channels, out_channels, num_heads=2, num_layers=2, featureless=()):
        super().__init__()
        self.emb = nn.ParameterDict({t: nn.Parameter(torch.randn(num_nodes[t], hidden_channels)) for t in featureless})
        self.lin_dict = nn.ModuleDict({t: pyg_nn.Linear(-1, hidden_channels) for t in metadata[0]})
        self.convs = ModuleList([HGTConv(hidden_channels, hidden_channels, metadata, num_heads)
                                 for _ in range(num_layers)])
        self.lin = Linear(hidden_channels, out_channels)

    def forward(self, x_dict, edge_index_dict):
        x_dict = {**x_dict, **{t: e for t, e in self.emb.items()}}
        x_dict = {t: self.lin_dict[t](x).relu_() for t, x in x_dict.items()}
        for conv in self.convs:
            x_dict = conv(x_dict, edge_index_dict)
        return self.lin(x_dict["author"])


class HAN(nn.Module):
    """examples/hetero/han_imdb.py: HANConv with attention dropout 0.6, a Linear on the target;
    the featureless types' inputs are bare ``nn.Parameter`` s (``field_x``, ``institution_x``)."""

    def __init__(self, metadata, num_nodes, out_channels, hidden_channels=16, heads=4):
        super().__init__()
        self.field_x = nn.Parameter(torch.randn(num_nodes["field"], 8))
        self.institution_x = nn.Parameter(torch.randn(num_nodes["institution"], 8))
        self.han_conv = HANConv(-1, hidden_channels, heads=heads, dropout=0.6, metadata=metadata)
        self.lin = nn.Linear(hidden_channels, out_channels)

    def forward(self, x_dict, edge_index_dict):
        x_dict = {**x_dict, "field": self.field_x, "institution": self.institution_x}
        out = self.han_conv(x_dict, edge_index_dict)
        return self.lin(out["paper"])


class HeteroGNN(nn.Module):
    """examples/hetero/hetero_conv_dblp.py: HeteroConv of GCN, SAGE and GAT per layer."""

    def __init__(self, hidden_channels, out_channels, num_layers=2):
        super().__init__()
        self.convs = ModuleList()
        for _ in range(num_layers):
            self.convs.append(HeteroConv({
                ("paper", "cites", "paper"): GCNConv(-1, hidden_channels),
                ("author", "writes", "paper"): SAGEConv((-1, -1), hidden_channels),
                ("paper", "rev_writes", "author"): GATConv((-1, -1), hidden_channels, add_self_loops=False),
            }, aggr="sum"))
        self.lin = Linear(hidden_channels, out_channels)

    def forward(self, x_dict, edge_index_dict):
        for conv in self.convs:
            x_dict = conv(x_dict, edge_index_dict)
            x_dict = {key: x.relu() for key, x in x_dict.items()}
            x_dict = {key: F.dropout(x, p=0.2, training=self.training) for key, x in x_dict.items()}
        return self.lin(x_dict["author"])


class EntityRGCN(nn.Module):
    """examples/rgcn.py (AIFB): featureless nodes, ``RGCNConv(num_nodes, ...)`` called with
    ``x=None``; ``forward(edge_index, edge_type)``."""

    def __init__(self, num_nodes, hidden_channels, out_channels, num_relations):
        super().__init__()
        self.conv1 = RGCNConv(num_nodes, hidden_channels, num_relations, num_bases=4)
        self.conv2 = RGCNConv(hidden_channels, out_channels, num_relations, num_bases=4)

    def forward(self, edge_index, edge_type):
        x = F.relu(self.conv1(None, edge_index, edge_type))
        x = F.dropout(x, p=0.2, training=self.training)
        return self.conv2(x, edge_index, edge_type)


class LitHGT(LightningModule):
    """A LightningModule around a typed model, ``forward(x_dict, edge_index_dict)``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x_dict, edge_index_dict):
        return self.model(x_dict, edge_index_dict)


# --- the harness's own checks (run by tests/benchmarks/test_models_sweep.py, not in the sweep) --------
class WrongOnWorkers(nn.Module):
    """Deliberately wrong: it scales its input by 2 where a process group is up (on the
    workers), so the sweep must report it WRONG there, in eval (against eager) and in train
    (against the compiled one-machine run: it has dropout)."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = SAGEConv(in_channels, out_channels)

    def forward(self, x, edge_index):
        scale = 2.0 if torch.distributed.is_initialized() else 1.0
        return self.conv(F.dropout(x * scale, p=0.5, training=self.training), edge_index)


class DropoutOnlyEager(nn.Module):
    """Deliberately wrong: dropout only where the graph is a tensor (eagerly), so the compiled
    model trains without it; the sweep must report that."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = SAGEConv(in_channels, out_channels)

    def forward(self, x, edge_index):
        if isinstance(edge_index, torch.Tensor):
            x = F.dropout(x, p=0.5, training=self.training)
        return self.conv(x, edge_index)


class NotRowLocal(nn.Module):
    """Deliberately not row-local: the rows in reverse order; the sweep must report a refusal."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = SAGEConv(in_channels, out_channels)

    def forward(self, x, edge_index):
        return self.conv(x.flip(0), edge_index)
