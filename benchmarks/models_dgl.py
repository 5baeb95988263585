"""Whole DGL node models for ``benchmarks/dgl_models_sweep.py``, written the way DGL's examples
and tutorials write them (``examples/pytorch/gcn``, ``gat``, ``graphsage``, ``appnp``, ``tagcn``,
``sgc``, ``gatv2``, ``gcnii``, ``rgcn``, ``rgcn-hetero``, ``hgt``, ``han``, the user guide's
"Write your own GNN module" and the heterograph node-classification tutorial), in our own
code: dropout as they use it (``nn.Dropout``, ``feat_drop`` / ``attn_drop``, APPNP's
``edge_drop``, RelGraphConv's ``dropout``), graphs as they pass them (``forward(g, x)``, kept on
the module as ``self.g``, a ``blocks`` list, a list of metapath graphs, features in the
graph's frames, a ``training`` flag, a node type named by a string).
"""

from __future__ import annotations

import math

import dgl
import dgl.function as fn
import dgl.nn as dglnn
import torch
import torch.nn.functional as F
from dgl.nn.functional import edge_softmax
from torch import nn


# --- citation-network examples ---------------------------------------------------------------
class GCN(nn.Module):
    """examples/pytorch/gcn/train.py: dropout before every layer but the first."""

    def __init__(self, in_size, hid_size, out_size):
        super().__init__()
        self.layers = nn.ModuleList([dglnn.GraphConv(in_size, hid_size, activation=F.relu),
                                     dglnn.GraphConv(hid_size, out_size)])
        self.dropout = nn.Dropout(0.5)

    def forward(self, g, features):
        h = features
        for i, layer in enumerate(self.layers):
            if i != 0:
                h = self.dropout(h)
            h = layer(g, h)
        return h


class GAT(nn.Module):
    """examples/pytorch/gat/train.py: feature and attention dropout 0.6, heads flattened, the
    output heads averaged."""

    def __init__(self, in_size, hid_size, out_size, heads=(8, 1)):
        super().__init__()
        self.gat_layers = nn.ModuleList([
            dglnn.GATConv(in_size, hid_size, heads[0], feat_drop=0.6, attn_drop=0.6, activation=F.elu),
            dglnn.GATConv(hid_size * heads[0], out_size, heads[1], feat_drop=0.6, attn_drop=0.6, activation=None),
        ])

    def forward(self, g, inputs):
        h = inputs
        for i, layer in enumerate(self.gat_layers):
            h = layer(g, h)
            h = h.mean(1) if i == 1 else h.flatten(1)
        return h


class SAGE(nn.Module):
    """examples/pytorch/graphsage/train_full.py: SAGEConv('gcn'), dropout on the input and
    between layers."""

    def __init__(self, in_size, hid_size, out_size):
        super().__init__()
        self.layers = nn.ModuleList([dglnn.SAGEConv(in_size, hid_size, "gcn"),
                                     dglnn.SAGEConv(hid_size, out_size, "gcn")])
        self.dropout = nn.Dropout(0.5)

    def forward(self, graph, x):
        h = self.dropout(x)
        for l, layer in enumerate(self.layers):
            h = layer(graph, h)
            if l != len(self.layers) - 1:
                h = F.relu(h)
                h = self.dropout(h)
        return h


class APPNP(nn.Module):
    """examples/pytorch/appnp/appnp.py: the graph kept as ``self.g``, an MLP with feature
    dropout, APPNPConv with edge dropout; ``forward(features)``."""

    def __init__(self, g, in_feats, hiddens, n_classes, activation, feat_drop, edge_drop, alpha, k):
        super().__init__()
        self.g = g
        self.layers = nn.ModuleList([nn.Linear(in_feats, hiddens[0])])
        for i in range(1, len(hiddens)):
            self.layers.append(nn.Linear(hiddens[i - 1], hiddens[i]))
        self.layers.append(nn.Linear(hiddens[-1], n_classes))
        self.activation = activation
        self.feat_drop = nn.Dropout(feat_drop) if feat_drop else (lambda x: x)
        self.propagate = dglnn.APPNPConv(k, alpha, edge_drop)

    def forward(self, features):
        h = self.feat_drop(features)
        h = self.activation(self.layers[0](h))
        for layer in self.layers[1:-1]:
            h = self.activation(layer(h))
        h = self.layers[-1](self.feat_drop(h))
        return self.propagate(self.g, h)


class TAGCN(nn.Module):
    """examples/pytorch/tagcn/tagcn.py: the graph kept as ``self.g``."""

    def __init__(self, g, in_feats, n_hidden, n_classes, n_layers, activation, dropout):
        super().__init__()
        self.g = g
        self.layers = nn.ModuleList([dglnn.TAGConv(in_feats, n_hidden, activation=activation)])
        for _ in range(n_layers - 1):
            self.layers.append(dglnn.TAGConv(n_hidden, n_hidden, activation=activation))
        self.layers.append(dglnn.TAGConv(n_hidden, n_classes))
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, features):
        h = features
        for i, layer in enumerate(self.layers):
            if i != 0:
                h = self.dropout(h)
            h = layer(self.g, h)
        return h


class SGC(nn.Module):
    """examples/pytorch/sgc/sgc.py: one SGConv, k=2, cached; no dropout."""

    def __init__(self, in_feats, n_classes):
        super().__init__()
        self.conv = dglnn.SGConv(in_feats, n_classes, k=2, cached=True, bias=True)

    def forward(self, g, features):
        return self.conv(g, features)


class GIN(nn.Module):
    """Node-level GIN: GINConv over an MLP with BatchNorm, learnable eps, dropout."""

    def __init__(self, in_size, hid_size, out_size, num_layers=2):
        super().__init__()
        self.ginlayers = nn.ModuleList()
        self.batch_norms = nn.ModuleList()
        for layer in range(num_layers):
            mlp = nn.Sequential(nn.Linear(in_size if layer == 0 else hid_size, hid_size), nn.BatchNorm1d(hid_size),
                                nn.ReLU(), nn.Linear(hid_size, hid_size))
            self.ginlayers.append(dglnn.GINConv(mlp, learn_eps=True))
            self.batch_norms.append(nn.BatchNorm1d(hid_size))
        self.linear = nn.Linear(hid_size, out_size)
        self.drop = nn.Dropout(0.5)

    def forward(self, g, h):
        for layer, norm in zip(self.ginlayers, self.batch_norms):
            h = F.relu(norm(layer(g, h)))
        return self.linear(self.drop(h))


class GATv2(nn.Module):
    """examples/pytorch/gatv2/gatv2.py: feature and attention dropout, residuals, shared
    weights, the output heads averaged."""

    def __init__(self, in_dim, num_hidden, num_classes, heads=(4, 1), feat_drop=0.6, attn_drop=0.6):
        super().__init__()
        self.gatv2_layers = nn.ModuleList([
            dglnn.GATv2Conv(in_dim, num_hidden, heads[0], feat_drop, attn_drop, 0.2, False, F.elu, bias=False,
                            share_weights=True),
            dglnn.GATv2Conv(num_hidden * heads[0], num_classes, heads[1], feat_drop, attn_drop, 0.2, True, None,
                            bias=False, share_weights=True),
        ])

    def forward(self, g, inputs):
        h = self.gatv2_layers[0](g, inputs).flatten(1)
        return self.gatv2_layers[1](g, h).mean(1)


class GCNII(nn.Module):
    """examples/pytorch/gcnii: GCN2Conv layers on an initial projection, dropout throughout."""

    def __init__(self, in_size, hid_size, out_size, num_layers=4, alpha=0.1, lambda_=0.5, dropout=0.6):
        super().__init__()
        self.fcs = nn.ModuleList([nn.Linear(in_size, hid_size), nn.Linear(hid_size, out_size)])
        self.convs = nn.ModuleList([dglnn.GCN2Conv(hid_size, layer=i + 1, alpha=alpha, lambda_=lambda_,
                                                   activation=F.relu) for i in range(num_layers)])
        self.dropout = nn.Dropout(dropout)

    def forward(self, graph, features):
        h0 = F.relu(self.fcs[0](self.dropout(features)))
        h = h0
        for conv in self.convs:
            h = conv(graph, self.dropout(h), h0)
        return self.fcs[-1](self.dropout(h))


# --- the ways a graph and flags reach a model ---------------------------------------------
class BlockSAGE(nn.Module):
    """examples/pytorch/graphsage/node_classification.py: ``forward(blocks, x)``, a layer per
    block; trained full-graph with ``blocks = [g, g]``."""

    def __init__(self, in_size, hid_size, out_size):
        super().__init__()
        self.layers = nn.ModuleList([dglnn.SAGEConv(in_size, hid_size, "mean"),
                                     dglnn.SAGEConv(hid_size, out_size, "mean")])
        self.dropout = nn.Dropout(0.5)

    def forward(self, blocks, x):
        h = x
        for l, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if l != len(self.layers) - 1:
                h = F.relu(h)
                h = self.dropout(h)
        return h


class FrameGCN(nn.Module):
    """``forward(g)``: the features read from the graph's frame ``g.ndata['feat']``."""

    def __init__(self, in_size, hid_size, out_size):
        super().__init__()
        self.conv1 = dglnn.GraphConv(in_size, hid_size, activation=F.relu)
        self.conv2 = dglnn.GraphConv(hid_size, out_size)
        self.dropout = nn.Dropout(0.5)

    def forward(self, g):
        h = self.conv1(g, self.dropout(g.ndata["feat"]))
        return self.conv2(g, self.dropout(h))


class MySAGEConv(nn.Module):
    """The user guide's "Write your own GNN module" SAGEConv: ``update_all`` in a local scope."""

    def __init__(self, in_feat, out_feat):
        super().__init__()
        self.linear = nn.Linear(in_feat * 2, out_feat)

    def forward(self, g, h):
        with g.local_scope():
            g.ndata["h"] = h
            g.update_all(message_func=fn.copy_u("h", "m"), reduce_func=fn.mean("m", "h_N"))
            h_N = g.ndata["h_N"]
            h_total = torch.cat([h, h_N], dim=1)
            return self.linear(h_total)


class MyModel(nn.Module):
    """Two of the guide's layers with dropout."""

    def __init__(self, in_feats, h_feats, num_classes):
        super().__init__()
        self.conv1 = MySAGEConv(in_feats, h_feats)
        self.conv2 = MySAGEConv(h_feats, num_classes)

    def forward(self, g, in_feat):
        h = F.relu(self.conv1(g, in_feat))
        h = F.dropout(h, 0.5, self.training)
        return self.conv2(g, h)


class FlagGCN(nn.Module):
    """A ``training`` flag passed next to the graph, used in place of ``self.training``."""

    def __init__(self, in_size, hid_size, out_size):
        super().__init__()
        self.conv1 = dglnn.GraphConv(in_size, hid_size)
        self.conv2 = dglnn.GraphConv(hid_size, out_size)

    def forward(self, g, x, training):
        h = F.relu(self.conv1(g, F.dropout(x, 0.5, training)))
        return self.conv2(g, F.dropout(h, 0.5, training))


class JKMean(nn.Module):
    """Every layer's output averaged with ``torch.stack(hs).mean(0)``; a ``x.dim()`` test."""

    def __init__(self, in_size, hid_size, out_size, num_layers=3):
        super().__init__()
        self.inp = nn.Linear(in_size, hid_size)
        self.layers = nn.ModuleList([dglnn.SAGEConv(hid_size, hid_size, "mean") for _ in range(num_layers)])
        self.out = nn.Linear(hid_size, out_size)
        self.dropout = nn.Dropout(0.3)

    def forward(self, g, x):
        if x.dim() > 2:
            x = x.flatten(1)
        h, hs = self.inp(x), []
        for layer in self.layers:
            h = self.dropout(F.relu(layer(g, h)))
            hs.append(h)
        return self.out(torch.stack(hs).mean(0))


class SAGELightning(nn.Module):
    """DGL's graphsage Lightning example: a LightningModule-like class whose ``forward`` calls
    the inner model (lightning itself is not installed)."""

    def __init__(self, in_feats, n_hidden, n_classes, lr=0.005):
        super().__init__()
        self.module = SAGE(in_feats, n_hidden, n_classes)
        self.lr = lr

    def forward(self, g, x):
        return self.module(g, x)

    def training_step(self, batch, batch_idx):
        g, x, y, mask = batch
        return F.cross_entropy(self(g, x)[mask], y[mask])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


# --- typed graphs ----------------------------------------------------------------------------
class RelGraphConvLayer(nn.Module):
    """examples/pytorch/rgcn-hetero/model.py's layer: GraphConv(norm='right') per relation
    with the relation's weight from a basis, a self-loop weight, activation, dropout."""

    def __init__(self, in_feat, out_feat, rel_names, num_bases, activation=None, self_loop=True, dropout=0.0):
        super().__init__()
        self.rel_names, self.activation, self.self_loop = rel_names, activation, self_loop
        self.conv = dglnn.HeteroGraphConv({
            rel: dglnn.GraphConv(in_feat, out_feat, norm="right", weight=False, bias=False, allow_zero_in_degree=True)
            for rel in rel_names})
        self.basis = dglnn.WeightBasis((in_feat, out_feat), num_bases, len(self.rel_names))
        self.h_bias = nn.Parameter(torch.zeros(out_feat))
        if self_loop:
            self.loop_weight = nn.Parameter(torch.empty(in_feat, out_feat))
            nn.init.xavier_uniform_(self.loop_weight, gain=nn.init.calculate_gain("relu"))
        self.dropout = nn.Dropout(dropout)

    def forward(self, g, inputs):
        g = g.local_var()
        weight = self.basis()
        wdict = {self.rel_names[i]: {"weight": w.squeeze(0)} for i, w in enumerate(torch.split(weight, 1, dim=0))}
        hs = self.conv(g, inputs, mod_kwargs=wdict)

        def _apply(ntype, h):
            if self.self_loop:
                h = h + torch.matmul(inputs[ntype], self.loop_weight)
            h = h + self.h_bias
            if self.activation:
                h = self.activation(h)
            return self.dropout(h)

        return {ntype: _apply(ntype, h) for ntype, h in hs.items()}


class RelGraphEmbed(nn.Module):
    """rgcn-hetero's embedding layer: a learnable table per node type in a ParameterDict."""

    def __init__(self, g, embed_size):
        super().__init__()
        self.embeds = nn.ParameterDict()
        for ntype in g.ntypes:
            embed = nn.Parameter(torch.empty(g.num_nodes(ntype), embed_size))
            nn.init.xavier_uniform_(embed, gain=nn.init.calculate_gain("relu"))
            self.embeds[ntype] = embed

    def forward(self, block=None):
        return self.embeds


class EntityClassify(nn.Module):
    """rgcn-hetero's model: the graph kept as ``self.g``, featureless types embedded,
    ``forward()`` with no argument for full-graph training; the category's rows out."""

    def __init__(self, g, h_dim, out_dim, num_bases, category, dropout=0.2):
        super().__init__()
        self.g, self.category = g, category
        self.rel_names = sorted(set(g.etypes))
        self.embed_layer = RelGraphEmbed(g, h_dim)
        self.layers = nn.ModuleList([
            RelGraphConvLayer(h_dim, h_dim, self.rel_names, num_bases, activation=F.relu, dropout=dropout),
            RelGraphConvLayer(h_dim, out_dim, self.rel_names, num_bases, activation=None),
        ])

    def forward(self, h=None, blocks=None):
        if blocks is None:
            h = self.embed_layer()
            for layer in self.layers:
                h = layer(self.g, h)
        return h[self.category]


class HeteroRGCNLayer(nn.Module):
    """The heterograph node-classification tutorial's layer: a Linear per relation, the
    messages in the graph's frames, ``multi_update_all``."""

    def __init__(self, in_size, out_size, etypes):
        super().__init__()
        self.weight = nn.ModuleDict({name: nn.Linear(in_size, out_size) for name in etypes})

    def forward(self, G, feat_dict):
        funcs = {}
        for srctype, etype, dsttype in G.canonical_etypes:
            Wh = self.weight[etype](feat_dict[srctype])
            G.nodes[srctype].data["Wh_%s" % etype] = Wh
            funcs[etype] = (fn.copy_u("Wh_%s" % etype, "m"), fn.mean("m", "h"))
        G.multi_update_all(funcs, "sum")
        return {ntype: G.nodes[ntype].data["h"] for ntype in G.ntypes}


class HeteroRGCN(nn.Module):
    """The tutorial's model: ``forward(G)``, every type embedded, the paper rows out."""

    def __init__(self, G, in_size, hidden_size, out_size):
        super().__init__()
        embed_dict = {ntype: nn.Parameter(torch.empty(G.num_nodes(ntype), in_size)) for ntype in G.ntypes}
        for embed in embed_dict.values():
            nn.init.xavier_uniform_(embed)
        self.embed = nn.ParameterDict(embed_dict)
        self.layer1 = HeteroRGCNLayer(in_size, hidden_size, G.etypes)
        self.layer2 = HeteroRGCNLayer(hidden_size, out_size, G.etypes)

    def forward(self, G):
        h_dict = self.layer1(G, self.embed)
        h_dict = {k: F.leaky_relu(h) for k, h in h_dict.items()}
        h_dict = self.layer2(G, h_dict)
        return h_dict["paper"]


class HGTLayer(nn.Module):
    """examples/pytorch/hgt/model.py's layer: per-type K/Q/V, relation attention and messages
    (``einsum("bij,ijk->bik")``), ``edge_softmax`` per relation, ``multi_update_all`` with a
    mean across relations, a gated skip, dropout."""

    def __init__(self, in_dim, out_dim, node_dict, edge_dict, n_heads, dropout=0.2):
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.node_dict, self.edge_dict = node_dict, edge_dict
        self.n_heads, self.d_k = n_heads, out_dim // n_heads
        self.sqrt_dk = math.sqrt(self.d_k)
        num_types, num_relations = len(node_dict), len(edge_dict)
        self.k_linears = nn.ModuleList([nn.Linear(in_dim, out_dim) for _ in range(num_types)])
        self.q_linears = nn.ModuleList([nn.Linear(in_dim, out_dim) for _ in range(num_types)])
        self.v_linears = nn.ModuleList([nn.Linear(in_dim, out_dim) for _ in range(num_types)])
        self.a_linears = nn.ModuleList([nn.Linear(out_dim, out_dim) for _ in range(num_types)])
        self.relation_pri = nn.Parameter(torch.ones(num_relations, n_heads))
        self.relation_att = nn.Parameter(torch.empty(num_relations, n_heads, self.d_k, self.d_k))
        self.relation_msg = nn.Parameter(torch.empty(num_relations, n_heads, self.d_k, self.d_k))
        self.skip = nn.Parameter(torch.ones(num_types))
        self.drop = nn.Dropout(dropout)
        nn.init.xavier_uniform_(self.relation_att)
        nn.init.xavier_uniform_(self.relation_msg)

    def forward(self, G, h):
        with G.local_scope():
            for srctype, etype, dsttype in G.canonical_etypes:
                sub_graph = G[srctype, etype, dsttype]
                k = self.k_linears[self.node_dict[srctype]](h[srctype]).view(-1, self.n_heads, self.d_k)
                v = self.v_linears[self.node_dict[srctype]](h[srctype]).view(-1, self.n_heads, self.d_k)
                q = self.q_linears[self.node_dict[dsttype]](h[dsttype]).view(-1, self.n_heads, self.d_k)
                e_id = self.edge_dict[etype]
                k = torch.einsum("bij,ijk->bik", k, self.relation_att[e_id])
                v = torch.einsum("bij,ijk->bik", v, self.relation_msg[e_id])
                sub_graph.srcdata["k"] = k
                sub_graph.dstdata["q"] = q
                sub_graph.srcdata["v_%d" % e_id] = v
                sub_graph.apply_edges(fn.v_dot_u("q", "k", "t"))
                attn_score = sub_graph.edata.pop("t").sum(-1) * self.relation_pri[e_id] / self.sqrt_dk
                attn_score = edge_softmax(sub_graph, attn_score, norm_by="dst")
                sub_graph.edata["t"] = attn_score.unsqueeze(-1)
            G.multi_update_all({etype: (fn.u_mul_e("v_%d" % e_id, "t", "m"), fn.sum("m", "t"))
                                for etype, e_id in self.edge_dict.items()}, cross_reducer="mean")
            new_h = {}
            for ntype in G.ntypes:
                n_id = self.node_dict[ntype]
                alpha = torch.sigmoid(self.skip[n_id])
                t = G.nodes[ntype].data["t"].view(-1, self.out_dim)
                trans_out = self.drop(self.a_linears[n_id](t))
                new_h[ntype] = trans_out * alpha + h[ntype] * (1 - alpha)
            return new_h


class HGT(nn.Module):
    """examples/pytorch/hgt/model.py: inputs read from the frames ``G.nodes[t].data['inp']``,
    ``forward(G, out_key)`` with the target type named by a string."""

    def __init__(self, G, n_inp, n_hid, n_out, n_layers, n_heads):
        super().__init__()
        self.node_dict = {ntype: i for i, ntype in enumerate(G.ntypes)}
        self.edge_dict = {etype: i for i, etype in enumerate(G.etypes)}
        self.adapt_ws = nn.ModuleList([nn.Linear(n_inp, n_hid) for _ in G.ntypes])
        self.gcs = nn.ModuleList([HGTLayer(n_hid, n_hid, self.node_dict, self.edge_dict, n_heads)
                                  for _ in range(n_layers)])
        self.out = nn.Linear(n_hid, n_out)

    def forward(self, G, out_key):
        h = {}
        for ntype in G.ntypes:
            h[ntype] = F.gelu(self.adapt_ws[self.node_dict[ntype]](G.nodes[ntype].data["inp"]))
        for layer in self.gcs:
            h = layer(G, h)
        return self.out(h[out_key])


class SemanticAttention(nn.Module):
    """examples/pytorch/han/model.py: attention over the metapaths, its weights averaged over
    all nodes."""

    def __init__(self, in_size, hidden_size=16):
        super().__init__()
        self.project = nn.Sequential(nn.Linear(in_size, hidden_size), nn.Tanh(), nn.Linear(hidden_size, 1, bias=False))

    def forward(self, z):
        w = self.project(z).mean(0)  # (M, 1)
        beta = torch.softmax(w, dim=0)
        beta = beta.expand((z.shape[0],) + beta.shape)
        return (beta * z).sum(1)


class HANLayer(nn.Module):
    """HAN's layer: a GATConv per metapath graph, stacked on a new axis 1, semantic attention."""

    def __init__(self, num_meta_paths, in_size, out_size, layer_num_heads, dropout):
        super().__init__()
        self.gat_layers = nn.ModuleList([dglnn.GATConv(in_size, out_size, layer_num_heads, dropout, dropout,
                                                       activation=F.elu) for _ in range(num_meta_paths)])
        self.semantic_attention = SemanticAttention(out_size * layer_num_heads)

    def forward(self, gs, h):
        semantic_embeddings = [layer(g, h).flatten(1) for g, layer in zip(gs, self.gat_layers)]
        return self.semantic_attention(torch.stack(semantic_embeddings, dim=1))


class HAN(nn.Module):
    """examples/pytorch/han/model.py: ``forward(g, h)`` with ``g`` a list of metapath graphs."""

    def __init__(self, num_meta_paths, in_size, hidden_size, out_size, num_heads=(4,), dropout=0.6):
        super().__init__()
        self.layers = nn.ModuleList([HANLayer(num_meta_paths, in_size, hidden_size, num_heads[0], dropout)])
        for l in range(1, len(num_heads)):
            self.layers.append(HANLayer(num_meta_paths, hidden_size * num_heads[l - 1], hidden_size, num_heads[l],
                                        dropout))
        self.predict = nn.Linear(hidden_size * num_heads[-1], out_size)

    def forward(self, g, h):
        for gnn in self.layers:
            h = gnn(g, h)
        return self.predict(h)


class TypedHGT(nn.Module):
    """``dgl.nn.HGTConv`` on the homogeneous form (its own dropout), node and edge types given."""

    def __init__(self, in_size, head_size, num_heads, num_ntypes, num_etypes, out_size):
        super().__init__()
        self.conv1 = dglnn.HGTConv(in_size, head_size, num_heads, num_ntypes, num_etypes, dropout=0.2)
        self.conv2 = dglnn.HGTConv(head_size * num_heads, head_size, num_heads, num_ntypes, num_etypes, dropout=0.2)
        self.out = nn.Linear(head_size * num_heads, out_size)

    def forward(self, g, x, ntype, etype):
        h = F.relu(self.conv1(g, x, ntype, etype))
        return self.out(self.conv2(g, h, ntype, etype))


class EntityRGCN(nn.Module):
    """examples/pytorch/rgcn/entity.py: every node embedded (``self.emb``), relation types and
    normalisers read from the graph's edge frames."""

    def __init__(self, num_nodes, h_dim, out_dim, num_rels):
        super().__init__()
        self.emb = nn.Embedding(num_nodes, h_dim)
        self.conv1 = dglnn.RelGraphConv(h_dim, h_dim, num_rels, regularizer="basis", num_bases=num_rels,
                                        self_loop=False, dropout=0.2)
        self.conv2 = dglnn.RelGraphConv(h_dim, out_dim, num_rels, regularizer="basis", num_bases=num_rels,
                                        self_loop=False)

    def forward(self, g):
        x = self.emb.weight
        h = F.relu(self.conv1(g, x, g.edata[dgl.ETYPE], g.edata["norm"]))
        return self.conv2(g, h, g.edata[dgl.ETYPE], g.edata["norm"])
