"""The dropout pass: dropout of node and edge rows draws masks keyed by id, the same on any N."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sarcompile as sc
from sarcompile.errors import CompileError
from sarcompile.ir import ops
from sarcompile.ir.node_info import set_info
from sarcompile.ir.probe import Input
from sarcompile.ir.vocab import Residency
from sarcompile.compile.passes.dropout import STREAM, dropout
from sarcompile.compile.passes.lower import lower
from sarcompile.compile.passes.residency import residency
from sarcompile.compile.trace import trace

from cases import assert_workers_match, case_on_edges, payloads, run_worker, single_machine

TOL = dict(rtol=1e-7, atol=1e-10)


def _graph(n=30, e=120, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return sc.Graph.from_edges(torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen), n)


class Drops(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, g, x):
        h = self.drop(F.dropout(x, 0.2, self.training))
        e = F.dropout(sc.sddmm(g, h, h, "dot"), p=0.3, training=self.training)
        return sc.spmm(g, h, "sum", edge_weight=e) * F.dropout(self.w, 0.5, self.training)


def _passed(model: nn.Module, g: sc.Graph) -> torch.fx.GraphModule:
    gm = trace(model)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            spec = Input(Residency.GRAPH) if node.target == "g" else Input(Residency.NODE, (g.num_nodes, 4))
            set_info(node, input=spec)
    return dropout(residency(lower(gm)))


def _calls(gm, target):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target]


def test_dropout_of_rows_becomes_keyed_masks_and_of_a_parameter_stays_torchs():
    gm = _passed(Drops(), _graph())
    assert len(_calls(gm, ops.node_dropout)) == 2 and len(_calls(gm, ops.edge_dropout)) == 1
    assert len(_calls(gm, F.dropout)) == 1  # the parameter's: the same on every worker from the same RNG
    assert not [n for n in gm.graph.nodes if n.op == "call_module" and n.target == "drop"]
    assert sum(n.op == "call_module" and n.target == STREAM for n in gm.graph.nodes) == 1


def test_eval_mode_rewrites_nothing_and_is_the_identity():
    model = Drops().eval()
    gm = _passed(model, _graph())
    assert not _calls(gm, ops.node_dropout) and not hasattr(gm, STREAM)
    g, x = _graph(), torch.randn(30, 4)
    torch.testing.assert_close(sc.distribute(model)(g, x), model(g, x))


def test_masks_scale_kept_entries_and_are_the_same_for_the_same_seed_and_step():
    g, x = _graph(), torch.randn(30, 4, dtype=torch.float64)
    a, b = sc.distribute(Drops().double(), seed=7), sc.distribute(Drops().double(), seed=7)
    torch.manual_seed(0)
    first = a(g, x)
    torch.manual_seed(0)
    torch.testing.assert_close(b(g, x), first)  # same seed, same step
    torch.manual_seed(0)
    assert not torch.equal(a(g, x), first)  # the next step draws new masks
    assert int(a.dropout_stream().step) == 2


def _dropped(model, g, x):
    """Which entries a one-layer dropout model zeroes, and the scale of the others."""
    out = model(g, x)
    return out == 0, out[out != 0] / x[out != 0]


class NodeDrop(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, g, x):
        return F.dropout(sc.spmm(g, x, "sum") * 0 + x, self.p, self.training)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_the_masks_keep_each_entry_with_probability_1_minus_p_independently(p):
    n, width = 2000, 50
    g = sc.Graph.from_edges(torch.arange(n), torch.arange(n), n)
    x = torch.rand(n, width, dtype=torch.float64) + 1.0
    model = sc.distribute(NodeDrop(p), seed=3)
    dropped, scale = _dropped(model, g, x)
    torch.testing.assert_close(scale, torch.full_like(scale, 1 / (1 - p)))
    kept = (~dropped).double()
    sd = (p * (1 - p) / kept.numel()) ** 0.5
    assert abs(kept.mean().item() - (1 - p)) < 5 * sd
    # the output's mean and variance are those of torch's dropout (both unbiased for the mean)
    out = model(g, x)
    want = F.dropout(x, p, True)
    assert abs(out.mean().item() - x.mean().item()) < 5 * (out.var().item() / out.numel()) ** 0.5
    assert abs(out.var().item() / want.var().item() - 1) < 0.05
    # no correlation between neighbouring columns or rows of the mask
    for a, b in ((kept[:, :-1], kept[:, 1:]), (kept[:-1], kept[1:])):
        assert abs(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1].item()) < 5 / a.numel() ** 0.5


def test_an_in_place_dropout_whose_input_is_read_again_is_refused():
    class M(nn.Module):
        def forward(self, g, x):
            h = sc.spmm(g, x, "sum")
            d = F.dropout(h, 0.5, True, inplace=True)
            return d + h

    with pytest.raises(CompileError, match="inplace=False"):
        sc.distribute(M())(_graph(), torch.randn(30, 4))


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_torch_dropouts_train_on_workers_as_the_compiled_model_on_one_machine(pool, world_size):
    n = 23
    gen = torch.Generator().manual_seed(world_size)
    src, dst = torch.randint(0, n, (90,), generator=gen), torch.randint(0, n, (90,), generator=gen)
    case = case_on_edges(src, dst, n, "torchdrop", 5, gen, assignment=torch.randint(0, world_size, (n,), generator=gen))
    want = single_machine(case)
    # the oracle drops something: eval mode gives other outputs
    case_eval = case_on_edges(src, dst, n, "torchdrop", 5, gen, assignment=case.assignment, train=False)
    case_eval.x, case_eval.loss_weight = case.x, case.loss_weight
    assert not torch.allclose(single_machine(case_eval).out, want.out)
    results = pool(world_size).run(run_worker, payloads(case, world_size))
    assert_workers_match(case, world_size, results, want, **TOL)


def test_a_model_with_dropout_learns_as_well_as_eager(graph_file):
    """A trained model's accuracy with keyed masks against eager torch's dropout."""
    data = torch.load(graph_file)
    g = sc.Graph.from_edges(data["src"], data["dst"], data["x"].shape[0])
    x, y, train = data["x"], data["y"], data["train_mask"]
    classes = int(y.max()) + 1

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = sc.nn.SAGEConv(x.shape[1], 32), sc.nn.SAGEConv(32, classes)

        def forward(self, g, x):
            h = F.dropout(x, 0.5, self.training)
            return self.c2(g, F.dropout(torch.relu(self.c1(g, h)), 0.5, self.training))

    def accuracy(compiled: bool) -> float:
        torch.manual_seed(0)
        net = Net()
        model = sc.distribute(net) if compiled else net
        opt = torch.optim.Adam(net.parameters(), lr=0.02)
        for _ in range(30):
            opt.zero_grad()
            F.cross_entropy(model(g, x)[train], y[train]).backward()
            opt.step()
        net.eval()
        return (model(g, x).argmax(1) == y)[~train].double().mean().item()

    compiled, eager = accuracy(True), accuracy(False)
    assert compiled > 0.8 and abs(compiled - eager) < 0.05, (compiled, eager)


def test_torch_dropout_follows_its_train_flag():
    class M(nn.Module):
        def forward(self, g, x):
            return torch.dropout(x, 0.5, False) + torch.dropout(sc.spmm(g, x, "sum"), 0.5, True)

    gm = _passed(M(), _graph())
    assert len(_calls(gm, ops.node_dropout)) == 1 and len(_calls(gm, torch.dropout)) == 1


class StackedDrop(nn.Module):
    """Dropout of a stack of node values, rows on dim 1, as models stack their layers' outputs."""

    def forward(self, g, x):
        hs = torch.stack([x, sc.spmm(g, x, "sum")])  # [2, n, F]
        return F.dropout(hs, 0.5, self.training).sum(0)


def test_dropout_of_rows_on_another_dim_keys_each_node_and_matches_the_rows_first_form():
    g, x = _graph(), torch.randn(30, 4, dtype=torch.float64)

    class RowsFirst(nn.Module):
        def forward(self, g, x):
            hs = torch.stack([x, sc.spmm(g, x, "sum")], dim=1)  # [n, 2, F]: the same entries, rows first
            return F.dropout(hs, 0.5, self.training).sum(1)

    torch.testing.assert_close(sc.distribute(StackedDrop(), seed=4)(g, x), sc.distribute(RowsFirst(), seed=4)(g, x))
