"""The checks' outlier draw (issue 46): wrong plans that N(0, 0.5) inputs cannot tell apart now fail.

N(0, 0.5) values never leave [-4, 4], and every row's maximum looks alike, so a plan that clamps its
inputs to +-4, its outputs to +-60, or takes a softmax's shift from wrongly scaled scores computed the
right answer on them and passed. Each such plan is checked twice here: on the normal draw alone (what
the check ran before: it passes, so the test shows the hole) and on every draw (it fails).
"""

from __future__ import annotations

import copy
from functools import partial

import numpy as np
import pytest

from pyrunner.ir import catalog
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.ir.reference import OUTLIER_MAGNITUDE, outlier_inputs, random_inputs
from pyrunner.plan.schema import Plan, plan_document, with_hash
from pyrunner.plan.validate import plan_graph
from pyrunner.planner import search
from pyrunner.planner.search import Budget
from pyrunner.run.draws import NORMAL
from pyrunner.run.executor import execute
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import cpu_check_plan
from pyrunner.run.verify import GpuVerifier, verify_executor

SEEDS = range(3)


def _const(v: float) -> dict:
    return {"kind": "const", "value": v}


def _clamp(buf: str, limit: float) -> dict:
    """A plan op clamping ``buf`` to [-limit, limit]."""
    inner = {"kind": "call", "fn": "max", "args": [{"kind": "ref", "buf": buf}, _const(-limit)]}
    return {"op": "map", "dst": buf, "expr": {"kind": "call", "fn": "min", "args": [inner, _const(limit)]}}


def _matmul_doc() -> dict:
    g = catalog.get("Matmul", {"m": 64, "d": 64, "n": 64})
    return plan_document(search(g, "fp16", tuning=False, budget=Budget(4000))[0])


def _checks(doc: dict, seed: int) -> tuple[bool, bool, str]:
    """(passes the normal draw alone, passes every draw, the full check's message) of an edited plan."""
    plan = cpu_check_plan(with_hash(Plan.model_validate(doc)))
    g = graph_of(plan)
    run = partial(execute, audit=True)
    before = verify_executor(plan, g, run, seed=seed, draws=(NORMAL,))
    now = verify_executor(plan, g, run, seed=seed)
    return before.ok, now.ok, now.message


def test_outlier_inputs_hold_an_outlier_in_every_row_and_no_zero() -> None:
    g = catalog.get("Matmul", {"m": 48, "d": 80, "n": 32})
    x = outlier_inputs(g, 3)
    assert x.keys() == random_inputs(g, 3).keys()
    for v in x.values():
        big = np.abs(v) >= OUTLIER_MAGNITUDE / 2
        assert big.any(axis=-1).all()  # every row
        assert big.mean() < 0.05 and np.abs(v).max() <= OUTLIER_MAGNITUDE
        assert (v != 0).all()
    assert all(np.array_equal(x[k], outlier_inputs(g, 3)[k]) for k in x)  # a seed gives the same draw
    assert not np.array_equal(x["X"], outlier_inputs(g, 4)["X"])


def test_the_catalog_matmul_passes_both_draws() -> None:
    before, now, msg = _checks(_matmul_doc(), 0)
    assert before and now, msg
    assert "on outlier inputs (up to 20)" in msg


@pytest.mark.parametrize("seed", SEEDS)
def test_a_plan_clamping_its_inputs_to_4_fails(seed: int) -> None:
    doc = _matmul_doc()
    (k,) = doc["kernels"]
    ops = next(k[part] for part in ("prologue", "body") if any(op["op"] == "load" for op in k[part]))
    at = max(i for i, op in enumerate(ops) if op["op"] == "load") + 1  # the loads: before the loop or in it
    ops[at:at] = [_clamp(op["dst"], 4.0) for op in ops if op["op"] == "load"]
    before, now, msg = _checks(doc, seed)
    assert before, "the normal draw alone passes it (the hole)"
    assert not now and "outlier inputs" in msg, msg


@pytest.mark.parametrize("seed", SEEDS)
def test_a_plan_clamping_its_outputs_to_60_fails(seed: int) -> None:
    doc = _matmul_doc()
    (k,) = doc["kernels"]
    store = next(i for i, op in enumerate(k["epilogue"]) if op["op"] == "store")
    k["epilogue"].insert(store, _clamp(k["epilogue"][store]["src"], 60.0))
    before, now, msg = _checks(doc, seed)
    assert before, "the normal draw alone passes it (the hole)"
    assert not now and "outlier inputs" in msg, msg


def _negate(node: object, value: float) -> bool:
    """Negate the first constant ``value`` under ``node``."""
    if isinstance(node, dict):
        if node.get("kind") == "const" and node.get("value") == value:
            node["value"] = -value
            return True
        return any(_negate(v, value) for v in node.values())
    return isinstance(node, list) and any(_negate(v, value) for v in node)


def test_a_softmax_shift_from_negated_scores_fails() -> None:
    """The mutation that passed the 100-plan test: attention with sinks planned with its row maximum in a
    kernel of its own, and the 0.125 scale negated there only. The maximum is only the exponent's
    shift, so nothing changes until the shifted exponent overflows, which needs a row holding a large
    score."""
    g = load_graph_file("benchmarks/graphs/attention_sinks.json").with_sizes({"h": 16, "q": 256, "t": 256, "d": 64})
    doc = plan_document(search(g, "fp16", tuning=False, budget=Budget(4000))[0])
    def ops(k: dict) -> list[dict]:
        return k["prologue"] + k["body"] + k["epilogue"]
    row_max = [k for k in doc["kernels"] if any(op["op"] == "reduce" and op["fn"] == "max" for op in ops(k))
               and not any(op["op"] == "store" and op["dst"] == "O" for op in ops(k))]
    assert row_max, "the plan keeps its row maximum in a kernel of its own"
    assert _negate(row_max[0], 0.125)
    for seed in SEEDS:
        before, now, msg = _checks(copy.deepcopy(doc), seed)
        assert before, "the normal draw alone passes it (the hole)"
        assert not now and "outlier inputs" in msg, msg


@pytest.mark.parametrize("wrong", ["inputs", "outputs"])
def test_the_gpu_check_draws_the_outliers_too(wrong: str, matmul_plan, fake_launch) -> None:
    """The device check runs the same draws: a launch clamping its inputs to +-4 or its outputs to +-60
    passes the normal draw and fails the outlier one (``GpuVerifier`` on the CPU with a torch launch)."""
    plan = matmul_plan(64, 64, 64)
    g = plan_graph(plan)
    good = fake_launch(g)
    if wrong == "outputs":
        bad = fake_launch(g, corrupt=lambda y: y.clamp(-60.0, 60.0))
    else:
        def bad(t: dict) -> None:
            for name in ("X", "W"):
                t[name].clamp_(-4.0, 4.0)
            good(t)
    for seed in SEEDS:
        assert GpuVerifier(plan, g, seed=seed, device="cpu", draws=(NORMAL,)).check(bad).ok
        v = GpuVerifier(plan, g, seed=seed, device="cpu")
        assert v.check(good).ok
        res = v.check(bad)
        assert not res.ok and "outlier inputs" in res.message, res.message


def test_a_graph_whose_values_leave_float16_on_large_outliers_is_checked_on_smaller_ones() -> None:
    """SwiGLU of two outliers of 20 reaches silu(400) * 400 = 1.6e5, past float16's 65504: no fp16 output
    can hold it, so the outlier draw is taken at the largest magnitude whose values fit (up to 10)."""
    from pyrunner.ir.reference import evaluate

    g = catalog.get("SwiGLU", {"m": 64, "d": 64, "n": 64})
    plan = cpu_check_plan(search(g, "fp16", tuning=False, budget=Budget(4000))[0])
    assert plan_graph(plan).sizes == g.sizes
    assert np.abs(evaluate(g, outlier_inputs(g, 0))["Y"]).max() > 65504  # on this seed
    res = verify_executor(plan, graph_of(plan), partial(execute, audit=True), seed=0)
    assert res.ok and "on outlier inputs (up to 10)" in res.message, res.message


def test_a_draw_is_checkable_only_where_the_graph_itself_fits_the_dtypes() -> None:
    """The rule that lowers an outlier draw's magnitude: the reference must be finite, fit each output's
    dtype, and survive the graph's own operand rounding (a move of half or more: it does not)."""
    from pyrunner.run.draws import LOST_OPERAND_ERROR, checkable

    ref = {"Y": np.array([1.0, -3.0])}
    assert checkable(ref, 0.0, {"Y": "float16"})
    assert not checkable(ref, LOST_OPERAND_ERROR, {"Y": "float16"})
    assert not checkable(ref, float("inf"), {"Y": "float16"})
    assert not checkable({"Y": np.array([1e5])}, 0.0, {"Y": "float16"})
    assert checkable({"Y": np.array([1e5])}, 0.0, {"Y": "bfloat16"})
    assert not checkable({"Y": np.array([np.nan])}, 0.0, {"Y": "float32"})


def test_a_draw_on_which_the_graphs_own_values_overflow_is_taken_smaller() -> None:
    """The LM-head softmax written as the IR's exp(L) / sum(exp(L)): on outliers of 20 its logits pass 88,
    so exp(L), a value of the graph itself, leaves float32 (float64 gives inf too; only the reference's
    stable softmax stays finite). A plan that stores sum(exp(L)) without the max shift is as exact as
    the graph there; the outlier draw is taken at a magnitude where the graph's values fit (it failed
    the check before, seed 1889985064 in a CI run)."""
    graph = load_graph_file("tests/data/matmul_lm_head_softmax.json")
    unshifted = [p for p in search(graph, "bf16", top=3) if "softmax_max_shift" not in
                 [s.rule for s in p.derivation]]
    assert unshifted, "the search no longer offers an unshifted plan: pick another graph for this test"
    small = cpu_check_plan(unshifted[0])
    res = verify_executor(small, graph_of(small), execute, seed=1889985064)
    assert res.ok, res.message
    assert "on outlier inputs (up to 20)" not in res.message and "on outlier inputs (up to" in res.message
