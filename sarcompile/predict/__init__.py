"""``python -m sarcompile.predict``: every node's prediction, or a layer's output (its
embedding), from a trained run, on N workers::

    torchrun --standalone --nproc-per-node 4 -m sarcompile.predict --run-dir runs/x --parts parts4 --out pred
    torchrun ... -m sarcompile.predict --run-dir runs/x --parts parts4 --out emb --layer convs.0
    python -m sarcompile.predict --run-dir runs/x --parts parts1 --out pred     # one process

    out = sc.read_predictions("pred")    # [num_nodes, C] in global node order (a dict per type if typed)

Every worker rebuilds the run's model from its checkpoint (``RUN/checkpoint.pt``, as
:func:`sarcompile.train.load_trained` does), compiles it with :func:`sarcompile.distribute`
in the run's mode, runs it once in eval mode under ``torch.no_grad()`` on its part of the
partition (any number of parts of the graph the run was trained on; as many workers as
parts), and writes its own nodes' global ids and rows (:mod:`.files`). Rank 0 writes the
manifest last. The values are the eager model's on the whole graph, to float rounding.

With ``--layer NAME`` (a submodule's path: ``convs.0``, ``layers.1``; an unknown name is
refused with the list of names) the rows are that layer's output instead
(:mod:`.layer`); a typed model's layer that gives a dict per node type writes every type
in it. A model's own output on a typed graph is its target type's rows.

Refused before anything is written, on every rank: a run directory without a checkpoint,
a partition of another graph (its ``graph_sha256`` against the checkpoint's) or of another
number of parts than workers, an unknown ``--layer`` or one whose output is not one row
per node, and an ``--out`` that holds other files, or the predictions of another
checkpoint or layer (``--overwrite`` replaces those). Rank 0 locks ``--out`` while it
writes, shows a progress bar on stderr and prints one line when done; a failure ends every
worker with a one-line message, as in ``python -m sarcompile.train``.

The package: :mod:`.run` (:func:`predict`), :mod:`.layer` (``--layer``), :mod:`.files`
(the directory's files, :func:`read_predictions`), :mod:`.cli` (the command line).
"""

from sarcompile.predict.cli import main
from sarcompile.predict.files import read_predictions
from sarcompile.predict.layer import LayerOutput
from sarcompile.predict.run import PredictConfig, parse_args, predict

__all__ = ["LayerOutput", "PredictConfig", "main", "parse_args", "predict", "read_predictions"]
