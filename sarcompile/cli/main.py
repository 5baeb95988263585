"""The ``sarcompile`` command line (also ``python -m sarcompile``).

``sarcompile partition --edges FILE --parts N --out DIR`` cuts a graph into N parts for
N workers; ``--dataset ogbn-arxiv --root DIR`` in place of ``--edges`` reads an OGB dataset
instead (``--dataset ogbn-mag``: the heterogeneous one, a typed partition), ``--synthetic mag
--scale S`` generates a MAG-like typed graph, and ``--dgl-partition CONFIG.json --out DIR``
converts a partition made by DGL's ``partition_graph`` (keeping its assignment).
``sarcompile partition --help`` lists the edge file formats.
``sarcompile plan MODULE:FACTORY --parts DIR`` prints what a model will do on them, and
``sarcompile estimate MODULE:FACTORY --edges SRC.npy,DST.npy ...`` its memory per worker
for worker counts not yet partitioned, from the edge files alone.
``sarcompile allocator`` prints the path of tcmalloc's library, for
``LD_PRELOAD=$(sarcompile allocator) torchrun ...``.

This module is the grammar (every subcommand's options and help); what a command does is
:mod:`.partition`'s (partition) or :mod:`.model_commands`' (plan, explain, estimate).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sarcompile.codegen.gpu_compile import ARCHS
from sarcompile.cli.model_commands import run_estimate, run_explain, run_plan
from sarcompile.cli.partition import run_partition
from sarcompile.data.datasets import MAG, SUPPORTED
from sarcompile.compile.passes import PIPELINE
from sarcompile.errors import SarcompileError
from sarcompile.data.assign import METHODS
from sarcompile.dist import memory
from sarcompile.data.synthetic import MAG_SIZES
from sarcompile.ir.vocab import Mode

__all__ = ["main"]

EDGE_FORMATS = """\
graph sources (exactly one):
  --edges FILE                 an edge file (formats below)
  --edges SRC.npy,DST.npy      two one-dimensional integer .npy arrays (edge i: SRC[i] ->
                               DST[i]) with --num-nodes N; node data as --node-data
                               NAME=FILE.npy (x, y, train_mask, ...). Read in chunks and
                               partitioned out of core within --memory-limit (the whole
                               process's peak RSS): METIS on the whole graph where that
                               fits the limit, else on a graph coarsened out of core.
                               An edge .csv with --num-nodes or --memory-limit is read so
                               too
  --dataset NAME --root DIR    an OGB dataset read from DIR/NAME-with-_ (e.g. DIR/ogbn_arxiv/)
                               as OGB's zip extracts; never downloaded. Node data: x, y
                               (-1 = unlabelled), train_mask, val_mask, test_mask. With
                               --memory-limit its raw files are read in chunks and it is
                               partitioned out of core (homogeneous datasets).
                               NAME: {datasets}, or {mag} (heterogeneous: a typed
                               partition, reverse relations rev_* added; node data of
                               type paper)
  --synthetic mag              a generated MAG-like typed graph (paper, author,
                               institution, field_of_study; sarcompile.data.synthetic.mag_like):
                               --scale S times {mag_nodes} nodes (default 1), --seed also
                               seeds the generator
  --dgl-partition CONFIG.json  a partition written by dgl.distributed.partition_graph
                               (homogeneous graphs; needs dgl): converted with DGL's
                               node-to-part assignment and node features. Node ids are
                               DGL's reshuffled ids, or the original ids with
                               --dgl-mapping FILE (a torch.save'd orig_nids tensor, or the
                               (orig_nids, orig_eids) pair return_mapping=True returns).
                               --parts is then optional (DGL's number of parts).

edge file formats:
  .pt   torch.save'd dict with 'src' and 'dst' (node ids of each edge u->v), optional
        'num_nodes', and any other tensors with one row per node (e.g. x, y, train_mask),
        which are split into the parts as node data
  .npz  numpy.savez'd arrays with the same keys
  .csv  two integer columns, one edge per line: src,dst, or as a header line
        names them (src,dst or dst,src); a line of numbers is never a header.
        With --own-ids the two columns are your own node ids, any 64-bit integers
        (kept as int64) or else strings (spaces around them stripped): the nodes
        the edges name are numbered 0..n-1 in sorted order of the ids (integers
        ascending, strings by code point), --node-data rows follow that order, and
        DIR/node_ids.npy keeps your id of every node (sc.read_node_ids(DIR);
        sc.read_predictions(PRED, ids=True) gives it with the predictions). A first
        line that is exactly src,dst (or dst,src) is then a header. Read in chunks,
        out of core

node data is checked before anything is written: x floating point [nodes, features]
with no NaN or infinity (--allow-nonfinite keeps them), y integer labels (-1 =
unlabelled), masks boolean (or 0/1 integers)
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for bad input, with a one-line message)."""
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except (SarcompileError, OSError) as e:
        message = " ".join(str(e).split())
        print(f"sarcompile {args.command}: error: {message}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sarcompile", description="Compile single-machine PyTorch GNNs into distributed full-batch training."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser(
        "partition",
        help="cut a graph into one part per worker",
        description="Cut a graph into one part per worker and write them, with a manifest, to a directory "
        "that sc.load_partition reads.",
        epilog=EDGE_FORMATS.format(datasets=", ".join(SUPPORTED), mag=MAG, mag_nodes=sum(MAG_SIZES.values())),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--edges", metavar="FILE", help="edge list (.pt, .npz or .csv; see below)")
    source.add_argument("--dataset", metavar="NAME", help="an OGB dataset under --root (see below)")
    source.add_argument("--synthetic", choices=("mag",), help="a generated MAG-like typed graph (see below)")
    source.add_argument(
        "--dgl-partition", metavar="CONFIG.json", help="convert a DGL partition_graph output (see below)"
    )
    p.add_argument(
        "--dgl-mapping",
        metavar="FILE",
        help="with --dgl-partition: the original ids partition_graph(return_mapping=True) returned, torch.save'd",
    )
    p.add_argument("--root", metavar="DIR", help="directory holding the OGB dataset folders (needed by --dataset)")
    p.add_argument(
        "--symmetrize",
        action=argparse.BooleanOptionalAction,
        help="with --dataset: add the reverse of every edge, each pair once (default: for the datasets "
        "OGB stores directed, arxiv and papers100M, as OGB's examples do)",
    )
    p.add_argument("--scale", type=float, metavar="S", help="with --synthetic: the graph's size, S times the default")
    p.add_argument(
        "--parts", type=_positive_int, metavar="N",
        help="number of parts (= workers); needed by --edges, --dataset, --synthetic",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write the parts and manifest.json to")
    p.add_argument("--num-nodes", type=_positive_int, metavar="N", help="with --edges SRC.npy,DST.npy: the node count")
    p.add_argument(
        "--node-data", action="append", metavar="NAME=FILE.npy",
        help="with --edges SRC.npy,DST.npy or FILE.csv: a node tensor (one row per node), repeatable",
    )
    p.add_argument(
        "--own-ids", action="store_true",
        help="with --edges FILE.csv: its ids are your own (sparse integers or strings), numbered 0..n-1 in sorted "
        "order and kept in the partition (see below)",
    )
    p.add_argument(
        "--memory-limit", metavar="SIZE",
        help="with --edges SRC.npy,DST.npy (default: 3/4 of the memory available) or --dataset: the peak "
        "RSS the run may reach, e.g. 8GiB; reads in chunks and partitions out of core",
    )
    p.add_argument(
        "--scratch", metavar="DIR",
        help="out of core: where scratch files go (default: a hidden folder in --out)",
    )
    p.add_argument(
        "--method", choices=METHODS, help="how nodes are assigned to parts (default: metis)"
    )
    p.add_argument("--seed", type=int, help="seed of the metis and random methods (default: 0)")
    p.add_argument("--name", help="name recorded in the manifest (default: the edge file's or dataset's name)")
    p.add_argument(
        "--allow-nonfinite",
        action="store_true",
        help="keep NaN or infinite values in floating-point node data (refused by default, naming the node)",
    )
    p.set_defaults(run=run_partition)

    p = commands.add_parser(
        "plan",
        help="print what a model will do on a partition, and its memory per worker",
        description="Print the plan of a model on a partition directory: one row per graph op with its "
        "strategy, traffic and saved tensors, and the estimated memory per worker.",
        epilog=MODEL_SPEC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODULE:FACTORY", help="the model to plan (see below)")
    p.add_argument("--parts", required=True, metavar="DIR", help="partition directory (sarcompile partition --out)")
    p.add_argument("--args", default="{}", metavar="JSON", help="keyword arguments for FACTORY, as a JSON object")
    p.add_argument("--mode", choices=Mode.values(), default=str(Mode.SAR), help="execution mode (default: sar)")
    p.add_argument("--optimizer", choices=("adam", "sgd"), help="count this optimizer's state in the estimate")
    p.add_argument("--stage", metavar="PASS", help="also print the program after this pass: trace, "
                   + ", ".join(step.name for step in PIPELINE))
    p.add_argument(
        "--show-kernels",
        action="store_true",
        help="also print the source of every Triton kernel generated for the plan (as generated for CUDA)",
    )
    p.add_argument(
        "--gpu",
        choices=sorted(ARCHS),
        metavar="ARCH",
        help="with --show-kernels: also each kernel's registers, spills and shared memory on this GPU "
        f"architecture ({', '.join(sorted(ARCHS))}: A100, H100), compiled here with triton (no GPU needed)",
    )
    p.add_argument("--dot", metavar="FILE", help="also write the plan as Graphviz source to FILE")
    p.set_defaults(run=run_plan)

    p = commands.add_parser(
        "explain",
        help="say how each layer of a model is lowered into graph ops, or why it is refused",
        description="Compile a model for 2 workers on a small generated graph and print, layer by layer, "
        "the graph ops it became, each with its strategy and why; or, for a model that cannot run "
        "distributed, the reason and the line (exit status 1). No partition is needed.",
        epilog=MODEL_SPEC.replace("sarcompile plan examples/train_sage.py:SAGE --parts parts",
                                  "sarcompile explain examples/train_sage.py:SAGE --features 32"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODULE:FACTORY", help="the model (see below)")
    p.add_argument("--args", default="{}", metavar="JSON", help="keyword arguments for FACTORY, as a JSON object")
    p.add_argument("--features", required=True, type=_positive_int, metavar="F", help="the width of x")
    p.add_argument("--mode", choices=Mode.values(), default=str(Mode.SAR), help="execution mode (default: sar)")
    p.set_defaults(run=run_explain)

    p = commands.add_parser(
        "estimate",
        help="estimate the memory per worker of a model on a graph, for worker counts not yet partitioned",
        description="Print the estimated peak memory per worker of a model for each worker count: from a "
        "partition where one is given (--partition N=DIR), else from the random-partition model on the "
        "graph's degrees, read from its edge files in one pass (the graph is never loaded).",
        epilog=MODEL_SPEC.replace("sarcompile plan examples/train_sage.py:SAGE --parts parts",
                                  "sarcompile estimate examples/train_sage.py:SAGE --edges src.npy,dst.npy "
                                  "--num-nodes 1000000 --features 32 --workers 16 32 64"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODULE:FACTORY", help="the model (see below)")
    p.add_argument("--args", default="{}", metavar="JSON", help="keyword arguments for FACTORY, as a JSON object")
    p.add_argument("--edges", required=True, metavar="SRC.npy,DST.npy", help="the graph's edge arrays")
    p.add_argument("--num-nodes", required=True, type=_positive_int, metavar="N", help="the node count")
    p.add_argument("--features", required=True, type=_positive_int, metavar="F", help="the width of x (float32)")
    p.add_argument("--workers", type=_positive_int, nargs="+", default=[1, 2, 4, 8], metavar="N",
                   help="worker counts (default: 1 2 4 8)")
    p.add_argument("--partition", action="append", metavar="N=DIR",
                   help="a partition of this graph into N parts: that row from its plan (repeatable)")
    p.add_argument("--modes", nargs="+", choices=Mode.values(), default=[str(Mode.SAR)], help="(default: sar)")
    p.add_argument("--optimizer", choices=("adam", "sgd"), help="count this optimizer's state in the estimate")
    p.add_argument("--plot", metavar="FILE.png", help="also plot peak per worker against workers")
    p.set_defaults(run=run_estimate)

    p = commands.add_parser(
        "allocator",
        help="print the path of an allocator library to LD_PRELOAD (less memory, faster epochs)",
        description="Print the path of tcmalloc's (or jemalloc's) shared library, for "
        "LD_PRELOAD=$(sarcompile allocator) torchrun ... : glibc's allocator keeps freed tensors' memory "
        "resident in holes of its heap; tcmalloc reuses it (see docs/benchmarks.md).",
    )
    p.add_argument("name", nargs="?", choices=tuple(memory.ALLOCATORS), default="tcmalloc",
                   help="which allocator (default: tcmalloc)")
    p.set_defaults(run=_allocator)
    return parser


def _allocator(args: argparse.Namespace) -> int:
    path = memory.find_allocator(args.name)
    if path is None:
        raise SarcompileError(f"{args.name} is not installed here; install it "
                              f"({memory.ALLOCATORS[args.name].install}), or run without LD_PRELOAD "
                              "(glibc's allocator: more memory held, same results)")
    print(path)
    return 0




MODEL_SPEC = """\
naming a model:
  MODULE:FACTORY   FACTORY is a function or class in MODULE that returns the torch.nn.Module,
                   called with the keyword arguments of --args; MODULE is an importable
                   module (my_package.models) or a path to a Python file (models/gat.py),
                   whose folder is then importable, as when the file is run
example:
  sarcompile plan examples/train_sage.py:SAGE --parts parts \\
      --args '{"in_dim": 32, "hidden": 64, "num_classes": 8, "dropout": 0.5}'
"""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value
