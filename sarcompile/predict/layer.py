"""A model whose output is one of its layers' outputs: what ``--layer NAME`` compiles.

In a compiled model a layer is traced inline (or stays one opaque node, for the layers the
compiler lowers), so a forward hook never fires at run time, and a lowered layer is not
even called while the model is traced. :func:`tap` instead gives the layer's instance a
class of its own whose ``__call__`` records what the call returned -- the tracer's value
while the model is traced, a tensor when it runs eagerly -- and :class:`LayerOutput`
returns that record. The program compiled from it returns the layer's output; its
parameter paths, the layer's class (as the compiler's lowering rules match it) and its
module stay the model's own::

    >>> from sarcompile.train import build_model
    >>> net = build_model(model="sage", in_dim=2, num_classes=3, layers=2, hidden=4).eval()
    >>> g = sc.Graph.from_edges(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3)
    >>> sc.distribute(LayerOutput(net, "convs.0"))(g, torch.ones(3, 2)).shape
    torch.Size([3, 4])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from sarcompile.errors import PredictionError

__all__ = ["LayerOutput", "layer_names"]


def layer_names(model: nn.Module) -> list[str]:
    """The names ``--layer`` accepts: every submodule's path (``convs.1``, ``layers.0``)."""
    return [name for name, _ in model.named_modules() if name]


class LayerOutput(nn.Module):
    """``model`` run as ``call(model, graph, x)`` runs it, returning instead the output of
    its submodule ``name`` (a tensor, or a dict of tensors per node type). The submodule
    must be called exactly once by a forward; ``model`` itself is changed (see :func:`tap`),
    so give it a model of its own."""

    def __init__(self, model: nn.Module, name: str,
                 call: Callable[[nn.Module, Any, Any], Any] = lambda m, g, x: m(g, x)):
        super().__init__()
        known = layer_names(model)
        if name not in known:
            shown = ", ".join(known[:40]) + (f", ... ({len(known)} in all)" if len(known) > 40 else "")
            raise PredictionError(f"--layer {name}: the model has no such layer; its layers are: {shown}")
        self.model = model
        self.name = name
        self.call = call
        self.outputs: list[Any] = []
        tap(model.get_submodule(name), self.outputs)

    def forward(self, graph: Any, x: Any) -> Any:
        self.outputs.clear()
        self.call(self.model, graph, x)
        if len(self.outputs) != 1:
            raise PredictionError(
                f"--layer {self.name}: the layer is called {len(self.outputs)} times by one forward, so it has no one "
                "output to write; name a layer the model calls once" + (" (a module whose weights the model reads "
                "directly, as a node table's, is never called)" if not self.outputs else "")
            )
        return self.outputs[0]


def tap(layer: nn.Module, outputs: list[Any]) -> None:
    """Make every call of ``layer`` append its result to ``outputs``: the instance gets a
    subclass of its class (same name and module, so the tracer and the lowering rules treat
    it as before) that overrides ``__call__``. ``__call__``, not a forward hook: the tracer
    replaces a lowered layer's call by a node of the program, and hooks run inside the call."""
    cls = type(layer)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = super(tapped, self).__call__(*args, **kwargs)
        outputs.append(out)
        return out

    tapped = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__,
                                         "__qualname__": cls.__qualname__})
    layer.__class__ = tapped
