"""The residency checker's rule tables: which torch ops, methods and modules keep every row
where it is, and which move, reduce or mix rows (the rules themselves are stated in
:mod:`sarcompile.compile.passes.residency`'s docstring).

Names and sets only, with the two lookups that read them (:func:`is_pointwise`,
:func:`name_of`); :mod:`sarcompile.compile.residency_check` and
:mod:`sarcompile.compile.residency_dims` apply them. An op torch tags pointwise is
row-local without being listed here.
"""

from __future__ import annotations

import builtins
import operator

import torch
import torch.fx as fx
from torch import nn

# Inputs without an example take their residency from their name: these are the graph.
GRAPH_NAMES = ("g", "graph", "edge_index", "adj", "adj_t", "block")

# Row-preserving ops not tagged pointwise in every torch version.
ELEMENTWISE = {
    "elu", "leaky_relu", "softplus", "hardtanh", "mish", "selu", "celu", "relu6", "threshold", "hardsigmoid",
    "hardswish", "log_sigmoid", "logsigmoid", "floor_divide", "fill", "fill_", "to", "type", "type_as", "float",
    "double", "half", "bfloat16", "long", "int", "bool", "detach", "clone", "contiguous", "requires_grad_",
    "cpu", "cuda", "relu", "sigmoid", "tanh", "gelu", "silu", "softsign", "tanhshrink", "masked_fill",
    "where", "nan_to_num", "clamp", "clamp_min", "clamp_max", "prelu", "dropout", "alpha_dropout",
    "feature_alpha_dropout",
}
# name -> (position of the dim argument, its default; None: a full reduction)
ALONG = {
    "sum": (1, None), "mean": (1, None), "prod": (1, None), "amax": (1, ()), "amin": (1, ()), "all": (1, None),
    "any": (1, None), "argmax": (1, None), "argmin": (1, None), "logsumexp": (1, None), "std": (1, None),
    "var": (1, None), "nansum": (1, None), "nanmean": (1, None), "count_nonzero": (1, None),
    "median": (1, None), "mode": (1, -1), "norm": (2, None), "softmax": (1, None), "log_softmax": (1, None),
    "softmin": (1, None), "cumsum": (1, None), "cumprod": (1, None), "cummax": (1, None), "cummin": (1, None),
    "logcumsumexp": (1, None), "sort": (1, -1), "argsort": (1, -1), "topk": (2, -1), "kthvalue": (2, -1),
    "diff": (2, -1), "unbind": (1, 0), "chunk": (2, 0), "split": (2, 0), "tensor_split": (2, 0),
    "narrow": (1, None), "select": (1, None), "index_select": (1, None), "gather": (1, None),
    "scatter": (1, None), "scatter_add": (1, None), "scatter_reduce": (1, None), "glu": (1, -1),
    "flip": (1, None), "roll": (2, None), "normalize": (2, 1), "unflatten": (1, None), "renorm": (2, None),
    "squeeze": (1, "all"), "max": (1, None), "min": (1, None), "cosine_similarity": (2, 1),
}
# Those whose result lacks the dims they work along (without keepdim; squeeze: those of size 1).
DROPS = {"sum", "mean", "prod", "amax", "amin", "all", "any", "argmax", "argmin", "logsumexp", "std", "var", "nansum",
         "nanmean", "count_nonzero", "median", "mode", "norm", "max", "min", "kthvalue", "select", "unbind",
         "squeeze", "cosine_similarity"}
RETURNS_SEQ = {"max", "min", "median", "mode", "sort", "topk", "kthvalue", "unbind", "chunk", "split",
               "tensor_split", "cummax", "cummin"}
SHAPED = {"view", "reshape", "expand", "view_as", "reshape_as", "expand_as", "repeat"}
# Tensor methods whose answer is the same on every worker (``x.dim()``, ``x.element_size()``).
META = {"dim", "ndim", "dtype", "device", "is_cuda", "requires_grad", "element_size", "is_floating_point", "layout"}
LIKE = {"zeros_like", "ones_like", "full_like", "empty_like"}
RANDOM = {"rand_like", "randn_like", "randint_like", "bernoulli", "bernoulli_", "multinomial", "normal_",
          "uniform_", "rrelu", "rand", "randn", "randint", "randperm"}
POSITIONS = {"arange", "eye", "linspace", "logspace"}  # numbers by position (refused before RANDOM)
FACTORIES = {"zeros", "ones", "full", "empty", "new_zeros", "new_ones", "new_full", "new_empty"}
OPERATORS = {
    operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
    operator.floordiv: "floor_divide", operator.mod: "remainder", operator.pow: "pow", operator.neg: "neg",
    operator.pos: "positive", operator.abs: "abs", operator.invert: "bitwise_not", operator.and_: "bitwise_and",
    operator.or_: "bitwise_or", operator.xor: "bitwise_xor", operator.eq: "eq", operator.ne: "ne",
    operator.lt: "lt", operator.le: "le", operator.gt: "gt", operator.ge: "ge", operator.matmul: "matmul",
    operator.getitem: "getitem", builtins.getattr: "getattr", operator.iadd: "add", operator.imul: "mul",
    operator.isub: "sub", operator.itruediv: "div",
}
ACTIVATIONS = (
    nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.Sigmoid, nn.Tanh, nn.SiLU, nn.Mish, nn.Softplus, nn.Hardtanh,
    nn.ReLU6, nn.SELU, nn.CELU, nn.Hardswish, nn.Hardsigmoid, nn.LogSigmoid, nn.Tanhshrink, nn.Softsign,
    nn.Identity, nn.Threshold, nn.PReLU, nn.Softshrink, nn.Hardshrink,
)
ATTENTION = (nn.MultiheadAttention, nn.Transformer, nn.TransformerEncoder, nn.TransformerEncoderLayer,
             nn.TransformerDecoder, nn.TransformerDecoderLayer)
ATTENTION_FIX = ("Attention over all nodes cannot be split by rows: use attention over the edges (GATConv, "
                 "sc.ops.attention), or leave the global attention out.")
DROPOUTS = (nn.Dropout, nn.AlphaDropout, nn.FeatureAlphaDropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)
# Ops reading or writing rows by an index tensor: only the graph's own ends index rows exactly.
BY_INDEX = frozenset({"index_select", "index_add", "index_reduce", "index_copy", "index_fill", "index_put", "gather",
                      "scatter", "scatter_add", "scatter_reduce", "take", "take_along_dim"})
INDEX_FIX = ("Rows picked or aggregated by an index tensor (a batch vector, a permutation, node ids) live on other "
             "workers; index and aggregate by the graph's own ends instead: x[edge_index[0]], "
             "t.index_add_(0, edge_index[1], msg), t.scatter_reduce(0, edge_index[1].unsqueeze(-1).expand_as(msg), "
             "msg, 'amax', include_self=False), or PyG's scatter(msg, edge_index[1]).")
DROPOUT_FIX = ("Use F.dropout or nn.Dropout on node or edge rows outside message functions (the compiler gives them "
               "a mask keyed by node or edge id, the same on any number of workers), e.g. on the messages' inputs or "
               "on the aggregated output.")


def is_pointwise(name: str) -> bool:
    base = name[:-1] if name.endswith("_") and not name.startswith("_") else name
    if base in ELEMENTWISE or name in ELEMENTWISE:
        return True
    op = getattr(torch.ops.aten, base, None)
    try:
        return any(torch.Tag.pointwise in getattr(op, o).tags for o in op.overloads())
    except (AttributeError, RuntimeError, TypeError):
        return False


def name_of(node: fx.Node) -> str | None:
    """The op a node runs, as torch names it (``add``, ``softmax``), or None if unknown."""
    if node.op == "call_method":
        return node.target
    t = node.target
    if t in OPERATORS:
        return OPERATORS[t]
    module = getattr(t, "__module__", None) or ""
    owner = getattr(t, "__self__", None)
    if module.startswith("torch") or owner is torch or owner is torch._C._VariableFunctions \
            or module == "torch._C._nn" or getattr(torch, getattr(t, "__name__", ""), None) is t:
        return t.__name__
    return None


def verb(name: str) -> str:
    if name in ("sort", "argsort", "topk", "kthvalue", "flip", "roll"):
        return "reorders values along"
    if name in ("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "diff"):
        return "accumulates along"
    if name in ("narrow", "select", "index_select", "gather", "scatter", "scatter_add", "scatter_reduce",
                "unbind", "chunk", "split", "tensor_split", "unflatten", "squeeze"):
        return "picks or splits by position along"
    return "reduces over"
