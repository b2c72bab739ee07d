"""Wild graphs (tests/wild_graphs.py): odd sizes, column reductions, masks, chained contractions.

Every one plans, its plan passes the plan checks a plan file gets, and it passes the CPU executor.
CI runs a bounded slice of seeds; ``SUPEROPT_WILD_GRAPHS=N`` runs the first N. The planner bugs
these graphs found are kept as small graphs of their own below.
"""

from __future__ import annotations

import json
import logging
import os

import pytest
from wild_graphs import seeded_wild_doc

from pyrunner.errors import PlanError
from pyrunner.ir.graph_json import graph_from_json
from pyrunner.plan.validate import check_plan
from pyrunner.planner import search
from pyrunner.run.executor import execute
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import cpu_check_plan
from pyrunner.run.verify import verify_executor

COUNT = int(os.environ.get("SUPEROPT_WILD_GRAPHS", "24"))


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _plan_and_check(doc: dict) -> None:
    """The best plan passes the checks without the search skipping one (a skipped plan is a planner bug)."""
    graph = graph_from_json(doc)
    records = _Records()
    logger = logging.getLogger("pyrunner.planner")
    logger.addHandler(records)
    try:
        (plan,) = search(graph, "bf16", top=1)
    finally:
        logger.removeHandler(records)
    assert not records.messages, records.messages
    check_plan(plan)
    small = cpu_check_plan(plan)  # what the runner checks: the real shapes where they are small
    res = verify_executor(small, graph_of(small), execute, seed=0)
    assert res.ok, f"{res.message} for graph {json.dumps(doc)}"


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(COUNT))
def test_wild_graph_plans_validly_and_passes_cpu_executor(seed: int) -> None:
    _plan_and_check(seeded_wild_doc(seed))


def test_generator_is_varied_and_reproducible() -> None:
    docs = [seeded_wild_doc(s) for s in range(300)]
    assert seeded_wild_doc(11) == seeded_wild_doc(11)
    ops = {n["op"] for d in docs for n in d["nodes"]}
    assert {"matmul", "where", "iota", "lt", "exp", "log", "softmax", "layernorm", "mean", "max"} <= ops
    sizes = {n for d in docs for n in d["axes"].values()}
    assert {1, 3, 17, 100, 1000} <= sizes
    # contractions in sequence, and reductions over the rows (columns), both appear
    assert any(sum(n["op"] == "matmul" for n in d["nodes"]) >= 2 and "t_q" not in d["axes"] for d in docs)
    assert any(n.get("axis") == "m" and n["op"] in ("sum", "max", "mean") for d in docs for n in d["nodes"])


def test_elementwise_output_keeps_its_axis_order() -> None:
    """``v[f] * X[m, f]`` is stored ``[f, m]``: its tile takes that order, not the loaded tile's."""
    doc = {"name": "BiasFirst", "axes": {"m": 256, "f": 48}, "inputs": {"X": ["m", "f"], "v": ["f"]},
           "nodes": [{"name": "Y", "op": "mul", "args": ["v", "X"]}], "outputs": ["Y"]}
    _plan_and_check(doc)


@pytest.mark.parametrize("fn", ["sum", "max", "mean"])
def test_reduction_over_an_axis_of_extent_one(fn: str) -> None:
    doc = {"name": "OneRow", "axes": {"m": 1, "f": 100}, "inputs": {"X": ["m", "f"]},
           "nodes": [{"name": "N", "op": "neg", "args": ["X"]},
                     {"name": "R", "op": fn, "args": ["N"], "axis": "m"}], "outputs": ["R", "N"]}
    _plan_and_check(doc)


def test_search_skips_a_plan_that_fails_the_checks(monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A plan the checks reject is a planner bug: the next-ranked plan is handed out, with a warning."""
    import pyrunner.plan.validate as validate

    graph = graph_from_json(seeded_wild_doc(1))
    first, second = search(graph, "bf16", top=2)
    real = validate.check_plan

    def reject_first(plan):
        if plan.provenance.plan_hash == first.provenance.plan_hash:
            raise PlanError("kernels[0]: injected")
        real(plan)

    monkeypatch.setattr(validate, "check_plan", reject_first)
    with caplog.at_level(logging.WARNING, logger="pyrunner.planner"):
        (got,) = search(graph, "bf16", top=1)
    assert got.provenance.plan_hash == second.provenance.plan_hash
    assert "fails the plan checks and is skipped: kernels[0]: injected" in caplog.text
    monkeypatch.setattr(validate, "check_plan", lambda plan: (_ for _ in ()).throw(PlanError("injected")))
    with pytest.raises(PlanError, match="every plan found for graph 'Wild1' fails the plan checks"):
        search(graph, "bf16", top=1)


@pytest.mark.slow
def test_a_contraction_major_operand_goes_through_shared_memory() -> None:
    """``(W1 @f0 X) @f1 W2`` with ``W1`` written first leaves the first product as ``[f1, m]``: as the
    second GEMM's A operand it is contraction-major, which has no register layout; TileLang lowers it
    from shared memory (it failed layout inference in registers: Wild0 of the dry sweep)."""
    from pyrunner.backend.tilelang.compile import lower_to_cuda
    from pyrunner.plan.schema import Gemm

    doc = {"name": "ChainWeightFirst", "axes": {"m": 128, "f0": 128, "f1": 64, "f2": 96},
           "inputs": {"X": ["m", "f0"], "W1": ["f0", "f1"], "W2": ["f1", "f2"]},
           "nodes": [{"name": "H", "op": "matmul", "args": ["W1", "X"], "contract": "f0"},
                     {"name": "G", "op": "gelu", "args": ["H"]},
                     {"name": "Y", "op": "matmul", "args": ["G", "W2"], "contract": "f1"}],
           "outputs": ["Y"]}
    _plan_and_check(doc)
    graph = graph_from_json(doc)
    plans = search(graph, "bf16", top=3)
    fused = [p for p in plans if any(sum(isinstance(op, Gemm) for op in k.prologue + k.body) == 2 for k in p.kernels)]
    assert fused, "no plan fuses the two contractions; the case this test is about is not exercised"
    for plan in fused:
        for k in plan.kernels:
            bufs = {b.name: b for b in k.buffers}
            for op in k.prologue + k.body + k.epilogue:
                if isinstance(op, Gemm) and bufs[op.a].scope == "fragment":
                    assert bufs[op.a].axes[-1] == op.contract, (k.name, op)
    assert lower_to_cuda(fused[0])


PROJECTED_ATTENTION = {
    "name": "ProjectedAttention", "axes": {"b": 2, "h": 4, "g": 2, "t_q": 400, "t_kv": 1200, "d": 192, "e": 256},
    "inputs": {"Q": ["b", "h", "g", "t_q", "d"], "K": ["b", "h", "t_kv", "d"], "V": ["b", "h", "t_kv", "d"],
               "Wo": ["h", "d", "e"]},
    "nodes": [{"name": "S", "op": "matmul", "args": ["Q", "K"], "contract": "d"},
              {"name": "P", "op": "softmax", "args": ["S"], "axis": "t_kv"},
              {"name": "O", "op": "matmul", "args": ["P", "V"], "contract": "t_kv"},
              {"name": "H", "op": "matmul", "args": ["O", "Wo"], "contract": "d"},
              {"name": "Y", "op": "sum", "args": ["H"], "axis": "h"}],
    "outputs": ["Y"]}
"""Wild136 at its real shape: attention with the output projection fused in keeps its output
accumulator as ``[d, t_q]``, whose columns the scores' row statistics must scale."""


@pytest.mark.slow
def test_row_statistics_bridge_to_an_accumulator_held_the_other_way_round() -> None:
    """GEMM accumulators share a row layout only where their row axes agree: ``max[t_q]`` of the
    scores ``[t_q, t_kv]`` scaling an output accumulator ``[d, t_q]`` goes through shared memory
    (it failed TileLang's layout inference: "Layout infer conflict between max_t_kv and max_t_kv_prev")."""
    from pyrunner.backend.tilelang.compile import lower_to_cuda
    from pyrunner.plan.schema import Gemm
    from pyrunner.target.layout import layout_bridges

    (plan,) = search(graph_from_json(PROJECTED_ATTENTION), "bf16", top=1)
    check_plan(plan)
    fused = [k for k in plan.kernels if sum(isinstance(op, Gemm) for op in k.body) == 2]
    assert fused, "the attention chain is not fused; the case this test is about is not exercised"
    k = fused[0]
    bufs = {b.name: b for b in k.buffers}
    out_acc = [op.c for op in k.body if isinstance(op, Gemm)][1]
    if bufs[out_acc].axes[0] != "t_q":  # the orientation this test is about
        bridged = {r for refs in layout_bridges(k).values() for r in refs}
        assert any(bufs[r].axes == ["t_q"] for r in bridged), (bufs[out_acc].axes, bridged)
    assert lower_to_cuda(plan)


@pytest.mark.slow
def test_a_loop_of_run_time_length_keeps_its_bound_in_the_lowered_cuda() -> None:
    """Capped causal attention at a shape where four query blocks see one or two key steps: the
    loop over the visible steps must run ``hi`` steps in every block. TileLang 0.1.15 pipelined it
    (cp.async, one stage) with a constant trip count of the bound's maximum, so blocks with one
    visible step ran two (Wild120 at its real shape, wrong on the H200); it is a serial loop now."""
    import re

    from pyrunner.backend.tilelang.compile import lower_to_cuda

    doc = {"name": "CappedCausal", "axes": {"h": 2, "g": 2, "t_q": 256, "t_kv": 4000, "d": 192},
           "inputs": {"Q": ["h", "g", "t_q", "d"], "K": ["h", "t_kv", "d"], "V": ["h", "t_kv", "d"]},
           "nodes": [{"name": "S", "op": "matmul", "args": ["Q", "K"], "contract": "d"},
                     {"name": "S2", "op": "div", "args": ["S", 30.0]},
                     {"name": "S3", "op": "tanh", "args": ["S2"]},
                     {"name": "S4", "op": "mul", "args": ["S3", 30.0]},
                     {"name": "ik", "op": "iota", "axis": "t_kv"},
                     {"name": "iq", "op": "iota", "axis": "t_q"},
                     {"name": "vis", "op": "le", "args": ["ik", "iq"]},
                     {"name": "M", "op": "where", "args": ["vis", "S4", "-inf"]},
                     {"name": "P", "op": "softmax", "args": ["M"], "axis": "t_kv"},
                     {"name": "O", "op": "matmul", "args": ["P", "V"], "contract": "t_kv"}],
           "outputs": ["O"]}
    (plan,) = search(graph_from_json(doc), "bf16", top=1)
    bounded = [k.name for k in plan.kernels if k.loop is not None and k.loop.visible is not None]
    assert bounded, "no loop over visible steps; the case this test is about is not exercised"
    sources = lower_to_cuda(plan)
    for name in bounded:
        loops = re.findall(r"for \(int (t_kv_step) = ([^;]*); \1 < ([^;]*);", sources[name])
        assert loops, sources[name][:2000]
        assert all("blockIdx" in hi for _, _, hi in loops), (name, loops)
