"""Plan analysis: op reads/writes, expression references, config resolution, kernel geometry."""

from __future__ import annotations

import pytest
from plan_fixtures import attention_plan, elementwise4d_plan, gemm_plan

from pyrunner.errors import PlanError
from pyrunner.plan.analysis import (
    block_param,
    expr_refs,
    kernel_geometry,
    numbered_ops,
    op_reads_writes,
    plan_geometry,
    resolve_config,
)
from pyrunner.plan.schema import Call, Const, Gemm, Map, Reduce, Ref, axis_sizes


def test_op_reads_writes_follow_accumulation():
    assert op_reads_writes(Gemm(a="A", b="B", c="C", contract="k", clear=True)) == (["A", "B"], ["C"])
    assert op_reads_writes(Gemm(a="A", b="B", c="C", contract="k", clear=False)) == (["A", "B", "C"], ["C"])
    assert op_reads_writes(Reduce(fn="max", src="S", dst="m", axis="t", accumulate=True)) == (["S", "m"], ["m"])
    assert op_reads_writes(Reduce(fn="sum", src="S", dst="l", axis="t", accumulate=False)) == (["S"], ["l"])


def test_expr_refs_in_order_with_repeats():
    e = Call(fn="add", args=[Ref(buf="x"), Call(fn="mul", args=[Ref(buf="y"), Ref(buf="x")]), Const(value=1.0)])
    assert expr_refs(e) == ["x", "y", "x"]
    assert op_reads_writes(Map(dst="z", expr=e)) == (["x", "y", "x"], ["z"])


def test_numbered_ops_cover_every_section_in_order():
    k = attention_plan().kernels[0]
    ops = numbered_ops(k)
    assert len(ops) == len(k.prologue) + len(k.body) + len(k.epilogue)
    assert [s for s, _, _ in ops] == ["prologue"] * len(k.prologue) + ["body"] * len(k.body) + \
        ["epilogue"] * len(k.epilogue)


def test_block_param_is_the_planners_name():
    assert block_param("t_kv") == "block_t_kv"
    assert attention_plan().kernels[0].loop.block == block_param("t_kv")


def test_geometry_under_defaults_and_a_config():
    plan = gemm_plan(m=256, d=128, n=256)
    geo = plan_geometry(plan)["matmul"]
    assert geo.blocks == {"m": 128, "n": 128, "d": 32} and geo.tiles == {"m": 2, "n": 2, "d": 4}
    assert (geo.threads, geo.stages, geo.grid_blocks, geo.loop_steps()) == (128, 2, 4, 4)
    geo = plan_geometry(plan, {"matmul": {"block_m": 64, "block_d": 64}})["matmul"]
    assert geo.blocks["m"] == 64 and geo.tiles["m"] == 4 and geo.loop_steps() == 2


def test_indexed_axes_have_block_one():
    plan = elementwise4d_plan()
    k = plan.kernels[0]
    geo = kernel_geometry(k, k.defaults, axis_sizes(plan))
    assert geo.indexed == {"a", "b"} and geo.held == {"c", "e"}


def test_config_errors_name_the_problem():
    plan = gemm_plan()
    with pytest.raises(PlanError, match="unknown parameter 'block_q'"):
        resolve_config(plan, {"matmul": {"block_q": 64}})
    with pytest.raises(PlanError, match=r"block_m=96 is not in its space"):
        resolve_config(plan, {"matmul": {"block_m": 96}})
    with pytest.raises(PlanError, match="unknown kernel"):
        resolve_config(plan, {"nope": {}})
    assert resolve_config(plan, {"matmul": {"block_m": 64}})["matmul"]["block_m"] == 64
