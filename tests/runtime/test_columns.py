"""runtime/columns.py: Columns' row gathers, against the concatenated tensor."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sarcompile.runtime.columns import Columns


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 12), st.lists(st.integers(0, 5), min_size=1, max_size=3), st.data())
def test_columns_gather_what_the_concatenated_tensor_would(n, widths, data):
    parts = tuple(torch.randn(n, w, dtype=torch.float64) for w in widths)
    rows = torch.tensor(data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=20) if n else st.just([])),
                        dtype=torch.long)
    cols = Columns(parts)
    whole = torch.cat(parts, 1)
    assert cols.shape == whole.shape and cols.dtype == whole.dtype
    got = cols[rows]
    assert got.is_contiguous() and torch.equal(got, whole[rows])  # repeated rows, none, all
    assert cols.new_empty((0, whole.shape[1])).shape == (0, whole.shape[1])


def test_columns_are_data_to_send_not_part_of_the_autograd_graph():
    h = torch.randn(4, 3, requires_grad=True)
    cols = Columns((h * 2, torch.zeros(4, 1)))
    assert cols.parts[0].requires_grad and not cols.detach().parts[0].requires_grad
    rows = cols[torch.tensor([3, 0])]  # with grad mode on, from a tensor that requires grad
    assert not rows.requires_grad and torch.equal(rows, cols.detach()[torch.tensor([3, 0])])
