"""Typed graphs: construction, typed partitions, and exact aggregation over relations on N workers."""

from __future__ import annotations

import pytest
import torch
from hetero_cases import RelationNet, TableNet, inputs, run_worker, step, typed_graphs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sarcompile as sc
from sarcompile.errors import GraphError, PartitionError
from sarcompile.graph.hetero import relation_key
from sarcompile.data.typed_partition import assign_typed, balance_types
from sarcompile.data.assign import assign

TOL = 1e-9  # float64: only the order of summation differs
SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))


def small() -> sc.HeteroGraph:
    return sc.HeteroGraph.from_edges(
        {("author", "writes", "paper"): (torch.tensor([0, 1, 1, 2]), torch.tensor([0, 0, 2, 3])),
         ("paper", "cites", "paper"): (torch.tensor([1, 2, 3, 3]), torch.tensor([0, 0, 1, 3])),
         ("paper", "has_topic", "field"): (torch.tensor([0, 3]), torch.tensor([1, 1]))},
        num_nodes={"author": 3, "paper": 4, "field": 2, "institution": 0},
    )


# -- the graph -------------------------------------------------------------------------------
def test_relations_are_graphs_between_their_types():
    g = small()
    assert g.node_types == ("author", "paper", "field", "institution")
    assert g.num_nodes() == 9 and g.num_nodes("institution") == 0 and g.num_edges() == 10
    writes = g["writes"]
    assert writes.bipartite and (writes.num_src_nodes, writes.num_nodes) == (3, 4)
    assert writes.in_degrees().tolist() == [2, 0, 1, 1]
    assert not g["cites"].bipartite  # one node set: self-loops mean something there
    assert g["cites"].with_self_loops().num_edges == 4 + 4 - 1
    assert g[("author", "paper")] is writes and g["author", "writes", "paper"] is writes
    assert g.metadata() == (["author", "paper", "field", "institution"], list(g.edge_types))


def test_bipartite_spmm_matches_a_dense_product():
    g = small()
    x = torch.randn(3, 5, dtype=torch.float64)
    dense = torch.zeros(4, 3, dtype=torch.float64)
    dense.index_put_((g["writes"].dst, g["writes"].src), torch.ones(4, dtype=torch.float64), accumulate=True)
    torch.testing.assert_close(sc.spmm(g["writes"], x, "sum"), dense @ x)
    deg = dense.sum(1, keepdim=True).clamp(min=1)
    torch.testing.assert_close(sc.spmm(g["writes"], x, "mean"), dense @ x / deg)
    with pytest.raises(GraphError, match="x has 4 rows but the graph needs 3"):
        sc.spmm(g["writes"], torch.randn(4, 5), "sum")


@pytest.mark.parametrize("make, match", [
    (lambda: sc.HeteroGraph.from_edges({("a", "r", "b"): ([0], [0])}, {"a": 1}), "node type 'b'"),
    (lambda: sc.HeteroGraph.from_edges({("a", "r", "b"): ([1], [0])}, {"a": 1, "b": 1}), "source ids must lie in"),
    (lambda: sc.HeteroGraph.from_edges({("a", "x__y", "a"): ([0], [0])}, {"a": 1}), "may not contain '__'"),
    (lambda: small()["nope"], "no relation matches 'nope'"),
    (lambda: small()["writes"].with_self_loops(), "bipartite"),
    (lambda: sc.ops.message_passing(small()["writes"], torch.nn.Identity(), torch.zeros(3, 1)), "two node types"),
])
def test_bad_typed_graphs_are_refused_clearly(make, match):
    with pytest.raises(GraphError, match=match):
        make()


def test_from_pyg_keeps_types_and_relations():
    pyg = pytest.importorskip("torch_geometric.data")
    data = pyg.HeteroData()
    data["paper"].x = torch.randn(4, 3)
    data["author"].num_nodes = 3
    data["author", "writes", "paper"].edge_index = torch.tensor([[0, 1, 2], [3, 3, 0]])
    g = sc.HeteroGraph.from_pyg(data)
    assert g.node_types == ("paper", "author") and g.num_nodes("paper") == 4
    assert g["writes"].src.tolist() == [0, 1, 2] and g["writes"].dst.tolist() == [3, 3, 0]


# -- typed partitions --------------------------------------------------------------------------
def test_metis_then_balance_spreads_every_type():
    # one type clustered in one community: plain METIS would put it on one part
    gen = torch.Generator().manual_seed(0)
    n, k = 400, 4
    community = torch.arange(n) // (n // k)
    src = torch.randint(0, n, (6000,), generator=gen)
    dst = community[src] * (n // k) + torch.randint(0, n // k, (6000,), generator=gen)
    types = (torch.arange(n) < n // k).long()  # the first community is the second type
    g = sc.Graph.from_edges(src, dst, n)
    parts = assign(g, k, "metis")
    assert torch.bincount(parts[types == 1], minlength=k).max() > 60  # clustered, as expected
    balanced = balance_types(g, parts, types, k)
    excess = 0
    for t in (0, 1):
        cap = -(-int((types == t).sum()) * 105 // (100 * k))  # ceil(n_t / k * 1.05)
        assert torch.bincount(balanced[types == t], minlength=k).max() <= cap
        excess += int((torch.bincount(parts[types == t], minlength=k) - cap).clamp(min=0).sum())
    # it moves no more nodes than the parts had too many of (each type's excess, once)
    assert int((balanced != parts).sum()) == excess


@given(case=typed_graphs(), parts=st.integers(1, 4), method=st.sampled_from(["metis", "random", "contiguous"]))
@SETTINGS
def test_every_node_of_every_type_lands_in_exactly_one_part(tmp_path_factory, case, parts, method):
    g, seed = case
    out = tmp_path_factory.mktemp("typed")
    data = inputs(g, seed)
    node_data = {t: {"x": data["x"][t]} for t in g.node_types}
    manifest = sc.partition(g, parts, out, node_data=node_data, method=method, seed=seed)
    assert manifest.typed and set(manifest.node_types) == set(g.node_types)
    seen = {t: torch.zeros(g.num_nodes(t), dtype=torch.long) for t in g.node_types}
    for r in range(parts):
        p = sc.load_partition(out, rank=r, world_size=parts)
        for t in g.node_types:
            seen[t][p.global_ids[t]] += 1
            torch.testing.assert_close(p.node_data[t]["x"], data["x"][t][p.global_ids[t]], rtol=0, atol=0)
            assert p.graph.num_nodes(t) == p.global_ids[t].numel() == manifest.parts[r].type_nodes[t]
    assert all(bool((s == 1).all()) for s in seen.values())
    whole, whole_data = sc.load_whole_graph(out)
    for rel, rg in g.items():
        assert torch.equal(whole[rel].src, rg.src) and torch.equal(whole[rel].dst, rg.dst)
    for t in g.node_types:
        torch.testing.assert_close(whole_data[t]["x"], data["x"][t], rtol=0, atol=0)


def test_typed_node_data_is_checked_and_damaged_parts_refused(tmp_path):
    g = small()
    wrong_rows = r"node_data\['paper'\]\['x'\] has shape \(3, 2\) but type 'paper' has 4 nodes"
    with pytest.raises(GraphError, match=wrong_rows):
        sc.partition(g, 2, tmp_path, node_data={"paper": {"x": torch.randn(3, 2)}})
    with pytest.raises(GraphError, match=r"node_data\['paper'\]\['x'\] has dtype"):
        sc.partition(g, 2, tmp_path, node_data={"paper": {"x": torch.ones(4, 2, dtype=torch.long)}})
    with pytest.raises(GraphError, match="node type 'venue'"):
        sc.partition(g, 2, tmp_path, node_data={"venue": {"x": torch.randn(4, 2)}})
    with pytest.raises(GraphError, match="must be a dict of name -> tensor"):
        sc.partition(g, 2, tmp_path, node_data={"paper": torch.randn(4, 2)})
    sc.partition(g, 2, tmp_path, node_data={"paper": {"x": torch.randn(4, 2)}})
    path = tmp_path / "part-1.pt"
    path.write_bytes(path.read_bytes()[:-7] + b"damaged")
    with pytest.raises(PartitionError, match="does not match the manifest's checksum"):
        sc.load_partition(tmp_path, rank=1, world_size=2)


def test_identity_hash_follows_the_graph_not_the_parts(tmp_path):
    g = small()
    a = sc.partition(g, 1, tmp_path / "a").graph_sha256
    b = sc.partition(g, 3, tmp_path / "b", method="random").graph_sha256
    changed = sc.HeteroGraph.from_edges({r: (rg.src, rg.dst.flip(0)) for r, rg in g.items()},
                                        {t: g.num_nodes(t) for t in g.node_types})
    assert a == b != sc.partition(changed, 1, tmp_path / "c").graph_sha256


def test_a_given_typed_assignment_is_checked():
    g = small()
    with pytest.raises(PartitionError, match="no part ids for node types"):
        assign_typed(g, 2, {"paper": torch.zeros(4, dtype=torch.long)})
    with pytest.raises(PartitionError, match="one part id per node"):
        assign_typed(g, 2, {t: torch.zeros(1, dtype=torch.long) for t in g.node_types})


# -- exact on N workers ----------------------------------------------------------------------
@given(case=typed_graphs(), data=st.data())
@SETTINGS
def test_relations_aggregate_exactly_on_one_to_four_workers_eager_and_compiled(pool, tmp_path_factory, case, data):
    g, seed = case
    world = data.draw(st.integers(1, 4))
    kind = data.draw(st.sampled_from(["metis", "random", "one-part"]))
    if kind == "one-part":  # every node on one worker: the others hold no rows of any type
        target = data.draw(st.integers(0, world - 1))
        method = {t: torch.full((g.num_nodes(t),), target) for t in g.node_types}
    else:
        method = kind
    out_dir = tmp_path_factory.mktemp("typed")
    sc.partition(g, world, out_dir, method=method, seed=seed)
    torch.manual_seed(seed)
    model = RelationNet(g).double()
    batch = inputs(g, seed)
    want = step(model, g, batch, None)
    compiled = data.draw(st.booleans())  # eager ops on a shard, or the compiled program
    if compiled:  # compiled on one machine too: the same as the eager model
        got = step(sc.distribute(model), g, batch, None)
        for key in ("out", "x_grad"):
            for t in g.node_types:
                torch.testing.assert_close(got[key][t], want[key][t], atol=_tol(want[key][t]), rtol=0)
    payload = {"dir": str(out_dir), "graph": g, "state": model.state_dict(), "data": batch, "compiled": compiled}
    results = pool(world).run(run_worker, [payload] * world)
    for t in g.node_types:
        for key in ("out", "x_grad"):
            got = torch.zeros_like(want[key][t])
            for r in results:
                got[r["ids"][t]] = r[key][t]
            torch.testing.assert_close(got, want[key][t], atol=_tol(want[key][t]), rtol=0, msg=f"{key} of {t}")
    for r in results:
        for k, grad in want["param_grads"].items():
            torch.testing.assert_close(r["param_grads"][k], grad, atol=_tol(grad), rtol=0, msg=k)


@given(case=typed_graphs(), data=st.data())
@settings(SETTINGS, max_examples=8)
def test_node_tables_live_on_their_rows_workers_and_train_exactly(pool, tmp_path_factory, case, data):
    """Featureless types fed by nn.Embedding tables: each worker holds and gets gradients
    for its own rows of each table only; outputs and every gradient equal one machine's."""
    g, seed = case
    world = data.draw(st.integers(1, 4))
    featureless = tuple(t for t in g.node_types if g.num_nodes(t) and data.draw(st.booleans()))
    out_dir = tmp_path_factory.mktemp("tables")
    sc.partition(g, world, out_dir, method=data.draw(st.sampled_from(["metis", "random"])), seed=seed)
    torch.manual_seed(seed)
    model = TableNet(g, featureless).double()
    batch = inputs(g, seed)
    batch["x"] = {t: v for t, v in batch["x"].items() if t not in featureless}
    want = step(model, g, batch, None)
    payload = {"dir": str(out_dir), "graph": g, "state": model.state_dict(), "data": batch, "compiled": True,
               "featureless": featureless}
    results = pool(world).run(run_worker, [payload] * world)
    for t in g.node_types:
        rows = [("out", want["out"][t])] + ([("x_grad", want["x_grad"][t])] if t in batch["x"] else []) + (
            [("table_grads", want["table_grads"][t])] if t in featureless else [])
        for key, full in rows:
            got = torch.zeros_like(full)
            for r in results:
                assert r[key][t].shape[0] == r["ids"][t].numel()  # a worker's own rows only
                got[r["ids"][t]] = r[key][t]
            torch.testing.assert_close(got, full, atol=_tol(full), rtol=0, msg=f"{key} of {t}")
    for r in results:
        for k, grad in want["param_grads"].items():
            torch.testing.assert_close(r["param_grads"][k], grad, atol=_tol(grad), rtol=0, msg=k)


def test_a_node_table_read_by_position_is_refused():
    class ByPosition(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.ModuleDict({"paper": torch.nn.Embedding(4, 2)})

        def forward(self, g, x):
            ids = x["paper"][:, 0].long().abs() % 4  # row i reads another row of the table
            return self.emb["paper"](ids)

    with pytest.raises(sc.CompileError, match="an embedding lookup reads rows of a node table .*by index"):
        sc.distribute(ByPosition())(small(), {"paper": torch.randn(4, 2)})


def test_the_ids_of_a_type_in_no_relation_are_refused_with_the_fix():
    class Unlinked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.ModuleDict({"institution": torch.nn.Embedding(0, 2)})

        def forward(self, g, x):
            return {"institution": self.emb["institution"](g.global_ids["institution"])}

    with pytest.raises(sc.CompileError, match=r"'institution' is in no relation.*`\.weight` rather than a lookup"):
        sc.distribute(Unlinked())(small(), {"paper": torch.randn(4, 2)})


def _tol(t: torch.Tensor) -> float:
    return TOL * max([1.0, *t.abs().flatten().tolist()])


def test_relation_keys_name_each_relation_once():
    g = small()
    assert [relation_key(r) for r in g.edge_types] == ["author__writes__paper", "paper__cites__paper",
                                                        "paper__has_topic__field"]


class _Mixes(torch.nn.Module):
    def forward(self, g, x):
        h = sc.spmm(g["writes"], x["author"], "mean")
        return h + x["author"][:, :1]


class _WrongEnd(torch.nn.Module):
    def forward(self, g, x):
        return sc.spmm(g["writes"], x["paper"], "mean")


@pytest.mark.parametrize("model, match", [
    (_Mixes, r"`add` combines the rows of 'author' and 'paper', which are node types .* at test_hetero.py:\d+: "
             r"`return h \+ x\[\"author\"\]\[:, :1\]`"),
    (_WrongEnd, r"spmm over relation \('author', 'writes', 'paper'\) takes the rows of 'author' \(its source type\) "
                r"for x, but got the rows of 'paper'.*Pass spmm the source type's rows"),
])
def test_mixing_two_types_rows_is_refused_naming_the_line(model, match):
    x = {"author": torch.randn(3, 2), "paper": torch.randn(4, 2)}
    with pytest.raises(sc.CompileError, match=match):
        sc.distribute(model())(small(), x)


def test_a_compiled_program_takes_dicts_and_relations_and_names_every_type():
    class PerRelation(torch.nn.Module):
        def forward(self, g, x):
            n = g.num_nodes("paper")
            h = sc.spmm(g["writes"], x["author"], "mean")
            return {"paper": h * 2 + x["paper"][:n], "deg": g["writes"].in_degrees()}

    g, x = small(), {"author": torch.randn(3, 2), "paper": torch.randn(4, 2)}
    model = sc.distribute(PerRelation())
    got = model(g, x)
    want = PerRelation()(g, x)
    assert set(got) == {"paper", "deg"}
    torch.testing.assert_close(got["paper"], want["paper"])
    assert got["deg"].tolist() == [2, 0, 1, 1]
    listing = dict(model.program(False).stages)["residency"]
    assert "x__author: node 'author'" in listing and "g__author__writes__paper: graph ('author', 'writes', 'paper')" \
        in listing
    assert "sarcompile_ir_ops_spmm(g__author__writes__paper, x__author, 'mean')  # node 'paper'" in listing


@given(case=typed_graphs(), data=st.data())
@settings(SETTINGS, max_examples=6)
def test_typed_plans_equal_the_runtime_counters(pool, tmp_path_factory, case, data):
    """The plan of a typed model prices each op on its relation: bytes received per phase,
    saved activations and remote blocks alive at once are what the runtime counts, node
    tables included (as parameters, each worker's own rows)."""
    g, seed = case
    world = data.draw(st.integers(1, 3))
    featureless = tuple(t for t in g.node_types if g.num_nodes(t) and data.draw(st.booleans()))
    out_dir = tmp_path_factory.mktemp("typed_plan")
    batch = inputs(g, seed)
    batch["x"] = {t: v for t, v in batch["x"].items() if t not in featureless}
    sc.partition(g, world, out_dir, node_data={t: {"x": v} for t, v in batch["x"].items()},
                 method=data.draw(st.sampled_from(["metis", "random"])), seed=seed)
    torch.manual_seed(seed)
    model = TableNet(g, featureless).double()
    compiled = sc.distribute(model)
    step(compiled, g, batch, None)  # one machine first: the plan is of this call's shape (edge weights given)
    plan = compiled.plan(out_dir, x={t: v.detach().requires_grad_() for t, v in batch["x"].items()})
    payload = {"dir": str(out_dir), "graph": g, "state": model.state_dict(), "data": batch, "compiled": True,
               "featureless": featureless, "count": True}
    results = pool(world).run(run_worker, [payload] * world)
    for rank, r in enumerate(results):
        assert plan.forward_bytes(rank) == r["received"].get("forward", 0), rank
        assert plan.backward_bytes(rank) == r["received"].get("backward", 0), rank
        memory = plan.memory_estimate()[rank].breakdown
        assert memory["saved_activations"] == r["saved_bytes"], rank
        assert memory["remote_blocks"] == r["peak_block_bytes"], rank
        table_rows = sum(r["ids"][t].numel() for t in featureless) * 4 * 8  # f_in float64 values per row
        assert memory.get("node_tables", 0) == table_rows * 2, rank  # the rows and their gradient (no optimizer)
        # A checkpoint written in the background copies the rows, their int64 ids, and on rank 0 the parameters.
        copied = plan.memory_estimate(checkpoint=True)[rank]
        ids = sum(r["ids"][t].numel() for t in featureless) * 8
        assert copied.breakdown == {**memory, "checkpoint_copy": table_rows + ids + (memory["parameters"] if rank == 0 else 0)}
        assert copied.peak_bytes == sum(copied.breakdown.values())
    assert {op.relation for op in plan.ops} <= set(g.edge_types)
    text = str(plan)
    assert "relations per worker:" in text and all(f"{s} -{n}-> {d}" in text for s, n, d in g.edge_types)


def test_a_typed_plan_reads_only_the_manifest(tmp_path):
    g = small()
    sc.partition(g, 2, tmp_path, node_data={"paper": {"x": torch.randn(4, 3)}})
    for part in tmp_path.glob("part-*.pt"):
        part.write_bytes(b"damaged")  # a plan that read one would fail its checksum

    class PerRelation(torch.nn.Module):
        def forward(self, g, x):
            return {"paper": sc.spmm(g["cites"], x["paper"], "mean")}

    plan = sc.distribute(PerRelation()).plan(tmp_path)
    assert [op.relation for op in plan.ops] == [("paper", "cites", "paper")]
    assert [w.nodes for w in plan.workers] == [{t: n for t, n in zip(g.node_types, c)} for c in
                                               ([a, b, c, d] for a, b, c, d in zip(*[_counts(tmp_path, t, 2)
                                                                                    for t in g.node_types]))]


def _counts(out_dir, ntype: str, parts: int) -> list[int]:
    manifest = sc.Manifest.from_json((out_dir / "manifest.json").read_text())
    return [manifest.parts[r].type_nodes[ntype] for r in range(parts)]
