"""The cost model's load-latency bound for streamed loops without tensor cores.

A block of such a loop has ``stages`` tiles in flight, so it streams at most one tile per load
latency / stages (Little's law). H200 run 45 measured logsumexp over 32000 at 125 steps of 256 in
28 us for 65 MB (2.3 TB/s, not the 4.3 of a copy) and a variance over 1000 at 63 steps of 16 in
5.9 us for 8 MB. These tests plan with the model alone (no tuning database), so they check the
model's choices, not measured ones.
"""

from __future__ import annotations

import math
from pathlib import Path

from pyrunner.ir import catalog
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.plan.analysis import block_param, resolve_config
from pyrunner.planner.cost import DEFAULT_MACHINE as H200
from pyrunner.planner.cost import estimate
from pyrunner.planner.search import Planner, search
from pyrunner.target.device import DTYPE_BYTES

ROOT = Path(__file__).resolve().parent.parent


def _streamed(plan):
    """(kernel, its config) of every kernel with a streamed loop and no GEMM."""
    cfg = resolve_config(plan)
    return [(k, cfg[k.name]) for k in plan.kernels if k.loop is not None
            and not any(getattr(op, "op", "") == "gemm" for op in k.body)]


def test_a_short_grid_steps_wide_with_a_masked_last_step() -> None:
    """1024 rows give 128 blocks of 8 rows: at 256 wide each waits out 125 latencies, so the
    planner steps 512 or 1024 wide over 32000 (no such power of two divides it: the last step is
    partial and masked)."""
    plan = search(load_graph_file(ROOT / "tests" / "data" / "reduce_logsumexp.json"), "bf16", tuning=False)[0]
    loops = _streamed(plan)
    assert loops
    for k, cfg in loops:
        assert cfg[k.loop.block] >= 512, (k.name, cfg)
        assert 32000 % cfg[k.loop.block]


def test_latency_bound_grows_with_steps_and_shrinks_with_stages() -> None:
    """The same kernel at narrower steps or fewer stages is predicted slower once latency binds,
    and no faster than the bandwidth bound at wide ones."""
    graph = load_graph_file(ROOT / "tests" / "data" / "reduce_logsumexp.json")
    planner = Planner(graph, "bf16", H200)
    cand = next(c for c in planner.candidates() if len(c.kernels) == 1)
    (kc,) = cand.kernels
    tb = {t.name: math.prod(t.shape) * DTYPE_BYTES[t.dtype] for t in cand.tensors}
    stream = block_param(kc.low.stream)
    (row,) = [block_param(g.axis) for g in kc.low.grid]

    def time(step: int, stages: int) -> float:
        cfg = {row: 8, stream: step, "stages": stages, "threads": 256}
        return estimate(kc.low, cfg, planner.sizes, tb, kc.fit.footprint(cfg).smem_bytes).time_us

    assert time(64, 3) > time(128, 3) > time(256, 3) > time(1024, 3)
    assert time(256, 1) > time(256, 2) > time(256, 3)
    bandwidth_us = 2 * 1024 * 32000 / (H200.device.hbm_bw * H200.memory_efficiency) * 1e6
    assert time(1024, 3) >= bandwidth_us


def test_a_short_grid_over_most_of_l2_steps_widest() -> None:
    """The LM head's softmax statistics read its 33 MB of float32 logits on 128 blocks of 2 rows. The
    logits fit in L2, but fill most of it, so they do not stay there between calls beside the GEMM's
    65 MB of weights, and the steps wait out HBM's latency: run 70 measured
    72.9 us at steps of 512, 72.0 at 1024 and 63.0 at 2048. The model charges 512 for its latency and
    ties 1024 with 2048 at the bandwidth bound; a short grid's ties go to the widest step."""
    graph = load_graph_file(ROOT / "tests" / "data" / "matmul_lm_head_softmax.json")
    plan = search(graph, "bf16", tuning=False)[0]
    ((k, cfg),) = _streamed(plan)
    assert cfg[k.loop.block] == 2048 and 32000 % 2048
    planner = Planner(graph, "bf16", H200)
    cand = planner.candidates()[0]
    kc = next(kc for kc in cand.kernels if kc.low.stream is not None and not kc.low.gemms)
    tb = {t.name: math.prod(t.shape) * DTYPE_BYTES[t.dtype] for t in cand.tensors}

    def time(step: int) -> float:
        c = {**kc.est.config, block_param(kc.low.stream): step}
        return estimate(kc.low, c, planner.sizes, tb, kc.fit.footprint(c).smem_bytes).time_us

    assert time(512) > time(1024) == time(2048)


def test_bandwidth_bound_loops_keep_steps_of_at_most_256() -> None:
    """Row softmax over 4096 x 4096 runs 128 blocks that draw full bandwidth at 256-wide steps;
    wider steps only add registers per thread (run 35: 27 -> 40 us at 1024), so ties keep 256."""
    plan = search(load_graph_file(ROOT / "tests" / "data" / "softmax_rows.json"), "bf16", tuning=False)[0]
    for k, cfg in _streamed(plan):
        assert cfg[k.loop.block] <= 256, (k.name, cfg)
    plan = search(catalog.get("RMSNorm"), "bf16", tuning=False)[0]
    for k, cfg in _streamed(plan):
        assert cfg[k.loop.block] <= 256, (k.name, cfg)



def test_a_wide_partial_step_is_masked_and_exact_on_the_executor() -> None:
    """A step the tuning space offers that does not divide the axis (1024 over 4000) is one the
    kernel masks: the plan validates (a partial tile feeding an unmasked accumulator is refused)
    and matches float64 on the CPU executor (bf16 bound 2e-2)."""
    from pyrunner.ir.graph_json import graph_from_json
    from pyrunner.plan.validate import validate_plan
    from pyrunner.run.executor import execute
    from pyrunner.run.runner import graph_of
    from pyrunner.run.verify import verify_executor

    doc = {"name": "LSE", "axes": {"m": 64, "v": 4000}, "inputs": {"X": ["m", "v"]}, "nodes": [
        {"name": "M", "op": "max", "args": ["X"], "axis": "v"},
        {"name": "D", "op": "sub", "args": ["X", "M"]},
        {"name": "E", "op": "exp", "args": ["D"]},
        {"name": "S", "op": "sum", "args": ["E"], "axis": "v"},
        {"name": "L", "op": "log", "args": ["S"]},
        {"name": "Y", "op": "add", "args": ["L", "M"]}], "outputs": ["Y"]}
    plan = search(graph_from_json(doc), "bf16", tuning=False)[0]
    steps = [cfg[k.loop.block] for k, cfg in _streamed(plan)]
    assert steps and all(s >= 512 and 4000 % s for s in steps), steps
    validate_plan(plan)
    for seed in (1, 2):
        res = verify_executor(plan, graph_of(plan), execute, seed=seed)
        assert res.ok, res.message
