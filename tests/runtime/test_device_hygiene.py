"""No tensor in ``sarcompile/runtime/``, ``sarcompile/codegen/`` or ``sarcompile/dist/`` is made on a hard-coded
device (issue 55): a source check, so that a new one fails CI before a GPU run meets it.

Every call of a torch tensor factory there (``torch.zeros``, ``torch.empty``, ...; the
``*_like`` and ``Tensor.new_*`` ones follow their input by construction) must pass
``device=``, taken from an input; a constant device (``device="cpu"``, ``torch.device("cpu")``),
``.cpu()`` and ``.to("cpu")`` are allowed only where :data:`ALLOWED` says why the path is
CPU-only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "sarcompile"
PACKAGES = ("runtime", "codegen", "dist")

# torch functions that make a tensor (or a generator) on the default device unless told
FACTORIES = {
    "zeros", "ones", "empty", "full", "arange", "range", "tensor", "as_tensor", "rand", "randn", "randint",
    "randperm", "eye", "linspace", "logspace", "empty_strided", "Generator", "from_numpy", "frombuffer",
    "sparse_csr_tensor", "sparse_coo_tensor",
}

# (file under sarcompile/, enclosing function, construct) -> why that path is CPU-only
ALLOWED: dict[tuple[str, str, str], str] = {
    ("runtime/link.py", "Wire.encode", "torch.Generator"):
        "stochastic rounding's noise is drawn on the CPU so that a seed gives the same noise on every device",
    ("runtime/link.py", "Wire.encode", "torch.rand"): "(the same noise, drawn with that CPU generator)",
    ("dist/memory.py", "floor_bytes", "torch.zeros"): "warms up the CPU optimizer: it measures this process's RSS",
    ("dist/memory.py", "floor_bytes", "torch.ones"): "(the same)",
    ("codegen/cpu_spmm.py", "_build", ".cpu()"): "native.cpu() describes the host CPU the C kernel is built for",
}


def _constant_device(value: ast.expr) -> bool:
    """A device written as a constant: "cpu", or torch.device("cpu")."""
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return True
    return (isinstance(value, ast.Call) and ast.unparse(value.func) == "torch.device"
            and all(isinstance(a, ast.Constant) for a in value.args))


def _hard_coded(call: ast.Call) -> str | None:
    """The construct ``call`` makes a tensor with on a device of its own choosing, if any."""
    func = call.func
    name = ast.unparse(func)
    device = next((k.value for k in call.keywords if k.arg == "device"), None)
    if name.startswith("torch.") and name[len("torch."):] in FACTORIES:
        if device is None or _constant_device(device):
            return name
    elif isinstance(func, ast.Attribute) and func.attr == "cpu" and not call.args:
        return ".cpu()"
    elif isinstance(func, ast.Attribute) and func.attr == "to" and any(_constant_device(a) for a in call.args):
        return ".to(<constant device>)"
    elif device is not None and _constant_device(device):
        return f"{name}(device=<constant>)"
    return None


def findings() -> list[tuple[str, str, str, int]]:
    """(file, enclosing function, construct, line) of every hard-coded device in the packages."""
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))

            def walk(node: ast.AST, scope: list[str]) -> None:
                for child in ast.iter_child_nodes(node):
                    inner = scope + [child.name] if isinstance(
                        child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else scope
                    if isinstance(child, ast.Call) and (what := _hard_coded(child)):
                        out.append((rel, ".".join(scope) or "<module>", what, child.lineno))
                    walk(child, inner)

            walk(ast.parse(path.read_text(), str(path)), [])
    return out


def test_no_tensor_is_made_on_a_hard_coded_device():
    bad = [f"sarcompile/{f}:{line} in {fn}: {what}" for f, fn, what, line in findings() if (f, fn, what) not in ALLOWED]
    assert not bad, ("tensors made on a hard-coded device; take the device from an input (device=x.device), "
                     "or add the site to ALLOWED with why it is CPU-only:\n" + "\n".join(bad))


def test_every_allowed_site_still_exists():
    """An entry whose site is gone would let a new one in silently."""
    found = {(f, fn, what) for f, fn, what, _ in findings()}
    assert not set(ALLOWED) - found, sorted(set(ALLOWED) - found)


@pytest.mark.parametrize("source, what", [
    ("torch.zeros(3)", "torch.zeros"),
    ("torch.zeros(3, device='cpu')", "torch.zeros"),
    ("torch.arange(3, device=torch.device('cpu'))", "torch.arange"),
    ("x.cpu()", ".cpu()"),
    ("x.to('cpu')", ".to(<constant device>)"),
    ("x.new_empty(3, device='cpu')", "x.new_empty(device=<constant>)"),
])
def test_the_check_catches(source, what):
    assert _hard_coded(ast.parse(source).body[0].value) == what


@pytest.mark.parametrize("source", ["torch.zeros(3, device=x.device)", "torch.zeros_like(x)", "x.new_zeros(3)",
                                    "x.to(y.device)"])
def test_the_check_passes(source):
    assert _hard_coded(ast.parse(source).body[0].value) is None
