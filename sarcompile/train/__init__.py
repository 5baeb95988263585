"""``python -m sarcompile.train``: full-batch GNN training on a partition directory.

    torchrun --standalone --nproc-per-node 4 -m sarcompile.train --parts parts/ \\
        --model sage --layers 3 --hidden 256 --epochs 100
    python -m sarcompile.train --parts parts1/          # a 1-part partition, one process

Every worker loads its partition, builds the same model (same seed), compiles it with
:func:`sarcompile.distribute` and trains it: the cross-entropy summed over its training
nodes divided by the *global* number of training nodes, gradients summed across workers,
Adam. Dropout masks are keyed by global node / edge id and batch norm statistics span
all workers, so the per-epoch loss and accuracies are the same on any number of workers
(to float rounding) as on one machine.

A model of one's own trains the same way: ``--model my_model.py:build --model-args
'{"hidden": 64}'`` calls ``build(in_features=..., num_classes=..., hidden=64)`` (see
:mod:`.factory`, :func:`.model.build_model` and :func:`.model.call_model`), and ``--task
multilabel|regression`` trains other targets than one class per node (:mod:`.tasks`).

A typed partition (a heterogeneous graph, e.g. ``sarcompile partition --dataset ogbn-mag``)
trains ``--model rgcn`` or ``--model hgt`` (:mod:`sarcompile.train.typed_models`). The *target*
type is the one node type holding ``y`` and the masks (ogbn-mag's papers; ``--target``
when several do): the loss and the accuracies are its nodes'. Types without features learn
an embedding each, ``--embed-dim`` wide (default: the target's feature width), a node
table whose rows each worker holds and updates for its own nodes only, never all-reduced;
dropout masks are keyed by (type, id within the type)::

    sarcompile partition --dataset ogbn-mag --root dataset --parts 4 --out mag4
    torchrun --standalone --nproc-per-node 4 -m sarcompile.train --parts mag4 --model rgcn --hidden 64

Each epoch trains one step, then evaluates (eval mode, no gradients) the accuracy on the
``train_mask``, ``val_mask`` and ``test_mask`` nodes, counted on every worker and summed.
Rank 0 shows a progress bar (stderr), prints one line per epoch (stdout) and appends one
JSON line per epoch to the log (``OUT/log.jsonl``)::

    {"epoch": 3, "loss": 1.27, "train_acc": 0.61, "val_acc": 0.58, "test_acc": 0.59,
     "epoch_s": 0.41, "train_s": 0.33, "world_size": 4,
     "comm": {"sent": {"forward": [81920, 79872, ...], "backward": [...], "allreduce": [...]},
              "received": {"forward": [...], "backward": [...], "allreduce": [...]}}}

``epoch_s`` is the whole epoch, ``train_s`` the training step alone (forward, backward,
gradient all-reduce, optimizer step). ``comm`` is the bytes each worker (list index =
rank) sent and received during that training step, per phase: ``forward`` (remote
feature rows), ``backward`` (remote feature-gradient rows), ``allreduce`` (parameter
gradients; an all-reduce is counted as receiving what it sends) and, with
``--batch-norm``, ``batch_norm`` (its statistics). Evaluation traffic is not counted: it
is not a cost of training. All zero on one worker.

Communication reduction (opt-in, approximate; exact SAR is the default), passed to
:func:`sarcompile.distribute` (see :mod:`sarcompile.runtime.link`): ``--staleness K``
(remote rows refreshed every K training iterations), ``--bounded-staleness S``
(pipelined, exact every S), ``--compress 1bit|2bit|int4|int8`` (rows crossing workers
quantized, with error feedback unless ``--no-error-feedback``), restricted to the layers
``--compress-layers`` lists (e.g. ``convs.0``; default all).

A checkpoint (``OUT/checkpoints/epoch-NNNNNN/``, see :mod:`.checkpoints`) is written every
``--checkpoint-every`` epochs and at the end, sharded: each worker writes its own rows of
every node table and of their Adam state, rank 0 the replicated state, and the manifest
comes last; the latest ``--keep-checkpoints`` are kept. ``--resume`` continues from the
latest, on any number of workers (each reading only its own rows), to the same numbers an
uninterrupted run gives; at the same number of workers the communication reduction
options' stale caches and error-feedback residuals resume too (bit for bit), at another
their links start afresh. A checkpoint records the partition's ``graph_sha256`` (the same
for any number of parts), and ``--resume`` refuses a partition of another graph.
``--resume auto`` resumes where ``OUT`` holds a complete checkpoint and starts afresh
otherwise (rank 0 decides, under the run's lock), so a job that ``torchrun --max-restarts``
restarts continues by itself.
The workers wait for a checkpoint write up to ``SARCOMPILE_CHECKPOINT_TIMEOUT`` seconds
(default 4 x ``SARCOMPILE_TIMEOUT``), in a process group of their own.

Rank 0 locks ``OUT`` for the run's life (:mod:`sarcompile.data.rundir`): a second run on it is
refused on every rank before anything is written, and a fresh run refuses an ``OUT``
with a checkpoint or a log that already holds lines. Node data is checked when it is
loaded (:mod:`sarcompile.data.validate`), and a loss that is not finite stops the run with a
:class:`~sarcompile.errors.TrainingError` naming the epoch, before that epoch is logged
or checkpointed; ``--allow-nonfinite`` lets both through.

:func:`build_model` rebuilds the eager single-machine model from a checkpoint's config,
and :func:`load_trained` does both steps::

    model, config = load_trained("runs/x/checkpoint.pt")   # eval mode, one machine
    g, data = sc.load_whole_graph("parts")
    evaluate(model, g, data)   # {'train_acc': ..., 'val_acc': ..., 'test_acc': ...}


The package, by responsibility: :mod:`.config` (the options and their flags), :mod:`.model`
(the models, and calling them), :mod:`.factory` (a model of one's own by reference),
:mod:`.tasks` (labels, loss and metric per task), :mod:`.evaluation` (the metrics per mask,
reloading a trained model), :mod:`.checkpoints`
(writing and resuming, agreed across workers), :mod:`.log` (the JSONL log and the printed
lines), :mod:`.loop` (:func:`train`), :mod:`.cli` (``python -m sarcompile.train``).
"""

from sarcompile.train.checkpoints import checkpoint_timeout
from sarcompile.train.cli import main
from sarcompile.train.config import TrainConfig, parse_args
from sarcompile.train.evaluation import evaluate, load_trained
from sarcompile.train.loop import train
from sarcompile.train.model import GNN, build_model

__all__ = ["GNN", "TrainConfig", "build_model", "checkpoint_timeout", "evaluate", "load_trained", "main", "parse_args",
           "train"]
