"""Long rows held whole: a kernel that normalises a row it reduces (softmax, RMSNorm, L1 over 4096)
reads the row once and keeps it on chip (``planner.lower._held_whole``), a graph output that such a
kernel also computes merges into it (``planner.merge._mergeable``), and its configs rank small tiles
and few threads first (``planner.cost._rank_key``), with registers in its occupancy."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from plan_fixtures import assert_scaled_plan_matches_float64

from pyrunner.ir.graph import GraphBuilder
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.plan.schema import Load, Store
from pyrunner.plan.validate import check_plan
from pyrunner.planner import cost, search
from pyrunner.planner.merge import Group, merge_siblings
from pyrunner.planner.search import Planner

DATA = Path(__file__).resolve().parent / "data"


def _ops(kernel, kind):
    return [op for ops in (kernel.prologue, kernel.body, kernel.epilogue) for op in ops if isinstance(op, kind)]


def _whole(kernel, axis: str) -> bool:
    return kernel.loop is None and any(g.axis == axis and isinstance(g.block, int) for g in kernel.grid)


def test_residual_and_its_norm_are_one_kernel_reading_each_input_once() -> None:
    """R = X + H and Y = rmsnorm(R) * g, both returned: R is a graph output, so no partition can
    leave its cut out; the dependent merge makes one kernel that stores R and normalises it on chip."""
    (plan,) = search(load_graph_file(DATA / "multi_residual_rmsnorm_outputs.json"), "bf16", tuning=False)
    check_plan(plan)
    (k,) = plan.kernels
    assert sorted(k.writes) == ["R", "Y"]
    assert sorted(op.src for op in _ops(k, Load)) == ["H", "X", "g"]
    assert sorted(op.dst for op in _ops(k, Store)) == ["R", "Y"]
    assert _whole(k, "d")


@pytest.mark.parametrize("name", ["norm_l1_rows", "softmax_log_capped"])
def test_long_normalised_rows_are_read_once(name: str) -> None:
    (plan,) = search(load_graph_file(DATA / f"{name}.json"), "bf16", tuning=False)
    (k,) = plan.kernels
    row = plan.kernels[0].writes[0]
    axis = next(t for t in plan.tensors if t.name == row).axes[-1]
    assert _whole(k, axis)
    assert plan.cost.launches == 1


def test_a_kernel_storing_only_the_statistic_streams_the_row() -> None:
    """Holding a row whole pays only where the kernel also stores along it; a row sum streams."""
    g = GraphBuilder("RowSum")
    g.output("S", g.reduce("sum", g.input("X", m=1024, d=4096), "d"))
    (plan,) = search(g.build(), "bf16", tuning=False)
    (k,) = plan.kernels
    assert k.loop is not None and k.loop.axis == "d"


def test_a_strided_reduction_is_not_held_whole() -> None:
    """Batch norm reduces over the 8192 rows (the strided axis of [m, c]): held whole, each block read
    two columns with a stride (run 63: 23.9 us against 14.4 streamed), so it streams m."""
    (plan,) = search(load_graph_file(DATA / "norm_batchnorm_columns.json"), "bf16", tuning=False)
    assert not any(_whole(k, "m") for k in plan.kernels)


@pytest.mark.parametrize("name,dtype", [("multi_residual_rmsnorm_outputs", "bf16"), ("norm_l1_rows", "fp16"),
                                        ("softmax_log_capped", "bf16")])
def test_whole_row_plans_match_float64(name: str, dtype: str) -> None:
    """The plan's tiled algorithm and its rendered TileLang (emulated) against the float64 reference,
    bounded per dtype by ``error_bound`` (bfloat16 about 8e-3, float16 about 1.1e-3)."""
    (plan,) = search(load_graph_file(DATA / f"{name}.json"), dtype, tuning=False)
    assert_scaled_plan_matches_float64(plan, f"{name} {dtype}")


def test_long_row_configs_rank_small_tiles_and_few_threads_first() -> None:
    """Run 64 measured add + RMSNorm over 4096 at 2 rows x 128 threads 34.2 us and at 4 x 512 42.3:
    the default is the smallest fitting tile with the fewest threads, and the space still offers more."""
    (plan,) = search(load_graph_file(DATA / "multi_residual_rmsnorm_outputs.json"), "bf16", tuning=False)
    (k,) = plan.kernels
    assert k.defaults == {"block_m": min(k.params["block_m"]), "threads": min(k.params["threads"])}
    assert len(k.params["block_m"]) * len(k.params["threads"]) > 1


def test_registers_bound_the_occupancy_of_a_loop_free_kernel() -> None:
    """2 x 4096 rows at 128 threads: shared memory alone admits 14 blocks per SM, so 2048 blocks
    would take 2 waves, the second half empty (a 0.55 wave efficiency the model charges); its
    registers admit 5, so 4 nearly full waves. A streamed kernel's estimate ignores registers."""
    p = Planner(load_graph_file(DATA / "norm_l1_rows.json"), "bf16")
    (kc,) = p.candidates()[0].kernels
    assert kc.low.stream is None and cost.long_rows_whole(kc.low)
    nbytes = {n: 2 * 4096 * 4096 for n in (*kc.low.reads, *kc.low.writes)}
    cfg = {"block_m": 2, "threads": 128}
    fp = kc.fit.footprint(cfg)
    assert 4 <= 65536 // (fp.regs_per_thread * 128) < 228 * 1024 // fp.smem_bytes
    by_smem = cost.estimate(kc.low, cfg, p.sizes, nbytes, fp.smem_bytes)
    by_regs = cost.estimate(kc.low, cfg, p.sizes, nbytes, fp.smem_bytes, regs=fp.regs_per_thread)
    assert by_regs.time_us < by_smem.time_us

    g = GraphBuilder("RowSum")
    g.output("S", g.reduce("sum", g.input("X", m=1024, d=4096), "d"))
    q = Planner(g.build(), "bf16")
    (sc,) = q.candidates()[0].kernels
    assert sc.low.stream == "d"
    scfg = sc.est.config
    sfp = sc.fit.footprint(scfg)
    sbytes = {n: 2 * 1024 * 4096 for n in (*sc.low.reads, *sc.low.writes)}
    assert math.isclose(cost.estimate(sc.low, scfg, q.sizes, sbytes, sfp.smem_bytes, regs=255).time_us,
                        cost.estimate(sc.low, scfg, q.sizes, sbytes, sfp.smem_bytes).time_us)


def test_a_graph_output_read_by_its_norm_merges_with_it() -> None:
    """Kernel 0 writes R (a graph output), kernel 1 reads it: they merge only in the dependent pass,
    and only because R is an output (no third kernel reads it)."""
    def grp(i, reads, writes):
        return Group((i,), frozenset(reads), frozenset(writes), ("k",), str(i), 10.0)

    def union(a, b):
        return Group(a.members + b.members, a.reads | b.reads, a.writes | b.writes, a.key, "ab", 12.0)

    a, b = grp(0, {"X"}, {"R"}), grp(1, {"R"}, {"Y"})
    assert merge_siblings([a, b], union, dependent=False) == [a, b]
    assert merge_siblings([a, b], union, dependent=True) == [a, b]
    (merged,) = merge_siblings([a, b], union, dependent=True, outputs=frozenset({"R", "Y"}))
    assert merged.writes == {"R", "Y"}
