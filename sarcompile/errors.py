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
    """Base class of every error this package raises on purpose."""


class GraphError(SarcompileError, ValueError):
    """A graph or an edge/node tensor does not fit what the operation needs."""


class PartitionError(SarcompileError):
    """A partition directory is missing, incomplete, corrupt or made for another world size."""


class DatasetError(SarcompileError):
    """A dataset is unsupported, or its files are missing or unreadable where it is loaded from."""


class CompileError(SarcompileError):
    """A model cannot be traced or rewritten into a distributed plan."""


class CommError(SarcompileError, RuntimeError):
    """A peer worker did not answer in time or went away."""


class CheckpointError(SarcompileError):
    """A training checkpoint is missing, truncated, corrupt, or made for another run."""


__all__.append("CheckpointError")


class KernelError(SarcompileError, RuntimeError):
    """A generated kernel cannot be built or launched (Triton missing, unsupported input)."""


__all__.append("KernelError")


class RunDirError(SarcompileError):
    """A run or partition directory is in use by another process, or cannot be used."""


class TrainingError(SarcompileError, RuntimeError):
    """Training cannot go on (e.g. the loss stopped being finite)."""


__all__ += ["RunDirError", "TrainingError"]
