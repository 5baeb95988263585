"""A user's model by reference: ``MODULE:FACTORY``, as ``sarcompile plan`` and ``python -m
sarcompile.train --model`` name it.

MODULE is an importable module (``my_package.models``) or a path to a Python file
(``models/gat.py``), whose folder is then importable, as when the file is run. FACTORY is a
function or class in it that returns the ``torch.nn.Module``, called with keyword arguments.

A run records the reference with a file's path made absolute (:func:`recorded_spec`), so a
resume or ``sarcompile.predict`` started from another folder rebuilds the same model.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
from pathlib import Path
from typing import Any, Callable

from sarcompile.errors import GraphError


def is_factory_spec(model: str) -> bool:
    """Whether ``--model`` names a factory (``MODULE:FACTORY``) rather than a built-in model."""
    return ":" in model


def recorded_spec(spec: str) -> str:
    """``spec`` as a run records it: a ``.py`` file's path made absolute (a dotted module is
    kept as given: it is found on ``sys.path`` wherever the run starts)."""
    module_name, sep, attr = spec.rpartition(":")
    if sep and module_name.endswith(".py"):
        return f"{Path(module_name).resolve()}:{attr}"
    return spec


def load_factory(spec: str) -> Callable[..., Any]:
    """The callable ``spec`` (``MODULE:FACTORY``) names; a :class:`GraphError` that says what
    is wrong with it otherwise."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise GraphError(f"model {spec!r} is not MODULE:FACTORY (e.g. my_models:make_gat)")
    try:
        if module_name.endswith(".py"):
            location = importlib.util.spec_from_file_location(Path(module_name).stem, module_name)
            if location is None or not Path(module_name).is_file():
                raise ImportError(f"no file {module_name}")
            module = importlib.util.module_from_spec(location)
            # As `python file.py` does: the file's folder is importable, for its sibling modules.
            folder = str(Path(module_name).resolve().parent)
            if folder not in sys.path:
                sys.path.insert(0, folder)
            location.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as e:
        raise GraphError(f"cannot import {module_name!r} ({e})") from None
    if not hasattr(module, attr):
        raise GraphError(f"{module_name!r} has no {attr!r}")
    return getattr(module, attr)


def factory_kwargs(text: str, flag: str = "--args") -> dict[str, Any]:
    """The keyword arguments for a model's FACTORY, from ``flag``'s JSON object."""
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as e:
        raise GraphError(f"{flag} is not JSON ({e})") from None
    if not isinstance(kwargs, dict):
        raise GraphError(f"{flag} must be a JSON object of keyword arguments, not {text!r}")
    return kwargs


def build_from_factory(spec: str, kwargs: dict[str, Any], flag: str = "--args") -> Any:
    """The model ``MODULE:FACTORY`` builds with ``kwargs``; arguments that do not fit the
    factory's signature are refused before it is called, naming ``flag``."""
    factory = load_factory(spec)
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as e:  # the arguments do not fit the factory's signature
        raise GraphError(f"{spec} with keyword arguments {json.dumps(kwargs, default=str)}: {e}; give its own "
                         f"arguments as {flag} '{{\"name\": value, ...}}'") from None
    except ValueError:  # no signature to check (a builtin): the call says
        pass
    return factory(**kwargs)
