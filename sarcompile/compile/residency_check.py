"""The residency checker: one walk over a program that gives every value its
:class:`~sarcompile.compile.residency_values.Val` (``info(node).residency``) and refuses what
mixes rows, as :mod:`sarcompile.compile.passes.residency` states.

IR ops declare their rows, and a ``message_passing``'s message function is traced and
checked with per-edge inputs; the graph may only be used as a graph; modules must be known
row-local ones; torch ops go through the rule table
(:mod:`sarcompile.compile.residency_rules`) and :class:`~sarcompile.compile.residency_dims.DimRules`.
"""

from __future__ import annotations

import builtins
import inspect
from dataclasses import replace
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from sarcompile.compile.residency_dims import DimRules
from sarcompile.compile.residency_rules import (ALONG, ACTIVATIONS, ATTENTION, ATTENTION_FIX, BY_INDEX, DROPOUT_FIX,
                                                DROPOUTS, FACTORIES, GRAPH_NAMES, INDEX_FIX, LIKE, META,
                                                POSITIONS, RANDOM, SHAPED, is_pointwise, name_of)
from sarcompile.compile.residency_values import (CONST, CONST_VAL, EDGE, GRAPH, GRAPH_VAL, NODE, PARAM,
                                                 PARAM_VAL, ROWS, Val, end_of, flat, layer_of, type_name)
from sarcompile.compile.trace import ShapeTracer
from sarcompile.errors import CompileError, SarcompileError
from sarcompile.graph.shard import DERIVED_GRAPHS
from sarcompile.ir.lowering import declared_helpers
from sarcompile.ir.node_info import info, set_info
from sarcompile.ir.opdef import Halo, Push
from sarcompile.ir.ops import registry
from sarcompile.ir.probe import PROBES, Input, summary
from sarcompile.ir.vocab import Residency
from sarcompile.nn import NodeDropout, RandomStream


class Checker(DimRules):
    """Checks ``gm`` and gives its nodes their residency (:meth:`run`)."""

    def run(self) -> None:
        nodes = list(self.gm.graph.nodes)
        for i, node in enumerate(nodes):
            try:
                v = self.visit(node)
            except CompileError:
                self.prefer_attention(nodes[i + 1:])
                raise
            self.vals[node] = v
            set_info(node, residency=v.res)
            if v.of is not None:  # a typed graph's node type or relation
                set_info(node, rows_of=v.of)
            if v.per_row and v.axis:  # rows off dim 0 (after torch.stack(xs)): only row-local torch code reads it
                set_info(node, row_axis=v.axis)

    def prefer_attention(self, later: list[fx.Node]) -> None:
        """Code before a global attention (PyG's to_dense_batch) is refused first; name the
        attention instead, the reason the code is there."""
        for node in later:
            if node.op == "call_module" and isinstance(self.gm.get_submodule(node.target), ATTENTION):
                raise self.refuse(node, f"{type(self.gm.get_submodule(node.target)).__name__} attends over all "
                                  "nodes (global attention), and the code preparing its input mixes rows",
                                  ATTENTION_FIX) from None

    def visit(self, node: fx.Node) -> Val:
        if node.op == "placeholder":
            spec = info(node).input
            if spec is not None:
                return Val(spec.residency, of=spec.of)
            name = str(node.target)
            return GRAPH_VAL if name in GRAPH_NAMES else Val(EDGE if "edge" in name else NODE)
        if node.op == "get_attr":
            return PARAM_VAL
        if node.op == "output":
            self.rows_first(node, node.args[0], "the message function's result" if self.inside else "the output")
            return self.val(node.args[0])
        if node.op == "call_function" and node.target is getattr(fx._symbolic_trace, "_assert_is_none", None):
            return CONST_VAL  # fx's check that an input traced as None is None
        if node.op == "call_function" and node.target in registry():
            return self.ir_op(node)
        if node.op == "call_function" and node.target in declared_helpers():
            return self.declared(node)
        ins = [self.vals[n] for n in node.all_input_nodes]
        if any(v.res is GRAPH for v in ins):
            return self.graph_use(node)
        if node.op == "call_module":
            return self.module(node, ins)
        if not any(v.per_row or v.res is ROWS for v in ins):
            return PARAM_VAL if any(v.res is PARAM for v in ins) else CONST_VAL
        return self.torch_op(node, ins)

    # -- IR ops and declared helpers ---------------------------------------------------------
    def ir_op(self, node: fx.Node) -> Val:
        op = registry()[node.target]
        bound = op.bind(node.args, node.kwargs)
        # On a typed graph the relation says whose rows each argument holds: what travels
        # (the halo's sends) is the source type's, the rest the destination type's.
        rel = self.val(bound["g"]).of if isinstance(bound.get("g"), fx.Node) else None
        sources = op.exchange.sends if isinstance(op.exchange, Halo) else ()
        for name, value in bound.items():
            v = self.val(value)
            if name in op.inputs:
                want = op.inputs[name]
                if value is not None and v.res is not want:
                    raise self.refuse(node, f"{op.name}'s argument {name} must be per-{want} rows, got a "
                                      f"{v.word()} value", f"Pass {op.name} a per-{want} tensor for {name}.")
                self.rows_first(node, value, f"{op.name}'s argument {name}")
                expect = end_of(rel, want, name in sources)
                if value is not None and rel is not None and want.per_row and v.of != expect:
                    end = "source" if name in sources else "destination"
                    raise self.refuse(
                        node, f"{op.name} over relation {rel} takes the rows of {type_name(expect)} (its {end} "
                        f"type) for {name}, but got the rows of {type_name(v.of)}",
                        f"Pass {op.name} the {end} type's rows for {name} (x_dict[{expect!r}]), or the relation "
                        f"whose {end} type is {type_name(v.of)}.")
            elif name == "g":
                if v.res is not GRAPH:
                    raise self.refuse(node, f"{op.name} got a {v.word()} value where it takes the graph",
                                      "Pass the graph argument (or g.with_self_loops() ...).")
            elif v.per_row or v.res in (ROWS, GRAPH):
                raise self.refuse(node, f"{op.name}'s argument {name} got a {v.word()} value",
                                  f"Only {', '.join(op.inputs)} take rows.")
            if name == "fn" and isinstance(value, fx.Node) and node.op == "call_function":
                self.message_body(node, value)
        if rel is None:  # no graph (batch_norm): the rows of its input
            return Val(op.output, of=self.rows_of(node, op.output))
        return Val(op.output, of=end_of(rel, op.output, isinstance(op.exchange, Push)))

    def rows_of(self, node: fx.Node, res: Residency) -> Any:
        """The type of the ``res`` rows among ``node``'s inputs (None on a one-type graph)."""
        kinds = {self.vals[n].of for n in node.all_input_nodes if self.vals[n].res is res}
        return kinds.pop() if len(kinds) == 1 else None

    def declared(self, node: fx.Node) -> Val:
        out = declared_helpers()[node.target]  # its author vouches for it, whatever it is given
        self.rows_first(node, (node.args, node.kwargs), getattr(node.target, "__name__", str(node.target)))
        if isinstance(out, Residency):
            return Val(out, of=self.rows_of(node, out))
        bound = inspect.signature(node.target).bind(*node.args, **node.kwargs)
        return self.val(bound.arguments.get(out))

    def message_body(self, node: fx.Node, fn_node: fx.Node) -> None:
        """Trace the message function and check it with per-edge inputs."""
        fn = self.gm.get_submodule(fn_node.target)
        bound = registry()[node.target].bind(node.args, node.kwargs)
        where = f"the message function {type(fn).__name__} of {layer_of(node, self.gm)}"
        names = list(inspect.signature(fn.forward).parameters)
        if len(names) != 3:
            raise self.refuse(node, f"{where} takes {names}, not (x_j, x_i, edge_attr)",
                              "Write the message as forward(x_j, x_i, edge_attr).")
        no_edge = bound.get("edge_attr") is None
        recorded = self.ir_args.get(node)
        examples = None
        if recorded is not None:  # per-edge rows of the recorded shapes, on as many edges as each probe has
            x, e = recorded["x"], recorded["edge_attr"]
            edges = [e.shape[0] if e is not None else PROBES[0].edges, PROBES[1].edges]
            examples = []
            for probe, count in zip(PROBES, edges):
                rows = _edge_rows(x, count, probe.seed)
                examples.append([rows, rows.clone(), e if probe is PROBES[0] else _edge_rows(e, count, probe.seed)])
        tracer = ShapeTracer(examples, every_value=True)
        try:
            graph = tracer.trace(fn, concrete_args={names[2]: None} if no_edge else None)
            body = fx.GraphModule(fn, graph)
        except SarcompileError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever stopped tracing: say it cannot be checked
            raise CompileError(
                f"{where} cannot be traced ({type(e).__name__}: {e}), so sarcompile cannot prove it computes each "
                "edge's message from that edge's rows alone; write it without control flow on tensor values"
            ) from None
        placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
        seen = {n: summary(v[0]) for n, v in tracer.values.items()} if examples is not None else None
        why = "" if examples is not None else "no example run"
        for i, ph in enumerate(placeholders):  # x_j, x_i, edge_attr: one row per edge
            set_info(ph, input=Input(CONST if (no_edge and i == 2) else EDGE))
        checker = Checker(body, seen, why, inside=where, distributed=self.distributed)
        checker.run()
        out = checker.vals[next(n for n in body.graph.nodes if n.op == "output")]
        if out.res is not EDGE:
            raise self.refuse(node, f"{where} returns a {out.word()} value, not one message per edge",
                              "Return a tensor with one row per edge, computed from x_j, x_i and edge_attr.")

    # -- the graph ---------------------------------------------------------------------------
    def graph_use(self, node: fx.Node) -> Val:
        first = node.args[0] if node.args else None
        others = [n for n in node.all_input_nodes if n is not first]
        if node.op == "call_method" and self.val(first).res is GRAPH:
            # a derived graph's arguments are constants (PyG's node count), the same on every worker
            if node.target in DERIVED_GRAPHS and all(self.val(n).res is CONST for n in others):
                return self.val(first)
            if node.target == "in_degrees" and len(node.args) == 1:
                return Val(NODE, of=end_of(self.val(first).of, NODE, False))
        if node.op == "call_function" and node.target is builtins.getattr and len(node.args) == 2:
            attr, rel = node.args[1], self.val(first).of
            dst, src = end_of(rel, NODE, False), end_of(rel, NODE, True)
            known = {"num_nodes": Val(ROWS, NODE, of=dst), "num_dst": Val(ROWS, NODE, of=dst),
                     "num_src_nodes": Val(ROWS, NODE, of=src), "num_edges": Val(ROWS, EDGE, of=rel),
                     "global_ids": Val(NODE, of=dst), "src_global_ids": Val(NODE, of=src),
                     "edge_ids": Val(EDGE, of=rel)}
            if attr in known:
                return known[attr]
        if node.op == "call_module":
            m = self.gm.get_submodule(node.target)
            if isinstance(m, NodeDropout) and len(node.args) == 2 and self.val(node.args[0]).res is GRAPH:
                self.rows_first(node, node.args[1], "NodeDropout")
                x, rel = self.val(node.args[1]), self.val(node.args[0]).of
                want = end_of(rel, NODE, m.source)
                if want is not None and x.of is not None and x.of != want:
                    end = "source" if m.source else "destination"
                    raise self.refuse(node, f"NodeDropout keys its mask by the ids of relation {rel}'s {end} type "
                                      f"{want!r}, but is given rows of {x.of!r}",
                                      f"Pass a relation whose {end} type is {x.of!r} (source=True: its source type).")
                return x
        what = name_of(node) or getattr(node.target, "__name__", str(node.target))
        raise self.refuse(
            node, f"`{what}` uses the graph argument as a tensor or an object",
            "The graph (edge_index) is a sarcompile Graph split across workers: pass it only to IR ops, layers "
            "and g.with_self_loops() / g.remove_self_loops() / g.in_degrees(); reverse or change a graph when "
            "building it (sc.Graph.from_edges(dst, src, n)).",
        )

    # -- modules -----------------------------------------------------------------------------
    def module(self, node: fx.Node, ins: list[Val]) -> Val:
        m = self.gm.get_submodule(node.target)
        kind = type(m).__name__
        if isinstance(m, RandomStream):
            return CONST_VAL
        rows = [v for v in ins if v.per_row]
        if not rows and not any(v.res is ROWS for v in ins):
            return PARAM_VAL if any(v.res is PARAM for v in ins) else CONST_VAL
        k = self.one_kind(node, ins)
        x = node.args[0] if node.args else next(iter(node.kwargs.values()), None)
        if isinstance(m, ATTENTION):
            raise self.refuse(node, f"{kind} attends over all rows of a {k.word()} value (global attention)",
                              ATTENTION_FIX)
        if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)):
            raise self.refuse(node, f"{kind} normalises over the rows it sees",
                              "Use sc.nn.BatchNorm (statistics across all workers, same parameters and "
                              "state_dict keys) or LayerNorm.")
        if any(v.res is ROWS for v in ins):
            raise self.refuse(node, f"{kind} is given a row count", "Do not compute with the number of rows.")
        if isinstance(m, DROPOUTS):
            # nn.Dropout gets a mask keyed by row id (the dropout pass); the others draw theirs from torch's RNG
            if m.training and m.p > 0 and self.distributed and (type(m) is not nn.Dropout or self.inside):
                raise self.refuse(node, f"{kind}(p={m.p}) in training draws its mask from torch's RNG row by row",
                                  DROPOUT_FIX)
            return k
        if isinstance(m, ACTIVATIONS):
            return k
        nd = self.ndim(node, x, f"the feature axis of {kind}")
        a = self.val(x).axis
        if isinstance(m, (nn.Linear, nn.Bilinear, nn.LazyLinear)):
            if a >= nd - 1:
                raise self.refuse(node, f"{kind} contracts the last dim of a {nd}-D {k.word()} tensor, which holds "
                                  "its rows", "Give it the features on the last dim: [rows, in_features] "
                                  "(x.unsqueeze(-1)).")
            return k
        if isinstance(m, nn.RNNBase):  # e.g. JumpingKnowledge(mode="lstm"): a sequence per row
            return self.rnn(node, m, x, k, nd)
        if isinstance(m, nn.RNNCellBase):  # e.g. GatedGraphConv's GRUCell: one step per row, rows as the batch
            if nd != 2 or a != 0:
                raise self.refuse(node, f"{kind} on a {nd}-D {k.word()} tensor does not take its rows as the batch",
                                  "Give it [rows, features].")
            hx = self.arg(node, 1, "hx")
            if hx is not None and not all(self.val(h).per_row and self.val(h).axis == 0
                                          for h in (hx if isinstance(hx, tuple) else (hx,))):
                raise self.refuse(node, f"{kind}'s hidden state is not one row per {k.word()} row",
                                  "Give it a hidden state [rows, hidden] computed per row, or none.")
            return replace(k, seq=isinstance(m, nn.LSTMCell))  # LSTMCell: (h, c)
        if isinstance(m, nn.LayerNorm):
            if len(m.normalized_shape) >= nd - a:
                raise self.refuse(node, f"LayerNorm{tuple(m.normalized_shape)} normalises over the row axis too",
                                  "Normalise over the feature dims only.")
            return k
        if isinstance(m, nn.GroupNorm):
            if nd < 2 or a != 0:
                raise self.refuse(node, f"GroupNorm on a {nd}-D {k.word()} tensor with its rows on dim {a} normalises "
                                  "over rows", "Give it [rows, channels].")
            return k
        if isinstance(m, nn.Flatten):
            return self.flattened(node, x, m.start_dim, m.end_dim, k, kind)
        if isinstance(m, nn.Unflatten):
            return self.unflattened(node, x, m.dim, len(m.unflattened_size), k, kind)
        if isinstance(m, nn.Embedding):
            return k
        if isinstance(m, (nn.Softmax, nn.LogSoftmax, nn.Softmin)):
            if m.dim is None or self.axis(node, x, m.dim) == a:
                raise self.refuse(node, f"{kind}(dim={m.dim}) works along the row axis", "Give it a feature dim.")
            return k
        raise self.refuse(
            node, f"sarcompile cannot prove that {kind} is row-local (each output row computed from the same "
            "input row alone)",
            "Write it with torch operations that work per row, or as an IR op.",
        )

    def rnn(self, node: fx.Node, m: nn.RNNBase, x: fx.Node, k: Val, nd: int) -> Val:
        """An RNN over a sequence per row: the rows are its batch (dim 0 with ``batch_first``,
        else 1), and so are its hidden states' dim 1, given and returned."""
        kind, batch = type(m).__name__, 0 if m.batch_first else 1
        if nd != 3 or self.val(x).axis != batch:
            raise self.refuse(node, f"{kind} on a {nd}-D {k.word()} tensor with its rows on dim {self.val(x).axis} "
                              "runs its sequence along the row axis", "Give it the rows as the batch: [rows, steps, "
                              "features] with batch_first=True (or [steps, rows, features] without).")
        hx = self.arg(node, 1, "hx")
        for h in (hx if isinstance(hx, (tuple, list)) else () if hx is None else (hx,)):
            if not all(v.per_row and v.axis == 1 for v in flat(self.val(h)) if v.parts is None):
                raise self.refuse(node, f"{kind}'s hidden state is not [layers, rows, hidden] with one row per "
                                  f"{k.word()} row", "Compute it per row, e.g. torch.zeros(layers, x.size(0), hidden) "
                                  "for batch_first input x, or give none.")
        state = self.at(node, k, 1)
        hidden = replace(state, seq=True, parts=(state, state)) if isinstance(m, nn.LSTM) else state
        out = self.at(node, k, batch)
        return replace(out, seq=True, parts=(out, hidden))  # (output, hidden state)

    # -- torch operations ----------------------------------------------------------------------

    def torch_op(self, node: fx.Node, ins: list[Val]) -> Val:
        name = name_of(node)
        k = self.one_kind(node, ins)
        w = k.word()
        if name is None:
            what = getattr(node.target, "__qualname__", str(node.target))
            raise self.refuse(
                node, f"sarcompile cannot prove that {what} is row-local (it takes a {w} value, and the program "
                "calls it as one step it cannot look into)", "Write it with torch operations, and do not wrap it "
                "(torch.fx.wrap), so that its body is traced and checked.",
            )
        x = node.args[0] if node.args else None
        xv = self.val(x)
        # shapes and sizes -----------------------------------------------------------------
        if name in ("size", "shape", "numel", "nelement", "__len__", "len") or (
                name == "getattr" and node.args[1] in ("shape", "ndim", "dtype", "device", "T", "mT", "is_cuda",
                                                       "requires_grad", "data")):
            return self.meta_of(node, name, x, xv)
        if name in META and node.op == "call_method":  # x.dim(), x.element_size(): the same on every worker
            return CONST_VAL
        if (xv.seq or xv.parts is not None) and name in ("getattr", "getitem"):  # x.max(1).values, x.split(2, 1)[0]
            return self.item(node, xv)
        if xv.res is ROWS and name == "getitem" and xv.shape_ndim is not None:
            return self.shape_item(node, xv)
        if name in POSITIONS:
            raise self.refuse(node, f"`{name}` numbers the rows of a {w} value by their position on this worker",
                              "A row's position differs between workers: where the model needs a node's id, use "
                              "the graph's node ids (g.global_ids).")
        if name in RANDOM:
            raise self.refuse(node, f"`{name}` draws random numbers for the rows of a {w} value from torch's "
                              "random number generator, which each worker runs over its own rows",
                              "For dropout use F.dropout or nn.Dropout, whose masks sarcompile keys by node id, the "
                              "same on any number of workers; draw other random numbers per row outside the model "
                              "and pass them in as an input with a row per node.")
        if name in FACTORIES:
            return self.factory(node, name, ins, k)
        if name == "getitem" and xv.per_row:
            return self.getitem(node, x, xv, k)
        if name == "add" and len(node.args) == 2:  # x.shape + (1,) * k: a longer shape
            longer = self.longer_shape(node)
            if longer is not None:
                return longer
        if any(v.res is ROWS for v in ins) and name not in SHAPED:
            raise self.row_count(node, name)
        if name == "getitem":
            return self.lookup(node, x, xv, k)
        if name in SHAPED:
            return self.reshape(node, name, x, k)
        if name in LIKE:
            return k
        if name in ("t", "T", "mT", "adjoint", "transpose", "swapaxes", "swapdims", "permute", "movedim",
                    "moveaxis", "unsqueeze", "flatten", "ravel"):
            return self.axes(node, name, x, k)
        if name in ("cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack", "column_stack"):
            return self.join(node, name, k)
        if name in ("matmul", "mm", "bmm", "linear", "einsum", "bilinear"):
            return self.matmul(node, name, k)
        if name == "addmm":
            return self.addmm(node, k)
        if name == "dropout" or name in ("alpha_dropout", "feature_alpha_dropout"):
            # dropout gets a mask keyed by row id (the dropout pass), but not inside a message function
            p, training = self.arg(node, 1, "p", 0.5), self.arg(node, 2, "training", True)
            if training and p and self.distributed and (name != "dropout" or self.inside):
                raise self.refuse(node, f"{name}(p={p}) in training draws its mask from torch's RNG row by row",
                                  DROPOUT_FIX)
            return k
        if name == "layer_norm":
            shape = self.arg(node, 1, "normalized_shape")
            if len(shape) >= self.ndim(node, x, "the feature axis of layer_norm") - xv.axis:
                raise self.refuse(node, "layer_norm normalises over the row axis too", "Normalise over features.")
            return k
        if name == "embedding" and self.val(self.arg(node, 1, "weight")).per_row:
            raise self.refuse(node, f"an embedding lookup reads rows of a node table ({self.val(node.args[1]).word()}) "
                              "by index", "A worker holds only its own rows of a node table: use the table's "
                              "rows as they are (emb[t].weight), or look them up by the type's own ids "
                              "(emb[t](g[rel].global_ids) on a relation into t).")
        if name in ("embedding", "one_hot"):
            return k
        if name in ALONG:
            return self.along(node, name, x, k)
        if name in ("to", "type_as") and isinstance(x, fx.Node):  # the other tensor gives a dtype and a device only
            return xv
        if is_pointwise(name):
            return self.pointwise(node, name, k)
        raise self.refuse(
            node, f"sarcompile cannot prove that `{name}` is row-local (it takes a {w} value)",
            INDEX_FIX if name.rstrip("_") in BY_INDEX else "Write it with row-wise torch operations, or as an IR op.",
        )


def _edge_rows(like: torch.Tensor | None, edges: int, seed: int) -> torch.Tensor | None:
    """An example like ``like`` with ``edges`` rows (None for None)."""
    if like is None:
        return None
    shape = (edges, *like.shape[1:])
    if not like.is_floating_point():
        return like.new_zeros(shape)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=like.dtype).to(like.device)
