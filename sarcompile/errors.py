"""The project's exceptions. Each message says what went wrong and what to do about it."""

__all__ = [
    "SarcompileError",
    "GraphError",
    "PartitionError",
    "DatasetError",
    "CompileError",
    "CommError",
]


class SarcompileError(Exception):
    """Base class of every error this package raises on purpose.

    Example:

    >>> try:
    ...     sc.load_partition("no/such/dir", rank=0, world_size=1)
    ... except sc.SarcompileError as e:   # every error the package raises on purpose
    ...     print(type(e).__name__)
    PartitionError
    """


class GraphError(SarcompileError, ValueError):
    """A graph or an edge/node tensor does not fit what the operation needs.

    Example:

    >>> sc.Graph.from_edges(torch.tensor([0]), torch.tensor([5]), 3)
    Traceback (most recent call last):
      ...
    sarcompile.errors.GraphError: edge endpoints must lie in [0, 3), found ids from 0 to 5; pass the right num_nodes
    """


class PartitionError(SarcompileError):
    """A partition directory is missing, incomplete, corrupt or made for another world size.

    Example:

    >>> sc.load_partition("no/such/dir", rank=0, world_size=1)
    Traceback (most recent call last):
      ...
    sarcompile.errors.PartitionError: partition directory 'no/such/dir' does not exist: run `sarcompile partition` or sc.partition first
    """


class DatasetError(SarcompileError):
    """A dataset is unsupported, or its files are missing or unreadable where it is loaded from.

    Example:

    >>> sc.load_ogb("ogbn-nothing", root="dataset")
    Traceback (most recent call last):
      ...
    sarcompile.errors.DatasetError: dataset 'ogbn-nothing' is not supported; choose one of ogbn-arxiv, ogbn-products, ogbn-papers100M (homogeneous OGB node property prediction)
    """


class CompileError(SarcompileError):
    """A model cannot be traced or rewritten into a distributed plan.

    Example:

    >>> sc.distribute(sc.nn.SAGEConv(2, 4), blocks_in_flight=-1)
    Traceback (most recent call last):
      ...
    sarcompile.errors.CompileError: blocks_in_flight must be an integer >= 0 (0: no overlap, 1: the default), got -1
    """


class CommError(SarcompileError, RuntimeError):
    """A peer worker did not answer in time or went away.

    Example:

    >>> issubclass(sc.CommError, RuntimeError)   # raised in a worker whose peer is gone or silent
    True
    """


class CheckpointError(SarcompileError):
    """A training checkpoint is missing, truncated, corrupt, or made for another run.

    Example:

    >>> from sarcompile.data.checkpoint import load_checkpoint
    >>> load_checkpoint("no/such/checkpoint.pt")   # doctest: +ELLIPSIS
    Traceback (most recent call last):
      ...
    sarcompile.errors.CheckpointError: ...
    """


__all__.append("CheckpointError")


class KernelError(SarcompileError, RuntimeError):
    """A generated kernel cannot be built or launched (Triton missing, unsupported input)."""


__all__.append("KernelError")


class RunDirError(SarcompileError):
    """A run or partition directory is in use by another process, or cannot be used.

    Example:

    >>> issubclass(sc.RunDirError, sc.SarcompileError)   # e.g. two training runs on one --out
    True
    """


class TrainingError(SarcompileError, RuntimeError):
    """Training cannot go on (e.g. the loss stopped being finite).

    Example:

    >>> issubclass(sc.TrainingError, RuntimeError)   # e.g. a loss that stopped being finite
    True
    """


__all__ += ["RunDirError", "TrainingError"]


class PredictionError(SarcompileError):
    """Predictions cannot be written or read: a predictions directory that is missing a
    file, holds a damaged one, or holds another model's predictions; a ``--layer`` the
    model does not have or whose output is not one row per node.

    Example:

    >>> sc.read_predictions("no/such/dir")   # doctest: +ELLIPSIS
    Traceback (most recent call last):
      ...
    sarcompile.errors.PredictionError: ...
    """


__all__.append("PredictionError")
