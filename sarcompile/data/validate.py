"""Checks on node tensors, run where data enters: at partition time and at load time.

The node tensors the trainer reads follow fixed conventions, and data that breaks them
would otherwise train silently into nonsense (a NaN feature makes every loss NaN, a float
label is truncated by ``.long()``, a float ``train_mask`` used as a mask marks every node).
So wherever node data is written or read:

* ``x`` (features): a floating-point tensor ``[nodes, features]``;
* ``y`` (labels): numbers, not booleans -- class ids (integers, negative for unlabelled
  nodes), 0/1 per label, or values to regress on; a floating-point ``y`` is checked as
  class ids by the task that reads it as such (:func:`class_ids_problem`: the trainer's
  ``--task classification``), since only the task knows;
* ``train_mask``, ``val_mask``, ``test_mask``: one boolean per node (a ``uint8``/integer
  tensor of 0 and 1, as DGL stores masks, is accepted);
* every floating-point tensor: finite (no NaN or infinity), unless ``allow_nonfinite``.

Other keys are not checked beyond finiteness. A violation raises the caller's error class
(:class:`~sarcompile.errors.GraphError` when partitioning,
:class:`~sarcompile.errors.PartitionError` when loading), naming the tensor, the first
offending node (by its original id) and column, and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from sarcompile.errors import GraphError

__all__ = ["FEATURES", "LABELS", "MASKS", "check_node_data", "class_ids_problem"]

FEATURES = "x"
LABELS = "y"
MASKS = ("train_mask", "val_mask", "test_mask")


def check_node_data(
    data: Mapping[str, torch.Tensor],
    *,
    ids: torch.Tensor | None = None,
    allow_nonfinite: bool = False,
    where: str = "node_data",
    error: type[Exception] = GraphError,
    fix: str = "",
) -> None:
    """Raise ``error`` if a tensor of ``data`` breaks the conventions above.

    ``ids[row]`` is the original id of the node in ``row`` (default: the row itself);
    ``where`` names the container in the message (``node_data``, a part file) and ``fix``
    is appended to it (e.g. "re-run partition").
    """
    for key, t in data.items():
        name = f"{where}[{key!r}]"
        problem = _problem(key, t, ids, allow_nonfinite)
        if problem:
            raise error(f"{name} {problem}" + (f"; {fix}" if fix else ""))


def _problem(key: str, t: torch.Tensor, ids: torch.Tensor | None, allow_nonfinite: bool) -> str | None:
    if key == FEATURES:
        if t.is_complex() or not t.is_floating_point():
            return (
                f"has dtype {_dtype(t)}: features must be floating point (e.g. x.float()); "
                "an integer id per node belongs in another key, or one-hot encoded in x"
            )
        if t.dim() != 2:
            hint = " (one feature per node: x.unsqueeze(1))" if t.dim() == 1 else " (flatten: x.reshape(len(x), -1))"
            return f"has shape {tuple(t.shape)}: features need two dimensions, [nodes, features]{hint}"
    elif key == LABELS:
        if t.is_complex() or t.dtype == torch.bool:
            return _float_labels(t, ids)
    elif key in MASKS:
        if t.dim() != 1:
            return f"has shape {tuple(t.shape)}: a mask needs one boolean per node, shape [nodes]"
        if t.is_floating_point() or t.is_complex():
            return (
                f"has dtype {_dtype(t)}: a mask must be boolean (e.g. torch.rand(n) < 0.6, not torch.rand(n)); "
                "as floats every nonzero value would count as selected"
            )
        if t.dtype != torch.bool:
            bad = ((t != 0) & (t != 1)).nonzero()
            if bad.numel():
                row = int(bad[0, 0])
                return (
                    f"has dtype {_dtype(t)} with values other than 0 and 1 (node {_id(ids, row)} has "
                    f"{t[row].item()}): a mask holds one boolean per node; to select nodes by index build "
                    "one with torch.zeros(n, dtype=torch.bool) and mask[index] = True"
                )
    if (t.is_floating_point() or t.is_complex()) and not allow_nonfinite:
        return _nonfinite(t, ids)
    return None


def class_ids_problem(t: torch.Tensor, ids: torch.Tensor | None = None) -> str | None:
    """What is wrong with labels ``t`` read as class ids (a message as :func:`check_node_data`
    gives), or None: they must be integers."""
    return _float_labels(t, ids) if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool else None


def _float_labels(t: torch.Tensor, ids: torch.Tensor | None) -> str:
    head = f"has dtype {_dtype(t)}: labels must be integer class ids (negative for unlabelled)"
    if t.dtype == torch.bool or t.is_complex():
        return head
    flat = _rows(t)
    bad = (~torch.isfinite(flat)).nonzero()
    if bad.numel():
        row = int(bad[0, 0])
        return f"{head}; node {_id(ids, row)} has {flat[row, int(bad[0, 1])].item()} (use -1 for a missing label)"
    bad = (flat != flat.round()).nonzero()
    if bad.numel():
        row = int(bad[0, 0])
        return (
            f"{head}; node {_id(ids, row)} has {flat[row, int(bad[0, 1])].item()}, which .long() would truncate: "
            "store the class ids"
        )
    return f"{head}; these are whole numbers: convert them with y.long()"


def _nonfinite(t: torch.Tensor, ids: torch.Tensor | None) -> str | None:
    finite = torch.isfinite(t)
    if bool(finite.all()):
        return None
    bad = (~_rows(finite)).nonzero()
    row, col = int(bad[0, 0]), int(bad[0, 1])
    value = _rows(t)[row, col].item()
    column = f", column {_column(t, col)}" if t.dim() > 1 else ""
    more = f" ({len(bad)} non-finite values in all)" if len(bad) > 1 else ""
    return (
        f"holds a non-finite value: {value} at node {_id(ids, row)}{column}{more}. NaN or infinite inputs make "
        "every loss NaN; clean the data (e.g. torch.nan_to_num, or drop the column), or pass "
        "allow_nonfinite=True (--allow-nonfinite) to keep them"
    )


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a 2-D view: one row per node, its values flattened."""
    if t.dim() == 0:
        return t.reshape(1, 1)
    return t.unsqueeze(1) if t.dim() == 1 else t.flatten(1)


def _column(t: torch.Tensor, flat_col: int) -> str:
    """The trailing index of flat column ``flat_col`` of ``t`` (an int for 2-D tensors)."""
    if t.dim() == 2:
        return str(flat_col)
    index = []
    for size in reversed(t.shape[1:]):
        index.append(flat_col % size)
        flat_col //= size
    return str(tuple(reversed(index)))


def _id(ids: torch.Tensor | None, row: int) -> int:
    return int(ids[row]) if ids is not None else row


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def check_node_tensors(
    node_data: dict[str, torch.Tensor] | None, num_nodes: int, where: str = "node_data", owner: str = "the graph"
) -> dict[str, torch.Tensor]:
    """Node tensors as detached CPU tensors with one row per node, checked before any work.
    ``where`` names the container in messages, ``owner`` what has ``num_nodes`` nodes."""
    checked = {}
    for key, t in (node_data or {}).items():
        if not isinstance(key, str):
            raise GraphError(f"{where} keys must be strings, got {key!r}")
        if not isinstance(t, torch.Tensor):
            raise GraphError(f"{where}[{key!r}] must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() == 0 or t.shape[0] != num_nodes:
            raise GraphError(
                f"{where}[{key!r}] has shape {tuple(t.shape)} but {owner} has {num_nodes} nodes; "
                "node tensors need one row per node"
            )
        checked[key] = t.detach().cpu()
    return checked
