"""Node tables found by use: a parameter whose rows a typed model uses as a featureless
type's features is that type's node table whatever its name -- ``self.author_emb``'s weight,
a ``ParameterDict`` entry under another key, a bare ``nn.Parameter``, an embedding looked up
by ``torch.arange(n)`` or by the type's ids -- and each worker holds, updates and gets the
gradient of its own rows only. Parameters whose first size only happens to equal a type's
node count (per-relation vectors indexed by a constant, attention vectors broadcast over
rows) stay parameters. Against the eager model on the whole graph, float64: every output
row, the features' gradient, every parameter's gradient and every table's gradient rows."""

from __future__ import annotations

import pytest
import torch
from hetero_cases import CHANNELS, HEADS, RelationNet, inputs
from torch import nn

import sarcompile as sc
from sarcompile.graph.hetero import relation_key

TOL = 1e-9
# 5 relations (RelationNet aggregates the fifth with attention, whose [2, 3] vectors have as
# many rows as 'field' has nodes), and as many relations as 'author' has nodes: the
# per-relation scales below have the authors' row count
COUNTS = {"paper": 9, "author": 5, "field": 2}
EDGES = {
    ("author", "writes", "paper"): ([0, 1, 1, 2, 4, 3], [0, 0, 2, 3, 8, 5]),
    ("paper", "cites", "paper"): ([1, 2, 3, 3, 7, 8, 5], [0, 0, 1, 3, 6, 2, 5]),
    ("field", "of", "paper"): ([0, 1, 1], [1, 4, 7]),
    ("paper", "rev_writes", "author"): ([0, 0, 2, 3, 8], [0, 1, 1, 2, 4]),
    ("paper", "has", "field"): ([1, 4, 7, 6], [0, 1, 1, 0]),
}
# how each featureless type's table is fed, per case
FORMS = [
    {"author": "weight", "field": "parameter"},
    {"author": "parameter_dict", "field": "arange"},
    {"author": "global_ids", "field": "parameter_dict"},
    {"author": "arange", "field": "weight"},
]


def graph() -> sc.HeteroGraph:
    return sc.HeteroGraph.from_edges({r: (torch.tensor(s), torch.tensor(d)) for r, (s, d) in EDGES.items()}, COUNTS)


class UseNet(RelationNet):
    """:class:`~hetero_cases.RelationNet` whose featureless types (``forms``' keys) are fed by
    tables no type names: ``weight``: ``self.<type>_emb.weight``; ``arange``:
    ``self.<type>_emb(torch.arange(n))``; ``global_ids``: ``self.<type>_emb(g.global_ids[type])``;
    ``parameter``: a bare ``self.<type>_x``; ``parameter_dict``: ``self.free["k<i>"]``. Each
    output is scaled by a per-relation vector read by position, of the authors' row count."""

    def __init__(self, g: sc.HeteroGraph, forms: dict[str, str], f_in: int = 4):
        super().__init__(g, f_in)
        self.forms = forms
        self.counts = {t: g.num_nodes(t) for t in forms}
        self.free = nn.ParameterDict()
        for t, form in forms.items():
            if form == "parameter_dict":
                self.free[f"k{len(self.free)}"] = nn.Parameter(torch.randn(self.counts[t], f_in))
            elif form == "parameter":
                setattr(self, f"{t}_x", nn.Parameter(torch.randn(self.counts[t], f_in)))
            else:
                setattr(self, f"{t}_emb", nn.Embedding(self.counts[t], f_in))
        self.scale = nn.Embedding(len(g.edge_types), HEADS * CHANNELS)

    def forward(self, g, x: dict[str, torch.Tensor], edge_weight: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        x = dict(x)
        keys = iter(self.free)
        for t, form in self.forms.items():
            if form == "weight":
                x[t] = getattr(self, f"{t}_emb").weight
            elif form == "arange":
                x[t] = getattr(self, f"{t}_emb")(torch.arange(self.counts[t]))
            elif form == "global_ids":
                x[t] = getattr(self, f"{t}_emb")(g.global_ids[t])
            elif form == "parameter":
                x[t] = getattr(self, f"{t}_x")
            else:
                x[t] = self.free[next(keys)]
        out = super().forward(g, x, edge_weight)
        return {t: v * self.scale.weight[i] for i, (t, v) in enumerate(out.items())}

    def tables(self) -> dict[str, str]:
        """``{parameter name: node type}`` of its node tables."""
        keys = iter(self.free)
        return {(f"free.{next(keys)}" if form == "parameter_dict" else f"{t}_x" if form == "parameter"
                 else f"{t}_emb.weight"): t for t, form in self.forms.items()}


def step(model: nn.Module, g, data: dict, ids: dict | None, tables: dict[str, str], pyg: bool = False) -> dict:
    """Forward (``model(g, x, edge_weight)``, or as PyG calls it, ``model(x_dict, g)``), a
    loss weighted per row, backward, on the rows of ``ids`` (all when None): outputs, the
    features' gradient, the gradient of each node table (its rows here) and of every other
    parameter (summed over the workers)."""
    pick = (lambda t, v: v) if ids is None else (lambda t, v: v[ids[t]])
    x = {t: pick(t, v).clone().requires_grad_() for t, v in data["x"].items()}
    if pyg:
        out = model(x, g)
    else:
        out = model(g, x, data["edge_weight"] if ids is None else {
            relation_key(r): data["edge_weight"][relation_key(r)][rg.edge_ids] for r, rg in g.items()})
    loss = sum((out[t] * pick(t, data["loss"][t])).sum() for t in out)
    model.zero_grad()
    loss.backward()
    grads = {k: torch.zeros_like(p) if p.grad is None else p.grad.clone() for k, p in model.named_parameters()}
    return {
        "out": {t: v.detach() for t, v in out.items()},
        "x_grad": {t: v.grad for t, v in x.items()},
        "table_grads": {k: grads[k] for k in tables},
        "table_rows": {k: model.get_parameter(k).shape[0] for k in tables},
        "param_grads": {k: sc.global_sum(v) if ids is not None else v for k, v in grads.items() if k not in tables},
    }


class PygTables(nn.Module):
    """A PyG model as ogbn-mag's examples write it: HeteroConv layers over the papers'
    features and learnable tables for the featureless authors and fields, named as their
    author pleased."""

    def __init__(self):
        super().__init__()
        gnn = pytest.importorskip("torch_geometric.nn")
        self.author_emb = nn.Embedding(COUNTS["author"], 3)
        self.field_emb = nn.Embedding(COUNTS["field"], 2)
        self.conv1 = gnn.HeteroConv({
            ("author", "writes", "paper"): gnn.SAGEConv((3, 4), 8),
            ("paper", "rev_writes", "author"): gnn.GATConv((4, 3), 4, heads=2, add_self_loops=False),
            ("paper", "cites", "paper"): gnn.GATConv(4, 8, heads=1),
            ("paper", "has", "field"): gnn.SAGEConv((4, 2), 8, aggr="max"),
            ("field", "of", "paper"): gnn.GraphConv((2, 4), 8),
        }, aggr="sum")
        self.conv2 = gnn.HeteroConv({
            ("author", "writes", "paper"): gnn.SAGEConv(8, 5),
            ("paper", "cites", "paper"): gnn.GraphConv(8, 5),
            ("paper", "rev_writes", "author"): gnn.GraphConv(8, 5, aggr="mean"),
        }, aggr="mean")

    def forward(self, x_dict, edge_index_dict):
        x_dict = {**x_dict, "author": self.author_emb.weight, "field": self.field_emb.weight}
        h = {k: v.relu() for k, v in self.conv1(x_dict, edge_index_dict).items()}
        return self.conv2(h, edge_index_dict)

    def tables(self) -> dict[str, str]:
        return {"author_emb.weight": "author", "field_emb.weight": "field"}


def run_worker(rank: int, world_size: int, payload: dict) -> dict:
    part = sc.load_partition(payload["dir"], rank=rank, world_size=world_size)
    model = payload["model"]
    tables = model.tables()
    result = step(sc.distribute(model), part.graph, payload["data"], part.global_ids, tables, payload["pyg"])
    return {**result, "ids": part.global_ids}


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(got, want, atol=TOL * max(1.0, want.abs().max().item() if want.numel() else 0),
                               rtol=0, msg=what)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_tables_of_any_name_train_exactly_on_their_rows_workers(pool, tmp_path, world):
    forms = FORMS[world - 1]
    g = graph()
    torch.manual_seed(world)
    data = inputs(g, world)
    data["x"] = {t: v for t, v in data["x"].items() if t not in forms}
    _check(pool, tmp_path, UseNet(g, forms).double(), g, data, world)


def test_a_pyg_model_with_tables_of_any_name_trains_exactly(pool, tmp_path):
    model = PygTables().double()
    g = graph()
    data = inputs(g, 0)
    data["x"] = {"paper": data["x"]["paper"]}
    data["loss"] = {t: data["loss"][t][:, :5] for t in ("paper", "author")}
    edge_index = {r: torch.stack([torch.tensor(s), torch.tensor(d)]) for r, (s, d) in EDGES.items()}
    _check(pool, tmp_path, model, g, data, 3, edge_index)


def _check(pool, tmp_path, model: nn.Module, g: sc.HeteroGraph, data: dict, world: int,
           pyg_edge_index: dict | None = None) -> None:
    """The model eagerly on the whole graph against it compiled on one machine and on
    ``world`` workers (PyG's calling convention where ``pyg_edge_index`` is given)."""
    pyg = pyg_edge_index is not None
    tables = model.tables()
    want = step(model, pyg_edge_index if pyg else g, data, None, tables, pyg)
    one = step(sc.distribute(model), g, data, None, tables, pyg)
    for key in ("out", "x_grad", "table_grads", "param_grads"):
        for k, full in want[key].items():
            _close(one[key][k], full, f"one machine: {key} of {k}")
    sc.partition(g, world, tmp_path, method="random", seed=world)
    payload = {"dir": str(tmp_path), "model": model, "data": data, "pyg": pyg}
    results = pool(world).run(run_worker, [payload] * world)
    for key, of in [("out", lambda k: k), ("x_grad", lambda k: k), ("table_grads", tables.get)]:
        for k, full in want[key].items():
            got = torch.full_like(full, float("nan"))
            for r in results:
                got[r["ids"][of(k)]] = r[key][k]
            _close(got, full, f"{world} workers: {key} of {k}")
    for r in results:
        assert r["table_rows"] == {k: r["ids"][t].numel() for k, t in tables.items()}  # its own rows only
        assert r["param_grads"].keys() == want["param_grads"].keys()  # scale and attention: parameters
        for k, full in want["param_grads"].items():
            _close(r["param_grads"][k], full, f"{world} workers: gradient of {k}")


def test_a_refusal_past_a_table_found_by_use_is_the_one_reported():
    class Pooled(UseNet):
        def forward(self, g, x, edge_weight):
            out = super().forward(g, x, edge_weight)
            return {**out, "paper": out["paper"] - out["paper"].max(0).values}

    g = graph()
    data = inputs(g, 0)
    with pytest.raises(sc.CompileError, match=r"^max over dim 0 reduces over the node axis"):
        sc.distribute(Pooled(g, FORMS[0]).double())(g, {"paper": data["x"]["paper"]}, data["edge_weight"])


def test_parameters_only_shaped_like_a_table_stay_parameters():
    class Shaped(UseNet):
        """Beside a table found by use, two parameters with as many rows as 'author' has
        nodes, used as constants: a [5, 5] mixing matrix and a [5, 6] bias summed over
        its rows (whose use runs either way: what compiles is kept)."""

        def __init__(self, g):
            super().__init__(g, {"author": "weight"})
            self.mix = nn.Parameter(torch.randn(5, 5))
            self.bias = nn.Parameter(torch.randn(5, HEADS * CHANNELS))

        def forward(self, g, x, edge_weight):
            out = super().forward(g, x, edge_weight)
            mixed = out["author"][:, :5] @ self.mix
            return {**out, "author": out["author"] + self.bias.sum(0) + mixed.sum(-1, keepdim=True)}

    g = graph()
    model = Shaped(g).double()
    data = inputs(g, 0)
    data["x"].pop("author")
    want = step(model, g, data, None, model.tables())
    compiled = sc.distribute(model)
    got = step(compiled, g, data, None, model.tables())
    for key in ("out", "x_grad", "table_grads", "param_grads"):
        for k, full in want[key].items():
            _close(got[key][k], full, f"{key} of {k}")
    assert compiled.program(False, stages=False).tables == {"author_emb.weight": "author"}


# -- one-type graphs: the graph's nodes as the single type ---------------------------------------
N = 10  # nodes of the one-type graph; EntityNet's look-alikes have as many rows
ONE_TYPE_EDGES = ([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 3, 5, 2, 8, 0], [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 0, 0, 2, 7, 3, 5])


class EntityNet(nn.Module):
    """Featureless nodes fed by a table, as DGL's RGCN entity example writes it (``x =
    self.emb.weight``; ``form``: ``weight``, ``arange`` -- ``self.emb(torch.arange(n))`` --
    or ``global_ids`` -- ``self.emb(g.global_ids)``), and two look-alikes with as many rows
    as the graph has nodes, used as constants: a [N, N] mixing matrix and a [N, 3] bias
    summed over its rows."""

    def __init__(self, form: str):
        super().__init__()
        self.form = form
        self.emb = nn.Embedding(N, 4)
        self.conv1 = sc.nn.SAGEConv(4, N, "mean")
        self.conv2 = sc.nn.GCNConv(N, 3)
        self.mix = nn.Parameter(torch.randn(N, N))
        self.bias = nn.Parameter(torch.randn(N, 3))

    def forward(self, g):
        if self.form == "weight":
            x = self.emb.weight
        elif self.form == "arange":
            x = self.emb(torch.arange(N))
        else:
            x = self.emb(g.global_ids)
        h = torch.relu(self.conv1(g, x)) @ self.mix
        return self.conv2(g, h) + self.bias.sum(0)


def one_type_step(model: nn.Module, g, loss: torch.Tensor) -> dict:
    """``model(g)``, a loss weighted per row (``loss``: this worker's rows), backward: the
    output, the table's gradient (its rows here) and every other parameter's gradient."""
    out = model(g)
    model.zero_grad()
    (out * loss).sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    return {"out": out.detach(), "table": grads.pop("emb.weight"), "params": grads,
            "rows": model.get_parameter("emb.weight").shape[0]}


def run_one_type_worker(rank: int, world_size: int, payload: dict) -> dict:
    part = sc.load_partition(payload["dir"], rank=rank, world_size=world_size)
    result = one_type_step(sc.distribute(payload["model"]), part.graph, payload["loss"][part.global_ids])
    return {**result, "params": {k: sc.global_sum(v) for k, v in result["params"].items()}, "ids": part.global_ids}


@pytest.mark.parametrize("world, form", [(1, "global_ids"), (2, "weight"), (3, "arange")])
def test_a_one_type_graphs_table_trains_exactly_on_its_rows_workers(pool, tmp_path, world, form):
    g = sc.Graph.from_edges(*map(torch.tensor, ONE_TYPE_EDGES), N)
    torch.manual_seed(world)
    model = EntityNet(form).double()
    loss = torch.randn(N, 3, dtype=torch.float64)
    want = one_type_step(model, g, loss)
    compiled = sc.distribute(model)
    one = one_type_step(compiled, g, loss)
    assert compiled.program(False, stages=False).tables == {"emb.weight": ""}  # mix and bias stay parameters
    for key in ("out", "table"):
        _close(one[key], want[key], f"one machine: {key}")
    for k, full in want["params"].items():
        _close(one["params"][k], full, f"one machine: gradient of {k}")
    sc.partition(g, world, tmp_path, method="random", seed=world)
    results = pool(world).run(run_one_type_worker, [{"dir": str(tmp_path), "model": model, "loss": loss}] * world)
    for key in ("out", "table"):
        got = torch.full_like(want[key], float("nan"))
        for r in results:
            got[r["ids"]] = r[key]
        _close(got, want[key], f"{world} workers: {key}")
    for r in results:
        assert r["rows"] == r["ids"].numel()  # its own rows only
        for k, full in want["params"].items():
            _close(r["params"][k], full, f"{world} workers: gradient of {k}")
