"""Node tensors side by side, sent as one: :class:`Columns`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Columns"]


@dataclass(frozen=True)
class Columns:
    """Node tensors side by side, as the one ``[n, sum of widths]`` tensor a round sends,
    without making it: ``columns[rows]`` gathers the rows straight into one buffer.
    (Attention sends ``h`` with ``a_src``; a whole concatenated copy would be one more
    ``[n, H*C]`` buffer next to the exchange's own, at its peak.) As a round's ``push_into``
    the gradients received add into each part (:meth:`index_add_`): they stay tensors of
    their own, which autograd can add the other gradients of ``h`` into in place."""

    parts: tuple[torch.Tensor, ...]  # 2-D, the same rows and dtype

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.parts[0].shape[0], sum(p.shape[1] for p in self.parts)))

    @property
    def dtype(self) -> torch.dtype:
        return self.parts[0].dtype

    @property
    def device(self) -> torch.device:
        return self.parts[0].device

    def __getitem__(self, rows: torch.Tensor) -> torch.Tensor:
        """The rows, as data to send: autograd does not see the gather (out= cannot be
        differentiated)."""
        return self.gather(rows, self.new_empty((rows.numel(), self.shape[1])))

    def gather(self, rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The rows, written into ``out`` (``[rows, sum of widths]``)."""
        with torch.no_grad():
            for p, columns in self._beside(out):
                torch.index_select(p, 0, rows, out=columns)
        return out

    def index_add_(self, dim: int, rows: torch.Tensor, source: torch.Tensor) -> "Columns":
        """``self[rows] += source`` (``source``: ``[rows, sum of widths]``), part by part."""
        for p, columns in self._beside(source):
            p.index_add_(dim, rows, columns)
        return self

    def _beside(self, wide: torch.Tensor):
        """Each part with its own columns of ``wide`` (``[any rows, sum of widths]``)."""
        start = 0
        for p in self.parts:
            yield p, wide[:, start : start + p.shape[1]]
            start += p.shape[1]

    def new_empty(self, shape: tuple[int, ...]) -> torch.Tensor:
        return self.parts[0].new_empty(shape)

    def detach(self) -> "Columns":
        return Columns(tuple(p.detach() for p in self.parts))
