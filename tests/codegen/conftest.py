"""Shared setup of the generated-kernel tests.

Without a GPU the generated Triton kernels run in Triton's interpreter on CPU tensors;
``TRITON_INTERPRET`` must be set before triton is imported, so tests/conftest.py sets it
before any test module is collected (and this file again, for a run of this folder alone). Compiled
kernels (a GPU, no ``TRITON_INTERPRET``) get CUDA tensors instead (:mod:`devices`). Every test
gets a kernel cache of its own session: nothing is read from or written to ~/.cache.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The tests' device (``devices.DEVICE``) follows the target, so it is computed only now.
import devices  # noqa: F401


@pytest.fixture(scope="session", autouse=True)
def kernel_cache_dir(tmp_path_factory):
    """The session's kernel cache (``SARCOMPILE_KERNEL_CACHE``): a temporary folder."""
    path = tmp_path_factory.mktemp("kernel_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SARCOMPILE_KERNEL_CACHE", str(path))
        yield path
