"""Hypothesis strategies shared by the tests."""

from __future__ import annotations

import torch
from hypothesis import strategies as st


@st.composite
def graphs(draw, max_nodes: int = 30, max_edges: int = 120):
    """(src, dst, n, seed): isolated nodes, self-loops, multi-edges, sometimes a hub with
    in-degree >= 100."""
    n = draw(st.integers(1, max_nodes))
    isolated = draw(st.integers(0, min(3, n - 1)))  # the last `isolated` nodes get no edges
    k = n - isolated
    node = st.integers(0, k - 1)
    m = draw(st.integers(0, max_edges))
    pairs = draw(st.lists(st.tuples(node, node), min_size=m, max_size=m))
    if pairs and draw(st.booleans()):
        pairs += draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=5))  # multi-edges
    if draw(st.booleans()):
        pairs += [(v, v) for v in draw(st.lists(node, min_size=1, max_size=3))]  # self-loops
    seed = draw(st.integers(0, 2**31 - 1))
    if draw(st.integers(0, 3)) == 0:  # a hub
        hub = draw(node)
        deg = draw(st.integers(100, 130))
        gen = torch.Generator().manual_seed(seed)
        pairs += [(int(u), hub) for u in torch.randint(0, k, (deg,), generator=gen)]
    draw(st.randoms(use_true_random=False)).shuffle(pairs)
    src = torch.tensor([p[0] for p in pairs], dtype=torch.long).reshape(-1)
    dst = torch.tensor([p[1] for p in pairs], dtype=torch.long).reshape(-1)
    return src, dst, n, seed
