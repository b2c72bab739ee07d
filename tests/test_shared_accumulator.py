"""A sum of contractions over the loop axis accumulated in one tile (``lower.SHARED_ACCUMULATOR``).

A backward pass sums the gradients an input gets from each projection it feeds: SwiGLU's
``dX = dG @ W_gate^T + dU @ W_up^T``, a QKV projection's three. Kept in two accumulators, the kernel
holds twice the registers and adds them after the loop; cuBLAS runs the sum as one GEMM over the
concatenated operands (run 159: 27.6 us against the two-accumulator kernel's 32.4). The switch is off
until a GPU sweep and an A/B decide it; these tests switch it on in their own process.
"""

from __future__ import annotations

import importlib

import pytest
from plan_cache import search

from pyrunner.backend.tilelang.render import render
from pyrunner.errors import PlanError
from pyrunner.ir.graph import GraphBuilder
from pyrunner.plan.schedule import mainloop_schedule
from pyrunner.plan.schedule_rules import loop_rule_ok
from pyrunner.plan.schema import Gemm, with_hash
from pyrunner.plan.validate import check_plan
from pyrunner.run.executor import execute
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import cpu_check_plan
from pyrunner.run.verify import verify_executor

lower_module = importlib.import_module("pyrunner.planner.lower")


def summed_projections(parts: int = 2, stored_first: bool = False, m: int = 1024, d: int = 2048, n: int = 1024):
    """``sum_i X_i @_d W_i``: each part's input and weight its own (the gradients of one input)."""
    g = GraphBuilder(f"SumOf{parts}Projections")
    total = None
    for i in range(parts):
        x = g.input(f"X{i}", m=m, d=d)
        w = g.input(f"W{i}", d=d, n=n)
        y = g.matmul(x, w, "d")
        if i == 0 and stored_first:
            g.output("Y0", y)
        total = y if total is None else g.add(total, y)
    g.output("Y", total)
    return g.build()


def _loop_gemms(plan):
    return [op for k in plan.kernels for op in k.body if isinstance(op, Gemm)]


def _plan(graph, on: bool, monkeypatch):
    monkeypatch.setattr(lower_module, "SHARED_ACCUMULATOR", on)
    (plan,) = search(graph, "bf16", tuning=False)
    check_plan(plan)
    return plan


def _cpu_checked(plan) -> None:
    small = cpu_check_plan(plan)
    res = verify_executor(small, graph_of(small), execute)
    assert res.ok, res.message


@pytest.mark.parametrize("parts", [2, 3])
def test_a_sum_of_projections_accumulates_in_one_tile(parts: int, monkeypatch) -> None:
    plan = _plan(summed_projections(parts), True, monkeypatch)
    (k,) = plan.kernels
    gemms = _loop_gemms(plan)
    assert len(gemms) == parts and len({g.c for g in gemms}) == 1
    assert "shared_accumulator" in k.fused_rules
    assert [b.name for b in k.buffers if b.scope == "fragment"] == [gemms[0].c]  # no second tile, no add
    assert mainloop_schedule(k) is not None  # still the warp-specialised mainloop
    src = render(plan)
    assert src.count(f", {gemms[0].c}, ") >= parts  # every GEMM of the sum into the one tile
    _cpu_checked(plan)


def test_switched_off_each_projection_keeps_its_tile(monkeypatch) -> None:
    plan = _plan(summed_projections(2), False, monkeypatch)
    gemms = _loop_gemms(plan)
    assert len({g.c for g in gemms}) == 2
    assert all("shared_accumulator" not in k.fused_rules for k in plan.kernels)


def test_a_projection_also_stored_keeps_its_own_tile(monkeypatch) -> None:
    """Y0 is an output: its value alone is needed, so it cannot take the other projection's products."""
    plan = _plan(summed_projections(2, stored_first=True), True, monkeypatch)
    gemms = _loop_gemms(plan)
    assert len({g.c for g in gemms}) == len(gemms) == 2
    _cpu_checked(plan)


def test_the_rule_needs_two_gemms_into_one_tile() -> None:
    load = [{"op": "load", "src": "X", "dst": "X_s"}, {"op": "load", "src": "W", "dst": "W_s"}]
    shared = [*load, {"op": "gemm", "a": "X_s", "b": "W_s", "c": "acc", "contract": "d", "clear": False},
              {"op": "gemm", "a": "X_s", "b": "W_s", "c": "acc", "contract": "d", "clear": False}]
    apart = [*shared[:3], {**shared[3], "c": "acc_2"}]
    other_axis = [*shared[:3], {**shared[3], "contract": "n"}]
    assert loop_rule_ok(shared, "d", 256, 64, "shared_accumulator")
    assert not loop_rule_ok(apart, "d", 256, 64, "shared_accumulator")
    assert not loop_rule_ok(other_axis, "d", 256, 64, "shared_accumulator")


def test_a_plan_citing_the_rule_without_a_shared_tile_is_refused(monkeypatch) -> None:
    """A hand edit that gives the second GEMM a tile of its own while the kernel still cites the rule."""
    plan = _plan(summed_projections(2), True, monkeypatch)
    data = plan.model_dump(mode="json")
    k = next(k for k in data["kernels"] if "shared_accumulator" in k["fused_rules"])
    second = [op for op in k["body"] if op["op"] == "gemm"][1]
    tile = next(b for b in k["buffers"] if b["name"] == second["c"])
    k["buffers"].append({**tile, "name": "acc_apart"})
    second["c"] = "acc_apart"
    k["prologue"].append({"op": "fill", "dst": "acc_apart", "value": 0.0})
    with pytest.raises(PlanError, match="shared_accumulator"):
        check_plan(with_hash(type(plan).model_validate(data)))


def test_swiglu_backward_sums_its_input_gradient_in_one_tile(monkeypatch) -> None:
    from pyrunner.ir import catalog
    from pyrunner.planner.saves import choose_saves
    from pyrunner.run.grad_check import backward_inputs

    monkeypatch.setattr(lower_module, "SHARED_ACCUMULATOR", True)
    bwd = choose_saves(catalog.get("SwiGLU"), "bfloat16")
    (plan,) = search(bwd.graph, "bf16", tuning=False)
    check_plan(plan)
    k = next(k for k in plan.kernels if "d_X" in k.writes)
    assert "shared_accumulator" in k.fused_rules
    assert len({op.c for op in k.body if isinstance(op, Gemm)}) == 1
    small = cpu_check_plan(plan)
    graph = graph_of(small)
    res = verify_executor(small, graph, execute, seed=3, inputs=backward_inputs(bwd, graph, 3))
    assert res.ok, res.message


def _graph(build) -> object:
    g = GraphBuilder(build.__name__)
    build(g)
    return g.build()


def _projection(g, i: int, m: int = 1024, d: int = 2048, n: int = 1024, axis: str = "d"):
    x = g.input(f"X{i}", **{"m": m, axis: d})
    w = g.input(f"W{i}", **{axis: d, "n": n})
    return g.matmul(x, w, axis)


def right_nested(g) -> None:
    a, b, c = (_projection(g, i) for i in range(3))
    g.output("Y", g.add(a, g.add(b, c)))


def balanced_four(g) -> None:
    a, b, c, d = (_projection(g, i) for i in range(4))
    g.output("Y", g.add(g.add(a, b), g.add(c, d)))


def sum_then_activation(g) -> None:
    s = g.input("S", n=1024)
    g.output("Y", g.mul(g.unary("relu", g.add(_projection(g, 0), _projection(g, 1))), s))


@pytest.mark.parametrize("build,parts", [(right_nested, 3), (balanced_four, 4), (sum_then_activation, 2)],
                         ids=["right_nested", "balanced_four", "sum_then_activation"])
def test_sums_of_any_shape_share_one_tile(build, parts: int, monkeypatch) -> None:
    plan = _plan(_graph(build), True, monkeypatch)
    gemms = _loop_gemms(plan)
    assert len(gemms) == parts and len({g.c for g in gemms}) == 1
    _cpu_checked(plan)


def difference(g) -> None:
    g.output("Y", g.sub(_projection(g, 0), _projection(g, 1)))


def scaled_member(g) -> None:
    g.output("Y", g.add(_projection(g, 0), g.mul(_projection(g, 1), 2.0)))


def different_axes(g) -> None:
    g.output("Y", g.add(_projection(g, 0), _projection(g, 1, axis="e", d=4096)))


def attention_plus_projection(g) -> None:
    """softmax(Q K^T) V + Z U, both contracting t: the attention's accumulator is rescaled by the running max
    at every step, which would scale Z U's products too."""
    q, k = g.input("Q", h=16, m=2048, d=64), g.input("K", h=16, t=2048, d=64)
    v, z, u = g.input("V", h=16, t=2048, n=64), g.input("Z", h=16, m=2048, t=2048), g.input("U", h=16, t=2048, n=64)
    p = g.softmax(g.matmul(q, k, "d"), "t")
    g.output("Y", g.add(g.matmul(p, v, "t"), g.matmul(z, u, "t")))


@pytest.mark.parametrize("build", [difference, scaled_member, different_axes, attention_plus_projection],
                         ids=lambda b: b.__name__)
def test_what_is_not_a_plain_sum_keeps_its_tiles(build, monkeypatch) -> None:
    plan = _plan(_graph(build), True, monkeypatch)
    for k in plan.kernels:
        accs = [op.c for op in k.body if isinstance(op, Gemm) and k.loop is not None and op.contract == k.loop.axis]
        assert len(set(accs)) == len(accs) and "shared_accumulator" not in k.fused_rules, k.name
    _cpu_checked(plan)


def random_sum(seed: int):
    """2-4 projections of one shape summed in a random tree, weights in either layout, sometimes a member
    stored too, sometimes an activation after the sum: unseen graphs of the kind the lowering groups."""
    import random

    rng = random.Random(seed)
    g = GraphBuilder(f"RandomSum{seed}")
    m, d, n = rng.choice([512, 1024]), rng.choice([512, 1024, 1536]), rng.choice([256, 512])
    parts = []
    for i in range(rng.randint(2, 4)):
        x = g.input(f"X{i}", m=m, d=d)
        w = g.input(f"W{i}", d=d, n=n) if rng.random() < 0.5 else g.input(f"W{i}", n=n, d=d)
        parts.append(g.matmul(x, w, "d"))
    if rng.random() < 0.3:
        g.output("P0", parts[0])
    while len(parts) > 1:
        i = rng.randrange(len(parts) - 1)
        parts[i:i + 2] = [g.add(parts[i], parts[i + 1])]
    y = parts[0]
    if rng.random() < 0.5:
        y = g.unary(rng.choice(["relu", "tanh", "exp"]), g.mul(y, 0.01))
    g.output("Y", y)
    return g.build()


@pytest.mark.parametrize("seed", range(8))
def test_random_sums_of_projections_plan_and_compute_the_graph(seed: int, monkeypatch) -> None:
    plan = _plan(random_sum(seed), True, monkeypatch)
    for k in plan.kernels:
        if k.loop is not None and "shared_accumulator" in k.fused_rules:
            accs = [op.c for op in k.body if isinstance(op, Gemm) and op.contract == k.loop.axis]
            assert len(set(accs)) < len(accs)
    _cpu_checked(plan)
