"""Synthetic typed graphs shaped like real ones: tests and benchmarks at any size, offline.

:func:`mag_like` imitates ogbn-mag (papers, authors, institutions, fields of study)::

    >>> ds = mag_like(num_papers=1000, num_authors=800, num_institutions=20, num_fields=50)
    >>> ds.graph.node_types
    ('paper', 'author', 'institution', 'field_of_study')
    >>> [rel[1] for rel in ds.graph.edge_types]
    ['writes', 'cites', 'affiliated_with', 'has_topic', 'rev_writes', 'rev_affiliated_with', 'rev_has_topic']

How it is made: every node of every type belongs to one of ``num_classes`` planted
communities, and a paper's label is its community. Each edge picks its far end from the
near end's community (or, with probability :data:`MIXING`, from a random one), and within
that community by a heavy-tailed popularity weight, so degrees are power-law-ish and a few
hubs exist. Paper features are the community's centroid plus noise. So labels are
learnable from features alone, better from neighbours too (cited papers, co-authors,
topics mostly share the label). A few nodes of every type (:data:`ISOLATED`) have no edges.
Everything is vectorised torch drawn from one seeded generator: the same arguments give
the same dataset.
"""

from __future__ import annotations

import math

import torch

from sarcompile.data.datasets import HeteroDataset, add_reverse_relations
from sarcompile.errors import GraphError
from sarcompile.graph.hetero import HeteroGraph, Relation
from sarcompile.data.validate import MASKS

__all__ = ["MAG_SIZES", "mag_like", "mag_like_sizes"]

PAPER, AUTHOR, INSTITUTION, FIELD = "paper", "author", "institution", "field_of_study"
MIXING = 0.2  # chance that an edge ignores communities: the graph is informative, not a partition
PARETO_ALPHA = 1.5  # popularity tail index: below 2 the degree variance is unbounded, as in citation graphs
SEPARATION = 2.5  # centroid distance in noise standard deviations: features alone are useful, not enough
ISOLATED = 0.001  # fraction of each type (at least one node) with no edges at all
SPLIT = (0.8, 0.1)  # train and valid fractions of the papers; the rest is test
AFFILIATIONS_PER_AUTHOR = 1.1

# mag_like's default node counts: 212k nodes, about 1/9 of ogbn-mag
MAG_SIZES = {"num_papers": 100_000, "num_authors": 100_000, "num_institutions": 2_000, "num_fields": 10_000}

Edges = tuple[torch.Tensor, torch.Tensor]


def mag_like_sizes(scale: float) -> dict[str, int]:
    """:data:`MAG_SIZES` times ``scale``, at least one node of each type: the node-count
    arguments of :func:`mag_like`.

    >>> mag_like_sizes(0.01)
    {'num_papers': 1000, 'num_authors': 1000, 'num_institutions': 20, 'num_fields': 100}
    """
    if not scale > 0:
        raise GraphError(f"the scale of a MAG-like graph must be > 0, got {scale}")
    return {k: max(1, round(n * scale)) for k, n in MAG_SIZES.items()}


def mag_like(
    num_papers: int = MAG_SIZES["num_papers"],
    num_authors: int = MAG_SIZES["num_authors"],
    num_institutions: int = MAG_SIZES["num_institutions"],
    num_fields: int = MAG_SIZES["num_fields"],
    features: int = 128,
    num_classes: int = 64,
    *,
    authors_per_paper: float = 3.0,
    citations_per_paper: float = 5.0,
    topics_per_paper: float = 4.0,
    seed: int = 0,
    add_reverse: bool = True,
) -> HeteroDataset:
    """An ogbn-mag-like :class:`~sarcompile.data.datasets.HeteroDataset` (see the module docstring).

    Relations: ``(author, writes, paper)`` (every paper has at least one author, every
    author at least one paper), ``(paper, cites, paper)`` (no self-loops),
    ``(author, affiliated_with, institution)`` (at least one per author) and
    ``(paper, has_topic, field_of_study)`` (at least one per paper); no multi-edges. The
    isolated nodes (:data:`ISOLATED` of each type with more than one node) are the
    exceptions: they have no edges. The ``*_per_paper`` means set the edge counts.
    ``add_reverse`` adds the ``rev_`` relations as
    :func:`~sarcompile.data.datasets.add_reverse_relations` does.

    ``node_data["paper"]`` holds ``x`` (float32 ``[num_papers, features]``), ``y`` (int64
    in ``[0, num_classes)``) and disjoint random ``train_mask``/``val_mask``/``test_mask``
    (80/10/10 %); the other types have no values. Raises :class:`GraphError` for a count
    below one or a mean the guarantees above cannot meet.
    """
    counts = {PAPER: num_papers, AUTHOR: num_authors, INSTITUTION: num_institutions, FIELD: num_fields}
    _check_arguments(counts, features, num_classes, authors_per_paper, citations_per_paper, topics_per_paper)
    gen = torch.Generator().manual_seed(seed)
    community = {t: torch.randint(num_classes, (n,), generator=gen) for t, n in counts.items()}
    isolated = {t: _isolated(n, gen) for t, n in counts.items()}
    # Weight zero: no edge ever picks an isolated node, so dropping their own edges below
    # takes nothing from anyone else.
    pickers = {t: _Picker(c, _popularity(counts[t], gen) * ~isolated[t], num_classes) for t, c in community.items()}

    def far_ends(near_type: str, near: torch.Tensor, far_type: str) -> torch.Tensor:
        return pickers[far_type].draw(_mix(community[near_type][near], num_classes, gen), gen)

    papers = _repeat(num_papers, authors_per_paper, 1, gen)
    authors = torch.arange(num_authors)
    # Each author's own paper guarantees them one; the paper's slots guarantee it an author.
    writes = (torch.cat([far_ends(PAPER, papers, AUTHOR), authors]),
              torch.cat([papers, far_ends(AUTHOR, authors, PAPER)]))
    citing = _repeat(num_papers, citations_per_paper, 0, gen)
    cites = (citing, far_ends(PAPER, citing, PAPER))
    affiliated = _repeat(num_authors, AFFILIATIONS_PER_AUTHOR, 1, gen)
    topical = _repeat(num_papers, topics_per_paper, 1, gen)
    edges: dict[Relation, Edges] = {
        (AUTHOR, "writes", PAPER): writes,
        (PAPER, "cites", PAPER): cites,
        (AUTHOR, "affiliated_with", INSTITUTION): (affiliated, far_ends(AUTHOR, affiliated, INSTITUTION)),
        (PAPER, "has_topic", FIELD): (topical, far_ends(PAPER, topical, FIELD)),
    }
    edges = {rel: _clean(rel, pair, counts, isolated) for rel, pair in edges.items()}
    if add_reverse:
        edges = add_reverse_relations(edges)

    y = community[PAPER]
    paper = {"x": _features(y, num_classes, features, gen), "y": y, **_split_masks(num_papers, gen)}
    node_data = {t: (paper if t == PAPER else {}) for t in counts}
    return HeteroDataset("mag-like", HeteroGraph.from_edges(edges, counts), node_data, num_classes, PAPER)


def _check_arguments(counts: dict[str, int], features: int, num_classes: int, authors: float, citations: float,
                     topics: float) -> None:
    small = {f"num_{t}": n for t, n in counts.items() if n < 1}
    small.update({k: v for k, v in (("features", features), ("num_classes", num_classes)) if v < 1})
    if small:
        raise GraphError(f"mag_like needs at least one of each; got {small}")
    # Every paper has one author and one topic by construction, so the means start at one.
    means = {"authors_per_paper": (authors, 1), "topics_per_paper": (topics, 1), "citations_per_paper": (citations, 0)}
    bad = {k: v for k, (v, least) in means.items() if not v >= least}
    if bad:
        raise GraphError(f"mag_like: {bad} below the least possible mean (1 author and 1 topic, 0 citations)")


class _Picker:
    """Draws nodes of one type from given communities, each with probability proportional
    to its popularity weight within its community: inverse-CDF sampling over the nodes
    sorted by community, so one ``searchsorted`` serves every community at once."""

    def __init__(self, community: torch.Tensor, weight: torch.Tensor, num_communities: int):
        self.order = torch.argsort(community, stable=True)
        # float64: a float32 running sum over 10^6 weights would lose the small ones.
        self.cum = torch.cumsum(weight[self.order].double(), 0)
        ends = torch.cumsum(torch.bincount(community, minlength=num_communities), 0)
        bounds = torch.cat([self.cum.new_zeros(1), self.cum])
        self.lo = bounds[ends - torch.bincount(community, minlength=num_communities)]
        self.hi = bounds[ends]

    def draw(self, communities: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """One node of nonzero weight per entry of ``communities``. A community with no
        such node (possible when the type has few nodes) yields one from any community."""
        u = torch.rand(communities.numel(), dtype=torch.float64, generator=gen)
        lo, hi = self.lo[communities], self.hi[communities]
        empty = hi == lo
        lo, hi = torch.where(empty, 0.0, lo), torch.where(empty, self.cum[-1], hi)
        # right=True: a target on a boundary goes to the node after it, never to a zero-weight one.
        target = lo + u * (hi - lo)
        index = torch.searchsorted(self.cum, target, right=True).clamp_(max=self.cum.numel() - 1)
        return self.order[index]


def _popularity(n: int, gen: torch.Generator) -> torch.Tensor:
    """Pareto(:data:`PARETO_ALPHA`) weights, at least 1: most nodes alike, a few hubs."""
    return (1 - torch.rand(n, dtype=torch.float64, generator=gen)).pow(-1 / PARETO_ALPHA)


def _mix(community: torch.Tensor, num_communities: int, gen: torch.Generator) -> torch.Tensor:
    """``community`` with a :data:`MIXING` share of entries replaced by random communities."""
    other = torch.randint(num_communities, community.shape, generator=gen)
    return torch.where(torch.rand(community.shape, generator=gen) < MIXING, other, community)


def _repeat(n: int, mean: float, least: int, gen: torch.Generator) -> torch.Tensor:
    """Each of ``arange(n)`` repeated ``least + Poisson(mean - least)`` times: the near
    ends of a relation where node ``i`` has that many edges."""
    extra = torch.poisson(torch.full((n,), float(mean - least)), generator=gen).long()
    return torch.repeat_interleave(torch.arange(n), extra + least)


def _isolated(n: int, gen: torch.Generator) -> torch.Tensor:
    """A bool mask of ``ceil(ISOLATED * n)`` random nodes, leaving at least one node out
    (edges need somewhere to go)."""
    mask = torch.zeros(n, dtype=torch.bool)
    mask[torch.randperm(n, generator=gen)[: min(math.ceil(ISOLATED * n), n - 1)]] = True
    return mask


def _clean(rel: Relation, pair: Edges, counts: dict[str, int], isolated: dict[str, torch.Tensor]) -> Edges:
    """The edges without self-loops, repeats and the isolated near ends' edges, sorted by (src, dst)."""
    s, _, d = rel
    src, dst = pair
    keep = ~isolated[s][src] & ~isolated[d][dst]
    if s == d:
        keep &= src != dst
    key = torch.unique(src[keep] * counts[d] + dst[keep])
    return key // counts[d], key % counts[d]


def _features(y: torch.Tensor, num_classes: int, features: int, gen: torch.Generator) -> torch.Tensor:
    """Class centroid plus unit noise; centroids :data:`SEPARATION` noise deviations apart
    on average whatever the width (pairs of random centroids are ``scale * sqrt(2F)`` apart)."""
    scale = SEPARATION / math.sqrt(2 * features)
    centroids = torch.randn(num_classes, features, generator=gen) * scale
    return centroids[y] + torch.randn(y.numel(), features, generator=gen)


def _split_masks(n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Disjoint random train/valid/test masks covering all ``n`` nodes in :data:`SPLIT` shares."""
    order = torch.randperm(n, generator=gen)
    bounds = [0, round(SPLIT[0] * n), round((SPLIT[0] + SPLIT[1]) * n), n]
    masks = {}
    for i, mask in enumerate(MASKS):
        masks[mask] = torch.zeros(n, dtype=torch.bool)
        masks[mask][order[bounds[i]: bounds[i + 1]]] = True
    return masks
