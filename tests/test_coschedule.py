"""Co-scheduling (planner/coschedule.py): a kernel is re-tiled onto the SMs that the next kernel of
its plan leaves idle, where that next kernel waits for it only after its loop. The pair is then
priced as the longer of the two, and nothing else about the plan changes."""

from __future__ import annotations

import pytest
from plan_cache import search

from pyrunner.backend.tilelang.render import render
from pyrunner.ir import catalog
from pyrunner.plan import passes
from pyrunner.plan.analysis import plan_geometry
from pyrunner.planner.coschedule import waits_after_loop
from pyrunner.target.device import H200


def _plan(name: str, sizes: dict[str, int] | None = None):
    return search(catalog.get(name, sizes), "bf16", top=1, tuning=False)[0]


def test_rmsnorm_statistics_run_on_the_sms_the_gemm_leaves_idle() -> None:
    plan = _plan("RMSNorm")  # 1024 x 4096 -> 4096: the GEMM's 128 x 256 tiles are 128 blocks
    stats, gemm = plan.kernels
    geo = plan_geometry(plan)
    idle = H200.sms - geo[gemm.name].grid_blocks
    assert idle > 0
    assert geo[stats.name].grid_blocks <= idle
    times = {c.kernel: c.time_us for c in plan.cost.kernels}
    assert plan.cost.total_us == pytest.approx(max(times.values()), abs=1e-3)
    assert plan.cost.total_us < sum(times.values())
    src = render(plan)  # and the GEMM's consumers wait for the statistics only after their loop
    assert "T.pdl_sync()  # dependent launch: the kernels ahead finished; the loop ran alongside them" in src


def test_a_gemm_past_one_wave_leaves_no_sm_for_the_kernel_ahead() -> None:
    plan = _plan("RMSNorm", {"m": 4096, "d": 4096, "n": 4096})  # 512 GEMM tiles
    geo = plan_geometry(plan)
    stats, gemm = plan.kernels
    assert geo[gemm.name].grid_blocks >= H200.sms
    assert geo[stats.name].grid_blocks > H200.sms - min(H200.sms, geo[gemm.name].grid_blocks)
    assert plan.cost.total_us == pytest.approx(sum(c.time_us for c in plan.cost.kernels), abs=1e-2)


def test_without_the_late_wait_the_kernels_run_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(passes, "sink_late_inputs", lambda kernel, earlier: kernel)
    plan = _plan("RMSNorm")
    stats, gemm = plan.kernels
    assert not waits_after_loop(gemm, frozenset(stats.writes))
    geo = plan_geometry(plan)
    assert geo[stats.name].grid_blocks > H200.sms - geo[gemm.name].grid_blocks  # tiled for the whole device
    assert plan.cost.total_us == pytest.approx(sum(c.time_us for c in plan.cost.kernels), abs=1e-2)


def test_a_gemm_that_streams_an_earlier_kernels_output_waits_before_its_loop() -> None:
    plan = next(p for p in search(catalog.get("LayerNormMatmul"), "bf16", top=6, tuning=False)
                if len(p.kernels) == 3)  # statistics, the normalised operand, then the GEMM streaming it
    written = frozenset(w for k in plan.kernels[:-1] for w in k.writes)
    gemm = plan.kernels[-1]
    assert set(gemm.reads) & written
    assert not waits_after_loop(gemm, written)


def test_autotuning_candidates_keep_the_pairs_sm_split() -> None:
    from pyrunner.planner.search import ranked_plan_configs

    graph = catalog.get("RMSNorm")
    plan = search(graph, "bf16", top=1, tuning=False)[0]
    stats, gemm = plan.kernels
    geo = plan_geometry(plan)
    cfgs = ranked_plan_configs(graph, plan, n=6)
    assert len(cfgs) > 1
    assert cfgs[0] == {k.name: k.defaults for k in plan.kernels}
    for cfg in cfgs:
        g = plan_geometry(plan, cfg)
        assert g[gemm.name].grid_blocks == geo[gemm.name].grid_blocks
        assert g[stats.name].grid_blocks <= H200.sms - g[gemm.name].grid_blocks
