"""Write a learnable synthetic graph for the demo: a stochastic block model whose node
features are noisy copies of a per-class centre, saved in the format
``sarcompile partition --edges`` reads (a torch.save'd dict)."""

from __future__ import annotations

import argparse

import torch


def sbm(num_nodes: int, num_classes: int, avg_degree: float, p_in: float, feat_dim: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, num_classes, (num_nodes,), generator=gen)
    num_edges = int(num_nodes * avg_degree)
    src = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    # With probability p_in an edge stays inside its source's class: pick a same-class node.
    by_class = [torch.nonzero(y == c).flatten() for c in range(num_classes)]
    same = torch.rand(num_edges, generator=gen) < p_in
    dst = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    for c, members in enumerate(by_class):
        pick = same & (y[src] == c)
        dst[pick] = members[torch.randint(0, members.numel(), (int(pick.sum()),), generator=gen)]
    centres = torch.randn(num_classes, feat_dim, generator=gen)
    x = centres[y] + 2.0 * torch.randn(num_nodes, feat_dim, generator=gen)
    split = torch.rand(num_nodes, generator=gen)
    return {
        "src": torch.cat([src, dst]),  # undirected: both directions
        "dst": torch.cat([dst, src]),
        "num_nodes": num_nodes,
        "x": x,
        "y": y,
        "train_mask": split < 0.6,
        "val_mask": (split >= 0.6) & (split < 0.8),
        "test_mask": split >= 0.8,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, help="file to write (.pt)")
    ap.add_argument("--nodes", type=int, default=20000)
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--degree", type=float, default=5.0, help="average out-degree before symmetrising")
    ap.add_argument("--p-in", type=float, default=0.7, help="fraction of edges inside a class")
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.save(sbm(a.nodes, a.classes, a.degree, a.p_in, a.features, a.seed), a.out)
    print(f"wrote {a.out}: {a.nodes} nodes, {int(a.nodes * a.degree * 2)} edges, {a.classes} classes")


if __name__ == "__main__":
    main()
