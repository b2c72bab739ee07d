"""The cost model's phases of a block that no other block hides (``cost.phased_time``).

A kernel without a loop loads its tiles, runs its MMAs and exponentials and stores, each after the
other; with one block per SM nothing overlaps those phases (H200 run 122: attention's backward score
gradient dS, 128 x 128 tiles at 129 KB of shared memory, 771 us where the longer of compute and memory
gave 325). These tests plan with the model alone (no tuning database), with ``cost.PHASED_BLOCKS`` on (the
default since runs 171-174 swept the plans it moves) or, to show what it changes, switched off.
"""

from __future__ import annotations

import math

import pytest
from plan_cache import search

from pyrunner.ir import catalog
from pyrunner.ir.grad import derive
from pyrunner.planner import cost
from pyrunner.planner.cost import phased_time
from pyrunner.planner.saves import choose_saves


def test_a_loop_less_block_adds_its_phases_when_it_is_alone_on_its_sm() -> None:
    """One block per SM: MMAs (3), exponentials (1), memory (5) and the waves' latencies (0.5) add; a
    second resident block hides half of the shorter side and of the latencies; many hide nearly all."""
    one = phased_time(False, True, 3.0, 1.0, 0.0, 0.0, 5.0, 1, 0.5, 0.9)
    two = phased_time(False, True, 3.0, 1.0, 0.0, 0.0, 5.0, 2, 0.5, 0.9)
    many = phased_time(False, True, 3.0, 1.0, 0.0, 0.0, 5.0, 16, 0.5, 0.9)
    assert one == pytest.approx(9.5)
    assert two == pytest.approx(5.0 + 4.5 / 2)
    assert 5.0 < many < two


def test_a_loop_alone_on_its_sm_runs_its_epilogue_after_it() -> None:
    """A loop overlaps its steps' loads with the MMAs (the longer side alone counts); the exponentials of
    values without the loop's axis (``t_once``: a softmax of scores accumulated over the loop) run after
    it, where a second block on the SM would hide them."""
    loop = phased_time(True, True, 3.0, 0.0, 0.0, 0.0, 5.0, 1, 0.5, 0.9)
    assert loop == pytest.approx(5.0)
    after = phased_time(True, True, 3.0, 2.0, 2.0, 0.0, 5.0, 1, 0.5, 0.9)
    assert after == pytest.approx(7.0)
    in_loop = phased_time(True, True, 3.0, 2.0, 0.0, 0.0, 5.0, 1, 0.5, 0.9)  # per step: under the MMAs
    assert in_loop == pytest.approx(5.0)


@pytest.fixture
def unphased(monkeypatch: pytest.MonkeyPatch) -> None:
    """The phases switched off (a test that patches plans for real: ``plan_cache`` skips it)."""
    monkeypatch.setattr(cost, "PHASED_BLOCKS", False)


def test_without_phases_the_attention_backward_stores_ds(unphased: None) -> None:
    """Off, the attention backward's top plan stores dS between kernels: the loop-less dS kernel's phases
    are taken to overlap, which run 122 measured they do not (771 us against 325 modelled)."""
    shapes = {"h": 4, "t_q": 2048, "t_kv": 2048, "d": 128}
    plan = search(derive(catalog.get("ScaledAttention", shapes)).graph, "bfloat16", tuning=False)[0]
    assert any(math.prod(t.shape) >= 4 * 2048 * 2048 for t in plan.tensors)


def test_scaled_attention_backward_recomputes_scores_in_fused_loops() -> None:
    """At h4 t2048 d128 the backward's top plan is FlashAttention-2's form (a dK/dV kernel looping over
    queries and a dQ kernel looping over keys, each recomputing the scores), not one that stores dS
    (4 x 2048 x 2048) between kernels: that plan was modelled 75.9 us against the fused 79.7 while its
    loop-less dS kernel's phases were taken to overlap (now the fused 77.6 wins)."""
    shapes = {"h": 4, "t_q": 2048, "t_kv": 2048, "d": 128}
    plan = search(derive(catalog.get("ScaledAttention", shapes)).graph, "bfloat16", tuning=False)[0]
    _assert_fused(plan, 4 * 2048 * 2048)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_scaled_attention_backward_at_scale_recomputes_scores(dtype: str) -> None:
    """The same at h16 t4096 d128 with the saves the cost model chooses: storing dS (16 x 4096 x 4096)
    was modelled 956 us against the fused 1038, where that kernel alone measured 771 us (run 122)."""
    graph = choose_saves(catalog.get("ScaledAttention"), dtype, None).graph
    _assert_fused(search(graph, dtype, tuning=False)[0], 16 * 4096 * 4096)


def _assert_fused(plan, scores: int) -> None:
    big = [t.name for t in plan.tensors if math.prod(t.shape) >= scores]
    assert not big, (big, [k.name for k in plan.kernels])
    assert any({"d_K", "d_V"} <= set(k.writes) for k in plan.kernels), [k.name for k in plan.kernels]
