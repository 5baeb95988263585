"""DGL models that read their inputs from the graph's frames (``g.ndata["feat"]``,
``g.edata[dgl.ETYPE]`` / ``g.edata["norm"]``, ``G.nodes[t].data["inp"]``), set by the script
before ``model(g)``: exact against eager DGL (outputs, the frame tensors' gradients,
parameter gradients) on one machine -- given the DGL graph itself or ``sc.Graph.from_dgl`` of
it -- and on 2 and 3 workers, where ``sc.load_partition`` fills ``part.graph``'s node frames
and the worker sets its edge frames in the shard's edge order. Runs in the DGL environment
(``scripts/dgl_env.sh``)."""

from __future__ import annotations

import pytest

dgl = pytest.importorskip("dgl")

import dgl.nn as dglnn
import torch
import torch.nn.functional as F
from torch import nn

import sarcompile as sc

TOL = 1e-9
DT = torch.float64
N = 19
RELS = 3
TYPES = {"paper": 11, "author": 7}


class FrameGCN(nn.Module):
    """``forward(g)``: the features read from ``g.ndata['feat']``."""

    def __init__(self):
        super().__init__()
        self.conv1 = dglnn.GraphConv(6, 8, activation=F.relu)
        self.conv2 = dglnn.GraphConv(8, 3)

    def forward(self, g):
        return self.conv2(g, self.conv1(g, g.ndata["feat"]))


class FrameRGCN(nn.Module):
    """rgcn/entity.py's use of the frames: relation types and normalisers read from ``g.edata``."""

    def __init__(self):
        super().__init__()
        self.conv1 = dglnn.RelGraphConv(6, 8, RELS, regularizer="basis", num_bases=2)
        self.conv2 = dglnn.RelGraphConv(8, 3, RELS, self_loop=False)

    def forward(self, g, x):
        h = F.relu(self.conv1(g, x, g.edata[dgl.ETYPE], g.edata["norm"]))
        return self.conv2(g, h, g.edata[dgl.ETYPE], g.edata["norm"])


class FrameHetero(nn.Module):
    """hgt/model.py's use of the frames: every type's input read from ``G.nodes[t].data['inp']``,
    the target type named by a string."""

    def __init__(self, hg):
        super().__init__()
        self.adapt = nn.ModuleDict({t: nn.Linear(5, 8) for t in hg.ntypes})
        self.conv = dglnn.HeteroGraphConv({r: dglnn.GraphConv(8, 3, norm="right", allow_zero_in_degree=True)
                                           for r in hg.etypes}, aggregate="sum")

    def forward(self, G, out_key):
        h = {t: torch.tanh(self.adapt[t](G.nodes[t].data["inp"])) for t in G.ntypes}
        return self.conv(G, h)[out_key]


def _homogeneous(seed: int):
    gen = torch.Generator().manual_seed(seed)
    g = dgl.graph((torch.randint(0, N, (70,), generator=gen), torch.randint(0, N, (70,), generator=gen)), num_nodes=N)
    g = dgl.add_self_loop(dgl.remove_self_loop(g))
    e = g.num_edges()
    data = {"feat": torch.randn(N, 6, generator=gen, dtype=DT), "w": torch.randn(N, 3, generator=gen, dtype=DT),
            "etype": torch.randint(0, RELS, (e,), generator=gen), "norm": torch.rand(e, 1, generator=gen, dtype=DT)}
    return g, data


def _heterograph(seed: int):
    gen = torch.Generator().manual_seed(seed)

    def edges(src: str, dst: str, count: int):
        return (torch.randint(0, TYPES[src], (count,), generator=gen), torch.randint(0, TYPES[dst], (count,),
                                                                                    generator=gen))

    hg = dgl.heterograph({("author", "writes", "paper"): edges("author", "paper", 20),
                          ("paper", "written_by", "author"): edges("paper", "author", 15),
                          ("paper", "cites", "paper"): edges("paper", "paper", 25)}, num_nodes_dict=TYPES)
    data = {"inp": {t: torch.randn(n, 5, generator=gen, dtype=DT) for t, n in TYPES.items()},
            "w": torch.randn(TYPES["paper"], 3, generator=gen, dtype=DT)}
    return hg, data


def _model(name: str, hg=None) -> nn.Module:
    torch.manual_seed(3)
    return {"gcn": FrameGCN, "rgcn": FrameRGCN}[name]().double() if hg is None else FrameHetero(hg).double()


def _step(model: nn.Module, run: nn.Module, name: str, g, data: dict, shard: bool = False) -> dict:
    """Set the frames as a script does (the node features requiring grad), call, backward."""
    if name == "hetero":
        inp = {t: v.clone().requires_grad_(True) for t, v in data["inp"].items()}
        for t, v in inp.items():
            g.nodes[t].data["inp"] = v
        out = run(g, "paper")
        grads = lambda: {t: v.grad for t, v in inp.items()}  # noqa: E731
    else:
        feat = data["feat"].clone().requires_grad_(True)
        norm = data["norm"].clone().requires_grad_(True)
        g.edata[dgl.ETYPE], g.edata["norm"] = data["etype"], norm
        if name == "gcn":
            g.ndata["feat"] = feat
            out = run(g)
        else:
            out = run(g, feat)
        grads = lambda: {"feat": feat.grad} | ({"norm": norm.grad} if name == "rgcn" else {})  # noqa: E731
    (out * data["w"]).sum().backward()
    # (a relation into the types not returned gives its layer no gradient: zeros, summed alike)
    params = {k: torch.zeros_like(p) if p.grad is None else p.grad for k, p in model.named_parameters()}
    return {"out": out.detach(), "grads": grads(),
            "params": {k: sc.global_sum(v) if shard else v for k, v in params.items()}}


def _close(got: dict, want: dict, what: str) -> None:
    for key in ("out", "grads", "params"):
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=TOL, msg=lambda m: f"{what}: {key}: {m}")


NAMES = ["gcn", "rgcn", "hetero"]


def _eager(name: str, seed: int):
    g, data = _heterograph(seed) if name == "hetero" else _homogeneous(seed)
    model = _model(name, g if name == "hetero" else None)
    return g, data, model, _step(model, model, name, g, data)


@pytest.mark.parametrize("name", NAMES)
def test_a_model_reading_the_frames_matches_dgl_on_one_machine(name):
    g, data, model, want = _eager(name, 0)
    for given in ("dgl", "sc"):
        model.zero_grad()
        graph = g if given == "dgl" else (sc.HeteroGraph if name == "hetero" else sc.Graph).from_dgl(g)
        _close(_step(model, sc.distribute(model), name, graph, data), want, f"{name}, {given} graph")


def _worker(rank: int, world_size: int, payload: dict) -> dict:
    part = sc.load_partition(payload["dir"], rank=rank, world_size=world_size)
    name, data = payload["name"], payload["data"]
    if name == "hetero":
        assert all(torch.equal(part.graph.nodes[t].data["inp"], data["inp"][t][part.global_ids[t]]) for t in TYPES)
        local = {"inp": {t: part.graph.nodes[t].data["inp"] for t in TYPES}, "w": data["w"][part.global_ids["paper"]]}
    else:
        assert torch.equal(part.graph.ndata["feat"], data["feat"][part.global_ids])
        edges = part.graph.edge_ids.long()  # the shard's edges, as ids of the whole graph's
        local = {"feat": part.graph.ndata["feat"], "w": data["w"][part.global_ids], "etype": data["etype"][edges],
                 "norm": data["norm"][edges]}
    model = payload["model"]
    result = _step(model, sc.distribute(model), name, part.graph, local, shard=True)
    return result | {"ids": part.global_ids, "edges": None if name == "hetero" else part.graph.edge_ids.long()}


def _gathered(results: list[dict], want: dict, name: str) -> dict:
    """The workers' outputs and frame gradients put back in the whole graph's rows."""
    def put(like, pieces):
        full = torch.zeros_like(like)
        for rows, value in pieces:
            full[rows] = value
        return full

    if name == "hetero":
        grads = {t: put(want["grads"][t], [(r["ids"][t], r["grads"][t]) for r in results]) for t in TYPES}
        out = put(want["out"], [(r["ids"]["paper"], r["out"]) for r in results])
    else:
        rows = {"feat": "ids", "norm": "edges"}
        grads = {k: put(v, [(r[rows[k]], r["grads"][k]) for r in results]) for k, v in want["grads"].items()}
        out = put(want["out"], [(r["ids"], r["out"]) for r in results])
    return {"out": out, "grads": grads}


@pytest.mark.parametrize("world", [2, 3])
def test_a_model_reading_the_frames_of_part_graph_is_exact_on_workers(pool, tmp_path_factory, world):
    for name in NAMES:
        g, data, model, want = _eager(name, world)
        out_dir = tmp_path_factory.mktemp(f"frames_{name}")
        if name == "hetero":
            sc.partition(sc.HeteroGraph.from_dgl(g), world, out_dir, node_data={t: {"inp": v} for t, v in
                                                                                  data["inp"].items()})
        else:
            sc.partition(sc.Graph.from_dgl(g), world, out_dir, node_data={"feat": data["feat"]})
        results = pool(world).run(_worker, [{"dir": str(out_dir), "name": name, "data": data, "model": model}] * world)
        for r in results:
            torch.testing.assert_close(r["params"], want["params"], rtol=0, atol=TOL, msg=f"{name}: parameter grads")
        got = _gathered(results, want, name)
        for key in ("out", "grads"):
            torch.testing.assert_close(got[key], want[key], rtol=0, atol=TOL, msg=f"{name}, {world} workers: {key}")


def test_a_field_the_graph_does_not_have_is_refused_naming_it_and_the_fields_it_has():
    g, data = _homogeneous(0)
    graph = sc.Graph.from_dgl(g)
    graph.ndata["x"] = data["feat"]  # not 'feat', which forward reads
    with pytest.raises(sc.CompileError, match=r"g.ndata\['feat'\]: the graph has no such field \(its fields: "
                                              r"\['x'\]\)\. Set it before calling the model.*test_dgl_frames.py"):
        sc.distribute(_model("gcn"))(graph)
    hg, hdata = _heterograph(0)
    with pytest.raises(sc.CompileError, match=r"G.nodes\['author'\].data\['inp'\]: the graph has no such field"):
        sc.distribute(_model("hetero", hg))(hg, "paper")


def test_the_program_is_keyed_by_the_fields_the_graph_has():
    g, data, model, want = _eager("gcn", 0)
    compiled = sc.distribute(model)
    graph = sc.Graph.from_dgl(g)
    model.zero_grad()
    _close(_step(model, compiled, "gcn", graph, data), want, "first call")
    graph.ndata["extra"] = torch.zeros(N, 2, dtype=DT)  # another field: another program, the same answer
    model.zero_grad()
    _close(_step(model, compiled, "gcn", graph, data), want, "with another field")
    assert len(compiled._programs) == 2
