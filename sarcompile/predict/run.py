""":func:`predict`: load a trained run's model, run it forward on this worker's part without
gradients, and write this worker's rows (see :mod:`sarcompile.predict.files`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from sarcompile import errors
from sarcompile.compile.distribute import DistributedModule, distribute
from sarcompile.data.checkpoint import latest_checkpoint, recorded_identity
from sarcompile.data.manifest import Manifest, now, read_manifest
from sarcompile.data.rundir import _atomic_write
from sarcompile.data.loading import load_partition
from sarcompile.data.rundir import DirLock, lock_dir, remove_stale_temps
from sarcompile.errors import CheckpointError, PartitionError, PredictionError, SarcompileError
from sarcompile.dist.process_group import init
from sarcompile.dist.memory import MemoryProbe, floor_bytes
from sarcompile.train.typed_models import TYPED_MODELS
from sarcompile.train.checkpoints import _agreed, _broadcast, _checkpoint_group, check_trainer_state, checkpoint_timeout, \
    load_sharded, read_sharded
from sarcompile.train.log import RUN_NAME, gather_peaks, peak_line
from sarcompile.train.model import build_model, call_model, graph_first
from sarcompile.predict.files import FORMAT, MANIFEST_NAME, copy_user_ids, is_ours, read_predictions_manifest, record_user_ids, \
    write_rows
from sarcompile.predict.layer import LayerOutput

__all__ = ["PredictConfig", "TrainedRun", "parse_args", "predict", "read_run"]


@dataclass
class PredictConfig:
    """Every option of ``python -m sarcompile.predict`` (field ``x_y`` is flag ``--x-y``)."""

    run: str
    parts: str
    out: str
    layer: str | None = None
    overwrite: bool = False
    progress: bool = True


def parse_args(argv: Sequence[str] | None = None) -> PredictConfig:
    ap = argparse.ArgumentParser(
        prog="python -m sarcompile.predict",
        description="Write every node's prediction (or, with --layer, a layer's output: embeddings) of a trained "
        "run, each worker its own rows. Run under torchrun with as many workers as --parts has parts.",
    )
    # --run-dir first: under torchrun, whose parser sees every argument, a bare --run is an
    # ambiguous abbreviation of its own --run-path and stops the launch (API.md's --run works
    # in one process, as the trainer's --log does).
    ap.add_argument("--run-dir", "--run", dest="run", required=True, metavar="RUN_DIR",
                    help="the trainer's --out (holds checkpoint.pt); --run also works without torchrun")
    ap.add_argument("--parts", required=True, metavar="P", help="a partition of the graph the run was trained on")
    ap.add_argument("--out", required=True, metavar="DIR", help="directory to write the predictions to")
    ap.add_argument("--layer", metavar="NAME", help="write this submodule's output instead (e.g. convs.1)")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace the predictions of another model or layer that --out holds")
    ap.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return PredictConfig(**vars(ap.parse_args(argv)))


def predict(config: PredictConfig | Mapping[str, Any] | Sequence[str]) -> dict[str, Any]:
    """Predict as ``python -m sarcompile.predict`` does; returns the manifest (every rank).

    ``config`` is a :class:`PredictConfig`, a dict of its fields, or command-line arguments.
    Joins the process group torchrun describes (or uses the one already up; one process
    without torchrun), which the caller tears down. Every worker reads the checkpoint and
    its part, runs the compiled model in eval mode under ``torch.no_grad()`` and writes its
    own rows; rank 0 locks ``out`` for the call and writes the manifest last.

    Refused before anything is computed, on every rank: a run directory without a
    checkpoint, a partition of another graph or with another number of parts than
    workers, an unknown ``layer``, an ``out`` holding other files or another model's
    predictions (unless ``overwrite``).
    """
    cfg = _as_config(config)
    rank, world_size = init()
    floor = floor_bytes()
    limit = checkpoint_timeout()
    manifest = read_manifest(cfg.parts)
    group, locks = _checkpoint_group(limit), []
    try:
        with tqdm(total=3, unit="step", file=sys.stderr, disable=not (rank == 0 and cfg.progress),
                  dynamic_ncols=True) as bar:
            bar.set_description("reading the checkpoint and the part")
            trained = read_run(Path(cfg.run), rank, world_size, group, limit)
            state, model_id = trained.state, trained.identity
            _check_graph(state, manifest, cfg)
            model_id["layer"] = cfg.layer
            part = load_partition(cfg.parts)  # a partition of another number of parts: refused
            net = trained.model(part.graph, group, limit)
            # an unknown layer: refused here
            module = LayerOutput(net.eval(), cfg.layer, _in_convention) if cfg.layer else net.eval()
            failure = None
            if rank == 0:
                try:
                    locks = [_claim_out(Path(cfg.out), model_id, cfg.overwrite)]
                except SarcompileError as e:
                    failure = (type(e).__name__, str(e))
            failure = _broadcast(failure)
            if failure is not None:  # the same error on every rank
                raise getattr(errors, failure[0])(failure[1])
            bar.update(1)
            model = distribute(module, mode=model_id["mode"] or "sar")
            with MemoryProbe() as probe:
                records = _predict(cfg, part, state, model, group, bar)
            estimate = model.plan(cfg.parts).memory_estimate(inference=True)[rank].peak_bytes
        memory = gather_peaks(probe, rank, world_size, floor, estimate)
        return _finish(cfg, rank, world_size, manifest, model_id, records, group, memory)
    finally:
        if group is not None:
            dist.destroy_process_group(group)
        for lock in locks:
            lock.release()


@dataclass
class TrainedRun:
    """A trained run's latest checkpoint as a worker reads it (:func:`read_run`): its
    ``path``; its replicated ``state`` (``config``, ``model`` without the node tables of a
    sharded checkpoint, ...); the checkpoint's ``manifest`` (None for an older version's
    single file, whose ``state`` holds the tables whole); and its ``identity``: the run's
    id, the checkpoint's epoch and sha256."""

    path: Path
    state: dict[str, Any]
    manifest: dict[str, Any] | None
    identity: dict[str, Any]

    def model(self, graph: Any, group: Any = None, limit_s: float | None = None) -> torch.nn.Module:
        """The trained eager model, for the worker whose shard is ``graph``
        (``part.graph``): a built-in typed model holds only the worker's rows of its node
        tables, read alone from the checkpoint's shards; a model of one's own is loaded
        whole, and its compiled call keeps the worker's rows. Agreed on every rank."""
        config = self.state["config"]
        if self.manifest is None:
            net = build_model(config)
            net.load_state_dict(self.state["model"])
            return net
        own_rows = config.get("target") is not None and config.get("model") in TYPED_MODELS
        net = build_model(config, rows=graph.global_ids if own_rows else None)
        _agreed(f"reading checkpoint '{self.path}'", lambda: load_sharded(self.path, self.manifest, self.state, net,
                                                                          None), group, limit_s)
        return net


def read_run(run_dir: Path, rank: int = 0, world_size: int = 1, group: Any = None,
             limit_s: float | None = None) -> TrainedRun:
    """A trained run's latest checkpoint, as worker ``rank`` of ``world_size`` reads it: its
    replicated state, each rank checking its share of the node tables' files (see
    :class:`TrainedRun`). Every rank reads it, agreeing on failure. The one place that
    knows where a run keeps its weights."""
    path = latest_checkpoint(run_dir)
    if path is None:
        what = "does not exist" if not run_dir.exists() else "has no checkpoint"
        raise CheckpointError(f"run directory '{run_dir}' {what}: give the --out of a training run that wrote a "
                              "checkpoint (python -m sarcompile.train --out RUN_DIR ...)")
    header = recorded_identity(path)  # before the state: a checkpoint replaced meanwhile shows in the epoch
    state, manifest = read_sharded(path, rank, world_size, group, limit_s)
    check_trainer_state(state, path)
    if header.get("epoch") != state["epoch"]:
        raise CheckpointError(f"checkpoint '{path}' changed while it was read (a run is training into "
                              f"'{run_dir}'?); predict again once it is written")
    try:
        run = json.loads((run_dir / RUN_NAME).read_text()).get("run")
    except (OSError, ValueError, AttributeError):
        run = None  # a run directory from before run ids
    return TrainedRun(path, state, manifest, {
        "run": run, "run_dir": str(run_dir.resolve()), "epoch": state["epoch"],
        "checkpoint_sha256": header.get("sha256"), "config": state["config"], "mode": state.get("mode")})


def _check_graph(state: dict[str, Any], manifest: Manifest, cfg: PredictConfig) -> None:
    """Refuse a partition of another graph than the one the run was trained on."""
    trained = state.get("graph") or {}
    ours = {"num_nodes": manifest.num_nodes, "num_edges": manifest.num_edges, "sha256": manifest.graph_sha256}
    # Checkpoints and manifests older than the graph's identity have none: then the sizes must do.
    differ = [k for k, v in ours.items() if v is not None and trained.get(k) is not None and trained[k] != v]
    if differ:
        detail = ", ".join(f"{k} {trained[k]} there, {ours[k]} here" for k in differ)
        raise PartitionError(
            f"partition '{cfg.parts}' is of another graph than run '{cfg.run}' was trained on ({detail}): "
            "predict with a partition of that graph (any number of parts)"
        )


def _claim_out(out: Path, model_id: dict[str, Any], overwrite: bool) -> DirLock:
    """Rank 0: create and lock ``out`` and clear what an earlier prediction left there;
    refuse a directory holding other files, or another model's or layer's predictions
    without ``overwrite``."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock = lock_dir(out, "prediction run")
    except OSError as e:
        raise PredictionError(f"cannot create --out '{out}' ({e}); choose another --out") from None
    try:
        others = sorted(p.name for p in out.iterdir() if not is_ours(p.name))
        if others:
            raise PredictionError(f"--out '{out}' holds files that are not predictions ({', '.join(others[:5])}): "
                                  "choose a new or empty directory")
        if (out / MANIFEST_NAME).exists():
            try:
                old = read_predictions_manifest(out)[0]["model"]
            except (PredictionError, KeyError, TypeError):
                old = None
            same = old is not None and all(old.get(k) == model_id[k] for k in ("checkpoint_sha256", "layer"))
            if not (same or overwrite):
                what = (f"of run {old.get('run')} (epoch {old.get('epoch')}"
                        f"{', layer ' + old['layer'] if old.get('layer') else ''})" if old else "that cannot be read")
                raise PredictionError(f"--out '{out}' holds predictions {what}, not of this checkpoint and layer: "
                                      "pass --overwrite to replace them, or choose another --out")
            (out / MANIFEST_NAME).unlink()  # first: a directory without it is one being written
        for path in out.glob("*.npy"):
            path.unlink()
        (out / "global.json").unlink(missing_ok=True)
        remove_stale_temps(out, ["*"])
    except OSError as e:
        lock.release()
        raise PredictionError(f"cannot use --out '{out}' ({e}); choose another --out") from None
    except BaseException:
        lock.release()
        raise
    return lock


def _predict(cfg: PredictConfig, part: Any, state: dict[str, Any], model: DistributedModule, group: Any,
             bar: tqdm) -> list[list[dict[str, Any]]]:
    """Run the compiled model on this worker's part and write its rows; every worker's file
    records, per worker a list per node type written."""
    bar.set_description("forward")
    target = state["config"].get("target")
    x = part.node_data["x"] if target is None else {t: d["x"] for t, d in part.node_data.items() if "x" in d}
    # A model of one's own has its node tables loaded whole; the compiled call keeps this
    # worker's rows (the built-in typed models' hold only them already).
    with torch.no_grad():  # (a LayerOutput is called as sarcompile's models are: module(graph, x))
        output = model(part.graph, x) if cfg.layer else call_model(model, part.graph, x, target)
    rows, error = _rows(output, part, target, cfg.layer)
    _agree(error)
    bar.update(1)
    bar.set_description("writing")
    out, records, error = Path(cfg.out), [], None
    try:
        records = [write_rows(out, part.rank, t, i, part.global_ids if t is None else part.global_ids[t], v)
                   for i, (t, v) in enumerate(rows.items())]
    except OSError as e:
        error = f"worker {part.rank} cannot write its rows to '{out}' ({e.strerror or e}); free space or choose " \
                "another --out"
    every = _agree(error, [(t, r) for t, r in zip(rows, records)], group)
    bar.update(1)
    return every


def _finish(cfg: PredictConfig, rank: int, world_size: int, manifest: Manifest, model_id: dict[str, Any],
            every: list[list[tuple[str | None, dict[str, Any]]]], group: Any,
            memory: list[dict[str, int]]) -> dict[str, Any]:
    """Rank 0 writes the manifest, once every worker has written its rows; returns it.
    ``memory``: every worker's peak and the plan's inference estimate (:func:`gather_peaks`)."""
    out = Path(cfg.out)
    counts = {t: info["num_nodes"] for t, info in (manifest.node_types or {}).items()}
    types = [t for t, _ in every[0]]
    result = {
        "format": FORMAT,
        "typed": manifest.typed,
        "layer": cfg.layer,
        "world_size": world_size,
        "outputs": [_output(t, [dict(r)[t] for r in every], manifest.num_nodes if t is None else counts[t])
                    for t in types],
        "model": model_id,
        "graph": {"sha256": manifest.graph_sha256, "num_nodes": manifest.num_nodes, "num_edges": manifest.num_edges,
                  "partition": str(Path(cfg.parts).resolve()), "num_parts": manifest.num_parts},
        # The rows are keyed by the partition's global node ids: those of the graph it was
        # made from (an edge file's ids, OGB's node indices, DGL's ids as converted). Where
        # the partition keeps the user's own ids, each output's "user_ids" names a copy.
        "node_ids": {"source": manifest.name, "ids": "the partition's global node ids"},
        "created": now(),
        "memory": memory,
    }
    record_user_ids(manifest, result["outputs"])
    error = None
    if rank == 0:
        try:
            copy_user_ids(Path(cfg.parts), manifest, out, result["outputs"])
            text = json.dumps(result, indent=1) + "\n"
            _atomic_write(out / MANIFEST_NAME, lambda f: f.write(text.encode()))
        except OSError as e:
            error = f"cannot write '{out / MANIFEST_NAME}' ({e.strerror or e}); free space or choose another --out"
        except PartitionError as e:  # the partition's id file is missing or damaged
            error = str(e)
    _agree(error, None, group)  # the manifest is there when predict returns on any rank
    if rank == 0:
        what = f"layer {cfg.layer}" if cfg.layer else "predictions"
        sizes = ", ".join(f"{o['type'] + ' ' if o['type'] else ''}{o['shape']}" for o in result["outputs"])
        print(f"{world_size} worker{'s' if world_size > 1 else ''} wrote the {what} of the checkpoint of epoch "
              f"{model_id['epoch']} ({sizes}) to {out}", flush=True)
        for r, peak in enumerate(memory):
            print(peak_line(r, peak, "the forward and the writing"), flush=True)
    return result


def _in_convention(model: torch.nn.Module, graph: Any, x: Any) -> Any:
    """``model`` called in its convention, as the trainer's :func:`call_model` calls it, its
    output unchecked: inside a :class:`LayerOutput` it runs while the model is traced."""
    return model(graph, x) if graph_first(model) else model(x, graph)


def _rows(output: Any, part: Any, target: str | None, layer: str | None) -> tuple[dict, str | None]:
    """``{node type (None on a one-type graph): this worker's rows}`` of the output, or
    the error that says why it is not one row per node."""
    what = f"--layer {layer}" if layer else "the model"
    if isinstance(output, Mapping) and target is not None:
        rows = dict(output)
    elif isinstance(output, torch.Tensor):
        rows = {target: output}
    else:
        return {}, (f"{what} returns a {type(output).__name__}, not a tensor of one row per node"
                    + (" (nor a dict of them per node type)" if target is not None else ""))
    counts = part.graph.num_nodes if target is None else {t: len(ids) for t, ids in part.global_ids.items()}
    for t, v in rows.items():
        if target is not None and t not in counts:
            return {}, f"{what} returns a dict with key {t!r}, which is not a node type ({', '.join(counts)})"
        n = counts if t is None else counts[t]
        if not isinstance(v, torch.Tensor) or v.dim() == 0 or v.shape[0] != n:
            shape = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
            of = f" of {t!r}" if t is not None else ""
            return {}, (f"{what} gives {shape} on worker {part.rank}, which holds {n} nodes{of}: not one row per "
                        "node, so it has no per-node values to write; name a layer whose output has a row per node")
    return rows, None


def _agree(error: str | None, value: Any = None, group: Any = None) -> list[Any]:
    """Every rank's ``value``, or on every rank the first rank's error: no rank goes on
    alone (each would wait for the others in its next collective)."""
    sent = (error, value)
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        got = [sent]
    else:
        got = [None] * dist.get_world_size()
        dist.all_gather_object(got, sent, group=group)
    failed = [e for e, _ in got if e is not None]
    if failed:
        raise PredictionError(failed[0])
    return [v for _, v in got]


def _output(ntype: str | None, parts: list[dict[str, Any]], num_nodes: int) -> dict[str, Any]:
    """A node type's record in the manifest: its node count, the global shape and dtype of
    its rows, and every worker's files."""
    width = next((p["values"]["shape"][1:] for p in parts), [])
    dtype = next((p["values"]["dtype"] for p in parts), "float32")
    return {"type": ntype, "num_nodes": num_nodes, "dtype": dtype, "shape": [num_nodes, *width], "parts": parts}


def _as_config(config: Any) -> PredictConfig:
    if isinstance(config, PredictConfig):
        return config
    if isinstance(config, Mapping):
        return PredictConfig(**config)
    if isinstance(config, argparse.Namespace):
        return PredictConfig(**vars(config))
    return parse_args(list(config))

