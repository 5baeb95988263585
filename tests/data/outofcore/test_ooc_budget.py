"""sarcompile.data.outofcore.budget: sizes as users write them, and what a limit allows."""

from __future__ import annotations

import pytest

from sarcompile.errors import PartitionError
from sarcompile.data.outofcore.budget import MARGIN, Budget, parse_size


@pytest.mark.parametrize("text, expected", [("8GiB", 8 * 2**30), ("1.5GB", 1_500_000_000), ("512 MiB", 512 * 2**20),
                                            ("1000000", 1_000_000), ("2g", 2 * 10**9), ("3KiB", 3072)])
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "8 parsecs", "-1GiB", "1e3"])
def test_unreadable_sizes_say_how_to_write_one(text):
    with pytest.raises(PartitionError, match="write e.g. 8GiB"):
        parse_size(text)


def test_the_budget_grows_with_the_limit_and_refuses_too_little_for_the_nodes():
    small, large = Budget(MARGIN + 2**26, 0), Budget(MARGIN + 2**32, 0)
    assert small.chunk_edges < large.chunk_edges and small.bucket_entries < large.bucket_entries
    assert small.metis_entries < large.metis_entries
    assert large.in_memory_fits(10**5, 10**6) and not small.in_memory_fits(10**5, 10**6)
    assert small.for_nodes(10**5).chunk_edges < small.chunk_edges  # the nodes' arrays come first
    with pytest.raises(PartitionError, match=r"give --memory-limit at least \d+ MiB"):
        small.for_nodes(10**6)
