"""Message passing written in plain torch over ``edge_index`` (sarcompile/frontends/plain.py, with PyG imported),
in a model's own forward and its helper methods: ``src, dst = edge_index``, ``x[src]``,
``index_select``, ``index_add_``, ``scatter_add_``, ``scatter_reduce`` / ``index_reduce`` (each
reduction, with and without the tensor's own entries), ``torch.ones_like(dst)``, PyG's
``scatter`` and ``degree`` -- against eager torch on the whole graph's real ``edge_index``, on one
machine and on 1-3 workers (outputs, input and parameter gradients, float64), on random graphs
with isolated nodes, self-loops, multi-edges and workers without nodes; and each refusal's message."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from hypothesis import given, settings
from torch import nn

pytest.importorskip("torch_geometric")

import sarcompile as sc  # noqa: E402
from pyg_models import DT, PLAIN, assert_close, check_distributed, dist_cases, make_model  # noqa: E402
from strategies import graphs  # noqa: E402

SETTINGS = settings(max_examples=8, deadline=None)
pytestmark = pytest.mark.filterwarnings("ignore:index_reduce:UserWarning")  # (beta in torch)


@pytest.mark.parametrize("name", PLAIN)
@given(graph=graphs(max_nodes=20, max_edges=60))
@SETTINGS
def test_one_machine_matches_eager_torch(name, graph):
    src, dst, n, seed = graph
    model = make_model(name, seed % 2**16)
    gen = torch.Generator().manual_seed(seed)
    x, w = torch.randn(n, 6, generator=gen, dtype=DT), torch.randn(n, 3, generator=gen, dtype=DT)

    def run(m, graph_arg):
        xr = x.clone().requires_grad_(True)
        out = m(xr, graph_arg)
        (out * w).sum().backward()
        return out.detach(), xr.grad, {k: p.grad for k, p in m.named_parameters()}

    compiled = copy.deepcopy(model)
    want = run(model, torch.stack([src, dst]))
    got = run(sc.distribute(compiled), sc.Graph.from_edges(src, dst, n))
    assert_close(got[0], want[0], "output")
    assert_close(got[1], want[1], "x grad")
    for k, g in want[2].items():
        assert_close(got[2][k], g, f"grad of {k}")


@given(case=dist_cases(list(PLAIN)))
@settings(SETTINGS, max_examples=5)
def test_workers_match_eager_torch(pool, case):
    check_distributed(pool, case)


# --- what is refused, and how ------------------------------------------------------------------
class Plain(nn.Module):
    """``forward(x, edge_index, ids)`` running ``body(h, edge_index, x, ids)``, ``h = lin(x)``."""

    def __init__(self, body):
        super().__init__()
        self.lin, self.body = nn.Linear(4, 4), body

    def forward(self, x, edge_index, ids):
        return self.body(self.lin(x), edge_index, x, ids)


def _refusal(body) -> str:
    src, dst, n = torch.tensor([0, 1, 2, 3, 4, 5]), torch.tensor([1, 2, 3, 0, 0, 7]), 8
    with pytest.raises(sc.CompileError) as e:
        sc.distribute(Plain(body))(torch.randn(n, 4), sc.Graph.from_edges(src, dst, n), torch.arange(n).flip(0))
    message = str(e.value)
    assert "test_pyg_plain.py:" in message, message  # the user's line
    return message


REFUSALS = [
    ("index_add_ over an index of another tensor",
     lambda h, ei, x, ids: torch.zeros_like(h).index_add_(0, ids, h),
     r"index_add_.*index tensor.*edge_index\[1\]"),
    ("rows by another index", lambda h, ei, x, ids: h.index_select(0, ids), r"index_select.*by the graph's own ends"),
    ("a maximum into the sources",
     lambda h, ei, x, ids: torch.zeros_like(h).scatter_reduce(
         0, ei[0].unsqueeze(-1).expand_as(h[ei[1]]), h[ei[1]], "amax", include_self=False),
     r"reduce='amax'.*into edge_index\[0\].*reduce into edge_index\[1\]"),
    ("amax with the tensor's own entries",
     lambda h, ei, x, ids: torch.zeros_like(h).scatter_reduce(0, ei[1].unsqueeze(-1).expand_as(h), h, "amax"),
     r"include_self=True.*pass include_self=False"),
    ("arithmetic on an end", lambda h, ei, x, ids: h[ei[1] + 1], r"edge_index\[1\].*used as a tensor"),
    ("a reduction of an end", lambda h, ei, x, ids: h * ei[0].max(), r"edge_index\[0\].*used as a tensor"),
    ("in place into a forward argument", lambda h, ei, x, ids: x.index_add_(0, ei[1], x[ei[0]]),
     r"in place into a forward argument.*out-of-place `index_add`"),
    ("in place into a view", lambda h, ei, x, ids: h[:, :2].index_add_(0, ei[1], h[ei[0]][:, :2]),
     r"a view.*torch.zeros_like"),
    ("into a tensor of a fixed size", lambda h, ei, x, ids: torch.zeros(8, 4).index_add_(0, ei[1], h[ei[0]]),
     r"fixed size.*x.new_zeros\(x.size\(0\), d\)"),
    ("scatter without a reduction",
     lambda h, ei, x, ids: torch.zeros_like(h).scatter_(0, ei[1].unsqueeze(-1).expand(-1, 4), h[ei[0]]),
     r"without a reduction.*scatter_reduce"),
    ("an index not shaped as the source",
     lambda h, ei, x, ids: torch.zeros_like(h).scatter_add_(0, ei[1].unsqueeze(-1).expand(-1, 2), h[ei[0]]),
     r"not shaped as its source.*expand_as\(src\)"),
    ("gathering along the features", lambda h, ei, x, ids: h.index_select(1, ei[0]), r"index_select\(dim=1"),
]


@pytest.mark.parametrize("body,pattern", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_what_is_not_exact_is_refused_naming_the_line_and_a_fix(body, pattern):
    message = _refusal(body)
    assert re.search(pattern, message, flags=re.S), message
