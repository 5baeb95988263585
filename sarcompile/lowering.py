"""The lowering rules: which layer modules the compiler rewrites into IR ops, and how.

A rule maps a layer to an equivalent module written with IR ops, with the layer's call
signature, sharing the layer's parameters. ``sarcompile.nn`` layers are written with IR
ops already, so their rule returns the layer itself; front-ends (PyG, DGL) register rules
for their layers when imported. The tracer keeps every layer with a rule as a leaf
(:mod:`sarcompile.trace`) and the lower pass inlines what the rule gives
(:mod:`sarcompile.passes.lower`).
"""

from __future__ import annotations

from typing import Callable

from torch import nn

__all__ = ["register_lowering", "lowering_for"]

_RULES: dict[type, Callable[[nn.Module], nn.Module]] = {}


def register_lowering(layer_type: type, rule: Callable[[nn.Module], nn.Module]) -> None:
    """Lower every ``layer_type`` module ``m`` to ``rule(m)``, a module written with IR ops."""
    _RULES[layer_type] = rule


def lowering_for(m: nn.Module) -> nn.Module | None:
    """What ``m`` lowers to (the rule of its nearest class that has one), or None."""
    for t in type(m).__mro__:
        if t in _RULES:
            return _RULES[t](m)
    return None
