"""The planner finds the known-good kernel structures by itself, and every plan
it emits computes the graph's meaning (CPU executor vs float64 reference)."""

from __future__ import annotations

import numpy as np
import pytest
from plan_cache import search

from pyrunner.ir import catalog as workloads
from pyrunner.ir import reference
from pyrunner.ir.graph import GraphBuilder
from pyrunner.ir.graph_json import graph_from_json
from pyrunner.plan.schema import Gemm, Load, Map, Plan, Reduce
from pyrunner.planner import explain
from pyrunner.planner.search import PRECISION_PENALTY, Planner
from pyrunner.run.executor import execute
from pyrunner.run.shrink import scale_down
from pyrunner.run.verify import max_error as max_rel_error

# Bounds on the normalised max error max|out-ref|/max|ref| at CPU scale.
EXACT_BOUND = 2e-5          # every buffer float32: only the algebra and fp32 rounding differ
DTYPE_BOUND = {"float16": 5e-3, "bfloat16": 4e-2}   # storage rounded to the plan's dtype


def ops(plan: Plan, kind: type) -> list:
    return [op for k in plan.kernels for op in k.prologue + k.body + k.epilogue if isinstance(op, kind)]


def rules(plan: Plan) -> set[str]:
    return {s.rule for s in plan.derivation}


def check_plan(plan: Plan, seed: int = 0) -> None:
    """Run the plan at CPU scale, both exact-fp32 and dtype-emulating, against float64."""
    small = scale_down(plan)
    g = graph_from_json(small.graph)
    x = reference.random_inputs(g, seed)
    ref = reference.evaluate(g, x)
    out = execute(small, x, exact=True)
    for name in ref:
        err = max_rel_error(out[name], ref[name])
        assert err <= EXACT_BOUND, f"{plan.workload} {plan.provenance.plan_hash}: exact error {err:.2e}"
    out = execute(small, x)
    for name in ref:
        err = max_rel_error(out[name], ref[name])
        assert err <= DTYPE_BOUND[plan.dtype], f"{plan.workload}: {plan.dtype} error {err:.2e}"


# --- the five structures, found from the graph definitions ---------------------

def test_attention_is_one_online_softmax_kernel() -> None:
    plan = search(workloads.get("Attention"), "bf16")[0]
    assert len(plan.kernels) == 1
    k = plan.kernels[0]
    assert k.loop is not None and k.loop.axis == "t_kv"
    # no t_q x t_kv tensor reaches global memory
    assert not [t for t in plan.tensors if {"t_q", "t_kv"} <= set(t.axes)]
    assert {"softmax_max_shift", "matmul_div_commute", "online_softmax_rescale"} <= rules(plan)
    state = {b.name for b in k.buffers if b.state}
    assert len(state) == 3  # running max, running sum, output accumulator
    assert len([op for op in k.body if isinstance(op, Gemm)]) == 2


def test_swiglu_is_one_kernel_sharing_the_x_tile() -> None:
    plan = search(workloads.get("SwiGLU"), "fp16")[0]
    assert len(plan.kernels) == 1
    k = plan.kernels[0]
    gemms = [op for op in k.body if isinstance(op, Gemm)]
    assert len(gemms) == 2 and gemms[0].a == gemms[1].a
    assert len([op for op in k.body if isinstance(op, Load) and op.src == "X"]) == 1
    epilogue_fns = {e.fn for op in k.epilogue if isinstance(op, Map) for e in _calls(op.expr)}
    assert "silu" in epilogue_fns and "mul" in epilogue_fns
    assert "shared_operand_fusion" in rules(plan)


def test_matmul_is_one_tiled_gemm() -> None:
    plan = search(workloads.get("Matmul"), "fp16")[0]
    assert len(plan.kernels) == 1
    k = plan.kernels[0]
    assert k.loop is not None and k.loop.axis == "d"
    assert len(ops(plan, Gemm)) == 1


def test_rmsnorm_accumulates_squares_inside_the_gemm_loop() -> None:
    """The one-kernel plan (sum of squares inside the GEMM's d loop, row scale in the
    epilogue) is found; the planner may rank a cheaper plan first only on its numbers."""
    plans = search(workloads.get("RMSNorm"), "fp16", top=6)
    fused = [p for p in plans if len(p.kernels) == 1]
    assert fused, "the one-kernel RMSNorm plan was not found"
    k = fused[0].kernels[0]
    assert k.loop is not None and k.loop.axis == "d"
    assert any(isinstance(op, Reduce) and op.axis == "d" for op in k.body)
    assert any(isinstance(op, Gemm) for op in k.body)
    assert any(isinstance(op, Map) for op in k.epilogue)  # the row scale after the loop
    assert {"matmul_row_scale_commute", "reduction_in_contraction_loop"} <= rules(fused[0])
    best = plans[0]
    assert best.cost.total_us <= fused[0].cost.total_us
    if len(best.kernels) > 1:  # a split plan wins only by predicted time, and still has no normalised X
        assert not [t for t in best.tensors if t.role == "intermediate" and set(t.axes) == {"m", "d"}]


def test_rmsnorm_mlp_one_kernel_plan_is_among_the_best_two() -> None:
    """The one-kernel plan (run 95: 12.1 us, 1.22x torch.compile) is one of the model's two best; since
    the model was fitted to the records (issue 41) it ranks the statistics kernel + GEMM plan (the
    RMSNorm seed's form, unmeasured at this shape) first by 0.7 us, which that plan wins only by
    predicted time: it never materialises the normalised X."""
    plans = search(workloads.get("RMSNormMLP"), "fp16", top=2)
    (plan,) = [p for p in plans if len(p.kernels) == 1]
    assert len(ops(plan, Gemm)) == 2
    assert {"matmul_row_scale_commute", "shared_operand_fusion"} <= rules(plan)
    for other in plans:
        assert not [t for t in other.tensors if t.role == "intermediate" and set(t.axes) == {"m", "d"}]


def _calls(e):
    if getattr(e, "kind", "") == "call":
        yield e
        for a in e.args:
            yield from _calls(a)


# --- every emitted plan is correct on the CPU -------------------------------------

SHAPES = {
    "Attention": [{}, {"h": 4, "t_q": 512, "t_kv": 1024, "d": 64}],
    "SwiGLU": [{}, {"m": 256, "n": 512, "d": 1024}],
    "Matmul": [{}, {"m": 512, "d": 256, "n": 1024}],
    "RMSNorm": [{}, {"m": 256, "d": 512, "n": 768}],
    "RMSNormMLP": [{}, {"m": 512, "d": 256, "n": 512}],
    "ScaledAttention": [{}, {"h": 2, "t_q": 256, "t_kv": 512, "d": 64}],
    "GroupedQueryAttention": [{}, {"kv_h": 2, "group": 2, "t_q": 256, "t_kv": 256, "d": 128}],
    "GeGLU": [{}, {"m": 128, "n": 256, "d": 512}],
    "LayerNormMatmul": [{}, {"m": 256, "d": 1024, "n": 256}],
}


def _top3_cases() -> list:
    """The fast tier: the second shape set, in bf16 (test_corpus_small checks every workload's best plan at
    the sweep's small shape); the slow tier adds the catalog's own sizes in fp16 and GQA's top 3."""
    slow = pytest.mark.slow
    return [pytest.param(name, setting, marks=slow if setting == 0 or name == "GroupedQueryAttention" else ())
            for setting in (0, 1) for name in sorted(SHAPES)]


@pytest.mark.parametrize("name, setting", _top3_cases(), ids=lambda x: str(x))
def test_top3_plans_pass_the_cpu_executor(name: str, setting: int) -> None:
    g = workloads.get(name, SHAPES[name][setting])
    dtype = "fp16" if setting == 0 else "bf16"
    plans = search(g, dtype, top=3)
    assert plans
    assert len({p.provenance.plan_hash for p in plans}) == len(plans)
    for p in plans:
        check_plan(p, seed=setting)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_naive_plan_is_one_kernel_per_op_and_correct(name: str) -> None:
    g = workloads.get(name)
    plan = search(g, "fp16", naive=True)[0]
    computed = [t for t in g.terms() if t.op not in ("input", "const", "axis_size")]
    assert len(plan.kernels) == len(computed)
    assert not plan.derivation or all(s.rule in ("reduction_tiling",) for s in plan.derivation)
    check_plan(plan)


def test_plans_at_small_sizes_directly() -> None:
    """Plans made at CPU sizes (no scaling) are correct too."""
    for name in ("Attention", "RMSNorm", "SwiGLU"):
        g = workloads.get(name)
        g = g.with_sizes({a: min(n, 64) for a, n in g.sizes.items()})
        for p in search(g, "fp16", top=2):
            check_plan(p)


def test_graph_supplied_as_json_plans_and_verifies() -> None:
    doc = {
        "name": "GatedMixture",
        "axes": {"m": 256, "d": 512, "n": 256, "e": 128},
        "inputs": {"X": ["m", "d"], "W1": ["d", "n"], "W2": ["d", "n"], "R": ["d", "e"]},
        "nodes": [
            {"name": "H", "op": "matmul", "args": ["X", "W1"], "contract": "d"},
            {"name": "G", "op": "sigmoid", "args": ["H"]},
            {"name": "U", "op": "matmul", "args": ["X", "W2"], "contract": "d"},
            {"name": "Y", "op": "mul", "args": ["G", "U"]},
            {"name": "L", "op": "matmul", "args": ["X", "R"], "contract": "d"},
            {"name": "P", "op": "softmax", "args": ["L"], "axis": "e"},
        ],
        "outputs": ["Y", "P"],
    }
    g = graph_from_json(doc)
    plans = search(g, "fp16", top=3)
    for p in plans:
        assert {t.name for t in p.tensors if t.role == "output"} == {"Y", "P"}
        check_plan(p)


def test_row_scale_side_condition_blocks_a_column_scale() -> None:
    """(X * s) @_d W with s varying along d must not be rewritten to (X @ W) * s."""
    b = GraphBuilder("ColumnScaled")
    x = b.input("X", m=128, d=256)
    s = b.input("s", d=256)
    w = b.input("W", d=256, n=128)
    b.output("Y", b.matmul(b.mul(x, s), w, contract="d"))
    g = b.build()
    planner_rules = {step.rule for p in search(g, "fp16", top=5) for step in p.derivation}
    assert "matmul_row_scale_commute" not in planner_rules
    for p in search(g, "fp16", top=2):
        check_plan(p)


def test_executor_catches_a_missing_rescale() -> None:
    """Dropping the online rescale of the output accumulator must be caught.

    t_kv = 512 exceeds what a kernel may hold whole, so the plan streams t_kv with online softmax.
    """
    plan = search(workloads.get("Attention", {"h": 1, "t_q": 64, "t_kv": 512, "d": 32}), "fp16")[0]
    k = plan.kernels[0]
    acc = next(op.c for op in k.body if isinstance(op, Gemm) and not op.clear)
    body = [op for op in k.body if not (isinstance(op, Map) and op.dst == acc)]
    broken = plan.model_copy(update={"kernels": [k.model_copy(update={"body": body})]})
    g = graph_from_json(plan.graph)
    x = reference.random_inputs(g, 3, scale=1.5)
    ref = reference.evaluate(g, x)["O"]
    small = {"t_kv": 16, "t_q": 16}
    cfg = {k.name: {p: small.get(p.removeprefix("block_"), v) for p, v in k.defaults.items()}}
    good = execute(plan, x, config=cfg, exact=True)["O"]
    bad = execute(broken, x, config=cfg, exact=True)["O"]
    assert max_rel_error(good, ref) <= EXACT_BOUND
    assert max_rel_error(bad, ref) > 1e-2


def test_unsafe_exponential_is_not_preferred() -> None:
    """Among equal-cost derivations, the max-shifted softmax wins (no overflow)."""
    plan = search(workloads.get("Attention"), "fp16")[0]
    small = scale_down(plan)
    gs = graph_from_json(small.graph)
    x = reference.random_inputs(gs, 0, scale=4.0)   # scores far beyond exp's fp32 range (e^88)
    ref = reference.evaluate(gs, x)["O"]            # float64 still holds them
    s = np.einsum("hqd,hkd->hqk", x["Q"], x["K"])
    assert s.max() > 100.0
    out = execute(small, x, exact=True)["O"]
    assert np.all(np.isfinite(out))
    assert max_rel_error(out, ref) < 1e-3


def test_top_k_are_distinct_and_ranked() -> None:
    plans = search(workloads.get("RMSNorm"), "fp16", top=3, tuning=False)
    costs = [p.cost.total_us for p in plans]
    # ranked by predicted time plus PRECISION_PENALTY per precision risk: a scaled GEMM operand
    # (N = X * rstd stored for a plain GEMM, say) may rank behind a slightly slower plan
    assert costs[0] == min(costs)
    assert all(b >= a or b * (1 + PRECISION_PENALTY) >= a for a, b in zip(costs, costs[1:]))
    assert len({p.provenance.plan_hash for p in plans}) == 3


def test_explain_names_rules_and_costs() -> None:
    plan = search(workloads.get("Attention"), "fp16")[0]
    text = explain(plan)
    assert "online_softmax_rescale" in text and "streams t_kv" in text
    assert "no intermediate reaches HBM" in text


def test_calibration_changes_the_prediction(tmp_path) -> None:
    """A current-generation record measured at twice the prediction scales its structure class."""
    import json

    from pyrunner.target.layout import GENERATION

    g = workloads.get("Matmul")
    base = search(g, "fp16", tuning=False)[0]
    log = tmp_path / "results.jsonl"
    pred = base.cost.total_us
    rec = {"status": "ok", "workload": "Matmul", "shapes": dict(g.sizes), "dtype": "float16", "device": "H200",
           "config": {k.name: dict(k.defaults) for k in base.kernels}, "predicted_us": pred, "plan_us": pred * 2,
           "bound": "compute", "extra": {"renderer": GENERATION}}
    log.write_text(json.dumps(rec) + "\n")
    slower = search(g, "fp16", calibration=log, tuning=False)[0]
    assert slower.cost.total_us > pred * 1.3


def test_planner_rejects_unknown_dtype() -> None:
    from pyrunner.errors import UserError

    with pytest.raises(UserError):
        Planner(workloads.get("Matmul"), "fp8")


@pytest.mark.slow
def test_plans_do_not_depend_on_the_hash_seed() -> None:
    """Same graph in, byte-identical plans out, whatever PYTHONHASHSEED is (the fast tier's check of this:
    tests/test_search_determinism.py, other graphs under two hash seeds)."""
    import os
    import subprocess
    import sys

    outs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run([sys.executable, "-m", "pyrunner", "superopt", "RMSNormMLP", "--top", "2"],
                             capture_output=True, text=True, env=env, check=True)
        outs.add(run.stdout)
    assert len(outs) == 1
