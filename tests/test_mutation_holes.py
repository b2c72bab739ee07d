"""Tail edits selections of tests/test_plan_mutations.py's edits let through (issue 46).

Each zeroes the last row of a stored tensor, and each changed outputs the CPU check never saw:

- retention (``O = ((Q K^T) * D) V`` with ``D = where(j <= i, 2^((j - i) softplus(g)), 0)``): the edit
  ``i < 255`` lengthened ``i`` to 256 in the CPU check's shapes while ``j`` stayed 80, so rows past 80
  saw only keys 176 or more positions back, their decay made them 1e-27, and zeroing row 255 moved
  nothing (error 4.9e-4 <= 1e-3). At the real, square shape that row is as large as any. Axes compared
  with one another now share their constants (``shrink.compared_constants``), so ``j`` grows with ``i``.
- gated mixture: ``H2 = X @ W2``'s row 7 zeroed makes ``R[7] = sum relu(H1[7]) * 1/2``; on seed 11's
  normal draw ``relu(H1[7])`` is all zero, so ``R[7]`` is right anyway (3.8e-4 <= 3e-3), and the outlier
  draw was skipped at 20, 10 and 5 (the softmax's unshifted exp leaves float16). It is now also tried at
  2.5, where it fits, and fails the edit.

A sweep of all 378 edit sites of every base plan let 5 more through, each a row drowned in a reduction on
normal and outlier inputs alike: the max of ``|X @ W|`` with row ``m - 1`` of ``X @ W`` (or of its row
maxima) zeroed changes only when the maximum sits in that row (1 in 256); a mean of squares with a row of
``X @ W2`` zeroed moves by about 1/m (1.5e-3 against a 2e-3 bound at seed 11); a decode softmax with its
last logit or probability zeroed loses a probability 2.7e-4 of the largest. The CPU check now also runs the
planted draw (``draws.planted_inputs``: the last index of every uncontracted axis holds the extreme, by
construction), which each edit fails by a wide margin. So does the GPU check (``GpuVerifier``, run here on the
CPU with the edited plan's tiled algorithm as its kernels): it ran normal and outlier inputs only, and a
kernel dropping a tail at the real shape (a partial last tile the CPU check's shape may not have) passed it.

Every plan is planned at the mutation test's shapes and edited by its ``_edit``, hash recomputed.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
from test_plan_mutations import SMALL, WORK, _at, _edit, _sites

from pyrunner.ir import catalog
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.plan.schema import Plan, plan_document, with_hash
from pyrunner.plan.validate import plan_graph
from pyrunner.planner import search
from pyrunner.planner.search import Budget
from pyrunner.run.draws import DRAWS, NORMAL, PLANTED, planted_inputs
from pyrunner.run.executor import execute
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import compared_constants, cpu_check_plan
from pyrunner.run.verify import GpuVerifier, verify_executor

ROOT = Path(__file__).resolve().parent.parent
SEED = 11
"""The seed the mutation test checks at (the one the gated mixture's normal draw is blind on)."""


def _tail_edited(graph_file: str, stored: str) -> tuple[Plan, Plan]:
    """The best of the planner's ranked plans of ``graph_file`` at the mutation test's shapes that stores
    ``stored`` (else its naive plan, which stores every value), and that plan with the last row of that store
    zeroed (the mutation test's tail edit): a search that finds a fuller fusion must not hide the hole."""
    g = load_graph_file(ROOT / graph_file)
    g = g.with_sizes({a: min(n, SMALL) for a, n in g.sizes.items()})
    docs = [plan_document(p) for p in search(g, "fp16", top=8, tuning=False, budget=Budget(WORK))]
    found = [(d, [p for p in _sites(d)["tail"] if _at(d, p)["dst"] == stored]) for d in docs]
    if not any(ps for _, ps in found):
        naive = plan_document(search(g, "fp16", naive=True, tuning=False)[0])
        found.append((naive, [p for p in _sites(naive)["tail"] if _at(naive, p)["dst"] == stored]))
    doc, paths = next(((d, ps) for d, ps in found if ps), (None, []))
    assert paths, f"no ranked plan of {graph_file} stores {stored!r}: pick another tensor"
    edited = _edit(doc, "tail", paths[0])
    assert edited is not None
    return with_hash(Plan.model_validate(doc)), with_hash(Plan.model_validate(edited))


def _check(plan: Plan, **kw: object):
    small = cpu_check_plan(plan)
    return verify_executor(small, graph_of(small), partial(execute, audit=True), seed=SEED, **kw)


def test_retention_with_its_last_row_zeroed_fails_the_cpu_check() -> None:
    plan, edited = _tail_edited("benchmarks/graphs/retention_parallel.json", "O")
    consts = compared_constants(edited)
    assert consts["i"] >= 255 and consts["j"] == consts["i"], consts  # j <= i: j keeps up with i
    small = cpu_check_plan(edited)
    sizes = {a: n for t in small.tensors for a, n in zip(t.axes, t.shape, strict=True)}
    assert sizes["j"] >= sizes["i"], sizes  # every row of O sees its own key and those just before it
    res = _check(edited)
    assert not res.ok and "'O'" in res.message, res.message
    assert _check(plan).ok  # the unedited plan still passes


def test_gated_mixture_with_a_row_of_a_gate_zeroed_fails_the_cpu_check() -> None:
    plan, edited = _tail_edited("tests/data/gated_mixture.json", "H2")
    blind = _check(edited, draws=(NORMAL,))
    assert blind.ok, f"seed {SEED}'s normal draw now catches the edit alone; the test no longer shows the hole"
    res = _check(edited)
    assert not res.ok and "on outlier inputs (up to 2.5)" in res.message, res.message
    ok = _check(plan)
    assert ok.ok and "on outlier inputs (up to 2.5)" in ok.message, ok.message


@pytest.mark.parametrize(("graph_file", "stored"), [
    ("benchmarks/graphs/gemm_max_scalar.json", "Y"),  # max |X @ W|, the GEMM's last row zeroed
    ("benchmarks/graphs/gemm_max_scalar.json", "r"),  # ... its last row maximum zeroed
    ("benchmarks/graphs/gemm_pair_mse.json", "B"),  # mean((X @ W1 - X @ W2)^2), X @ W2's last row zeroed
    ("benchmarks/graphs/gemv_softmax_decode.json", "z"),  # softmax(h @ E), the last logit zeroed
    ("benchmarks/graphs/gemv_softmax_decode.json", "p"),  # ... the last probability zeroed
])
def test_a_row_drowned_in_a_reduction_fails_on_the_planted_draw(graph_file: str, stored: str) -> None:
    plan, edited = _tail_edited(graph_file, stored)
    blind = _check(edited, draws=DRAWS)
    assert blind.ok, f"seed {SEED}'s normal and outlier draws now catch the edit alone; the test shows no hole"
    res = _check(edited)
    assert not res.ok and "on planted inputs" in res.message, res.message
    assert res.error > 10 * res.bound, res.message  # by construction, not by a seed's luck
    ok = _check(plan)
    assert ok.ok and "on planted inputs" in ok.message, ok.message


@pytest.mark.parametrize(("graph_file", "stored"), [
    ("benchmarks/graphs/gemm_max_scalar.json", "Y"),  # max |X @ W|, the GEMM's last row zeroed
    ("benchmarks/graphs/gemv_softmax_decode.json", "z"),  # softmax(h @ E), the last logit zeroed
])
def test_the_gpu_check_fails_a_dropped_row_on_the_planted_draw(graph_file: str, stored: str, executor_launch) -> None:
    """The device check at the plan's own shape, its reference float64 PyTorch as on the GPU: blind on normal and
    outlier inputs, it now plants too, and names the draws it ran."""
    plan, edited = _tail_edited(graph_file, stored)
    g = plan_graph(plan)
    bad, good = executor_launch(edited), executor_launch(plan)
    blind = GpuVerifier(plan, g, seed=SEED, device="cpu", draws=DRAWS).check(bad)
    assert blind.ok, f"seed {SEED}'s normal and outlier draws now catch the edit alone; the test shows no hole"
    verifier = GpuVerifier(plan, g, seed=SEED, device="cpu")
    res = verifier.check(bad)
    assert not res.ok and "on planted inputs" in res.message and res.error > 10 * res.bound, res.message
    assert res.draws == ["normal", "outlier", "planted"] and res.not_checked == []
    ok = verifier.check(good)
    assert ok.ok and "on planted inputs" in ok.message and ok.draws == ["normal", "outlier", "planted"], ok.message


def test_a_planted_draw_scaled_down_is_the_draw_made_at_that_scale() -> None:
    """``PlantedDraw.series`` scales its first draw instead of drawing again (0.5 s at attention's real shape):
    the values are those ``planted_inputs`` draws at each scale, bit for bit."""
    g = catalog.get("ScaledAttention", {"h": 2, "t_q": 24, "t_kv": 40, "d": 16})
    series = list(PLANTED.series(g, 7))
    assert [m for m, _ in series] == list(PLANTED.magnitudes)
    for m, got in series:
        want = planted_inputs(g, 7, m)
        assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want), m


@pytest.mark.parametrize("seed", range(8))
def test_the_planted_corner_is_the_largest_value_of_a_contraction(seed: int) -> None:
    """``X @ W`` on planted inputs: the corner (last row, last column) holds the largest magnitude, and row
    ``m - 1`` beats every other row's maximum by a wide margin, at any seed (what the argument relies on)."""
    g = catalog.get("Matmul", {"m": 40, "d": 64, "n": 56})
    x = planted_inputs(g, seed)
    y = np.abs(x["X"] @ x["W"])
    assert np.unravel_index(np.argmax(y), y.shape) == (y.shape[0] - 1, y.shape[1] - 1)
    assert y[-1].max() > 3 * y[:-1].max() and y[:, -1].max() > 3 * y[:, :-1].max()


@pytest.mark.slow  # about 5 s: planning attention in bfloat16 and three draws at 256-long axes
def test_a_correct_attention_plan_passes_the_planted_draw_at_a_well_conditioned_scale() -> None:
    """Projected-query attention in bfloat16 (``Q = X @ Wq`` rounded before the scores): at std 0.25 the planted
    corner's scores made the graph so sensitive to that rounding that the correct plan failed (1.08e-2 > 8e-3 at
    seed 11); the draw is now taken at a scale where the rounding moves the reference by at most a quarter of
    the a-priori bound."""
    g = load_graph_file(ROOT / "benchmarks/graphs/projected_query_attention.json")
    g = g.with_sizes({a: min(n, SMALL) for a, n in g.sizes.items()})
    plan = with_hash(Plan.model_validate(plan_document(search(g, "bf16", tuning=False, budget=Budget(WORK))[0])))
    res = _check(plan)
    assert res.ok and "on planted inputs (std 0.125)" in res.message, res.message
