"""Converting a DGL partition (``dgl.distributed.partition_graph``) to a sarcompile one:
same graph, same features, same node-to-part assignment, and training on it equals
DGL eager on the whole graph.

Runs only where DGL is installed (``scripts/test.sh`` runs it in the DGL environment).
"""

from __future__ import annotations

import json
import shutil

import pytest

dgl = pytest.importorskip("dgl")

import dgl.nn as dglnn
import torch
import torch.nn.functional as F
from dgl.data.utils import load_graphs
from torch import nn

import sarcompile as sc
from sarcompile.cli.main import main
from sarcompile.data.dgl_import import convert_dgl_partition

N, E, F_IN, CLASSES = 60, 240, 5, 3
TOL = 1e-9


def _dgl_graph(seed: int = 0):
    """Random edges with self-loops, repeats and isolated nodes; ``orig`` records each node's
    original id, so a partition without a saved mapping still tells us the relabelling."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, N - 4, (E,), generator=gen)  # nodes N-4.. have no out-edges
    dst = torch.randint(0, N, (E,), generator=gen)
    g = dgl.graph((torch.cat([src, src[:5]]), torch.cat([dst, src[:5]])), num_nodes=N)
    g.ndata["x"] = torch.randn(N, F_IN, generator=gen)
    g.ndata["y"] = torch.randint(0, CLASSES, (N,), generator=gen)
    g.ndata["train_mask"] = torch.rand(N, generator=gen) < 0.7
    g.ndata["orig"] = torch.arange(N)
    g.edata["w"] = torch.rand(g.num_edges(), generator=gen)  # edge features are not carried over
    return g


def _dgl_partition(tmp_path, num_parts: int, method: str, mapping: bool, hops: int = 1):
    g = _dgl_graph()
    dgl.random.seed(0)
    out = dgl.distributed.partition_graph(
        g, "toy", num_parts, str(tmp_path / "dgl"), num_hops=hops, part_method=method, return_mapping=mapping
    )
    return g, tmp_path / "dgl" / "toy.json", out


def _dgl_inner_nodes(config, p: int) -> torch.Tensor:
    """DGL's reshuffled ids of the nodes part ``p`` owns, read straight from its graph."""
    files = json.loads(config.read_text())[f"part-{p}"]
    pg = load_graphs(str(config.parent / files["part_graph"]))[0][0]
    return pg.ndata[dgl.NID][pg.ndata["inner_node"].bool()]


CASES = [(2, "metis", True, 1), (3, "metis", False, 1), (2, "random", False, 1), (3, "random", True, 1),
         (1, "metis", False, 1), (3, "metis", True, 2), (2, "random", False, 2)]  # hops: halo depth DGL stores


@pytest.mark.parametrize("num_parts, method, mapping, hops", CASES)
def test_converted_partition_is_dgls(tmp_path, num_parts, method, mapping, hops):
    g, config, returned = _dgl_partition(tmp_path, num_parts, method, mapping, hops)
    orig_nids, orig_eids = returned if mapping else (None, None)
    out = tmp_path / "ours"
    manifest = convert_dgl_partition(config, out, orig_nids, orig_eids)
    assert manifest.num_parts == num_parts and manifest.method == "given"
    assert manifest.name == f"toy (DGL {method} partition, {'original' if mapping else 'reshuffled'} ids)"

    whole, data = sc.load_whole_graph(out)
    assert set(data) == {"x", "y", "train_mask", "orig"}  # DGL's "_N/" prefix dropped; no edge data
    # orig[v] is the original id of node v in the directory's id space.
    if mapping:
        assert torch.equal(data["orig"], torch.arange(N))
        s, d = g.edges()
        assert torch.equal(whole.src, s) and torch.equal(whole.dst, d)  # original edge order too
    else:
        assert sorted(data["orig"].tolist()) == list(range(N))
    to_orig = data["orig"]
    assert data["train_mask"].dtype == torch.uint8  # DGL's files store bool tensors as uint8
    for key in ("x", "y", "train_mask"):
        assert data[key].tolist() == g.ndata[key][to_orig].tolist(), key
    s, d = g.edges()
    got = sorted(zip(to_orig[whole.src].tolist(), to_orig[whole.dst].tolist()))
    assert got == sorted(zip(s.tolist(), d.tolist()))

    # Every part holds exactly the nodes DGL's part holds (in our id space).
    from_reshuffled = orig_nids if mapping else torch.arange(N)
    for p in range(num_parts):
        ours = sc.load_partition(out, rank=p, world_size=num_parts).global_ids
        dgls = from_reshuffled[_dgl_inner_nodes(config, p)]
        assert sorted(ours.tolist()) == sorted(dgls.tolist()), p


class Net(nn.Module):
    """Plain DGL: SAGEConv -> ReLU -> GATConv (heads averaged)."""

    def __init__(self):
        super().__init__()
        self.sage = dglnn.SAGEConv(F_IN, 6, "mean")
        self.gat = dglnn.GATConv(6, CLASSES, num_heads=2, allow_zero_in_degree=True)

    def forward(self, g, x):
        return self.gat(g, F.relu(self.sage(g, x))).mean(1)


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return Net().double()


def _step(model: nn.Module, graph, x, y, mask, total, sync: bool):
    """One SGD step on the global mean loss; output before the step and parameters after."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    out = model(graph, x.double())
    mask = mask.bool()  # DGL's files store bool tensors as uint8
    loss = F.cross_entropy(out[mask], y[mask], reduction="sum") / total
    loss.backward()
    if sync:
        sc.sync_gradients(model)
    opt.step()
    return out.detach(), {k: p.detach().clone() for k, p in model.named_parameters()}


def _worker(rank: int, world_size: int, payload: dict):
    import dgl  # noqa: F401  (the front-end loads when the program imports DGL)

    part = sc.load_partition(payload["out"], rank, world_size)
    d = part.node_data
    total = sc.global_sum(d["train_mask"].sum())
    model = sc.distribute(_net(payload["seed"]))
    out, params = _step(model, part.graph, d["x"], d["y"], d["train_mask"], total, sync=True)
    return part.global_ids, out, params


@pytest.mark.parametrize("num_parts, method, mapping", [(2, "metis", True), (3, "random", False)])
def test_training_on_converted_partition_matches_dgl_eager(tmp_path, pool, num_parts, method, mapping):
    _, config, returned = _dgl_partition(tmp_path, num_parts, method, mapping)
    out = tmp_path / "ours"
    convert_dgl_partition(config, out, *(returned if mapping else ()))
    whole, data = sc.load_whole_graph(out)
    g_all = dgl.graph((whole.src, whole.dst), num_nodes=whole.num_nodes)
    mask = data["train_mask"]
    want_out, want_params = _step(_net(7), g_all, data["x"], data["y"], mask, mask.sum(), sync=False)

    results = pool(num_parts).run(_worker, [{"out": str(out), "seed": 7}] * num_parts)
    got = torch.zeros_like(want_out)
    for ids, rows, params in results:
        got[ids] = rows
        for k, p in want_params.items():
            torch.testing.assert_close(params[k], p, atol=TOL, rtol=0, msg=k)
    torch.testing.assert_close(got, want_out, atol=TOL, rtol=0)


# -- the command line and refusals ------------------------------------------------------------
def test_cli_converts_with_and_without_mapping(tmp_path, capsys):
    g, config, (orig_nids, orig_eids) = _dgl_partition(tmp_path, 2, "metis", True)
    assert main(["partition", "--dgl-partition", str(config), "--out", str(tmp_path / "a")]) == 0
    printed = capsys.readouterr().out
    assert "DGL metis partition, reshuffled ids" in printed and "node ids: DGL's reshuffled node ids" in printed

    torch.save((orig_nids, orig_eids), tmp_path / "mapping.pt")
    argv = ["partition", "--dgl-partition", str(config), "--dgl-mapping", str(tmp_path / "mapping.pt"),
            "--parts", "2", "--out", str(tmp_path / "b")]
    assert main(argv) == 0
    assert "node ids: original node ids" in capsys.readouterr().out
    whole, data = sc.load_whole_graph(tmp_path / "b")
    assert torch.equal(whole.src, g.edges()[0]) and torch.equal(data["x"], g.ndata["x"])


@pytest.mark.parametrize(
    "extra, expected",
    [(["--parts", "3"], "asked for 3 parts but the DGL partition"),
     (["--method", "random"], "--method apply only to --edges/--dataset")],
)
def test_cli_refuses_conflicting_options(tmp_path, capsys, extra, expected):
    _, config, _ = _dgl_partition(tmp_path, 2, "metis", False)
    assert main(["partition", "--dgl-partition", str(config), "--out", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sarcompile partition: error: ") and expected in err
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_refuses_missing_files_naming_them(tmp_path):
    _, config, _ = _dgl_partition(tmp_path, 2, "random", False)
    with pytest.raises(sc.PartitionError, match="toy-missing.json' not found"):
        convert_dgl_partition(tmp_path / "dgl" / "toy-missing.json", tmp_path / "o")
    graph_file = tmp_path / "dgl" / "part1" / "graph.dgl"
    graph_file.unlink()
    with pytest.raises(sc.PartitionError, match=f"part 1's graph '{graph_file}'.* is missing"):
        convert_dgl_partition(config, tmp_path / "o")
    shutil.rmtree(tmp_path / "dgl" / "part0")
    with pytest.raises(sc.PartitionError, match="part0/graph.dgl"):
        convert_dgl_partition(config, tmp_path / "o")
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_refuses_wrong_mapping(tmp_path):
    _, config, (orig_nids, _) = _dgl_partition(tmp_path, 2, "metis", True)
    with pytest.raises(sc.PartitionError, match="not a permutation"):
        convert_dgl_partition(config, tmp_path / "o", torch.zeros_like(orig_nids))
    with pytest.raises(sc.PartitionError, match="60 integer ids"):
        convert_dgl_partition(config, tmp_path / "o", orig_nids[:-1])


def test_refuses_heterogeneous_graphs(tmp_path):
    gen = torch.Generator().manual_seed(0)
    hg = dgl.heterograph({
        ("user", "follows", "user"): (torch.randint(0, 20, (60,), generator=gen), torch.randint(0, 20, (60,), generator=gen)),
        ("user", "buys", "item"): (torch.randint(0, 20, (60,), generator=gen), torch.randint(0, 10, (60,), generator=gen)),
    }, num_nodes_dict={"user": 20, "item": 10})
    dgl.distributed.partition_graph(hg, "het", 2, str(tmp_path / "dgl"), part_method="metis")
    with pytest.raises(sc.PartitionError, match="heterogeneous graph .2 node types, 2 edge types.*to_homogeneous"):
        convert_dgl_partition(tmp_path / "dgl" / "het.json", tmp_path / "o")
