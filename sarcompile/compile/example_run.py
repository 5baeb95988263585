"""Running a program once on example inputs, leaving its model as it was.

The residency pass and the node-tables pass learn shapes this way: :func:`run_example`
gives a :class:`~sarcompile.ir.probe.Recorder` of the run, with what it computed before a
failure.
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch import nn

from sarcompile.errors import CompileError
from sarcompile.ir.probe import Recorder
from sarcompile.dist.collectives import offline

__all__ = ["run_example"]


def run_example(gm: fx.GraphModule, inputs: list, buffers_of: nn.Module) -> tuple[Recorder, str]:
    """(recorder, why it failed or '') after running ``gm`` on ``inputs``: on a failure the
    recorder has the shapes of the values computed before it. Buffers, the RNG state and
    gradients are as before."""
    saved = {k: v.clone() for k, v in buffers_of.named_buffers()}
    rec = Recorder(gm)
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]), offline():
            rec.run(*inputs)
        return rec, ""
    except CompileError:  # a front-end's check refused the call itself
        raise
    except Exception as e:  # noqa: BLE001 - best effort: the shapes up to the failure are kept
        return rec, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        with torch.no_grad():
            for k, v in buffers_of.named_buffers():
                if k in saved:
                    v.copy_(saved[k])
