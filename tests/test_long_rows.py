"""Long rows held whole: a kernel that normalises a row it reduces (softmax, RMSNorm, L1 over 4096)
reads the row once and keeps it on chip (``planner.lower._held_whole``), a graph output that such a
kernel also computes merges into it (``planner.merge._mergeable``), and its configs rank small tiles
and few threads first (``planner.cost._rank_key``), with registers in its occupancy. Rows of a length
that is not a power of two (5120, 3072) are held whole where every thread can share every row
(``target.layout.reduced_tile_problem``), and rows no block divides (333, 768) in a padded
power-of-two tile, masked past their end."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from plan_fixtures import assert_scaled_plan_matches_float64

from pyrunner.ir.graph import GraphBuilder
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.plan.schema import AxisSize, Index, Load, Map, Store
from pyrunner.plan.validate import check_plan
from pyrunner.planner import cost, lower, search
from pyrunner.planner.merge import Group, merge_siblings
from pyrunner.planner.search import Planner
from pyrunner.target.fit import FitModel
from pyrunner.target.layout import padded_row, reduced_tile_problem

DATA = Path(__file__).resolve().parent / "data"
BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "graphs"


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


def test_a_row_held_whole_may_have_any_length_that_threads_times_vectors_divide() -> None:
    """TileLang's cross-thread butterfly needs a power-of-two group of threads per output. A row of
    5120 held whole at 128 threads is 5 rounds of 128 x 8 elements, each within one row, so all 128
    threads share every row; at 256 threads a round would straddle two rows."""
    assert reduced_tile_problem(4096, True, 512) is None
    assert reduced_tile_problem(64, False, 256) is None
    assert reduced_tile_problem(5120, True, 128) is None
    assert reduced_tile_problem(3072, True, 128) is None
    assert "256 threads" in reduced_tile_problem(5120, True, 256)
    assert "power-of-two" in reduced_tile_problem(5120, False, 128)
    assert reduced_tile_problem(96, True, 128) is not None  # 96 is no multiple of 1024: streamed


def test_a_statistic_returned_beside_the_rows_it_scales_is_one_kernel_over_5120() -> None:
    """Absmax scaling returns the row maximum s and X / s. Streamed, s is a kernel of its own (grid
    over rows, loop over d) and X is read twice; the dependent merge lowers the union afresh, which
    holds the 5120-wide rows whole at the one thread count that shares them (128)."""
    (plan,) = search(load_graph_file(DATA / "multi_absmax_row_scale.json"), "bf16", tuning=False)
    check_plan(plan)
    (k,) = plan.kernels
    assert sorted(k.writes) == ["Y", "s"] and _whole(k, "d")
    assert [op.src for op in _ops(k, Load)] == ["X"]
    assert k.params["threads"] == [128] and k.defaults["threads"] == 128
    why = FitModel(k, {"m": 4096, "d": 5120}).why_not({**k.defaults, "threads": 256})
    assert why is not None and "butterfly" in why


def test_statistic_kernels_of_different_grids_merge_only_through_a_graph_output() -> None:
    """Kernel 0 (one grid) writes the statistic s, kernel 1 (another grid) reads it: the dependent
    pass pairs them only when s is a graph output (else the partition without that cut is the
    fused kernel), and never in the sibling pass."""
    def union(a, b):
        return Group(a.members + b.members, a.reads | b.reads, a.writes | b.writes, ("m",), "ab", 12.0)

    a = Group((0,), frozenset({"X"}), frozenset({"s"}), ("m", "d-loop"), "a", 10.0)
    b = Group((1,), frozenset({"X", "s"}), frozenset({"Y"}), ("m", "d"), "b", 10.0)
    assert merge_siblings([a, b], union, dependent=True, outputs=frozenset({"Y"})) == [a, b]
    assert merge_siblings([a, b], union, dependent=False, outputs=frozenset({"s", "Y"})) == [a, b]
    (merged,) = merge_siblings([a, b], union, dependent=True, outputs=frozenset({"s", "Y"}))
    assert merged.writes == {"s", "Y"}


def test_a_row_only_two_warps_share_is_held_whole_at_64_threads() -> None:
    """3584 = 7 x 64 x 8: no block of 128 threads shares every row, so 64 threads are offered, and the
    fit check leaves only them."""
    assert lower.long_row_threads({"d": 4096}) == [128, 256, 512]
    assert lower.long_row_threads({"d": 3584}) == [64, 128, 256, 512]
    (plan,) = search(load_graph_file(BENCH / "rmsnorm_rows_3584.json"), "bf16", tuning=False)
    (k,) = plan.kernels
    assert _whole(k, "d") and k.params["threads"] == [64]


@pytest.mark.parametrize("path,dtype", [(DATA / "multi_absmax_row_scale.json", "bf16"),
                                        (BENCH / "layernorm_rows_5120.json", "fp16"),
                                        (BENCH / "residual_rmsnorm_3072.json", "bf16"),
                                        (BENCH / "rmsnorm_rows_3584.json", "bf16")])
def test_rows_of_any_length_held_whole_match_float64(path: Path, dtype: str) -> None:
    """Rows of 5120 and 3072 held whole, against the float64 reference (the plan's tiled algorithm
    and its emulated TileLang, ``error_bound`` per dtype)."""
    (plan,) = search(load_graph_file(path), dtype, tuning=False)
    assert len(plan.kernels) == 1 and plan.kernels[0].loop is None
    assert_scaled_plan_matches_float64(plan, f"{path.stem} {dtype}")


def test_a_row_no_block_divides_is_held_whole_in_a_padded_power_of_two_tile() -> None:
    """333 is neither a power of two nor a multiple of 64 threads x 8: the row is held whole in a
    tile of 512 (``target.layout.padded_row``), so the RMSNorm and its scale are one kernel reading
    X once, and the squares entering the sum are masked past 333 with the sum's identity."""
    assert padded_row(333) == 512 and padded_row(768) == 1024 and padded_row(1024) == 1024
    plans = search(load_graph_file(BENCH / "size_one_axis.json"), "bf16", top=2, tuning=False)
    (k,) = plans[0].kernels
    assert [(g.axis, g.block) for g in k.grid if isinstance(g.block, int) and g.block > 1] == [("n", 512)]
    masks = [op for op in _ops(k, Map) if op.expr.kind == "call" and op.expr.fn == "where"]
    assert len(masks) == 1 and masks[0].expr.args[0].args == [Index(axis="n"), AxisSize(axis="n")]
    assert plans[0].cost.total_us < plans[1].cost.total_us and len(plans[1].kernels) == 2


@pytest.mark.parametrize("path", [BENCH / "softmax_rows_odd_1000.json", BENCH / "norm_layernorm_768.json",
                                  BENCH / "size_one_axis.json"])
def test_rows_held_whole_in_padded_tiles_match_float64(path: Path) -> None:
    """Padded rows against the float64 reference: a softmax of ``-4 - |x|`` (a pad left unmasked
    would be the row maximum), a layernorm (unmasked pads would shift the variance), an RMSNorm."""
    (plan,) = search(load_graph_file(path), "bf16", tuning=False)
    assert len(plan.kernels) == 1 and plan.kernels[0].loop is None
    assert_scaled_plan_matches_float64(plan, path.stem)


def test_a_scalar_and_the_short_row_it_sums_are_one_kernel() -> None:
    """softplus(x - y) over 7 elements and its sum, both returned: the 7 are held whole in a padded
    tile of 8, and the scalar's unit axis (extent 1, one block) no longer keeps the merge out, so
    one kernel stores both (it was two launches: 2.3 us against torch.compile's 2.1, run 74)."""
    plans = search(load_graph_file(BENCH / "tiny_vec.json"), "bf16", top=2, tuning=False)
    (k,) = plans[0].kernels
    assert sorted(k.writes) == ["e", "s"] and k.loop is None
    assert ("n", 8) in [(g.axis, g.block) for g in k.grid]
    assert_scaled_plan_matches_float64(plans[0], "tiny_vec")
