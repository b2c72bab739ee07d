"""The bounds behind issue 46's blowup cases, checked directly (fast tier; test_blowups.py runs the
commands on the generated graphs in the slow tier)."""

from __future__ import annotations

import pytest

from pyrunner.backend.tilelang import limits
from pyrunner.errors import PlanError
from pyrunner.ir import catalog
from pyrunner.ir.graph import axis_size, binary, const, index_only, inp, iota, result_axes, unary, where
from pyrunner.planner import search


def _chain(depth: int):
    x = inp("X", ["m", "n"])
    for _ in range(depth):
        x = unary("exp", x)
    return x


def test_a_deep_chain_is_typed_once_and_compared_once() -> None:
    """Typing and equality of terms are memoised on the terms: two chains built apart compare equal,
    and after the first comparison the second does not walk the chain again (it is linked)."""
    a, b = _chain(3000), _chain(3000)
    assert result_axes(a) == ("m", "n") and a._axes == ("m", "n") and a.args[0]._axes == ("m", "n")
    assert a is not b and a == b
    assert a._same is b or b._same is a
    assert a != unary("exp", b) and not index_only(a)


def test_memoised_facts_hold_for_equal_terms_built_apart() -> None:
    """Equal leaves built as distinct objects each get their own memoised facts (a traversal that
    dedups by equality would visit one of them and leave the other unset)."""
    mask = binary("lt", iota("n"), axis_size("n"))
    t = where(mask, binary("mul", inp("X", ["m", "n"]), const(0.0)), const(0.0))
    assert result_axes(t) == ("m", "n")
    assert index_only(binary("add", mask, const(1.0))) and not index_only(t)
    assert index_only(where(mask, const(0.0), const(0.0)))


def test_a_plan_over_the_lowering_limits_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyrunner.backend.tilelang.compile import rendered_module
    from pyrunner.run.runner import run_plan

    plan = search(catalog.get("RMSNorm", {"m": 64, "d": 256}), "fp16", tuning=False)[0]
    assert limits.size_problem(plan) is None
    ops = max(len(k.prologue) + len(k.body) + len(k.epilogue) for k in plan.kernels)
    monkeypatch.setattr(limits, "MAX_KERNEL_OPS", ops - 1)
    why = limits.size_problem(plan)
    assert why is not None and f"has {ops} ops" in why and "\n" not in why
    for refuse in (rendered_module, run_plan):
        with pytest.raises(PlanError, match="TileLang is asked to lower at most"):
            refuse(plan)
    monkeypatch.setattr(limits, "MAX_KERNEL_OPS", ops)
    monkeypatch.setattr(limits, "MAX_PLAN_KERNELS", len(plan.kernels) - 1)
    assert "kernels" in (limits.size_problem(plan) or "")


@pytest.mark.slow
def test_the_planner_refuses_kernel_cones_past_the_cap() -> None:
    """A 25-deep softmax chain: each reduction's cone reaches back to the input, so past the cap no
    fused kernel is built and the plan's kernels all stay within it."""
    from pyrunner.ir.graph_json import graph_from_json
    from pyrunner.planner.search import MAX_KERNEL_TERMS

    nodes = [{"name": "s0", "op": "softmax", "args": ["X"], "axis": "n"}]
    nodes += [{"name": f"s{i}", "op": "softmax", "args": [f"s{i - 1}"], "axis": "n"} for i in range(1, 25)]
    g = graph_from_json({"name": "Chain", "axes": {"m": 64, "n": 64}, "inputs": {"X": ["m", "n"]},
                         "nodes": nodes, "outputs": ["s24"]})
    assert len(g.terms()) > MAX_KERNEL_TERMS
    plan = search(g, "fp16", tuning=False)[0]
    assert len(plan.kernels) > 1
    assert all(len(k.prologue) + len(k.body) + len(k.epilogue) <= limits.MAX_KERNEL_OPS for k in plan.kernels)


def test_a_plan_over_the_expression_limits_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Map's expression may be a tree of any width within the depth limit (issue 46: three 4,096-leaf trees
    took 140 CPU-s to lower and run on the CPU): the nodes of a kernel's and a plan's expressions are capped."""
    from pyrunner.run.runner import run_plan

    plan = search(catalog.get("RMSNorm", {"m": 64, "d": 256}), "fp16", tuning=False)[0]
    assert limits.size_problem(plan) is None
    nodes = [limits.expr_nodes(k) for k in plan.kernels]
    assert max(nodes) > 1
    monkeypatch.setattr(limits, "MAX_KERNEL_EXPR_NODES", max(nodes) - 1)
    why = limits.size_problem(plan)
    assert why is not None and f"has {max(nodes)} expression nodes" in why and "\n" not in why
    with pytest.raises(PlanError, match="expression nodes"):
        run_plan(plan)
    monkeypatch.setattr(limits, "MAX_KERNEL_EXPR_NODES", max(nodes))
    monkeypatch.setattr(limits, "MAX_PLAN_EXPR_NODES", sum(nodes) - 1)
    assert f"the plan has {sum(nodes)} expression nodes" in (limits.size_problem(plan) or "")
