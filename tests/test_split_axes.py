"""Split reductions (split-K, flash-decoding): a long reduced axis read as chunks, each reduced by its
own blocks, then combined, so a graph with few output tiles still fills the GPU.

The split changes no value (checked in float64 on random inputs); the attention form keeps every
chunk independent (its softmax rescale is taken out of the chunk's sums); the planner offers it only
where the outputs leave most SMs idle; a split plan keeps the author's graph and interface, and the
CPU executor and the rendered TileLang both compute the graph from it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from pyrunner.errors import GraphError, PlanError
from pyrunner.frontend.signature import signature
from pyrunner.ir import catalog
from pyrunner.ir.graph import Graph, GraphBuilder
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.ir.merge_axes import merge_all
from pyrunner.ir.reference import evaluate, random_inputs
from pyrunner.ir.split_axes import AxisSplit, _Splitter, split, split_problem
from pyrunner.plan.analysis import resolve_config
from pyrunner.plan.schema import Plan, plan_document, with_hash
from pyrunner.plan.validate import validate_plan
from pyrunner.plan.views import View, kernel_graph, to_plan_layout, to_source_layout
from pyrunner.planner.merge import Group, merge_siblings
from pyrunner.planner.search import derive, search, split_candidates
from pyrunner.run.executor import execute
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import cpu_check_plan
from pyrunner.run.verify import verify_executor

DATA = Path(__file__).resolve().parent / "data"
GQA_DECODE = DATA / "attention_gqa_decode.json"


def _split_inputs(g: Graph, gs: Graph, x: dict[str, np.ndarray], s: AxisSplit) -> dict[str, np.ndarray]:
    """The inputs of ``g`` as the split graph ``gs`` reads them (the plans' own view)."""
    written = {t.name: t.axes for t in g.inputs()}
    return {t.name: to_plan_layout(x[t.name], written[t.name], t.axes, View(splits=(s,))) for t in gs.inputs()}


def _layernorm_matmul() -> Graph:
    g = GraphBuilder("LayerNormMatmulSmall")
    x, w = g.input("X", m=6, d=32), g.input("W", d=32, n=5)
    g.output("Y", g.matmul(g.layernorm(x, axis="d"), w, contract="d"))
    return g.build()


def _mean_rows() -> Graph:
    g = GraphBuilder("RowMeanMax")
    x = g.input("X", m=5, d=24)
    g.output("A", g.add(g.reduce("mean", x, "d"), g.reduce("max", x, "d")))
    return g.build()


SMALL_GRAPHS = [
    ("gqa_decode", lambda: load_graph_file(GQA_DECODE).with_sizes({"t_kv": 32, "d": 16}), "t_kv"),
    ("softcap", lambda: load_graph_file(DATA / "attention_softcap.json"), "t_kv"),
    ("additive_bias", lambda: load_graph_file(DATA / "attention_additive_bias.json"), "t_kv"),
    ("rmsnorm_weight_matmul", lambda: load_graph_file(DATA / "norm_rmsnorm_weight_matmul.json"), "d"),
    ("layernorm_matmul", _layernorm_matmul, "d"),
    ("mean_and_max", _mean_rows, "d"),
    ("gelu_mlp_hidden", lambda: load_graph_file(DATA / "mlp_gelu.json"), "f"),
]


def _shrunk(g: Graph, axis: str) -> Graph:
    """Small extents (every axis at most 8, the split axis 16) so float64 evaluation is quick."""
    return g.with_sizes({a: (16 if a == axis else min(n, 8)) for a, n in g.sizes.items()})


@pytest.mark.parametrize("name,make,axis", SMALL_GRAPHS, ids=[c[0] for c in SMALL_GRAPHS])
def test_split_keeps_every_value_of_every_derivation(name: str, make, axis: str) -> None:
    g = _shrunk(make(), axis)
    x = random_inputs(g, 5)
    ref = evaluate(g, x)
    checked = 0
    for v in derive(g)[:10]:
        for chunks in (2, 4, 8):
            gs, s = split(v.graph, axis, chunks)
            assert s.sizes == (chunks, 16 // chunks) and axis not in gs.sizes
            got = evaluate(gs, _split_inputs(g, gs, x, s))
            for n, r in ref.items():
                np.testing.assert_allclose(got[n], r, rtol=1e-10, atol=1e-10, err_msg=f"{name} {v.steps} {chunks}")
            checked += 1
    assert checked >= 3


def test_the_attention_chunks_are_independent() -> None:
    """After the max shift, no per-chunk sum or contraction needs another chunk: the rescale factor
    exp(m_c - M) sits outside them, where the chunks are combined."""
    g, _ = merge_all(load_graph_file(GQA_DECODE))
    shifted = [v for v in derive(g) if any(st.rule.startswith("softmax") for st in v.steps)]
    assert shifted
    for v in shifted:
        gs, s = split(v.graph, "t_kv", 16)
        sp = _Splitter(s)
        per_chunk = [t for t in gs.terms() if t.op in ("reduce", "matmul") and t.axis == s.parts[1]]
        assert per_chunk and not [t for t in per_chunk if sp.late(t)], v.steps
        combine = [t for t in gs.terms() if t.op == "reduce" and t.axis == s.parts[0]]
        assert {t.fn for t in combine} == {"max", "sum"}


def test_a_factor_that_needs_every_chunk_and_varies_in_the_chunk_stays_inside() -> None:
    """LayerNorm over the split axis: x - mean(x) carries the in-chunk axis and needs every chunk, so
    the chunk's sum of squares depends on the combined mean (a second pass); the value is still right."""
    g = _shrunk(_layernorm_matmul(), "d")
    gs, s = split(g, "d", 4)
    sp = _Splitter(s)
    assert any(sp.late(t) for t in gs.terms() if t.op in ("reduce", "matmul") and t.axis == s.parts[1])


@pytest.mark.parametrize("build,axis,chunks,why", [
    (lambda: catalog.get("Attention"), "t_q", 2, "output 'O' carries axis 't_q'"),
    (lambda: catalog.get("CausalAttention"), "t_kv", 2, "indexes axis 't_kv'"),
    (lambda: catalog.get("Matmul"), "d", 3, "do not divide"),
    (lambda: catalog.get("Matmul"), "d", 1, "do not divide"),
    (lambda: catalog.get("Matmul"), "zz", 2, "not an axis"),
])
def test_split_refuses_what_would_change_a_value_or_cannot_be_chunked(build, axis, chunks, why) -> None:
    g = build()
    assert why in (split_problem(g, axis, chunks) or "")
    with pytest.raises(GraphError, match="cannot split axis"):
        split(g, axis, chunks)


def test_split_refuses_taken_names() -> None:
    with pytest.raises(GraphError, match="taken or not names"):
        split(catalog.get("Matmul"), "d", 2, ("m", "d_in"))
    with pytest.raises(GraphError, match="taken or not names"):
        split(catalog.get("Matmul"), "d", 2, ("a-b", "d_in"))


# --- the planner offers it where the outputs leave SMs idle ------------------------------------

def test_split_is_offered_only_for_few_output_tiles() -> None:
    merged, _ = merge_all(load_graph_file(GQA_DECODE))
    offered = split_candidates(merged)
    assert [(s.axis, s.sizes) for s in offered] == [("t_kv", (16, 256)), ("t_kv", (32, 128))]
    for name in catalog.SEED_WORKLOADS:
        assert split_candidates(catalog.get(name)) == [], name


@pytest.fixture(scope="module")
def decode_plans() -> list[Plan]:
    """The decode graph's four best plans, planned once for the module (a search of tens of seconds)."""
    return search(load_graph_file(GQA_DECODE), "bf16", top=4, tuning=False)


@pytest.fixture(scope="module")
def decode_plan(decode_plans: list[Plan]) -> Plan:
    return decode_plans[0]


def test_short_query_attention_splits_its_keys_into_chunks(decode_plan: Plan, monkeypatch) -> None:
    plan = decode_plan
    assert [s.model_dump() for s in plan.axis_splits] == [
        {"axis": "t_kv", "parts": ["t_kv_chunk", "t_kv_in"], "sizes": [16, 256]}]
    assert [st.rule for st in plan.derivation][:1] == ["merge_axes"] and any(
        st.rule == "split_reduction" for st in plan.derivation)
    chunk, combine = plan.kernels
    assert "t_kv_chunk" in {g.axis for g in chunk.grid} and chunk.loop.axis == "t_kv_in"
    assert len(chunk.writes) == 3  # each chunk's max, denominator and unnormalised output
    # the combine reads all 16 chunks at once: no loop, or a loop of one step over them all (a
    # loop-free block draws one SM share of bandwidth since run 73, a one-step loop 1.5, so either may win)
    assert combine.writes == ["O"]
    assert combine.loop is None or resolve_config(plan)[combine.name][combine.loop.block] >= 16, combine.loop
    k = next(t for t in plan.tensors if t.name == "K")
    assert k.axes == ["kv_h", "t_kv_chunk", "t_kv_in", "d"] and plan.graph["inputs"]["K"] == ["kv_h", "t_kv", "d"]
    # predicted faster than the best unsplit plan: the flash kernel's 16 blocks stream 4096 keys each,
    # and the best unsplit plan now materialises the scores and holds their 4096-key rows whole
    monkeypatch.setattr(sys.modules["pyrunner.planner.search"], "split_candidates", lambda g, m=None: [])
    (unsplit,) = search(load_graph_file(GQA_DECODE), "bf16", tuning=False)
    assert not unsplit.axis_splits and plan.cost.total_us < unsplit.cost.total_us


def test_the_split_plan_computes_the_graph_on_the_cpu_and_in_the_rendered_source(decode_plan: Plan) -> None:
    from pyrunner.backend.tilelang.emulate import execute_rendered

    validate_plan(plan_document(decode_plan))
    small = cpu_check_plan(decode_plan)
    assert small.axis_splits[0].sizes[0] * small.axis_splits[0].sizes[1] == small.graph["axes"]["t_kv"]
    for run in (execute, execute_rendered):
        res = verify_executor(small, graph_of(small), run)
        assert res.ok, res.message


def test_split_plans_keep_the_authors_interface(decode_plan: Plan) -> None:
    import torch

    sig = signature(decode_plan, graph_of(decode_plan))
    k = next(s for s in sig.inputs if s.name == "K")
    assert k.shape == (8, 4096, 128) and k.plan_shape == (8, 16, 256, 128)
    x = torch.randn(k.shape)
    assert torch.equal(k.to_plan(x)[2, 3, 5], x[2, 3 * 256 + 5])
    assert kernel_graph(decode_plan).sizes["t_kv_in"] == 256


def test_layout_round_trip_with_a_split_and_a_merge() -> None:
    from pyrunner.ir.merge_axes import AxisMerge

    view = View((AxisMerge("gt", ("g", "t"), (2, 3)),), (AxisSplit("s", ("s_c", "s_i"), (4, 5)),))
    x = np.arange(2 * 3 * 20 * 7, dtype=np.float32).reshape(2, 3, 20, 7)  # (g, t, s, d)
    y = to_plan_layout(x, ("g", "t", "s", "d"), ("d", "gt", "s_c", "s_i"), view)
    assert y.shape == (7, 6, 4, 5) and y[6, 4, 2, 3] == x[1, 1, 13, 6]
    np.testing.assert_array_equal(to_source_layout(y, ("d", "gt", "s_c", "s_i"), ("g", "t", "s", "d"), view), x)
    with pytest.raises(PlanError, match="adjacent and in order"):
        to_plan_layout(x, ("g", "t", "s", "d"), ("gt", "s_i", "s_c", "d"), view)


@pytest.mark.parametrize(("change", "error"), [
    ({"sizes": [8, 512]}, "t_kv_chunk. has extent 16, but the graph says 8"),
    ({"sizes": [16, 128]}, "is not the extent 4096"),
    ({"axis": "d"}, "output 'O' carries axis 'd'"),
    ({"parts": ["kv_h", "t_kv_in"]}, "a part name is taken"),
    ({"parts": ["../x", "t_kv_in"]}, "not an ASCII identifier"),
])
def test_tampered_axis_splits_are_rejected_in_one_line(decode_plan: Plan, change: dict, error: str) -> None:
    doc = plan_document(decode_plan)
    doc["axis_splits"][0].update(change)
    tampered = with_hash(Plan.model_validate(doc))
    with pytest.raises(PlanError, match=error) as e:
        validate_plan(plan_document(tampered))
    assert "\n" not in str(e.value)


def test_plans_without_splits_keep_their_document() -> None:
    (plan,) = search(catalog.get("Matmul"), "bf16", tuning=False)
    assert "axis_splits" not in json.loads(json.dumps(plan_document(plan)))


# --- a chunk's kernel computes the max it also stores -------------------------------------------

def _g(i: int, reads: set[str], writes: set[str]) -> Group:
    return Group((i,), frozenset(reads), frozenset(writes), ("k",), f"c{i}", 10.0)


def _merge_all(a: Group, b: Group) -> Group:
    return Group(a.members + b.members, a.reads | b.reads, a.writes | b.writes, a.key, "m", 15.0)


def test_dependent_merges_only_in_the_dependent_pass_and_only_where_a_third_kernel_reads() -> None:
    m, o, combine = _g(0, set(), {"m"}), _g(1, {"m"}, {"o"}), _g(2, {"m", "o"}, {"O"})
    assert len(merge_siblings([m, o, combine], _merge_all)) == 3  # the sibling pass leaves them apart
    merged = merge_siblings([m, o, combine], _merge_all, dependent=True)
    assert [g.members for g in merged] == [(0, 1), (2,)]
    lone = merge_siblings([_g(0, set(), {"m"}), _g(1, {"m"}, {"o"})], _merge_all, dependent=True)
    assert len(lone) == 2  # nobody else reads m: the partition without the cut is that kernel
    tried: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    chain = [_g(0, set(), {"a"}), _g(1, {"a"}, {"b"}), _g(2, {"a", "b"}, {"c"})]
    merge_siblings(chain, lambda p, q: tried.append((p.members, q.members)), dependent=True)
    assert ((0,), (1,)) in tried and ((0,), (2,)) not in tried  # a path through b: never a with c


def test_no_kernel_of_a_split_plan_reduces_a_chunk_and_combines_chunks(decode_plans: list[Plan]) -> None:
    """Such a kernel would hold every chunk of its rows (no parallelism from the split), and the chunk
    axis held in a tile beside the streamed in-chunk axis lowered to 2048 floats per thread (sweep 29)."""
    from pyrunner.planner.search import Planner

    merged, merges = merge_all(load_graph_file(GQA_DECODE))
    sp = split_candidates(merged)[0]
    planner = Planner(merged, "bf16", merges=tuple(merges), split=sp)
    assert planner.candidates()
    assert any("reduce both 't_kv_in' and the chunks 't_kv_chunk'" in why for why in planner.rejections)
    for plan in decode_plans:
        for k in plan.kernels:
            ops = k.prologue + k.body + k.epilogue
            reduced = {op.axis for op in ops if op.op == "reduce"} | {op.contract for op in ops if op.op == "gemm"}
            reduced |= {k.loop.axis} if k.loop else set()
            assert not {"t_kv_chunk", "t_kv_in"} <= reduced, (plan.provenance.plan_hash, k.name)


def test_chunks_are_whole_tiles() -> None:
    from pyrunner.ir.split_axes import chunk_counts

    assert chunk_counts(4096, 8, 132) == [16, 32]
    assert chunk_counts(2000, 8, 132) == []  # 250 or 125 keys a chunk: no whole 64-element tiles
    assert chunk_counts(4096, 40, 132) == []  # 4 chunks would do: fewer than 16 are never made
    assert chunk_counts(1 << 20, 40, 132) == []
    assert chunk_counts(8192, 1, 132) == [32, 64]


def test_single_token_decode_plans_with_its_query_rows_as_the_tile_rows() -> None:
    """t_q = 1 with 4 query heads per KV head: the 8 KV heads are a batch axis of both GEMMs and must
    not be taken for the tile rows (it was: "no feasible plan"); merged rows, split keys, verified."""
    graph = load_graph_file(Path(__file__).resolve().parents[1] / "benchmarks" / "graphs" / "gqa_decode_long.json")
    graph = graph.with_sizes({"t_kv": 8192})
    (plan,) = search(graph, "bf16", tuning=False)
    assert [m.axis for m in plan.axis_merges] == ["group_t_q"]
    assert [(s.axis, s.sizes[0]) for s in plan.axis_splits] in ([("t_kv", 32)], [("t_kv", 64)])
    assert {g.axis: g.block for g in plan.kernels[0].grid}["kv_h"] == 1
    small = cpu_check_plan(plan)
    res = verify_executor(small, graph_of(small), execute)
    assert res.ok, res.message
