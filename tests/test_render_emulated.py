"""The rendered TileLang source itself, run on the CPU (backend/tilelang/emulate.py), computes the graph and
agrees with the plan op by op (buffers, loads/stores and their regions, gemms, reductions, maps), for every
catalog workload and every tests/data graph; and the check catches renderer bugs planted in the source."""

from __future__ import annotations

import re

import numpy as np
import pytest
from plan_cache import search
from test_corpus import TOP, case_graph, planned_cases

from pyrunner.backend.tilelang.emulate import EmulationError, emulate, execute_rendered
from pyrunner.backend.tilelang.render import render
from pyrunner.backend.tilelang.structure import structure_problems
from pyrunner.ir import catalog
from pyrunner.ir.reference import evaluate, random_inputs
from pyrunner.run.executor import round_to
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import scale_down
from pyrunner.run.verify import compare, executor_bound, verify_executor

CASES = planned_cases()


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_rendered_source_computes_the_graph_and_follows_the_plan(case) -> None:
    top = 3 if case[0] == "catalog" and case[1] in catalog.SEED_WORKLOADS else 1
    for plan in search(case_graph(case), "bf16", top=TOP)[:top]:  # TOP: the plans tests/test_corpus.py checks
        small = scale_down(plan)
        graph = graph_of(small)
        res = verify_executor(small, graph, execute_rendered)
        assert res.ok, f"plan {plan.provenance.plan_hash}: rendered source {res.message} (seed {res.seed})"


def _matmul_case():
    (plan,) = search(catalog.get("RMSNorm"), "bf16", top=1)
    small = scale_down(plan)
    graph = graph_of(small)
    raw = random_inputs(graph, 3)
    inputs = {k: round_to(v, "bfloat16").astype(np.float64) for k, v in raw.items()}
    return small, graph, inputs, render(small)


def _check(plan, graph, inputs, source) -> tuple[bool, list[str]]:
    em = emulate(plan, inputs, source=source)
    res = compare(em.outputs, evaluate(graph, inputs), executor_bound(plan), 0,
                  {t.name: t.axes for t in plan.tensors if t.role == "output"}, graph)
    return res.ok, structure_problems(plan, em)


def test_the_check_passes_the_true_rendering() -> None:
    assert _check(*_matmul_case()) == (True, [])


@pytest.mark.parametrize("mutation", ["region", "loop_region", "reduce_dim", "gemm_clear",
                                      "drop_map", "transpose"])
def test_the_check_catches_planted_renderer_bugs(mutation: str) -> None:
    plan, graph, inputs, src = _matmul_case()
    subs = {
        # the store of Y lands one row further (a wrong index expression)
        "region": (r"Y\[(m_blk\w*) \* block_m:\((m_blk\w*) \+ 1\) \* block_m",
                   r"Y[\1 * block_m + 1:(\2 + 1) * block_m + 1"),
        # every loop step reads the same slice of W
        "loop_region": (r"W\[d_step \* block_d:\(d_step \+ 1\) \* block_d", "W[0:block_d"),
        "reduce_dim": (r"dim=1", "dim=0"),
        "gemm_clear": (r"T\.gemm\(([^)]*)\)", r"T.gemm(\1, clear_accum=True)"),
        "drop_map": (r"\n(\s+)for (m_i) in T\.Parallel\(block_m\):\n\s+(\w+)\[m_i\] = [^\n]*\n", r"\n"),
        "transpose": (r"T\.gemm\(X_s, W_s, acc", "T.gemm(X_s, W_s, acc, transpose_B=True"),
    }
    pat, rep = subs[mutation]
    # every rendering of the construct: the build function has an asynchronous and a T.Pipelined
    # form of the GEMM kernel, and the small config runs one of them
    bad, n = re.subn(pat, rep, src)
    assert n >= 1, f"mutation {mutation!r} did not apply"
    try:
        ok, problems = _check(plan, graph, inputs, bad)
    except EmulationError:
        return  # the emulator itself rejects it (a shape that TileLang would reject too)
    assert not ok or problems, f"mutation {mutation!r} went unnoticed"


def test_the_rendered_softplus_keeps_float32_precision_where_its_value_is_tiny() -> None:
    """softplus(x) is exp(x) itself at very negative x; as ``log(1 + exp(-|x|))`` the sum rounded to 1 (an
    Ampere sweep draw, x near -16: 1.2e-7 came out 8.8e-8 off). Evaluated as rendered, on the
    emulator's float32 ``T``, each value is within 1e-6 of float64 relative to itself."""
    from pyrunner.backend.tilelang.emulate import FakeT, Trace
    from pyrunner.ir.ops import UNARY

    op = UNARY["softplus"]
    helper: dict = {}
    exec(f"def softplus(x):\n    {op.tilelang}\n", {"T": FakeT(Trace())}, helper)  # noqa: S102 - our op table
    x = np.array([-80.0, -30.0, -16.1, -5.0, -0.5, 0.0, 0.5, 5.0, 16.1, 30.0, 80.0], dtype=np.float32)
    got = np.asarray(helper["softplus"](x), dtype=np.float64)
    ref = op.numpy(x.astype(np.float64))
    assert got.dtype == np.float64 and np.all(np.isfinite(got))
    assert np.max(np.abs(got - ref) / ref) < 1e-6
