"""Several outputs per kernel: sibling kernels of a partition merged into one multi-output kernel
(planner/merge.py, lower.lower with several roots), and every later stage (validator, CPU executor,
renderer, emulation, CUDA lowering) on kernels with several stores."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from plan_cache import search
from plan_fixtures import assert_scaled_plan_matches_float64

from pyrunner.backend.tilelang.compile import check_fits, compile_cubin, lower_to_cuda
from pyrunner.backend.tilelang.render import render
from pyrunner.errors import PlanError
from pyrunner.ir.graph import GraphBuilder
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.plan.schema import Load, Store, with_hash
from pyrunner.plan.validate import check_plan
from pyrunner.planner.lower import Infeasible, lower
from pyrunner.planner.merge import Group, merge_siblings, topological
from pyrunner.planner.search import Planner, derive
from pyrunner.run.executor import execute
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import scale_down
from pyrunner.run.verify import verify_executor

DATA = Path(__file__).resolve().parent / "data"
ATTENTION_LSE = DATA / "multi_attention_lse.json"
QKV = DATA / "multi_qkv_projection.json"


def row_stats(m: int = 1024, d: int = 4096):
    """Two sibling reductions over the same loop: a row sum and a row sum of squares."""
    g = GraphBuilder("RowStats")
    x = g.input("X", m=m, d=d)
    g.output("S", g.reduce("sum", x, "d"))
    g.output("Q", g.reduce("sum", g.mul(x, x), "d"))
    return g.build()


def _ops(kernel, kind):
    return [op for ops in (kernel.prologue, kernel.body, kernel.epilogue) for op in ops if isinstance(op, kind)]


# --- the plans the search chooses ------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_attention_with_lse_is_one_kernel_writing_both(dtype: str) -> None:
    (plan,) = search(load_graph_file(ATTENTION_LSE), dtype, top=1, tuning=False)
    check_plan(plan)
    (k,) = plan.kernels
    assert sorted(k.writes) == ["LSE", "O"]
    assert sorted(op.dst for op in _ops(k, Store)) == ["LSE", "O"]  # one store each
    assert sorted(op.src for op in _ops(k, Load)) == ["K", "Q", "V"]  # K and V streamed once, not twice
    assert plan.cost.launches == 1


def test_the_cost_model_chooses_the_merge_and_counts_what_it_saves() -> None:
    """The merged partition is offered beside the unmerged one; it wins on predicted time, because
    the scores (Q K^T) and the loads of K are shared and one launch is saved."""
    graph = load_graph_file(ATTENTION_LSE)
    planner = Planner(graph, "fp16")
    pairs = []
    for v in derive(graph):
        got = planner.partitions(v, ())
        if len(got) == 2:
            pairs.append(got)
    assert pairs, "no partition of the graph merged"
    for unmerged, merged in pairs:
        assert len(merged.kernels) < len(unmerged.kernels)
        assert merged.total_us < unmerged.total_us
        launch = planner.machine.launch_us  # the backend's launch term (target.cost_terms)
        assert unmerged.total_us - merged.total_us > launch  # more than the launch: the shared work too


def test_qkv_projection_shares_the_x_tile() -> None:
    (plan,) = search(load_graph_file(QKV), "bf16", top=1, tuning=False)
    check_plan(plan)
    (k,) = plan.kernels
    assert sorted(k.writes) == ["Kp", "Qp", "Vp"]
    loads = [op.src for op in k.body if isinstance(op, Load)]
    assert sorted(loads) == ["Wk", "Wq", "Wv", "X"]  # X loaded once per step for the three GEMMs
    assert "shared_operand_fusion" in k.fused_rules


def test_sibling_reductions_run_in_one_pass() -> None:
    (plan,) = search(row_stats(), "fp16", top=1, tuning=False)
    (k,) = plan.kernels
    assert k.loop is not None and k.loop.axis == "d"
    assert sorted(k.writes) == ["Q", "S"]
    assert [op.src for op in k.body if isinstance(op, Load)] == ["X"]


def test_dependent_kernels_are_not_merged() -> None:
    """Y = X @ W then Z = Y @ U: a kernel computing Z from Y never also computes Y. Only the
    re-associated Z = X @ (W @ U) (``matmul_assoc``), which reads no Y, may share Y's kernel."""
    g = GraphBuilder("Chain")
    x = g.input("X", m=256, k=512)
    w = g.input("W", k=512, n=512)
    u = g.input("U", n=512, p=256)
    y = g.matmul(x, w, contract="k", name="Y")
    g.output("Y", y)
    g.output("Z", g.matmul(y, u, contract="n"))
    plans = search(g.build(), "fp16", top=3, tuning=False)
    for plan in plans:
        check_plan(plan)
        for k in plan.kernels:
            assert not set(k.reads) & set(k.writes), k.name
            if {"Y", "Z"} <= set(k.writes):
                assert "matmul_assoc" in {s.rule for s in plan.derivation}
    assert any(any("Y" in k.reads for k in p.kernels) for p in plans)  # the dependent form is still planned


# --- the executor, the rendered source and CUDA -----------------------------------------------

CASES = [("attention_lse", "fp16"), ("attention_lse", "bf16"), ("qkv", "fp16"), ("qkv", "bf16"),
         ("row_stats", "fp16"), ("row_stats", "bf16")]


def _graph(name: str):
    return {"attention_lse": lambda: load_graph_file(ATTENTION_LSE), "qkv": lambda: load_graph_file(QKV),
            "row_stats": row_stats}[name]()


@pytest.mark.parametrize("name,dtype", CASES)
def test_multi_output_plans_match_float64(name: str, dtype: str) -> None:
    """The CPU executor and the rendered source (emulated) against the float64 reference, with the
    per-dtype bound of a one-kernel plan: (STORE_ROUNDINGS) u(dtype) + 16 sqrt(n) u(float32)
    (float16 about 1e-3, bfloat16 about 7.9e-3)."""
    (plan,) = search(_graph(name), dtype, top=1, tuning=False)
    assert any(len(k.writes) > 1 for k in plan.kernels) and len(plan.kernels) == 1
    assert_scaled_plan_matches_float64(plan, f"{name} {dtype}")


def test_render_stores_every_output() -> None:
    (plan,) = search(load_graph_file(ATTENTION_LSE), "bf16", top=1, tuning=False)
    src = render(plan)
    assert "O: T.Tensor" in src and "LSE: T.Tensor" in src
    assert "LSE[h_idx" in src and "O[h_idx" in src


@pytest.mark.slow
@pytest.mark.parametrize("path", [ATTENTION_LSE, QKV])
def test_multi_output_plans_lower_to_cuda_and_build(path: Path, tmp_path: Path) -> None:
    (plan,) = search(load_graph_file(path), "bf16", top=1, tuning=False)
    assert any(len(k.writes) > 1 for k in plan.kernels)
    check_fits(plan)
    sources = lower_to_cuda(plan)
    assert set(sources) == {k.name for k in plan.kernels}
    assert all("__global__" in s for s in sources.values())
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH: CUDA source checked, cubin not built")
    result = compile_cubin(sources, tmp_path / plan.provenance.plan_hash)
    assert len(list(result)) == len(plan.kernels)
    assert all(p.stat().st_size > 0 for p in result)


# --- the validator --------------------------------------------------------------------------

def test_validator_keeps_one_writer_per_tensor() -> None:
    (plan,) = search(load_graph_file(ATTENTION_LSE), "fp16", top=1, tuning=False)
    check_plan(plan)
    k = plan.kernels[0]
    store = next(op for op in k.epilogue if isinstance(op, Store) and op.dst == "LSE")
    twice = k.model_copy(update={"epilogue": [*k.epilogue, store]})
    bad = with_hash(plan.model_copy(update={"kernels": [twice]}))
    with pytest.raises(PlanError, match="a second time"):
        check_plan(bad)
    unlisted = k.model_copy(update={"writes": ["O"]})
    with pytest.raises(PlanError, match="writes does not list it"):
        check_plan(with_hash(plan.model_copy(update={"kernels": [unlisted]})))


# --- lowering several roots ---------------------------------------------------------------------

def test_lower_rejects_a_split_axis_missing_from_an_output() -> None:
    """Roots X*2 over (m, n) and Y*3 over (m): n is tiled across blocks for the first, so the
    second's store would race between the blocks of n; lowering them together is infeasible."""
    g = GraphBuilder("Mixed")
    x = g.input("X", m=256, n=512)
    y = g.input("Y", m=256)
    g.output("A", g.mul(x, 2.0))
    g.output("B", g.mul(y, 3.0))
    graph = g.build()
    (a, ta), (b, tb) = list(graph.outputs)
    boundary = {t: t.name for t in graph.inputs()} | {ta: a, tb: b}
    dtypes = {"X": "float16", "Y": "float16"}
    with pytest.raises(Infeasible, match="not in every output"):
        lower((ta, tb), boundary, dtypes, graph.sizes, "float16", None, graph.labels, [a, b])
    with pytest.raises(ValueError, match="output tensors"):
        lower((ta, tb), boundary, dtypes, graph.sizes, "float16", None, graph.labels, [a])


# --- the merge bookkeeping -------------------------------------------------------------------

def _g(i: int, reads: set[str], writes: set[str], key: str = "k") -> Group:
    return Group((i,), frozenset(reads), frozenset(writes), (key,), f"c{i}", 10.0)


def _merge_all(a: Group, b: Group) -> Group:
    return Group(a.members + b.members, a.reads | b.reads, a.writes | b.writes, a.key, "m", 15.0)


def test_merge_never_closes_a_cycle() -> None:
    """A -> C (C reads A), D -> B. Merging {A, B} makes C depend on D through the merged kernel,
    so C and D must not merge afterwards (that would be a cycle)."""
    a, b = _g(0, set(), {"a"}), _g(1, {"d"}, {"b"})
    c, d = _g(2, {"a"}, {"c"}), _g(3, set(), {"d"})
    out = merge_siblings([a, b, c, d], _merge_all)
    written: set[str] = set()
    for grp in out:  # a valid order: every tensor read is written by an earlier kernel (or an input)
        assert all(r in written for r in grp.reads), (grp.members, written)
        written |= grp.writes
    assert sorted(m for grp in out for m in grp.members) == [0, 1, 2, 3]
    assert all(not ({2, 3} <= set(grp.members)) for grp in out)


def test_merge_only_when_cheaper_and_compatible() -> None:
    a, b = _g(0, {"x"}, {"a"}), _g(1, {"x"}, {"b"})
    slow = lambda p, q: Group(p.members + q.members, p.reads | q.reads, p.writes | q.writes, p.key, "m", 25.0)  # noqa: E731
    assert merge_siblings([a, b], slow) == [a, b]
    other = _g(1, {"x"}, {"b"}, key="other loop")
    assert merge_siblings([a, other], _merge_all) == [a, other]
    (merged,) = merge_siblings([a, b], _merge_all)
    assert merged.members == (0, 1) and merged.writes == {"a", "b"}


def test_topological_order_follows_reads() -> None:
    a, b, c = _g(0, {"c"}, {"a"}), _g(1, {"a"}, {"b"}), _g(2, set(), {"c"})
    assert [g.members for g in topological([a, b, c])] == [(2,), (0,), (1,)]


def test_merge_tries_are_bounded() -> None:
    """Many compatible siblings: at most MAX_MERGE_TRIES lowerings per kernel, however many pairs."""
    from pyrunner.planner.merge import MAX_MERGE_TRIES

    groups = [_g(i, {f"x{i}"}, {f"y{i}"}) for i in range(12)]
    calls = []

    def never(a: Group, b: Group) -> Group | None:
        calls.append((a.members, b.members))
        return None  # nothing fits: every compatible pair is tried once, up to the cap

    out = merge_siblings(groups, never)
    assert len(out) == len(groups)
    assert len(calls) == min(MAX_MERGE_TRIES * len(groups), len(groups) * (len(groups) - 1) // 2)
    assert len(set(calls)) == len(calls)


def test_merges_are_paid_from_the_search_budget() -> None:
    """With no budget left, a partition is offered without merges (the search stays bounded)."""
    from pyrunner.planner.search import Budget

    graph = load_graph_file(ATTENTION_LSE)
    planner = Planner(graph, "fp16")
    v = next(v for v in derive(graph) if len(planner.partitions(v, (), budget=Budget())) == 2)
    assert len(Planner(graph, "fp16").partitions(v, (), budget=Budget(work=0))) == 1


def test_random_multi_output_graphs_merge_and_match_float64() -> None:
    """Randomized: seeded random graphs with several outputs (tests/graph_strategies.py) plan, some
    with multi-output kernels, and every plan passes the CPU executor at the bf16 bound of its
    kernel count (verify.executor_bound)."""
    from graph_strategies import seeded_graph_doc

    from pyrunner.ir.graph_json import graph_from_json

    merged = 0
    for seed in range(60):
        doc = seeded_graph_doc(seed)
        if len(doc["outputs"]) < 2:
            continue
        (plan,) = search(graph_from_json(doc), "bf16", top=1, tuning=False)
        check_plan(plan)
        merged += any(len(k.writes) > 1 for k in plan.kernels)
        small = scale_down(plan)
        res = verify_executor(small, graph_of(small), execute, seed=seed)
        assert res.ok, f"seed {seed}: {res.message}"
    assert merged >= 3
