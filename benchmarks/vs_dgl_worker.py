"""One run of the DGL comparison (started by benchmarks/vs_dgl.py): one engine, one model.

SAGE and GAT run on a one-type graph; RGCN (DGL's ogbn-mag example model, and
sarcompile.train.typed_models.RGCN) on a MAG-like typed graph, predicting the papers' classes.

    python benchmarks/vs_dgl_worker.py --engine dgl --graph g.pt --model sage --out r.json      # DGL env
    python benchmarks/vs_dgl_worker.py --engine sarcompile --parts parts1 --model gat --out r.json
    torchrun --standalone --nproc-per-node 4 benchmarks/vs_dgl_worker.py --engine sarcompile --parts parts4 ...

It reads its *floor* -- the resident size after importing torch and the engine and after
torch's lazy optimizer imports (a throwaway optimizer takes a step) -- then loads the graph,
builds the model and Adam, trains one warm-up epoch and ``--epochs`` timed ones, and records
the peak resident size above the floor (``VmHWM`` since the floor was read), the median
epoch, and, for sarcompile, a measured ledger of where the memory went next to the plan's
estimate. Every process writes its own JSON record; the driver joins them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from sarcompile.dist.memory import floor_bytes, malloc_stats, status_bytes  # noqa: E402  (torch 2.2 too: no DGL import)
from turns import Turns  # noqa: E402  (benchmarks/, this script's folder)


def _tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages among ``tensors``."""
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and not t.is_sparse:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


class Stack(torch.nn.Module):
    """Graph layers with a ReLU between them: the benchmark's SAGE, in either engine."""

    def __init__(self, convs):
        super().__init__()
        self.convs = torch.nn.ModuleList(convs)

    def forward(self, g, x):
        for i, conv in enumerate(self.convs):
            x = conv(g, x)
            x = torch.relu(x) if i < len(self.convs) - 1 else x
        return x


def _pairs(in_dim: int, hidden: int, classes: int) -> list[tuple[int, int]]:
    dims = [in_dim, hidden, hidden, classes]  # three layers
    return list(zip(dims, dims[1:]))


# -- DGL ---------------------------------------------------------------------------------------

def dgl_model(name: str, in_dim: int, hidden: int, classes: int):
    import dgl.nn as dglnn
    from torch import nn

    class GAT(nn.Module):
        def __init__(self):
            super().__init__()
            self.g1 = dglnn.GATConv(in_dim, hidden // 4, num_heads=4)
            self.g2 = dglnn.GATConv(hidden, classes, num_heads=1)

        def forward(self, g, x):
            h = torch.nn.functional.elu(self.g1(g, x).flatten(1))
            return self.g2(g, h).mean(1)

    if name == "sage":
        return Stack(dglnn.SAGEConv(a, b, "mean") for a, b in _pairs(in_dim, hidden, classes))
    return GAT()


class DglRGCNLayer(torch.nn.Module):
    """The relational layer of DGL's ogbn-mag RGCN example: per relation a GraphConv
    (norm="right": the mean over in-neighbours) with the relation's weight handed in,
    summed over the relations into a type (HeteroGraphConv), plus a self-loop weight and a
    bias. Only the types ``out_types`` are computed, as in sarcompile's model (the last
    layer: the target type only)."""

    def __init__(self, in_dims: dict, out_dim: int, edge_types: list, out_types: list):
        import dgl.nn as dglnn
        from torch import nn

        super().__init__()
        self.rels = [r for r in edge_types if r[2] in out_types]
        self.conv = dglnn.HeteroGraphConv({r: dglnn.GraphConv(in_dims[r[0]], out_dim, norm="right", weight=False,
                                                              bias=False, allow_zero_in_degree=True)
                                           for r in self.rels}, aggregate="sum")
        self.weight = nn.ParameterDict({"__".join(r): nn.Parameter(torch.empty(in_dims[r[0]], out_dim))
                                        for r in self.rels})
        self.loop = nn.ParameterDict({t: nn.Parameter(torch.empty(in_dims[t], out_dim)) for t in out_types})
        self.bias = nn.ParameterDict({t: nn.Parameter(torch.zeros(out_dim)) for t in out_types})
        for w in (*self.weight.values(), *self.loop.values()):
            nn.init.xavier_uniform_(w, gain=nn.init.calculate_gain("relu"))

    def forward(self, g, x: dict) -> dict:
        kwargs = {r[1]: {"weight": self.weight["__".join(r)]} for r in self.rels}  # (DGL keys them by name)
        # HeteroGraphConv runs a module for every relation of the graph it is given
        sub = g if len(self.rels) == len(g.canonical_etypes) else g.edge_type_subgraph(self.rels)
        out = self.conv(sub, {t: v for t, v in x.items() if t in sub.ntypes}, mod_kwargs=kwargs)
        return {t: out.get(t, 0) + x[t] @ self.loop[t] + self.bias[t] for t in self.loop}


class DglRGCN(torch.nn.Module):
    """DGL's ogbn-mag RGCN example as a full-graph model: learnable embeddings of the
    featureless types (HeteroEmbedding, as wide as the papers' features), two relational
    layers, ReLU and dropout between them; the papers' logits."""

    def __init__(self, g, in_dims: dict, hidden: int, classes: int, target: str, dropout: float, embed_dim: int):
        import dgl.nn as dglnn

        super().__init__()
        rels = list(g.canonical_etypes)
        self.featureless = [t for t in g.ntypes if t not in in_dims]
        self.embed = dglnn.HeteroEmbedding({t: g.num_nodes(t) for t in self.featureless}, embed_dim)
        dims = {**in_dims, **{t: embed_dim for t in self.featureless}}
        first = [t for t in g.ntypes if t == target or any(r[2] == target and r[0] == t for r in rels)]
        self.layer1 = DglRGCNLayer(dims, hidden, rels, first)
        self.layer2 = DglRGCNLayer({t: hidden for t in g.ntypes}, classes, rels, [target])
        self.target, self.dropout = target, dropout

    def forward(self, g, x: dict) -> torch.Tensor:
        h = {**x, **self.embed.weight}  # every node's own row of its type's table
        h = self.layer1(g, h)
        h = {t: torch.nn.functional.dropout(torch.relu(v), self.dropout, self.training) for t, v in h.items()}
        return self.layer2(g, h)[self.target]


def _dgl_inputs(a):
    """(graph, model input, labels, model) of the DGL run."""
    import dgl

    data = torch.load(a.graph)
    if a.model != "rgcn":
        g = dgl.graph((data["src"], data["dst"]), num_nodes=data["num_nodes"])
        torch.manual_seed(0)
        return g, data["x"], data["y"], dgl_model(a.model, data["x"].shape[1], a.hidden, a.classes)
    g = dgl.heterograph({tuple(r): (s, d) for r, (s, d) in data["edges"].items()}, data["num_nodes"])
    torch.manual_seed(0)
    width = data["x"].shape[1]
    model = DglRGCN(g, {"paper": width}, a.hidden, a.classes, "paper", a.dropout, embed_dim=width)
    return g, {"paper": data["x"]}, data["y"], model


def run_dgl(a, turns: Turns) -> list[dict]:
    floor = floor_bytes()
    g, x, y, model = _dgl_inputs(a)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def step() -> float:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(g, x), y)
        loss.backward()
        opt.step()
        return float(loss)

    times, losses = _train(step, a.epochs, turns)
    return [{"engine": "dgl", "rank": 0, "world": 1, "floor_bytes": floor,
             "peak_above_floor_bytes": status_bytes("VmHWM") - floor, "epoch_s": statistics.median(times),
             "epoch_times": times,
             "losses": losses, "threads": torch.get_num_threads(), "torch": torch.__version__}]


def _train(step, epochs: int, turns: Turns) -> tuple[list[float], list[float]]:
    """The warm-up epoch (caches, optimizer state) and the timed ones, each timed one in its
    turn (benchmarks/turns.py) after an untimed one that brings the run back to its steady
    state from waiting; returns in the last turn, the report's."""
    losses = [step()]
    turns.give()
    times = []
    for _ in range(epochs):
        turns.take()
        if turns.driven:
            step()
        t0 = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - t0)
        turns.give()
    turns.take()
    return times, losses


# -- sarcompile --------------------------------------------------------------------------------

def sc_model(name: str, in_dim: int, hidden: int, classes: int):
    import sarcompile as sc
    from torch import nn

    class GAT(nn.Module):
        def __init__(self):
            super().__init__()
            # The graph has its self-loops already, as DGL's GATConv expects
            self.g1 = sc.nn.GATConv(in_dim, hidden // 4, heads=4, add_self_loops=False)
            self.g2 = sc.nn.GATConv(hidden, classes, heads=1, add_self_loops=False)

        def forward(self, g, x):
            return self.g2(g, torch.nn.functional.elu(self.g1(g, x)))

    if name == "sage":
        return Stack(sc.nn.SAGEConv(a, b, "mean") for a, b in _pairs(in_dim, hidden, classes))
    return GAT()


def _graph_tensors(graph) -> list:
    """Index tensors of a shard, everything its blocks cached (CSR, transpose, tiles, rows)
    and the graphs derived from it (with self-loops, edge subsets)."""
    from sarcompile.graph.graph import Tiles

    out = [graph.global_ids, graph.edge_ids, *graph.send_index]
    for b in graph.blocks:
        out += [v for v in vars(b).values() if isinstance(v, torch.Tensor)]
        out += [v for v in b._cache.values() if isinstance(v, torch.Tensor)]
        out += [t for v in b._cache.values() if isinstance(v, Tiles) for t in v.tensors()]
    for d in graph._derived.values():
        out += _graph_tensors(d)
    return out


def _typed_model(a, manifest):
    """sarcompile's RGCN (sarcompile.train.typed_models), the same layers as :class:`DglRGCN`."""
    from sarcompile.graph.hetero import parse_relation_key
    from sarcompile.train.typed_models import RGCN

    counts = {t: info["num_nodes"] for t, info in manifest.node_types.items()}
    width = manifest.node_types["paper"]["node_data"]["x"]["shape"][0]
    rels = [parse_relation_key(k) for k in manifest.edge_types]
    return RGCN(counts, rels, {"paper": width}, "paper", a.classes, a.hidden, 2, a.dropout, embed_dim=width)


def run_sarcompile(a, turns: Turns) -> list[dict]:
    import torch.distributed as dist

    import sarcompile as sc
    from sarcompile.data.manifest import read_manifest
    from sarcompile.dist import cpu_cache
    from sarcompile.dist.traffic import stats

    rank, world = sc.init()
    floor = floor_bytes()
    part = sc.load_partition(a.parts)
    # after loading: the part file is mapped, and its node rows are file-backed pages too
    code_floor = status_bytes("RssFile")
    manifest = read_manifest(a.parts)
    typed = manifest.typed
    data = part.node_data["paper"] if typed else part.node_data
    x, y = ({"paper": data["x"]} if typed else data["x"]), data["y"]
    loaded = status_bytes("VmRSS") - floor
    torch.manual_seed(0)
    net = _typed_model(a, manifest) if typed else sc_model(a.model, x.shape[1], a.hidden, a.classes)
    model = sc.distribute(net, blocks_in_flight=a.blocks_in_flight)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    estimate = model.plan(a.parts, optimizer=opt).memory_estimate()[rank]
    total = sc.global_sum(torch.tensor(float(y.numel())))
    saved = {"bytes": 0}

    def count_saved(t):
        saved["ids"].setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    ledgers = []  # per step: seconds computing, waiting on the exchange, in all-reduces, in the optimizer

    def step() -> float:
        start = time.perf_counter()
        stats.reset()
        opt.zero_grad()
        saved["ids"] = {}
        with torch.autograd.graph.saved_tensors_hooks(count_saved, lambda t: t):
            out = model(part.graph, x)
        saved["bytes"] = sum(saved["ids"].values())
        loss = torch.nn.functional.cross_entropy(out, y, reduction="sum") / total
        loss.backward()
        sc.sync_gradients(model)
        stepped = time.perf_counter()
        opt.step()
        done = time.perf_counter()
        ledgers.append(stats.time_ledger(done - start, done - stepped))
        return float(sc.global_sum(loss.detach()))

    times, losses = _train(step, a.epochs, turns)
    steady = ledgers[1:]  # the warm-up step left out, as from the times
    time_ledger = {k: statistics.median(d[k] for d in steady) for k in steady[0]}
    params = list(model.parameters())
    state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    shards = list(part.graph.relations.values()) if typed else [part.graph]
    ledger = {
        "node_data": _tensor_bytes(data.values()),
        "graph_structures": _tensor_bytes([t for shard in shards for t in _graph_tensors(shard)]),
        "parameters": _tensor_bytes(params),
        "gradients": _tensor_bytes(p.grad for p in params),
        "optimizer": _tensor_bytes(state),
        "saved_activations": saved["bytes"],
        "loaded_rss": loaded,
        # file-backed pages that came in since the floor: the libraries' code the kernels
        # run for the first time (libtorch's sparse and scatter paths, gloo), not data
        "code_pages": status_bytes("RssFile") - code_floor,
    }
    cache = cpu_cache.stats()  # torch's large CPU tensors' caching allocator (None: not installed)
    if cache is not None:
        ledger["cpu_cache_idle"] = cache.idle_bytes  # freed blocks kept for reuse now (within malloc_in_use)
        ledger["cpu_cache_high"] = cache.high_bytes  # the most in use at once: in use + idle never exceed it
    ledger.update(malloc_stats())
    mine = {"engine": "sarcompile", "rank": rank, "world": world, "floor_bytes": floor,
            "peak_above_floor_bytes": status_bytes("VmHWM") - floor, "epoch_s": statistics.median(times),
            "epoch_times": times, "losses": losses, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "ledger": ledger, "time_ledger": time_ledger,
            "estimate": {"peak_bytes": estimate.peak_bytes, **estimate.breakdown},
            "num_nodes": manifest.num_nodes}
    everyone = [mine]
    if world > 1:
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
    sc.shutdown()
    return everyone


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("dgl", "sarcompile"), required=True)
    ap.add_argument("--model", choices=("sage", "gat", "rgcn"), required=True)
    ap.add_argument("--graph", help="the generated graph (.pt), for DGL")
    ap.add_argument("--parts", help="partition directory, for sarcompile")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--blocks-in-flight", type=int, default=1, help="sarcompile's overlap (sc.distribute)")
    ap.add_argument("--dropout", type=float, default=0.5, help="rgcn's dropout between its layers")
    ap.add_argument("--out", required=True)
    ap.add_argument("--turns", help="FIFO prefix: take turns with other runs (benchmarks/turns.py; set by the driver)")
    a = ap.parse_args()
    rank = int(os.environ.get("RANK", "0"))  # (torchrun's; sc.init() reads the same)
    turns = Turns(a.turns, rank)
    records = run_dgl(a, turns) if a.engine == "dgl" else run_sarcompile(a, turns)
    if rank == 0:
        tmp = Path(a.out).with_suffix(".tmp")
        tmp.write_text(json.dumps(records))
        tmp.replace(a.out)


if __name__ == "__main__":
    main()
