"""The partition search's work budget pays for the work done (issue 46).

A partition used to cost every term of its graph and a merge attempt 16 units per term, whether the
kernel cache already held the kernels or not; the QK-norm attention and ScaledAttention's backward ran
out of budget on lookups. A partition now pays for the terms of the kernels it lowers (at least one unit),
a merge 2 units per term where it lowers a new kernel and one unit where it does not; where none of
the best variants has computed GEMM operands, the operand pass walks the best ones that have.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from pyrunner.ir import catalog
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.plan.schema import canonical_json, plan_document
from pyrunner.planner.search import MERGE_WORK, OPERAND_PASS_VARIANTS, Budget, Planner, _best_variants, search

DATA = Path(__file__).resolve().parent / "data"


def test_a_partition_whose_kernels_are_cached_costs_one_unit() -> None:
    planner = Planner(catalog.get("RMSNormMLP", {"m": 64, "d": 128, "n": 64}), "bf16")
    merges: list[int] = []
    merge_work = planner._merge_work
    planner._merge_work = lambda *args: merges.append(merge_work(*args)) or merges[-1]
    v = planner.variants()[0]
    cut = tuple(planner.layout(v).primary)
    cost = len(planner.layout(v).terms)
    budget = Budget(10_000)

    def paid() -> int:
        left, merges[:] = budget.left, []
        assert budget.spend(cost)  # paid in advance, as ``_explore`` does
        assert planner._paid_partitions(v, cut, budget, cost)
        return left - budget.left - sum(merges)

    first = paid()
    assert 1 < first <= cost  # its kernels were lowered: their terms, never more than the graph's
    assert paid() == 1  # the same partition again: every kernel from the cache


def test_a_merge_the_cache_answers_costs_one_unit() -> None:
    """SwiGLU's two GEMMs share their input and merge: the first attempt pays per term, the same attempt
    in a later partition pays one unit."""
    planner = Planner(catalog.get("SwiGLU", {"m": 128, "d": 256, "n": 256}), "bf16")
    paid: list[int] = []
    merge_work = planner._merge_work

    def spy(*args) -> int:
        paid.append(merge_work(*args))
        return paid[-1]

    planner._merge_work = spy
    v = planner.variants()[0]
    cut = tuple(planner.layout(v).primary)
    budget = Budget(100_000)
    planner.partitions(v, cut, budget=budget)
    first = list(paid)
    assert first and all(w >= 2 * MERGE_WORK for w in first), first
    paid.clear()
    left = budget.left
    planner.partitions(v, cut, budget=budget)
    assert paid == [1] * len(first) and left - budget.left == len(first)


def test_best_variants_are_distinct_and_in_rank_order() -> None:
    a, b, c, d = (SimpleNamespace(name=x) for x in "abcd")
    ranked = [SimpleNamespace(variant=x) for x in (a, a, b, c, b, d)]
    assert _best_variants(ranked, 2) == [a, b]
    assert _best_variants(ranked, 2, lambda v: v is not a) == [b, c]
    assert _best_variants(ranked, 8) == [a, b, c, d]
    assert _best_variants(ranked, 8, lambda v: False) == []


@pytest.mark.slow
def test_qk_norm_attention_partition_search_runs_to_completion() -> None:
    """The held-out graph of issue 46: every partition of the 60 derivation variants is evaluated (only the
    derivation's own bound on variants remains). Its best first-pass variants differ only where a constant
    sits and have no operand to cut; the operand pass walks the best ones that have."""
    planner = Planner(load_graph_file(DATA / "attention_qk_norm.json"), "bf16")
    walked = []
    explore = planner._explore

    def spy(v, budget, operands=False):
        if operands:
            walked.append(v)
        return explore(v, budget, operands)

    planner._explore = spy
    assert planner.candidates()
    assert not [n for n in planner.cut if "partition search" in n], planner.cut
    assert len(walked) == OPERAND_PASS_VARIANTS and all(planner._has_operand_cuts(v) for v in walked)


@pytest.mark.slow
def test_scaled_attention_backward_is_not_cut() -> None:
    from pyrunner.planner.saves import choose_saves

    graph = choose_saves(catalog.get("ScaledAttention"), "bfloat16").graph
    plan = search(graph, "bf16")[0]
    assert not plan.provenance.search_cut, plan.provenance.search_cut


def test_a_search_that_completes_gives_the_plan_of_a_larger_budget() -> None:
    """Where no budget bites, the budget decides nothing: a hundred times the work gives the same bytes."""
    for g in (catalog.get("RMSNormMLP", {"m": 64, "d": 128, "n": 64}), load_graph_file(DATA / "softmax_rows.json")):
        plan = search(g, "bf16")[0]
        assert not plan.provenance.search_cut
        big = search(g, "bf16", budget=Budget(100 * 100_000))[0]
        assert canonical_json(plan_document(plan)) == canonical_json(plan_document(big))
