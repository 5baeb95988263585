"""Refusals name the user's line: the innermost frame in the user's files, never one inside
torch, PyG, DGL or the standard library, whether the refusal comes from a pass (the line a
node was traced from) or from the trace itself (the traceback of what failed)."""

from __future__ import annotations

import functools
import inspect

import hypothesis
import pytest
import torch

import sarcompile as sc
from sarcompile.compile.source_lines import user_file

G = sc.Graph.from_edges(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3)


def _line_of(fn, text: str) -> str:
    """``test_source_lines.py:N: `code``` for the line of ``fn``'s source holding ``text``."""
    lines, first = inspect.getsourcelines(fn)
    n, line = next((first + i, line) for i, line in enumerate(lines) if text in line)
    return f"test_source_lines.py:{n}: `{line.strip()}`"


def test_the_users_files_are_those_outside_the_libraries_and_sarcompile():
    import torch_geometric

    assert user_file(__file__)
    # a package of the user's own, installed in site-packages, is theirs: only the libraries are not
    assert "site-packages" in hypothesis.__file__ and user_file(hypothesis.__file__)
    for library in (torch.__file__, torch.fx.__file__, torch_geometric.nn.__file__, functools.__file__,
                    sc.__file__, "<frozen importlib._bootstrap>"):
        assert not user_file(library), library


def test_a_refusal_inside_a_pyg_function_names_the_users_call():
    pool = pytest.importorskip("torch_geometric.nn").global_max_pool

    class Readout(torch.nn.Module):
        def forward(self, g, x):
            h = pool(x, None)  # PyG's own x.max(dim=-2) is what is refused
            return x + h

    with pytest.raises(sc.CompileError, match="reduces over the node axis") as e:
        sc.distribute(Readout())(G, torch.randn(3, 2))
    assert f"at {_line_of(Readout.forward, 'h = pool(x, None)')}." in str(e.value)


def test_a_refusal_inside_a_pyg_layer_names_the_users_call():
    gnn = pytest.importorskip("torch_geometric.nn")

    class Selective(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = gnn.MFConv(2, 2)  # traced on its own, where it picks nodes by degree

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    with pytest.raises(sc.CompileError, match=r"`nonzero` .* in layer 'conv' \(MFConv\)") as e:
        sc.distribute(Selective())(torch.randn(3, 2), G)
    assert f"at {_line_of(Selective.forward, 'return self.conv(x, edge_index)')}." in str(e.value)


def test_a_trace_failure_inside_a_pyg_layer_names_the_users_call():
    aggr = pytest.importorskip("torch_geometric.nn.aggr")

    class Pooled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.agg = aggr.MaxAggregation()

        def forward(self, g, x):
            h = self.agg(x)  # PyG's code branches on a traced value
            return x + h

    with pytest.raises(sc.CompileError, match="cannot trace Pooled") as e:
        sc.distribute(Pooled())(G, torch.randn(3, 2))
    assert f"at {_line_of(Pooled.forward, 'h = self.agg(x)')}:" in str(e.value)


def test_a_trace_failure_inside_a_dgl_function_names_the_users_call():
    dgl = pytest.importorskip("dgl")

    class Looped(torch.nn.Module):
        def forward(self, g, x):
            g = dgl.add_self_loop(g)  # DGL's transforms/functional.py branches on a traced value
            g.ndata["h"] = x
            g.update_all(dgl.function.copy_u("h", "m"), dgl.function.sum("m", "h"))
            return g.ndata["h"]

    with pytest.raises(sc.CompileError, match="cannot trace Looped") as e:
        sc.distribute(Looped())(G, torch.randn(3, 2))
    assert f"at {_line_of(Looped.forward, 'g = dgl.add_self_loop(g)')}:" in str(e.value)
