"""What the trainer predicts (``--task``): the labels it reads, the loss it trains and the
metric it logs, each the same on any number of workers.

==============  ========================================  ==================================
task            labels ``y`` (target type)                loss, metric
==============  ========================================  ==================================
classification  ``[n]`` class ids, < 0 unlabelled         cross-entropy; accuracy (``acc``)
multilabel      ``[n, L]`` 0/1 per label (ogbn-proteins)  binary cross-entropy per label;
                                                          ROC-AUC (``rocauc``)
regression      ``[n]`` or ``[n, K]`` values              mean squared error; RMSE (``rmse``)
==============  ========================================  ==================================

The loss is a mean over the training nodes of all workers (and over the labels or targets
of each): every worker sums its own nodes' terms and divides by the global count, so the
gradients summed across workers are one machine's. The model outputs ``num_classes``
values per node: the classes, the labels (logits) or the targets (``[n]`` also accepted
for one target).

ROC-AUC is computed as OGB's evaluator computes it for ogbn-proteins: per label, over the
nodes of a mask, with scikit-learn's ``roc_auc_score``, averaged over the labels that have
both a positive and a negative node there. A rank statistic is not a sum, so the masked
nodes' scores and labels are gathered to every worker (``[nodes in the mask, L]`` each);
accuracy and RMSE are sums and gather nothing.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from sarcompile.data.validate import class_ids_problem
from sarcompile.errors import PartitionError
from sarcompile.dist.collectives import global_max, global_sum
from sarcompile.train.config import MASKS, TASKS


def labels(y: torch.Tensor, task: str, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y as the loss reads it, which nodes are labelled)`` for ``task``; a
    :class:`PartitionError` for labels of the wrong shape."""
    if task == "classification":
        problem = class_ids_problem(y)
        if problem:
            raise PartitionError(f"{where}: node data 'y' {problem} (or pass --task regression to regress on them)")
        if y.dim() != 1:
            raise PartitionError(
                f"{where}: node data 'y' has shape {tuple(y.shape)}; --task classification needs one class id per "
                "node (shape [nodes]; re-partition with y.reshape(-1) for a [nodes, 1] tensor, or pass --task "
                "multilabel for 0/1 labels per node)"
            )
        y = y.long()
        return y, y >= 0  # labels < 0: unlabelled
    if task == "multilabel" and y.dim() != 2:
        raise PartitionError(f"{where}: node data 'y' has shape {tuple(y.shape)}; --task multilabel needs 0/1 labels "
                             "per node, shape [nodes, labels]")
    if y.dim() not in (1, 2):
        raise PartitionError(f"{where}: node data 'y' has shape {tuple(y.shape)}; --task regression needs a value per "
                             "node or a row of them, shape [nodes] or [nodes, targets]")
    return y.to(torch.get_default_dtype()), torch.ones(y.shape[0], dtype=torch.bool)


def num_outputs(y: torch.Tensor, task: str) -> int:
    """How many values the model outputs per node: the classes (the largest class id of all
    workers + 1), the labels or the targets."""
    if task == "classification":
        return int(global_max(y.max().reshape(1) if y.numel() else y.new_full((1,), -1))) + 1
    return 1 if y.dim() == 1 else y.shape[1]


def loss(out: torch.Tensor, y: torch.Tensor, task: str, count: int) -> torch.Tensor:
    """This worker's share of the mean loss over ``count`` training nodes of all workers
    (``out`` and ``y`` its own training nodes' rows)."""
    if task == "classification":
        return F.cross_entropy(out, y, reduction="sum") / count
    out = out.reshape(y.shape) if out.dim() == 2 and y.dim() == 1 and out.shape[1] == 1 else out
    if out.shape != y.shape:
        raise PartitionError(f"the model outputs {tuple(out.shape[1:])} values per node, the labels are "
                             f"{tuple(y.shape[1:])} per node: give the factory's num_classes to the last layer")
    per_node = 1 if y.dim() == 1 else y.shape[1]
    if task == "multilabel":
        return F.binary_cross_entropy_with_logits(out, y, reduction="sum") / (count * per_node)
    return F.mse_loss(out, y, reduction="sum") / (count * per_node)


def metrics(out: torch.Tensor, y: torch.Tensor, masks: dict[str, torch.Tensor], task: str) -> dict[str, float | None]:
    """The task's metric per mask over the nodes of all workers (every worker calls it, and
    gets the same values): ``{"train_acc": ..., "val_acc": ..., "test_acc": ...}`` and the like,
    None where a mask is empty (or, for ROC-AUC, no label has both classes)."""
    name = TASKS[task]
    if task == "multilabel":
        return {m.replace("mask", name): _rocauc(*_gathered(out[masks[m]], y[masks[m]])) for m in MASKS}
    parts = []
    for m in MASKS:
        o, t = out[masks[m]], y[masks[m]]
        if task == "classification":
            parts += [(o.argmax(-1) == t).sum(), t.new_tensor(t.shape[0])]
        else:
            o = o.reshape(t.shape) if o.dim() == 2 and t.dim() == 1 else o
            parts += [((o - t) ** 2).sum(), t.new_tensor(t.numel())]
    sums = global_sum(torch.stack([p.to(torch.float64) for p in parts]))
    values = {}
    for i, m in enumerate(MASKS):
        total, count = float(sums[2 * i]), float(sums[2 * i + 1])
        value = total / count if count else None
        values[m.replace("mask", name)] = math.sqrt(value) if task == "regression" and value is not None else value
    return values


def _gathered(scores: torch.Tensor, truth: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every worker's rows of ``scores`` and ``truth``, in rank order (padded to the longest
    for gloo's all_gather, which needs one size)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return scores, truth
    rows = torch.tensor([scores.shape[0]], dtype=torch.float64)
    longest = int(global_max(rows))
    both = torch.cat([scores.to(torch.float64), truth.to(torch.float64)], dim=1)
    padded = torch.cat([both, both.new_zeros(longest - both.shape[0], both.shape[1])])
    pieces = [torch.empty_like(padded) for _ in range(dist.get_world_size())]
    counts = [torch.empty_like(rows) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, padded)
    dist.all_gather(counts, rows)
    whole = torch.cat([p[: int(c)] for p, c in zip(pieces, counts)])
    return whole[:, : scores.shape[1]], whole[:, scores.shape[1]:]


def _rocauc(scores: torch.Tensor, truth: torch.Tensor) -> float | None:
    """The mean ROC-AUC over the labels with both classes present, as OGB's evaluator."""
    from sklearn.metrics import roc_auc_score  # (scikit-learn comes with ogb; imported when first needed)

    aucs = [roc_auc_score(truth[:, j].numpy(), scores[:, j].numpy()) for j in range(truth.shape[1])
            if 0 < float(truth[:, j].sum()) < truth.shape[0]]
    return sum(aucs) / len(aucs) if aucs else None
