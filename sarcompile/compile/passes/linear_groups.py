"""Pass ``linear_groups``: the linear layers that read one value, and the activation
that made it, as one autograd op.

Contract. Expects the GraphModule after ``inplace``. Finds every value ``h`` read by
linear layers (nn.Linear, or F.linear of a parameter) -- by two or more, or by one when
``h`` is a relu or elu whose result nothing else reads but its shape -- and rewrites

    h = act(p);  y_i = linear(h, W_i, b_i)        (act: relu, elu or none)

as ``(h,) y_1, ..., y_k = linear_group(p, act, ...)``, the same values (the activation
in place exactly where ``inplace`` had put it in place). What changes is backward's
memory. Autograd gives the input's gradient one ``[n, in]`` buffer per linear, adds
them, and makes one more for the activation's derivative; here they all land in one
buffer, scaled by the derivative in place. And an output whose one reader is an
aggregation (``spmm``, whose backward returns a fresh buffer nobody else holds) *donates*
that gradient: when it has the input's shape, the input's gradient is written into it,
a bounded block of rows at a time. A SAGE layer's backward then holds two ``[n, F]``
buffers where autograd held four. Without such a buffer, an activation written in place
(read by nothing but the group) receives the input's gradient itself, so a second
backward of one forward (``retain_graph=True``) is refused with a clear error; an
activation not in place keeps its input (which the op before often keeps anyway: an
attention its output) and remakes ``h`` a block of rows at a time for the weights'
gradients, so ``h`` is not held through backward.

Off the fused path -- no gradient wanted, autocast, inputs that are not plain 2-D
strided tensors -- the helper runs the plain ops, as before the pass.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from sarcompile.ir import ops
from sarcompile.ir.node_info import set_info
from sarcompile.ir.vocab import Residency
from sarcompile.compile.passes.context import CompileOptions
from sarcompile.compile.passes.inplace import activation, elu_into, relu_into
from sarcompile.compile.passes.linear_first import linear_of

__all__ = ["linear_group", "linear_groups"]

ROW_BLOCK_BYTES = 1 << 21  # rows of the gradient made at once (2 MiB: 8 held 6 MiB more at SAGE's peak, no faster)
# Linears of one group whose outputs total at most this many columns run as one product
# (_stacked); wider ones each as their own.
STACK_COLUMNS = 64


def _autocasting() -> bool:
    try:
        return torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled()
    except TypeError:  # torch < 2.4: no device argument
        return torch.is_autocast_cpu_enabled() or torch.is_autocast_enabled()


def _act(p: torch.Tensor, act: str, alpha: float, in_place: bool) -> torch.Tensor:
    if act == "relu":
        return relu_into(p) if in_place else torch.relu(p)
    if act == "elu":
        return elu_into(p, alpha) if in_place else F.elu(p, alpha)
    return p


def _derivative_into(grad: torch.Tensor, t: torch.Tensor, act: str, alpha: float, is_result: bool) -> None:
    """``grad *= act'``, read from the activation's result ``t`` (``is_result``) or its
    input, by torch's own backward kernels (the ones autograd runs), written over ``grad``."""
    if act == "relu":  # (relu's result and its input are positive at the same places)
        torch.ops.aten.threshold_backward.grad_input(grad, t, 0, grad_input=grad)
    elif act == "elu":
        torch.ops.aten.elu_backward.grad_input(grad, alpha, 1, 1, is_result, t, grad_input=grad)


def _act_into(out: torch.Tensor, p: torch.Tensor, act: str, alpha: float) -> torch.Tensor:
    """``act(p)`` written into ``out`` by the kernels F.relu / F.elu run."""
    if act == "relu":
        return torch.clamp_min(p, 0, out=out)
    return torch.ops.aten.elu.out(p, alpha, 1, 1, out=out)


def _row_blocks(rows: int, width: int, itemsize: int):
    step = max(1, ROW_BLOCK_BYTES // max(1, width * itemsize))
    for lo in range(0, rows, step):
        yield slice(lo, min(lo + step, rows))


def _block_buffer(like: torch.Tensor, blocks: list[slice]) -> torch.Tensor:
    """One buffer for every row block of ``like``: a fresh one per block would be faulted
    in anew wherever glibc maps blocks of its size (dist.memory's fixed thresholds)."""
    return like.new_empty((blocks[0].stop - blocks[0].start if blocks else 0, like.shape[1]))


class _LinearGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p, act: str, alpha: float, in_place: bool, donated: tuple[bool, ...], *params):
        ctx.set_materialize_grads(False)
        ctx.stacked = _stacked(params[0::2])
        out = _plain(p, act, alpha, in_place, params, ctx.stacked)
        h = out[0] if act != "none" else p
        if h is p and act != "none":
            ctx.mark_dirty(p)
        # An activation not in place keeps its input for whatever else reads it -- often
        # the op before, for its own backward (attention keeps its output). Keeping that
        # input rather than h, and making h again a block of rows at a time in backward,
        # lets h go once the linears have read it: one [n, in] buffer fewer through backward.
        ctx.from_input = act != "none" and h is not p
        ctx.save_for_backward(p if ctx.from_input else h, *params[0::2])
        ctx.act, ctx.alpha, ctx.donated = act, alpha, donated
        ctx.has_bias = tuple(b is not None for b in params[1::2])
        return out

    @staticmethod
    @once_differentiable  # in-place ops on the gradients: refuse double backward clearly
    def backward(ctx, *grads):
        if getattr(ctx, "spent", False):
            raise RuntimeError(
                "sarcompile's fused linear layers ran their backward twice for one forward (retain_graph=True): "
                "the first wrote the input's gradient over the activation it kept. Run the forward again for a "
                "second backward."
            )
        kept, *weights = ctx.saved_tensors  # h, or the activation's input with from_input
        gys = grads[1:] if ctx.act != "none" else grads  # h's own gradient: nothing reads h but the group
        blocks = list(_row_blocks(kept.shape[0], kept.shape[1], kept.element_size()))
        live = [(i, g, w) for i, (g, w) in enumerate(zip(gys, weights)) if g is not None]
        # Stacked as in forward where every output has a gradient and every weight wants
        # one: one product for the weights' gradients and one per block for the input's.
        stacked = ctx.stacked and len(live) == len(gys) and all(_wanted(ctx, i)[0] for i in range(len(gys)))
        if stacked:
            g_all, w_all = torch.cat(gys, 1), torch.cat(weights)
            param_grads = _stacked_param_grads(ctx, kept, g_all, [w.shape[0] for w in weights], blocks)
            terms = [(g_all, w_all)]
        else:
            param_grads = _param_grads(ctx, kept, gys, blocks)
            terms = [(g, w) for _, g, w in live]
        if not ctx.needs_input_grad[0] or not live:
            return (None, None, None, None, None, *param_grads)
        is_result = not ctx.from_input
        # After the parameters' gradients: a donated buffer is overwritten from here on
        into = next((g for i, g, _ in live if ctx.donated[i] and g.shape == kept.shape and g.dtype == kept.dtype
                     and g.is_contiguous() and g._base is None), None)
        if into is None and ctx.act != "none" and not ctx.from_input:
            # h, the activation written over its input, is read by nothing but this group
            # (the passes proved it) and by nothing here once the parameters' gradients are
            # made: its rows become the input's gradient, each block read before written.
            into, ctx.spent = kept, True
        if into is None:
            gp = None
            for g, w in terms:
                gp = g.mm(w) if gp is None else gp.addmm_(g, w)
            for r in blocks if ctx.act != "none" else ():
                _derivative_into(gp[r], kept[r], ctx.act, ctx.alpha, is_result)
            return (gp, None, None, None, None, *param_grads)
        buffer = _block_buffer(kept, blocks)
        for r in blocks:
            block = buffer[: r.stop - r.start]
            for k, (g, w) in enumerate(terms):
                torch.mm(g[r], w, out=block) if k == 0 else block.addmm_(g[r], w)
            _derivative_into(block, kept[r], ctx.act, ctx.alpha, is_result)
            into[r] = block  # rows r of `into` are read above, before this write
        return (into, None, None, None, None, *param_grads)


def _wanted(ctx, i: int) -> tuple[bool, bool]:
    """Whether linear ``i``'s weight and its bias want gradients (forward's inputs: ``p``,
    four settings, then ``W_1, b_1, W_2, ...``)."""
    return ctx.needs_input_grad[5 + 2 * i], ctx.has_bias[i] and ctx.needs_input_grad[6 + 2 * i]


def _param_grads(ctx, kept: torch.Tensor, gys: tuple, blocks: list[slice]) -> list:
    """``[dW_1, db_1, dW_2, ...]`` (None where not wanted): ``g_i^T h`` and ``g_i`` summed
    over rows."""
    wanted = []
    for i, g in enumerate(gys):
        want_w, want_b = _wanted(ctx, i)
        wanted.append((g if want_w else None, g.sum(0) if g is not None and want_b else None))
    dws = _weight_grads(ctx, kept, [g for g, _ in wanted], blocks)
    return [t for (_, db), dw in zip(wanted, dws) for t in (dw, db)]


def _stacked_param_grads(ctx, kept: torch.Tensor, g_all: torch.Tensor, widths: list[int], blocks: list[slice]) -> list:
    """:func:`_param_grads` from the outputs' gradients side by side (``g_all``), in one
    product, split by the outputs' ``widths`` (every weight wants its gradient here)."""
    (dw_all,) = _weight_grads(ctx, kept, [g_all], blocks)
    sums = g_all.sum(0).split(widths) if any(ctx.has_bias) else [None] * len(widths)
    return [t for i, (dw, db) in enumerate(zip(dw_all.split(widths), sums))
            for t in (dw, db if _wanted(ctx, i)[1] else None)]


def _weight_grads(ctx, kept: torch.Tensor, gs: list, blocks: list[slice]) -> list:
    """``g^T h`` for each ``g`` (None for None), with ``h`` remade block by block where the
    group kept the activation's input."""
    if not ctx.from_input:
        return [None if g is None else g.t().mm(kept) for g in gs]
    dws = [None if g is None else g.new_zeros((g.shape[1], kept.shape[1])) for g in gs]
    if any(dw is not None for dw in dws):
        buffer = _block_buffer(kept, blocks)
        for r in blocks:
            h = _act_into(buffer[: r.stop - r.start], kept[r], ctx.act, ctx.alpha)
            for g, dw in zip(gs, dws):
                if dw is not None:
                    dw.addmm_(g[r].t(), h)
    return dws


def linear_group(p: torch.Tensor, act: str, alpha: float, in_place: bool, donated: tuple[bool, ...], *params):
    """``h = act(p)`` and ``F.linear(h, W_i, b_i)`` for ``params = (W_1, b_1, W_2, ...)``:
    ``(h, y_1, ...)``, or ``(y_1, ...)`` when ``act`` is ``"none"``. ``donated[i]``: the
    gradient of ``y_i`` is a buffer nobody else holds (the pass proved it)."""
    tensors = [p, *(t for t in params if t is not None)]
    fused = (
        torch.is_grad_enabled()
        and any(t.requires_grad for t in tensors)
        and not _autocasting()
        and all(t.layout is torch.strided and t.dtype == p.dtype and t.device == p.device for t in tensors)
        and p.dim() == 2
    )
    if fused:
        return _LinearGroup.apply(p, act, alpha, in_place, donated, *params)
    return _plain(p, act, alpha, in_place, params)


def _plain(p: torch.Tensor, act: str, alpha: float, in_place: bool, params: tuple, stacked: bool = False) -> tuple:
    """The group's values, op by op (``stacked``: the linears' products as one, see
    :func:`_stacked`): what it returns, fused or not."""
    h = _act(p, act, alpha, in_place)
    weights, biases = params[0::2], params[1::2]
    if stacked:
        parts = h.mm(torch.cat(weights).t()).split([w.shape[0] for w in weights], 1)
        # (each output a tensor of its own: later ops write into them in place)
        outs = tuple(y.contiguous() if b is None else y + b for y, b in zip(parts, biases))
    else:
        outs = tuple(F.linear(h, w, b) for w, b in zip(weights, biases))
    return (h, *outs) if act != "none" else outs


def _stacked(weights: tuple) -> bool:
    """Whether the fused group runs its linears as one product, their weights stacked: two
    or more, of :data:`STACK_COLUMNS` output columns or fewer in all. MKL runs a product of
    a few output columns well below its peak; SAGE's last layer (two linears, 256 -> 16, at
    100k rows) took 34 ms as two products and 23 as one here, the weights' gradients 40
    against 26 and the input's 19 against 16. Wider outputs gain nothing from stacking and
    would pay for copying each out of the stacked result."""
    return len(weights) > 1 and all(w.dim() == 2 for w in weights) and sum(w.shape[0] for w in weights) <= STACK_COLUMNS


def _param(gm: fx.GraphModule, ref) -> str | None:
    """The attribute path of a weight or bias given as a path or a get_attr node."""
    if isinstance(ref, str):
        return ref
    return ref.target if isinstance(ref, fx.Node) and ref.op == "get_attr" else None


def _donates(node: fx.Node) -> bool:
    """Whether ``node``'s gradient arrives as a fresh buffer nobody else holds: its one
    reader is an aggregation of it (spmm's backward returns a new tensor for ``x``)."""
    if len(node.users) != 1:
        return False
    (user,) = node.users
    if user.op != "call_function" or user.target is not ops.spmm:
        return False
    a = ops.registry()[ops.spmm].bind(user.args, user.kwargs)
    return a["x"] is node and a["reduce"] in ("sum", "mean", "max")


def _shape_only(node: fx.Node) -> bool:
    """Whether ``node`` reads only its input's shape (``h.size(0)``, ``h.shape``, ``h.dim()``)."""
    if node.op == "call_method":
        return node.target in ("size", "dim")
    return node.op == "call_function" and node.target is getattr and node.args[1:] in (("shape",), ("ndim",))


def linear_groups(gm: fx.GraphModule, ctx: CompileOptions | None = None) -> fx.GraphModule:
    graph = gm.graph
    for h in list(graph.nodes):
        if h.graph is not graph or h.op == "output":  # erased by an earlier rewrite
            continue
        found = [(u, linear_of(gm, u, h)) for u in h.users]
        # (linear_of's weight is always a parameter; F.linear's bias may be computed)
        lins = [(u, f) for u, f in found if f is not None and (f[1] is None or _param(gm, f[1]) is not None)]
        shapes = [u for u in h.users if _shape_only(u)]
        act = activation(gm, h)
        fuse_act = act is not None and lins and len(lins) + len(shapes) == len(h.users)
        if not fuse_act and len(lins) < 2:
            continue
        kind, src, alpha, in_place = act if fuse_act else ("none", h, 0.0, False)
        order = {n: i for i, n in enumerate(graph.nodes)}
        first = min([u for u, _ in lins] + (shapes if fuse_act else []), key=order.__getitem__)
        with graph.inserting_before(first):
            params = []
            for _, (w, b, _, _) in lins:
                params += [graph.get_attr(_param(gm, t)) if t is not None else None for t in (w, b)]
            for node in filter(None, params):
                set_info(node, residency=Residency.PARAM)
            donated = tuple(_donates(u) for u, _ in lins)
            group = graph.call_function(linear_group, (src, kind, alpha, in_place, donated, *params))
            offset = 1 if fuse_act else 0
            outs = [graph.call_function(operator.getitem, (group, i + offset)) for i in range(len(lins))]
            if fuse_act:  # what reads only h's shape reads the group's h
                h_out = graph.call_function(operator.getitem, (group, 0))
                h_out.meta.update(h.meta)
                h.replace_all_uses_with(h_out, delete_user_cb=lambda u: u in shapes)
        group.meta.update(lins[0][0].meta)
        for (u, _), out in zip(lins, outs):
            out.meta.update(u.meta)
            u.replace_all_uses_with(out)
            graph.erase_node(u)
        if fuse_act:
            graph.erase_node(h)
        for _, (w, b, _, _) in lins:  # F.linear's own get_attr nodes, now read by nobody
            for old in (w, b):
                if isinstance(old, fx.Node) and not old.users:
                    graph.erase_node(old)
    graph.lint()
    gm.recompile()
    return gm
