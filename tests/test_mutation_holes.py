"""Two tail edits another selection of tests/test_plan_mutations.py's edits let through (issue 46).

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

Both plans are planned at the mutation test's shapes and edited by its ``_edit``, hash recomputed.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from test_plan_mutations import SMALL, WORK, _at, _edit, _sites

from pyrunner.ir.graph_json import load_graph_file
from pyrunner.plan.schema import Plan, plan_document, with_hash
from pyrunner.planner import search
from pyrunner.planner.search import Budget
from pyrunner.run.draws import NORMAL
from pyrunner.run.executor import execute
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import compared_constants, cpu_check_plan
from pyrunner.run.verify import verify_executor

ROOT = Path(__file__).resolve().parent.parent
SEED = 11
"""The seed the mutation test checks at (the one the gated mixture's normal draw is blind on)."""


def _tail_edited(graph_file: str, stored: str) -> tuple[Plan, Plan]:
    """The planner's plan of ``graph_file`` at the mutation test's shapes, and that plan with the last row
    of the store into ``stored`` zeroed (the mutation test's tail edit)."""
    g = load_graph_file(ROOT / graph_file)
    g = g.with_sizes({a: min(n, SMALL) for a, n in g.sizes.items()})
    doc = plan_document(search(g, "fp16", tuning=False, budget=Budget(WORK))[0])
    paths = [p for p in _sites(doc)["tail"] if _at(doc, p)["dst"] == stored]
    assert paths, f"the plan of {graph_file} no longer stores {stored!r}: pick another tensor"
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
