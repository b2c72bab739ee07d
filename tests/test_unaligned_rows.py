"""Rows that are not 16-byte aligned (a 50257-long vocabulary in bf16) and streamed softmax statistics.

Unaligned rows cannot be fetched with cp.async or TMA, so a loop over them waits for its own loads
every step: the cost model prices it with one tile in flight and offers wide steps and one-row tiles,
the renderer steps it with ``T.serial``, and a loop-free kernel stores such rows through a dead
shared tile so consecutive threads write consecutive elements. The online-softmax statistics are
kept per tile position (``plan.passes.defer_online_sums``). Each test plans a graph as a user would;
the rewritten kernels are run on the CPU as rendered TileLang and compared with float64.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from plan_cache import search

from pyrunner.backend.tilelang import render as render_module
from pyrunner.backend.tilelang.emulate import execute_rendered
from pyrunner.backend.tilelang.render import render, unaligned_store_staging
from pyrunner.ir import catalog
from pyrunner.ir.graph import GraphBuilder
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.plan.passes import defer_online_sums, rendered_kernel
from pyrunner.plan.schema import Reduce
from pyrunner.planner.cost import param_space, staged_loads_fit, synchronous_loop
from pyrunner.planner.tiles import SYNC_STEP_MAX, stream_steps
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import scale_down
from pyrunner.run.verify import verify_executor
from pyrunner.target.device import rows_async
from pyrunner.target.fit import staged_tiles_fit
from pyrunner.target.layout import staged_loop_loads, synchronous_loop_loads
from pyrunner.target.tuning import measured_forms

ROOT = Path(__file__).resolve().parent.parent
VOCAB = ROOT / "benchmarks" / "graphs" / "softmax_vocab_50257.json"
DATA = ROOT / "tests" / "data"


def _plan(path: Path):
    return search(load_graph_file(path), "bf16", top=1)[0]


def test_rows_async_needs_16_byte_rows() -> None:
    assert rows_async(4096, "bfloat16") and rows_async(1000, "bfloat16") and rows_async(4, "float32")
    assert not rows_async(50257, "bfloat16") and not rows_async(65, "float16") and not rows_async(6, "float32")


def test_synchronous_loops_may_step_wider() -> None:
    assert max(stream_steps(50257, tensor_cores=False)) == 2048
    wide = stream_steps(50257, tensor_cores=False, synchronous=True)
    assert SYNC_STEP_MAX in wide and max(wide) == SYNC_STEP_MAX
    assert max(stream_steps(4096, tensor_cores=False, synchronous=True)) == 2048  # at least two steps


def test_vocabulary_softmax_plans_a_synchronous_loop_with_wide_steps_and_one_stage() -> None:
    plan = _plan(VOCAB)
    loops = [k for k in plan.kernels if k.loop is not None]
    assert loops
    for stats in loops:
        assert stats.params["stages"] == [1]
        assert min(stats.params["block_m"]) == 2 and max(stats.params["block_v"]) > 1024
    src = render(plan)
    assert "T.serial(" in src and "T.Pipelined(" not in src
    assert "'tl.enable_async_copy': False" in src


def test_aligned_softmax_keeps_its_pipeline() -> None:
    """Rows of 16384 (16-byte aligned, too long to hold whole: ``planner.lower.MAX_FULL_REDUCE``) stream
    their statistics through a cp.async pipeline of up to three stages."""
    g = GraphBuilder("LongRowSoftmax")
    g.output("P", g.softmax(g.input("X", m=4096, n=16384), "n"))
    (plan,) = search(g.build(), "bf16", tuning=False)
    (stats,) = [k for k in plan.kernels if k.loop is not None]
    assert stats.params["stages"] == [1, 2, 3] and min(stats.params["block_m"]) >= 8
    assert "T.Pipelined(" in render(plan) and "T.serial(" not in render(plan)


def test_synchronous_loop_is_recognised_from_the_lowering() -> None:
    from pyrunner.plan.schema import GridAxis
    from pyrunner.planner.lower import LoadInfo, Lowered

    def low(asynchronous: bool) -> Lowered:
        return Lowered(root=None, stream="v", grid=[GridAxis(axis="m", block="block_m")], tiled=["m"], full={},
                       buffers=[], prologue=[], body=[], epilogue=[], reads=["X"], writes=["Y"],
                       loads=[LoadInfo("X", ("m", "v"), True, asynchronous)], steps=[256, 512])
    assert synchronous_loop(low(False)) and not synchronous_loop(low(True))
    assert param_space(low(False), {"m": 512, "v": 50257})["stages"] == [1]
    assert min(param_space(low(False), {"m": 512, "v": 50257})["block_m"]) == 2
    assert min(param_space(low(True), {"m": 4096, "v": 4096})["block_m"]) == 8
    assert min(param_space(low(True), {"m": 256, "v": 4096})["block_m"]) == 2  # 32 blocks at 8 rows


def test_unaligned_store_goes_through_the_dead_input_tile() -> None:
    plan = _plan(VOCAB)
    (norm,) = [k for k in plan.kernels if k.loop is None]  # the normalisation
    staging = unaligned_store_staging(plan, norm)
    assert list(staging) == [(norm.epilogue[-1].src, "P")]
    (shared,) = staging.values()
    assert shared in {b.name for b in norm.buffers if b.scope == "shared"}
    src = render(plan)
    assert f"T.copy({norm.epilogue[-1].src}, {shared})" in src and f"T.copy({shared}, P[" in src
    aligned = _plan(DATA / "softmax_rows.json")
    assert all(not unaligned_store_staging(aligned, k) for k in aligned.kernels)


@pytest.mark.parametrize("path", [VOCAB, DATA / "softmax_causal_rows.json", DATA / "reduce_soft_target_xent.json",
                                  DATA / "reduce_logsumexp.json", DATA / "softmax_twice.json",
                                  ROOT / "benchmarks" / "graphs" / "outer_softmax_weighted_sum.json"],
                         ids=lambda p: p.stem)
def test_online_softmax_statistics_are_kept_per_position(path: Path) -> None:
    """The streamed max and its rescaled sums leave the loop body (no cross-thread reduction per
    step) and are combined once in the epilogue; the rendered source still computes the graph,
    including rows that are all -inf so far (the causal mask)."""
    # the best plan with a streamed online softmax (the vocabulary's may also split max and sum)
    plan = next(p for p in search(load_graph_file(path), "bf16", top=3)
                if any(defer_online_sums(k) is not k for k in p.kernels))
    for k in [k for k in plan.kernels if defer_online_sums(k) is not k]:
        after = rendered_kernel(k)
        assert not any(isinstance(op, Reduce) for op in after.body)
        fns = [op.fn for op in after.epilogue if isinstance(op, Reduce)]
        assert "max" in fns and "sum" in fns
    small = scale_down(plan)
    for seed in (1, 2):
        res = verify_executor(small, graph_of(small), execute_rendered, seed=seed)
        assert res.ok, res.message


def test_attention_statistics_stay_per_row() -> None:
    """Attention's running max also rescales the P @ V accumulator, so it must stay one per row."""
    (k,) = search(catalog.get("Attention"), "bf16", top=1)[0].kernels
    assert defer_online_sums(k) is k


LM_HEAD = ROOT / "benchmarks" / "graphs" / "lm_head.json"
STAGED = {"k0_Y": {"block_m": 64, "block_n": 64, "block_d": 64}}  # 8192 tile elements over 128 threads
UNSTAGED = {"k0_Y": {"block_m": 128, "block_n": 64, "block_d": 128}}  # 24576: more than 96 a thread


def _small_lm_head():
    """The LM head at a vocabulary of 515 (1030-byte rows: no TMA, no cp.async) with d streamed."""
    return search(load_graph_file(LM_HEAD).with_sizes({"m": 130, "d": 1024, "n": 515}), "bf16", top=1)[0]


def test_gemm_loop_over_unaligned_rows_stages_its_loads_one_step_ahead() -> None:
    plan = _small_lm_head()
    (k,) = plan.kernels
    tensors = {t.name: t for t in plan.tensors}
    assert k.loop is not None and synchronous_loop_loads(k, tensors)
    assert sorted(op.src for op in staged_loop_loads(k, tensors)) == ["W", "X"]
    assert measured_forms(plan).endswith("+staged")
    src = render(plan)
    assert "synchronous loads, staged in registers one step ahead" in src  # the staged build
    assert "synchronous loads: rows not 16-byte aligned" in src  # and the plain one, for larger tiles
    for cfg in (STAGED, UNSTAGED):
        res = verify_executor(plan, graph_of(plan), lambda p, i, c=None, cfg=cfg: execute_rendered(p, i, cfg), seed=3)
        assert res.ok, (cfg, res.message)


def test_staged_loads_that_fetch_the_current_step_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading step k (not k + 1) under step k's GEMMs feeds step k + 1 the same tile again: the
    emulated source is then wrong at the staged config and still right at the unstaged one."""
    plan = _small_lm_head()
    kept = render_module._staged_loads
    monkeypatch.setattr(render_module, "_staged_loads",
                        lambda w, ctx, step: kept(w, ctx, ctx.loop_var if step != "0" else step))
    wrong = verify_executor(plan, graph_of(plan), lambda p, i, c=None: execute_rendered(p, i, STAGED), seed=3)
    assert not wrong.ok
    right = verify_executor(plan, graph_of(plan), lambda p, i, c=None: execute_rendered(p, i, UNSTAGED), seed=3)
    assert right.ok, right.message


def test_the_planner_prices_staged_loads_and_picks_a_config_they_fit() -> None:
    """At the real LM head (1000 x 1024 x 50257) an unstaged synchronous loop waits for every step's
    loads before its MMAs (run 56: 460 us); the default config is one the staged form builds."""
    plan = search(load_graph_file(LM_HEAD), "bf16", top=1)[0]
    (k,) = plan.kernels
    cfg = k.defaults
    elements = cfg["block_m"] * cfg["block_d"] + cfg["block_d"] * cfg["block_n"]
    assert staged_tiles_fit(elements, cfg["threads"])
    assert "staged in registers one step ahead" in render(plan)


def test_staged_fit_counts_every_loop_tile() -> None:
    from pyrunner.plan.schema import GridAxis
    from pyrunner.planner.lower import LoadInfo, Lowered

    grid = [GridAxis(axis="m", block="block_m"), GridAxis(axis="n", block="block_n")]
    low = Lowered(root=None, stream="d", grid=grid,
                  tiled=["m", "n"], full={}, buffers=[], prologue=[], body=[], epilogue=[], reads=["X", "W"],
                  writes=["Y"], loads=[LoadInfo("X", ("m", "d"), True, True), LoadInfo("W", ("d", "n"), True, False)],
                  steps=[64])
    assert staged_loads_fit(low, {"m": 128, "n": 256, "d": 64}, 256)  # 8192 + 16384 = 96 a thread
    assert not staged_loads_fit(low, {"m": 128, "n": 256, "d": 128}, 256)
    assert not staged_loads_fit(low, {"m": 128, "n": 256, "d": 64}, 128)
