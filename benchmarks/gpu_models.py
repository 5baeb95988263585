"""One GPU, whole models: compiled sarcompile against eager PyG -- exactness, step time, peak memory.

    python benchmarks/gpu_models.py                       # on a CUDA machine: 200k nodes, 4M edges
    python benchmarks/gpu_models.py --device cpu --small  # checks the script on a CPU (CI, seconds)

Two models, built as the examples build them:

* ``sage``: examples/train_sage.py's ``SAGE`` (sarcompile's own ``SAGEConv`` layers),
  compiled; its eager reference is the same two layers in PyG (:class:`PygSAGE`), given
  the same weights.
* ``pyg``: examples/train_pyg.py's ``Net`` (PyG ``SAGEConv`` -> ``BatchNorm`` ->
  ``GATConv``), compiled unchanged; its eager reference is ``Net`` itself.

Dropout is 0 in both, so that neither draws masks (sarcompile's are keyed by node and edge,
torch's are not). Each engine runs alone on the device, one after the other: its first
training step (forward, cross-entropy over the training nodes, backward; no optimizer)
compiles the model and autotunes its kernels, and its loss, output and every parameter's
gradient are kept; then ``--repeats`` timed steps, then one step under
:class:`~sarcompile.dist.memory.MemoryProbe`.

Exactness: one worker's compiled model must give the eager model's output, loss and
gradients. In float32 every tensor must be within ``--tolerance`` (default 1e-4) of the
reference, relative to its largest magnitude (gradients: to the largest of all the
parameters' gradients; see :func:`errors`) -- summation order differs
(generated kernels against PyG's scatter, atomics on a GPU), so bitwise equality is not
expected; float64 exactness is checked in CI on CPU (tests/test_nn.py, tests/test_examples.py).

Step time: the median of the timed steps. Peak memory: the largest allocation during a
step (``torch.cuda.max_memory_allocated`` on CUDA; the process's peak resident set on CPU,
where it only keeps the script honest) above what was allocated before the engine was built,
so it counts the engine's model, graph structures, activations and gradients, and not the
features and labels both engines share. Ratios are sarcompile's over PyG's.

Writes ``--out`` (default benchmarks/results/gpu_models.json) and prints a markdown table;
exits 1 when a check fails or an engine raises (the JSON says which), 0 otherwise.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import torch_geometric.nn as gnn
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))  # the examples' models, imported unchanged
from harness import random_graph, results_dir, write_result
from train_pyg import Net
from train_sage import SAGE

import sarcompile as sc
from sarcompile.dist.memory import MemoryProbe

MODELS = ("sage", "pyg")
SIZES = {  # what fits a short lend on one GPU, and what runs in seconds on a CPU
    "full": {"nodes": 200_000, "degree": 20, "features": 128, "hidden": 64, "classes": 16, "heads": 4, "repeats": 10},
    "small": {"nodes": 2_000, "degree": 10, "features": 16, "hidden": 16, "classes": 4, "heads": 2, "repeats": 3},
}


class PygSAGE(nn.Module):
    """examples/train_sage.py's ``SAGE`` (dropout 0) in PyG layers, with the same parameter
    names, so that ``load_state_dict`` of the sarcompile model's weights fits."""

    def __init__(self, in_dim: int, hidden: int, num_classes: int):
        super().__init__()
        self.conv1 = gnn.SAGEConv(in_dim, hidden, aggr="mean")
        self.conv2 = gnn.SAGEConv(hidden, num_classes, aggr="mean")

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(torch.relu(self.conv1(x, edge_index)), edge_index)


# An engine: builds its model on the device and the arguments of its call.
Engine = Callable[[], tuple[nn.Module, tuple]]


def engines(model: str, a: argparse.Namespace, data: dict) -> dict[str, Engine]:
    """The compiled and the eager engine of ``model``, from one set of initial weights."""
    device, n = data["x"].device, data["x"].shape[0]
    g = sc.Graph.from_edges(data["src"], data["dst"], n)
    edge_index = torch.stack([data["src"], data["dst"]]).to(device)
    torch.manual_seed(0)
    if model == "sage":
        weights = SAGE(a.features, a.hidden, a.classes, dropout=0.0).state_dict()

        def ours() -> tuple[nn.Module, tuple]:
            net = SAGE(a.features, a.hidden, a.classes, dropout=0.0)
            net.load_state_dict(weights)
            return sc.distribute(net.to(device)), (g, data["x"])

        def pyg() -> tuple[nn.Module, tuple]:
            net = PygSAGE(a.features, a.hidden, a.classes)
            # every weight; what is left is the dropout's mask stream, which PyG has no use for
            missing = net.load_state_dict(weights, strict=False).missing_keys
            assert not missing, missing
            return net.to(device), (data["x"], edge_index)
    else:
        weights = Net(a.features, a.hidden, a.classes, a.heads, attn_dropout=0.0).state_dict()

        def eager_net() -> nn.Module:
            net = Net(a.features, a.hidden, a.classes, a.heads, attn_dropout=0.0)
            net.load_state_dict(copy.deepcopy(weights))
            return net.to(device)

        def ours() -> tuple[nn.Module, tuple]:
            return sc.distribute(eager_net()), (data["x"], g)

        def pyg() -> tuple[nn.Module, tuple]:
            return eager_net(), (data["x"], edge_index)
    return {"sarcompile": ours, "pyg": pyg}


def step(model: nn.Module, args: tuple, data: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """One full-batch training step without the optimizer: forward, loss, backward."""
    model.zero_grad(set_to_none=True)
    out = model(*args)
    mask = data["train_mask"]
    loss = F.cross_entropy(out[mask], data["y"][mask])
    loss.backward()
    return out, loss


def measure(build: Engine, data: dict, repeats: int) -> tuple[dict, dict[str, torch.Tensor]]:
    """Run one engine alone on the device; returns its timings and peak memory, and its first
    step's output, loss and parameter gradients (on the CPU, by name)."""
    device = data["x"].device
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    with MemoryProbe(device.type) as before:  # what is allocated before the engine exists
        pass
    sync()
    t0 = time.perf_counter()
    model, args = build()
    out, loss = step(model, args, data)  # the compiled model compiles (and autotunes) here
    sync()
    first = time.perf_counter() - t0
    result = {"out": out.detach().cpu(), "loss": loss.detach().cpu()}
    for name, p in model.named_parameters():
        result[f"grad {name}"] = torch.zeros_like(p, device="cpu") if p.grad is None else p.grad.cpu()
    del out, loss
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        step(model, args, data)
        sync()
        times.append(time.perf_counter() - t0)
    with MemoryProbe(device.type) as probe:
        step(model, args, data)
    del model, args
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    timing = {"first_step_s": first, "step_s": statistics.median(times),
              "peak_bytes": max(probe.peak_bytes - before.start_bytes, 0)}
    return timing, result


def errors(ours: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per tensor: the largest difference from the reference over a scale -- the output's
    and the loss's own largest magnitude, and for every gradient the largest magnitude of
    any of the reference's gradients (the scale an optimizer step sees: a gradient that is
    zero in exact arithmetic, such as a bias's before BatchNorm, is rounding noise, whose own
    magnitude is no scale). A tensor that only one side has, or that differs in shape,
    counts as infinitely wrong."""
    def largest(t: torch.Tensor) -> float:
        return t.abs().max().item() if t.numel() else 0.0

    grad_scale = max((largest(t) for k, t in ref.items() if k.startswith("grad ")), default=0.0)
    out = {}
    for name in sorted(ours.keys() | ref.keys()):
        a, b = ours.get(name), ref.get(name)
        if a is None or b is None or a.shape != b.shape:
            out[name] = float("inf")
            continue
        diff = largest(a.double() - b.double())
        scale = grad_scale if name.startswith("grad ") else largest(b)
        out[name] = diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))
    return out


def run_model(model: str, a: argparse.Namespace, data: dict) -> dict:
    """Both engines of ``model``, compared; an engine that raises is reported, not fatal."""
    row: dict = {"model": model}
    results = {}
    for name, build in engines(model, a, data).items():
        try:
            row[name], results[name] = measure(build, data, a.repeats)
        except Exception as e:  # report and go on: one run on a lent GPU should say as much as it can
            traceback.print_exc()
            row[name] = {"error": f"{type(e).__name__}: {e}"}
    if len(results) == 2:
        errs = errors(results["sarcompile"], results["pyg"])
        worst = max(errs, key=errs.get)
        row["exact"] = {"passed": errs[worst] <= a.tolerance, "worst": worst, "errors": errs}
        row["step_ratio"] = row["sarcompile"]["step_s"] / row["pyg"]["step_s"]
        pyg_peak = row["pyg"]["peak_bytes"]
        row["peak_ratio"] = row["sarcompile"]["peak_bytes"] / pyg_peak if pyg_peak else None
    return row


def table(summary: dict) -> str:
    """Markdown: per model, the exactness check, then step time and peak memory per engine."""
    lines = [
        (f"{summary['device']}, {summary['nodes']:,} nodes, {summary['edges']:,} edges, {summary['features']} "
         f"features, hidden {summary['hidden']}, float32, tolerance {summary['tolerance']:g}"),
        "",
        "| model | engine | exact (worst error) | first step (s) | step (ms) | vs PyG | peak (MiB) | vs PyG |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in summary["rows"]:
        exact = row.get("exact")
        verdict = f"{'yes' if exact['passed'] else 'NO'} ({exact['errors'][exact['worst']]:.1e}, {exact['worst']})" \
            if exact else "-"
        for engine in ("sarcompile", "pyg"):
            r = row[engine]
            if "error" in r:
                lines.append(f"| {row['model']} | {engine} | failed: {r['error'][:80]} | | | | | |")
                continue
            ours = engine == "sarcompile" and exact
            step_ratio = f"{row['step_ratio']:.2f}x" if ours else ""
            peak_ratio = f"{row['peak_ratio']:.2f}x" if ours and row["peak_ratio"] is not None else ""
            lines.append(f"| {row['model']} | {engine} | {verdict if engine == 'sarcompile' else ''} "
                         f"| {r['first_step_s']:.1f} | {r['step_s'] * 1e3:.1f} | {step_ratio} "
                         f"| {r['peak_bytes'] / 2**20:.1f} | {peak_ratio} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true", help="a graph of 2,000 nodes (CI, on a CPU)")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="largest error allowed, relative to each reference tensor's largest magnitude")
    for key in SIZES["full"]:
        p.add_argument(f"--{key}", type=int, default=None, help=f"default {SIZES['full'][key]} ({SIZES['small'][key]} with --small)")
    p.add_argument("--out", type=Path, default=results_dir() / "gpu_models.json")
    a = p.parse_args()
    for key, value in SIZES["small" if a.small else "full"].items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_models: no CUDA device: run on a GPU machine, or pass --device cpu --small to check the script")

    src, dst = random_graph(a.nodes, a.degree)
    gen = torch.Generator().manual_seed(1)
    data = {
        "src": src, "dst": dst,
        "x": torch.randn(a.nodes, a.features, generator=gen).to(device),
        "y": torch.randint(0, a.classes, (a.nodes,), generator=gen).to(device),
        "train_mask": (torch.rand(a.nodes, generator=gen) < 0.5).to(device),
    }
    rows = []
    for model in a.models:
        rows.append(run_model(model, a, data))
        print(json.dumps(rows[-1]), flush=True)
    summary = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else a.device,
        "torch": torch.__version__,
        "executor": "triton" if device.type == "cuda" else "torch",  # what executor="auto" picks there
        "nodes": a.nodes, "edges": a.nodes * a.degree,
        **{k: getattr(a, k) for k in ("features", "hidden", "classes", "heads", "repeats", "tolerance")},
        "rows": rows,
    }
    out = write_result(a.out.stem, summary, a.out.parent)
    print(table(summary))
    failed = [r["model"] for r in rows if not r.get("exact", {}).get("passed", False)]
    if failed:
        sys.exit(f"gpu_models: {', '.join(failed)}: failed or not within {a.tolerance:g} of eager PyG (see {out})")


if __name__ == "__main__":
    main()
