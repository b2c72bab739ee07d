"""Axis merging (issue 9 item 6): the query heads of a group share K/V tiles through one merged row axis.

The merge is legal only where it is a row-major reshape that changes no value; the planner offers it
where a GEMM operand is shared across the two axes, ranks it beside the unmerged plans, and a merged
plan keeps the author's graph, so every caller (verifier, CPU executor, load, export) converts at
the boundary.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from plan_cache import search
from test_corpus import TOP

from pyrunner.errors import GraphError, PlanError
from pyrunner.frontend.signature import signature
from pyrunner.ir import catalog
from pyrunner.ir.graph import GraphBuilder
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.ir.merge_axes import candidate_pairs, merge, merge_all, source_graph
from pyrunner.ir.reference import evaluate, random_inputs
from pyrunner.plan.schema import Plan, plan_document, with_hash
from pyrunner.plan.validate import validate_plan
from pyrunner.plan.views import kernel_graph, to_plan_layout, to_source_layout, view_of
from pyrunner.run.executor import execute
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import cpu_check_plan, fits_cpu_budget
from pyrunner.run.verify import verify_executor

DATA = Path(__file__).resolve().parent / "data"


def _gqa(t_q: int = 16, group: int = 8, kv_h: int = 2, t_kv: int = 256, d: int = 64):
    return catalog.get("GroupedQueryAttention", {"t_q": t_q, "group": group, "kv_h": kv_h, "t_kv": t_kv, "d": d})


def _batched(b: int = 4, m: int = 16, bias_on_m: bool = False):
    g = GraphBuilder("Batched")
    x = g.input("X", b=b, m=m, d=128)
    y = g.matmul(x, g.input("W", d=128, n=128), contract="d")
    if bias_on_m:
        y = g.add(y, g.input("B", m=m, n=128))
    g.output("Y", y)
    return g.build()


# --- which axes merge -------------------------------------------------------------------------

def test_shared_operand_axes_are_the_candidates() -> None:
    assert candidate_pairs(_gqa()) == [("group", "t_q")]
    assert candidate_pairs(_batched()) == [("b", "m")]
    mqa = load_graph_file(DATA / "attention_multi_query.json")
    assert candidate_pairs(mqa) == [("h", "t_q")]


@pytest.mark.parametrize("name", ["Attention", "Matmul", "CausalAttention", "SwiGLU"])
def test_no_merge_where_no_operand_is_shared_or_an_axis_is_used_alone(name: str) -> None:
    # Attention: K carries h; causal attention indexes t_q (iota) for its mask.
    assert candidate_pairs(catalog.get(name)) == []


def test_causal_grouped_attention_does_not_merge_its_indexed_axis() -> None:
    g = GraphBuilder("CausalGQA")
    q = g.input("Q", kv_h=2, group=4, t_q=64, d=64)
    k, v = g.input("K", kv_h=2, t_kv=64, d=64), g.input("V", kv_h=2, t_kv=64, d=64)
    keep = g.le(g.iota("t_kv"), g.iota("t_q"))
    p = g.softmax(g.masked(g.matmul(q, k, contract="d"), keep), axis="t_kv")
    g.output("O", g.matmul(p, v, contract="t_kv"))
    graph = g.build()
    assert candidate_pairs(graph) == []
    with pytest.raises(GraphError, match="iota uses axis 't_q' on its own"):
        merge(graph, "group", "t_q")


def test_an_input_with_only_one_of_the_axes_blocks_the_merge() -> None:
    graph = _batched(bias_on_m=True)  # B[m, n] is shared across b but not across m
    assert candidate_pairs(graph) == []
    with pytest.raises(GraphError, match="not adjacent in order"):
        merge(graph, "b", "m")


def test_merge_then_source_graph_is_the_identity_and_keeps_values() -> None:
    g = _gqa(t_q=4, group=3, kv_h=2, t_kv=8, d=4)
    merged, merges = merge_all(g)
    assert [m.describe() for m in merges] == ["group, t_q -> group_t_q"]
    assert merged.sizes["group_t_q"] == 12 and "group" not in merged.sizes
    back = source_graph(merged, merges)
    assert back.sizes == g.sizes and back.key() == g.key()
    x = random_inputs(g, 3)
    want = evaluate(g, x)["O"]
    got = evaluate(merged, {**x, "Q": x["Q"].reshape(2, 12, 4)})["O"].reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_merge_rejects_a_taken_name() -> None:
    with pytest.raises(GraphError, match="taken or not a name"):
        merge(_gqa(), "group", "t_q", name="d")


# --- the planner offers it and the cost model chooses ----------------------------------------

@pytest.mark.slow
def test_short_query_gqa_plans_with_the_group_in_the_gemm_rows() -> None:
    graph = load_graph_file(DATA / "attention_gqa_decode.json")
    plan = search(graph, "bf16", top=TOP, tuning=False)[0]  # the best plan: the plan cache's entry of test_corpus
    assert [m.model_dump() for m in plan.axis_merges] == [
        {"axis": "group_t_q", "parts": ["group", "t_q"], "sizes": [8, 16]}]
    assert plan.derivation[0].rule == "merge_axes"
    assert plan.graph["inputs"]["Q"] == ["kv_h", "group", "t_q", "d"]  # the author's graph, unchanged
    q = next(t for t in plan.tensors if t.name == "Q")
    assert (q.axes, q.shape) == (["kv_h", "group_t_q", "d"], [8, 128, 128])
    rows = {g.axis: g.block for k in plan.kernels for g in k.grid}
    assert "group_t_q" in rows and "group" not in rows
    validate_plan(plan_document(plan))
    small = cpu_check_plan(plan)
    res = verify_executor(small, graph_of(small), execute)
    assert res.ok, res.message


@pytest.mark.slow
def test_merged_plan_runs_at_real_shapes_on_the_cpu() -> None:
    graph = _gqa(t_q=16, group=4, kv_h=2, t_kv=128, d=64)
    plans = [p for p in search(graph, "bf16", top=4, tuning=False) if p.axis_merges]
    assert plans
    for plan in plans:
        assert fits_cpu_budget(plan)
        res = verify_executor(plan, graph, execute)
        assert res.ok, res.message


@pytest.mark.slow
def test_long_query_gqa_keeps_the_unmerged_plan_on_a_tie() -> None:
    """At t_q = 4096 a 128-row tile of one head reads K/V as often as one spread over the group:
    the costs tie and the plan as written wins."""
    plans = search(catalog.get("GroupedQueryAttention"), "bf16", top=2, tuning=False)
    assert not plans[0].axis_merges
    assert plans[1].axis_merges and plans[1].cost.total_us == plans[0].cost.total_us


def test_batched_short_rows_merge_into_one_gemm() -> None:
    (plan,) = search(load_graph_file(DATA / "matmul_batched_short_rows.json"), "bf16", tuning=False)
    assert [m.axis for m in plan.axis_merges] == ["b_m"]
    assert plan.kernels[0].grid[0].axis == "b_m"
    small = cpu_check_plan(plan)
    assert small.axis_merges[0].sizes[0] * small.axis_merges[0].sizes[1] == next(
        t.shape[0] for t in small.tensors if t.name == "X")
    res = verify_executor(small, graph_of(small), execute)
    assert res.ok, res.message


def test_naive_plans_never_merge() -> None:
    (plan,) = search(_gqa(), "bf16", naive=True)
    assert not plan.axis_merges


# --- a merged plan file is untrusted like any other -----------------------------------------

def _merged_plan() -> Plan:
    plan = search(load_graph_file(DATA / "attention_gqa_decode.json"), "bf16", top=TOP, tuning=False)[0]
    assert plan.axis_merges
    return plan


@pytest.mark.slow
@pytest.mark.parametrize(("change", "error"), [
    ({"sizes": [4, 32]}, "have extents \\[8, 16\\] in the graph, the plan says \\[4, 32\\]"),
    ({"parts": ["t_q", "group"], "sizes": [16, 8]}, "not adjacent in order"),
    ({"parts": ["kv_h", "group"]}, "have extents"),
    ({"axis": "d"}, "taken or not a name"),
    ({"axis": "a-b"}, "not an ASCII identifier"),
])
def test_tampered_axis_merges_are_rejected_in_one_line(change: dict, error: str) -> None:
    plan = _merged_plan()
    doc = plan_document(plan)
    doc["axis_merges"][0].update(change)
    tampered = with_hash(Plan.model_validate(doc))
    with pytest.raises(PlanError, match=error) as e:
        validate_plan(plan_document(tampered))
    assert "\n" not in str(e.value)


def test_plans_without_merges_keep_their_document_and_hash() -> None:
    (plan,) = search(catalog.get("Matmul"), "bf16", tuning=False)
    assert "axis_merges" not in plan_document(plan)
    assert "axis_merges" not in json.loads(json.dumps(plan_document(plan)))


# --- every caller converts at the boundary -----------------------------------------------------

@pytest.mark.slow
def test_layout_round_trip_numpy_and_torch() -> None:
    import torch

    merges = view_of(_merged_plan())
    src = ("kv_h", "group", "t_q", "d")
    x = np.arange(8 * 8 * 16 * 4, dtype=np.float32).reshape(8, 8, 16, 4)
    y = to_plan_layout(x, src, ("kv_h", "group_t_q", "d"), merges)
    assert y.shape == (8, 128, 4) and y[1, 17, 2] == x[1, 1, 1, 2]
    np.testing.assert_array_equal(to_source_layout(y, ("kv_h", "group_t_q", "d"), src, merges), x)
    t = torch.from_numpy(x)
    assert torch.equal(to_source_layout(to_plan_layout(t, src, ("kv_h", "group_t_q", "d"), merges),
                                        ("kv_h", "group_t_q", "d"), src, merges), t)
    with pytest.raises(PlanError, match="cannot be stored"):
        to_plan_layout(x, src, ("kv_h", "t_q", "d"), merges)


@pytest.mark.slow
def test_signature_takes_and_returns_the_authors_shapes() -> None:
    import torch

    plan = _merged_plan()
    sig = signature(plan, graph_of(plan))
    q = next(s for s in sig.inputs if s.name == "Q")
    assert q.shape == (8, 8, 16, 128) and q.plan_shape == (8, 128, 128)
    x = torch.randn(q.shape)
    assert torch.equal(q.to_plan(x)[3, 9 * 1 + 16 * 2], x[3, 2, 9])
    o = sig.outputs[0]
    assert torch.equal(o.from_plan(o.to_plan(torch.arange(float(np.prod(o.shape))).reshape(o.shape))),
                       torch.arange(float(np.prod(o.shape))).reshape(o.shape))


@pytest.mark.slow
def test_export_of_a_merged_plan_reshapes_at_the_boundary() -> None:
    from pyrunner.frontend.export import export_source

    text = export_source(_merged_plan())
    assert "'Q': (('kv_h', 'group', 't_q', 'd'), (8, 8, 16, 128)" in text
    assert ".reshape(TENSORS[name][0])" in text and "tensors[n].reshape(flat)" in text


@pytest.mark.slow
def test_kernel_graph_is_the_merged_graph() -> None:
    plan = _merged_plan()
    kg = kernel_graph(plan)
    assert kg.sizes["group_t_q"] == 128 and {"group", "t_q"}.isdisjoint(kg.sizes)
    assert graph_of(plan).sizes["group"] == 8


# --- pair contractions: a sum over one axis of a contraction over the other ---------------------

def _heads_out(layout: tuple[str, ...] = ("t", "h", "d"), also_per_head: bool = False):
    g = GraphBuilder("HeadsOut")
    o = g.input("O", **{a: {"t": 8, "h": 3, "d": 5}[a] for a in layout})
    per_head = g.matmul(o, g.input("W", h=3, d=5, n=6), contract="d")
    g.output("Y", g.reduce("sum", per_head, axis="h"))
    if also_per_head:
        g.output("P", per_head)
    return g.build()


def test_a_pair_contraction_merges_into_one_contraction_and_back() -> None:
    g = _heads_out()
    assert candidate_pairs(g) == [("h", "d")]  # no operand is shared: the pair contraction pays alone
    merged, merges = merge_all(g)
    (y,) = [t for n, t in merged.outputs]
    assert (y.op, y.axis) == ("matmul", "h_d") and set(merged.sizes) == {"t", "h_d", "n"}
    x = random_inputs(g, 4)
    want = evaluate(g, x)["Y"]
    got = evaluate(merged, {"O": x["O"].reshape(8, 15), "W": x["W"].reshape(15, 6)})["Y"]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    back = source_graph(merged, merges)
    assert back.sizes == g.sizes
    np.testing.assert_allclose(evaluate(back, x)["Y"], want, rtol=1e-12, atol=1e-12)


def test_a_pair_contraction_with_another_reader_or_apart_axes_does_not_merge() -> None:
    shared = _heads_out(also_per_head=True)  # the per-head products are an output too: they need h alone
    assert candidate_pairs(shared) == []
    with pytest.raises(GraphError, match="a matmul uses axis 'd' on its own"):
        merge(shared, "h", "d")
    apart = _heads_out(layout=("h", "t", "d"))  # O carries h and d apart: no reshape joins them
    assert candidate_pairs(apart) == []


def test_the_backward_of_a_head_split_projection_writes_no_per_head_products() -> None:
    """Q[i, h, d] = X[i, j] W[h, d, j]: d_X sums over h and d. Contracted over d alone, then summed over h,
    it wrote a [i, h, j] tensor (a Llama layer's query projection: 512 MiB, 615 us modelled of its 954)."""
    from pyrunner.ir.grad import derive
    from pyrunner.run.grad_check import backward_inputs

    bwd = derive(load_graph_file(DATA / "matmul_head_split_projection.json").with_sizes(
        {"i": 128, "j": 96, "h": 4, "d": 32}))
    (plan,) = search(bwd.graph, "bf16", tuning=False)
    assert [(m.parts, m.axis) for m in plan.axis_merges] == [(["h", "d"], "h_d")]
    assert not [t for t in plan.tensors if t.role == "intermediate"]  # no [i, h, j] partial products
    graph = graph_of(plan)
    res = verify_executor(plan, graph, execute, seed=3, inputs=backward_inputs(bwd, graph, 3))
    assert res.ok, res.message
