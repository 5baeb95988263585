"""The training loop: :func:`train` claims the run directory, loads this worker's part, compiles
the model and runs the epochs (a step, the evaluation, the log record, the checkpoints).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

from sarcompile import errors
from sarcompile.data.checkpoint import (
    CHECKPOINT_NAME,
    checkpoint_dir,
    latest_checkpoint,
    prune_checkpoints,
    read_replicated,
    remove_temp_checkpoints,
    shard_optimizer_rows,
    shard_state,
)
from sarcompile.compile.distribute import distribute
from sarcompile.errors import (
    CheckpointError,
    PartitionError,
    RunDirError,
    SarcompileError,
    TrainingError,
)
from sarcompile.graph.hetero import parse_relation_key
from sarcompile.data.loading import load_partition
from sarcompile.data.manifest import read_manifest
from sarcompile.data.rundir import lock_dir, lock_file, remove_stale_temps
from sarcompile.dist.collectives import global_max, global_sum, sync_gradients
from sarcompile.dist.process_group import init
from sarcompile.dist.traffic import TIME_LEDGER, stats
from sarcompile.runtime.link import link_states, load_link_states
from sarcompile.dist.memory import MemoryProbe, floor_bytes
from sarcompile.graph.tables import table_type
from sarcompile.train.checkpoints import (
    BackgroundWriter,
    _agreed,
    _broadcast,
    _check_resumable,
    _checkpoint_group,
    _split_state,
    check_trainer_state,
    checkpoint_timeout,
    load_sharded,
    read_sharded,
)
from sarcompile.train import tasks
from sarcompile.train.config import FORMAT, RESUME_KEYS, TASKS, TYPED_KEYS, TrainConfig, _as_config, _out_dir
from sarcompile.train.evaluation import _check_model_kind, _metrics, _node_tensors
from sarcompile.train.log import (
    RUN_NAME,
    _comm_record,
    _comm_row,
    _comm_summary,
    _epoch_line,
    _fmt,
    _check_log_owner,
    _prepare_log,
    _report,
    _run_id,
    _time_row,
)
from sarcompile.train.model import GNN, build_model, call_model


def train(config: TrainConfig | Mapping[str, Any] | argparse.Namespace | Sequence[str]) -> list[dict[str, Any]]:
    """Train as ``python -m sarcompile.train`` does; returns this call's per-epoch records.

    ``config`` is a :class:`TrainConfig`, a dict or namespace of its fields, or a list of
    command-line arguments. Joins the process group torchrun describes (or uses the one
    already up; a single process without torchrun). Does not tear the group down: the
    caller does (``sc.shutdown()``), as :func:`main` does. Every rank returns the same
    records (the values are summed across workers); with ``resume`` only the epochs run
    by this call.

    Rank 0 locks the run directory and the log for the whole call
    (:mod:`sarcompile.data.rundir`): a second run on the same ``out`` or log is refused on
    every rank with a :class:`RunDirError` before anything is written. With ``resume="auto"``
    rank 0 decides there, under the lock, whether the run resumes (``out`` holds a complete
    checkpoint) or starts afresh, and every rank follows.
    """
    cfg = _as_config(config)
    cfg.validate()
    ckpt_limit = checkpoint_timeout()
    rank, world_size = init()
    manifest = read_manifest(cfg.parts)
    target = _check_model_kind(cfg, manifest)

    locks, group = [], None
    try:
        out, run, failure, resume = None, None, None, False
        if rank == 0:
            try:
                locks, out, run, resume = _claim_out_dir(cfg)
            except SarcompileError as e:
                failure = (type(e).__name__, str(e))
        out, run, failure, resume = _broadcast((out, run, failure, resume))
        if failure is not None:  # the same error on every rank, each exits cleanly
            raise getattr(errors, failure[0])(failure[1])
        cfg.resume = resume  # (a copy) rank 0's decision for --resume auto: every rank resumes, or none
        group = _checkpoint_group(ckpt_limit)
        return _train(cfg, rank, world_size, manifest, target, Path(out), run, group, ckpt_limit)
    finally:
        if group is not None:
            dist.destroy_process_group(group)
        for lock in locks:
            lock.release()


def _claim_out_dir(cfg: TrainConfig):
    """Rank 0: create and lock the run directory and the log, decide whether the run
    resumes (``--resume auto``: where ``out`` holds a complete checkpoint), refuse what would
    overwrite another run's files, delete the temporary files a killed run left; returns
    (the locks, out, the run's id, whether it resumes)."""
    try:
        out = Path(_out_dir(cfg))
    except OSError as e:
        raise RunDirError(f"cannot create the run directory ({e}); choose another --out") from None
    locks = [lock_dir(out, "training run")]
    try:
        log_path = Path(cfg.log) if cfg.log else out / "log.jsonl"
        locks.append(lock_file(log_path, "training run"))  # --log may name a file in another run's directory
        found = latest_checkpoint(out) is not None
        resume = cfg.resume is True or (cfg.resume == "auto" and found)
        if not cfg.resume and found:
            raise CheckpointError(
                f"'{out}' already holds a checkpoint: pass --resume auto to continue that run, or choose another --out"
            )
        if not resume and log_path.is_file() and log_path.stat().st_size > 0:
            if cfg.resume != "auto":
                raise RunDirError(
                    f"the log '{log_path}' already holds another run's lines (and there is no checkpoint to resume): "
                    "a fresh run does not overwrite it; choose another --out (or --log), or delete it"
                )
            # This run's own lines, from a start killed before its first checkpoint: it starts
            # again, and so does its log. Another run's lines are still refused.
            _check_log_owner(log_path, _run_id(out, True))
        stale = [CHECKPOINT_NAME, RUN_NAME] + ([log_path.name] if log_path.parent.resolve() == out.resolve() else [])
        remove_stale_temps(out, stale)
        remove_temp_checkpoints(out)
        run = _run_id(out, resume)
        if resume:
            _check_log_owner(log_path, run)
    except OSError as e:
        for lock in locks:
            lock.release()
        raise RunDirError(f"cannot use the run directory '{out}' ({e})") from None
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks, str(out), run, resume


def _train(cfg: TrainConfig, rank: int, world_size: int, manifest, target: str | None, out: Path,
           run_id: str | None, group: Any, ckpt_limit: float):
    log_path = Path(cfg.log) if cfg.log else out / "log.jsonl"
    floor = floor_bytes()
    part = load_partition(cfg.parts, allow_nonfinite=cfg.allow_nonfinite)
    x, y, masks = _node_tensors(part.node_data, where=f"partition '{cfg.parts}'", target=target, task=cfg.task)
    num_classes = tasks.num_outputs(y, cfg.task)
    num_train = int(global_sum(masks["train_mask"].sum()))
    if num_classes < 1 or num_train == 0:
        raise PartitionError(f"partition '{cfg.parts}' has no labelled training nodes (train_mask & y >= 0)"
                             + (f" of the target type {target!r}" if target else ""))
    labelled = int(global_sum((y >= 0).sum()))
    if cfg.task == "classification" and num_classes > labelled:  # a class id, not a count or a value: the output layer would be that wide
        ids = part.global_ids if target is None else part.global_ids[target]
        holders = torch.where(y == num_classes - 1, ids, -1)
        node = int(global_max((holders.max() if holders.numel() else ids.new_tensor(-1)).reshape(1)))
        raise PartitionError(
            f"partition '{cfg.parts}': node {node} has label {num_classes - 1}, so the model would predict "
            f"{num_classes} classes, more than the {labelled} labelled nodes; labels must be class ids 0..C-1 "
            "(-1 or any negative value for unlabelled): check y, and re-partition"
        )
    run = {**dataclasses.asdict(cfg), "num_classes": num_classes, **_model_fields(cfg, manifest, target, x)}
    graph = {"num_nodes": manifest.num_nodes, "num_edges": manifest.num_edges}
    if manifest.graph_sha256:  # the partition's identity, whatever its number of parts
        graph["sha256"] = manifest.graph_sha256

    state, manifest, ckpt_path = None, None, None
    if cfg.resume:
        ckpt_path = _broadcast(latest_checkpoint(out) if rank == 0 else None)
        if ckpt_path is None:  # (the same on every rank)
            raise CheckpointError(f"no checkpoint at '{out}': nothing to resume (run without --resume, or with "
                                  "--resume auto, to start afresh)")
        state, manifest = read_sharded(ckpt_path, rank, world_size, group, ckpt_limit)
        check_trainer_state(state, ckpt_path)
        _check_resumable(state, run, graph, ckpt_path)
    torch.manual_seed(cfg.seed)  # same initial weights and dropout seeds on every worker
    # Only this worker's rows of the typed models' node tables (an older version's single
    # file holds them whole, loaded whole below)
    own_rows = target is not None and not cfg.own_model and (state is None or manifest is not None)
    net = build_model(run, rows=part.graph.global_ids if own_rows else None)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start = 0
    if state is not None:
        if manifest is None:  # an older version's single file: the tables whole, sharded below
            net.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        start = int(state["epoch"])
    if target is not None and not cfg.own_model:  # each worker keeps its own rows of the node tables, and of their Adam state
        shard_state(net, opt, part.graph)
    _check_layer_paths(net, cfg.compress_layers)
    model = distribute(
        net, mode=cfg.mode, staleness=cfg.staleness, bounded_staleness=cfg.bounded_staleness,
        compress=cfg.compress, error_feedback=cfg.error_feedback, compress_layers=cfg.compress_layers,
        blocks_in_flight=cfg.blocks_in_flight,
    )
    reduced = bool(_comm_summary(cfg))  # (the summary is empty for the exact exchange)
    same_links = False
    if state is not None:
        model.load_mask_state(state["rng"].get("masks", {"model": model.dropout_stream().state_dict(), "layers": {}}))
        if cfg.own_model:  # its tables are found, and sharded, where it compiles
            _shard_own_tables(model, opt, part.graph, x, target)
        if manifest is not None:
            same_links = reduced and manifest.get("links") and manifest["world_size"] == world_size
            _agreed(f"reading checkpoint '{ckpt_path}'", lambda: _load_sharded_run(
                ckpt_path, manifest, state, net, opt, part.graph, rank if same_links else None), group, ckpt_limit)

    def save(epoch: int) -> None:
        """Start writing the checkpoint of ``epoch`` in the background (every rank), then keep
        the latest --keep-checkpoints."""
        weights, optimizer, rows, tables = _split_state(net, opt)
        replicated = {
            "format": FORMAT,
            "epoch": epoch,
            "model": weights,
            "optimizer": optimizer,
            "config": {k: run[k] for k in RESUME_KEYS},  # what build_model and --resume need
            "args": dataclasses.asdict(cfg),  # the whole command line of the run that wrote it
            "rng": {"torch": torch.get_rng_state(), "masks": model.mask_state()},
            "graph": graph,
            "world_size": world_size,
            "mode": cfg.mode,
        }
        links = link_states(part.graph) if reduced else None  # this worker's: resumed at the same N only
        manifest = {"epoch": epoch, "world_size": world_size, "graph_sha256": graph.get("sha256"), "run": run_id,
                    "tables": tables, "links": links is not None}
        writer.start(epoch, checkpoint_dir(out, epoch), replicated, rows, manifest, links, lambda: _agreed(
            f"deleting checkpoints older than the latest {cfg.keep_checkpoints}",
            lambda: prune_checkpoints(out, cfg.keep_checkpoints) if rank == 0 else None, group, ckpt_limit))

    show = rank == 0
    if show:
        _prepare_log(log_path, start)
        where = f"resuming from epoch {start}" if start else "starting"
        if start and reduced and same_links:
            where += " (with the links' stale caches and error-feedback residuals: on the uninterrupted curve)"
        elif start and reduced:
            where += (" (on another number of workers, or from a checkpoint without them: the stale caches and "
                      "error-feedback residuals start afresh, so the curve continues close to an uninterrupted "
                      "run's, not exactly)")
        print(
            f"{world_size} worker{'s' if world_size > 1 else ''}, {num_train} training nodes"
            f"{f' of {target!r}' if target else ''}, "
            f"{_model_summary(cfg, net)}, mode={cfg.mode}{_comm_summary(cfg)}; {where}; writing {out}",
            flush=True,
        )
    records: list[dict[str, Any]] = []
    stopped = False
    writer = BackgroundWriter(rank, group, ckpt_limit, start if state is not None else None)
    plan = model.plan(cfg.parts, optimizer=opt)
    estimate = plan.memory_estimate(checkpoint=_overlapping_checkpoints(cfg, start))[rank].peak_bytes
    probe = MemoryProbe()
    with contextlib.ExitStack() as stack:
        # Unbuffered: a write that fails (a full disk) leaves nothing for close() to retry.
        log = stack.enter_context(open(log_path, "ab", buffering=0)) if show else None
        bar = stack.enter_context(
            tqdm(total=cfg.epochs, initial=min(start, cfg.epochs), unit="epoch", file=sys.stderr,
                 disable=not (show and cfg.progress), dynamic_ncols=True)
        )
        stack.enter_context(probe)
        stack.callback(writer.close)  # (a no-op once waited for: on an error, the write in flight is finished)
        for epoch in range(start + 1, cfg.epochs + 1):
            t0 = time.perf_counter()
            stats.reset()
            loss, optimizer_s = _train_step(model, opt, part.graph, x, y, masks["train_mask"], num_train, cfg.task,
                                            target)
            train_s = time.perf_counter() - t0
            # read before evaluating: its traffic and waits are not training's
            traffic, times = _comm_row(rank, world_size), _time_row(rank, world_size, train_s, optimizer_s)
            metrics = _metrics(model, part.graph, x, y, masks, cfg.task, target)
            # One all-reduce: the loss, every rank's traffic and time ledger, and whether its
            # checkpoint write has ended (all have: every rank takes its outcome at this epoch).
            done = torch.tensor([writer.finished()], dtype=torch.float64)
            summed = global_sum(torch.cat([loss.to(torch.float64).reshape(1), traffic.reshape(-1), times.reshape(-1),
                                           done]))
            if writer.in_flight and summed[-1] == world_size:
                writer.wait()  # a failed write stops the run here, on every rank
            summed = summed[:-1]
            n, m = 1, 1 + traffic.numel()
            rec = {"epoch": epoch, "loss": float(summed[0]), **metrics}
            if run_id is not None:
                rec["run"] = run_id
            if not (cfg.allow_nonfinite or math.isfinite(rec["loss"])):  # the same sum on every rank
                writer.close()  # the last good checkpoint, if one is being written
                raise TrainingError(_nonfinite_loss_message(epoch, rec["loss"], out, writer.saved))
            rec.update(epoch_s=round(time.perf_counter() - t0, 4), train_s=round(train_s, 4), world_size=world_size)
            rec["comm"] = _comm_record(summed[n:m].reshape(traffic.shape))
            # to the microsecond: a rank's exchange waits on a small graph can sum to under 0.1 ms
            rec["time"] = {k: [round(float(v), 6) for v in summed[m:].reshape(times.shape)[:, i]]
                           for i, k in enumerate(TIME_LEDGER)}
            records.append(rec)
            if log is not None:
                try:
                    line = (json.dumps(rec) + "\n").encode()
                    while line:  # (a raw write may take part of it)
                        line = line[log.write(line):]
                except OSError as e:  # a full disk: say which file, and what is kept (a cut line is dropped on resume)
                    writer.close()
                    kept = (f"the checkpoint of epoch {writer.saved} is kept" if writer.saved is not None
                            else "no checkpoint yet")
                    raise TrainingError(
                        f"epoch {epoch}: cannot write the log '{log_path}' ({e.strerror or e}); {kept}. Free space "
                        "on its disk, or pass --log-file on another one, and --resume"
                    ) from None
                bar.write(_epoch_line(rec), file=sys.stdout)
                sys.stdout.flush()
                bar.set_postfix(loss=f"{rec['loss']:.4f}", val=_fmt(rec[f"val_{TASKS[cfg.task]}"]), refresh=False)
                bar.update(1)
            stopped = cfg.stop_after is not None and epoch == cfg.stop_after
            every = cfg.checkpoint_every and epoch % cfg.checkpoint_every == 0
            if every or stopped or epoch == cfg.epochs:
                save(epoch)
            if stopped or epoch == cfg.epochs:
                writer.wait()  # the run ends with its checkpoint complete
            if stopped:
                break

    if stopped:
        if show:
            print(f"stopped after epoch {records[-1]['epoch']} (--stop-after); continue with --resume auto", flush=True)
        return records
    _report(records, probe, rank, world_size, start, floor, estimate)
    if show and records:
        print(f"checkpoints: the training loop spent {writer.copy_s:.2f} s copying them and {writer.wait_s:.2f} s "
              "waiting for the disk (worker 0; the writes ran in the background, the last one waited for)", flush=True)
    return records


def _overlapping_checkpoints(cfg: TrainConfig, start: int) -> bool:
    """Whether a checkpoint's copy is held while later steps run: one is due before this
    run's last epoch (the final one and --stop-after's are waited for before returning)."""
    last = min(cfg.epochs, cfg.stop_after or cfg.epochs)
    every = cfg.checkpoint_every
    return bool(every) and (start // every + 1) * every < last


def _nonfinite_loss_message(epoch: int, loss: float, out: Path, saved: int | None) -> str:
    kept = (
        f"the last good checkpoint, of epoch {saved}, is kept in '{latest_checkpoint(out)}'"
        if saved is not None
        else "no checkpoint was written before it"
    )
    return (
        f"epoch {epoch}: the training loss is {loss}, not finite, so every later step would be too; stopped, and "
        f"{kept}. Lower --lr, or check the node data for extreme values; --allow-nonfinite trains on regardless"
    )


def _load_sharded_run(path: Path, manifest: dict[str, Any], state: dict[str, Any], net: nn.Module, opt,
                      graph, links_of: int | None) -> None:
    """Load a sharded checkpoint into a worker's model, its node tables sharded: its own
    rows, and (``links_of``: this rank, at the same number of workers) its links' state."""
    load_sharded(path, manifest, state, net, opt)
    if links_of is not None:
        load_link_states(graph, read_replicated(path, manifest, f"rank-{links_of:04d}/links.pt"))


def _model_fields(cfg: TrainConfig, manifest, target: str | None, x) -> dict[str, Any]:
    """What :func:`build_model` needs besides the options and the class count: the feature
    width of a one-type graph; a typed graph's types, relations, feature widths, target
    and embedding width (the target's feature width unless --embed-dim says)."""
    if target is None:
        return {"in_dim": x.shape[1], **{k: None for k in TYPED_KEYS}}
    in_dims = {t: v.shape[1] for t, v in x.items()}
    return {
        "in_dim": in_dims.get(target),
        "target": target,
        "embed_dim": None if cfg.own_model else cfg.embed_dim or in_dims[target],
        "node_counts": {t: info["num_nodes"] for t, info in manifest.node_types.items()},
        "edge_types": [list(parse_relation_key(k)) for k in manifest.edge_types],
        "in_dims": in_dims,
    }


def _train_step(model, opt, graph, x, y, mask, num_train: int, task: str,
                target: str | None) -> tuple[torch.Tensor, float]:
    """One full-batch step; returns this worker's share of the global mean loss, and the
    seconds the optimizer's step took."""
    opt.zero_grad()
    out = call_model(model, graph, x, target)
    loss = tasks.loss(out[mask], y[mask], task, num_train)
    loss.backward()
    for p in model.parameters():
        # On one machine every row of a node table has a gradient (0 where nothing reached
        # it): a worker holding no rows of its type must step it too, so that Adam's state
        # (its step count) is the same on every worker.
        if p.grad is None and table_type(p) is not None:
            p.grad = torch.zeros_like(p)
    sync_gradients(model)  # each worker holds its nodes' share of the gradient: sum them
    start = time.perf_counter()
    opt.step()
    return loss.detach(), time.perf_counter() - start


def _check_layer_paths(net: nn.Module, paths: list[str] | None) -> None:
    """Refuse a --compress-layers path that names no layer of the model: the compiler would
    silently leave everything exact."""
    if paths is None:
        return
    known = {name for name, _ in net.named_modules() if name}
    unknown = [p for p in paths if p not in known]
    if unknown:
        if isinstance(net, GNN) or hasattr(net, "layers"):  # the built-in models: the layers that communicate
            prefix = "convs" if isinstance(net, GNN) else "layers"
            layers = " ".join(f"{prefix}.{i}" for i in range(len(getattr(net, prefix))))
        else:
            layers = " ".join(name for name, m in net.named_children())
        raise ValueError(f"--compress-layers {' '.join(unknown)}: no such layer in this model (its layers: {layers})")


def _shard_own_tables(model, opt, graph, x, target: str | None) -> None:
    """On resume, a model of one's own: its node tables are found where it is compiled (by
    use, see sarcompile.graph.tables), and each worker then keeps its own rows; the optimizer's
    per-row state, loaded whole, must follow. One forward in eval mode compiles it first."""
    net = model.original
    before = {id(p) for p in net.parameters() if table_type(p) is not None}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            call_model(model, graph, x, target)
    finally:
        model.train(was_training)
    shard_optimizer_rows([p for p in net.parameters() if table_type(p) is not None and id(p) not in before], opt, graph)


def _model_summary(cfg: TrainConfig, net: nn.Module) -> str:
    """The model as the start line names it."""
    if cfg.own_model:
        return f"{type(net).__name__} from {cfg.model}"
    return f"{cfg.model} x {cfg.layers} layers"
