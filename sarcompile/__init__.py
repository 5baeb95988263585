"""sarcompile: compile a single-machine PyTorch GNN into exact distributed full-batch
training with Sequential Aggregation and Rematerialization (SAR)."""

from sarcompile import nn
from sarcompile.ir import ops
from sarcompile.compile.distribute import DistributedModule, distribute
from sarcompile.data.datasets import Dataset, HeteroDataset, load_ogb, load_ogb_mag
from sarcompile.errors import (
    CheckpointError,
    CommError,
    CompileError,
    DatasetError,
    GraphError,
    PartitionError,
    PredictionError,
    RunDirError,
    SarcompileError,
    TrainingError,
)
from sarcompile.compile.estimate import EstimateTable, estimate
from sarcompile.graph.graph import Graph
from sarcompile.graph.hetero import HeteroGraph, HeteroShard
from sarcompile.ir.ops import edge_softmax, sddmm, spmm
from sarcompile.data.manifest import Manifest
from sarcompile.data.loading import Partition, load_partition, load_whole_graph, read_node_ids
from sarcompile.data.partitioning import partition
from sarcompile.data.outofcore import partition_files
from sarcompile.plan.plan import MemoryEstimate, OpPlan, Plan
from sarcompile.predict.files import read_predictions
from sarcompile.runtime import ops as _shard_implementations  # noqa: F401  registers each IR op's shard implementation
from sarcompile.dist.cpu_cache import empty_cache
from sarcompile.dist.collectives import global_max, global_sum, sync_gradients
from sarcompile.dist.process_group import init, shutdown
from sarcompile.train.checkpoints import load_checkpoint, save_checkpoint

__version__ = "0.1.0"

__all__ = [
    "Graph",
    "HeteroGraph",
    "HeteroShard",
    "distribute",
    "DistributedModule",
    "Plan",
    "OpPlan",
    "MemoryEstimate",
    "estimate",
    "EstimateTable",
    "nn",
    "ops",
    "spmm",
    "sddmm",
    "edge_softmax",
    "partition",
    "partition_files",
    "load_partition",
    "load_whole_graph",
    "read_node_ids",
    "read_predictions",
    "Partition",
    "Manifest",
    "load_ogb",
    "Dataset",
    "load_ogb_mag",
    "HeteroDataset",
    "init",
    "shutdown",
    "sync_gradients",
    "global_sum",
    "global_max",
    "empty_cache",
    "save_checkpoint",
    "load_checkpoint",
    "SarcompileError",
    "GraphError",
    "PartitionError",
    "CompileError",
    "CommError",
    "DatasetError",
    "CheckpointError",
    "RunDirError",
    "TrainingError",
    "PredictionError",
]
