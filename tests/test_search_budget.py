"""The partition search's work budget pays for work done, not for lookups (issue 46).

A merge attempt used to cost 16 units per term whether or not the kernel cache already held the merged
kernel: ScaledAttention's backward and the QK-norm attention spent most of their budget on merges the
cache answered, and their searches were cut. A merge now costs ``MERGE_WORK`` per term where it lowers
a new kernel and one unit where the cache answers it; where none of the best first-pass variants has
computed GEMM operands, the operand pass walks the best ones that have.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from pyrunner.ir import catalog
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.plan.schema import canonical_json, plan_document
from pyrunner.planner.search import Budget, Planner, _best_variants, search

DATA = Path(__file__).resolve().parent / "data"


def test_a_merge_the_cache_answers_costs_one_unit() -> None:
    """SwiGLU's two GEMMs share their input and merge: the first partition pays for lowering the union,
    the same partition again pays one unit per merge tried."""
    planner = Planner(catalog.get("SwiGLU", {"m": 128, "d": 256, "n": 256}), "bf16")
    v = planner.variants()[0]
    cut = tuple(planner.layout(v).primary)
    budget = Budget(1_000_000)

    def spent() -> tuple[int, int]:
        left = budget.left
        got = planner.partitions(v, cut, budget=budget)
        return left - budget.left, len(got)

    first, n = spent()
    assert n == 2, "the two GEMMs should merge"  # the partition and its merged form
    again, _ = spent()
    assert first > 2 * len(planner.layout(v).terms)  # a lowering: several units per term
    assert 1 <= again <= 4  # a lookup per merge tried (the pair, and at most a retry)


def test_best_variants_are_distinct_and_in_rank_order() -> None:
    a, b, c, d = (SimpleNamespace(name=x) for x in "abcd")
    ranked = [SimpleNamespace(variant=x) for x in (a, a, b, c, b, d)]
    assert _best_variants(ranked, 2) == [a, b]
    assert _best_variants(ranked, 2, lambda v: v is not a) == [b, c]
    assert _best_variants(ranked, 8) == [a, b, c, d]
    assert _best_variants(ranked, 8, lambda v: False) == []


@pytest.mark.slow
def test_a_search_that_completes_gives_the_plan_of_a_larger_budget() -> None:
    """Where no budget bites, the budget decides nothing: a hundred times the work gives the same bytes."""
    for g in (catalog.get("RMSNormMLP", {"m": 64, "d": 128, "n": 64}), load_graph_file(DATA / "softmax_rows.json")):
        plan = search(g, "bf16")[0]
        assert not plan.provenance.search_cut
        big = search(g, "bf16", budget=Budget(100 * 140_000))[0]
        assert canonical_json(plan_document(plan)) == canonical_json(plan_document(big))


@pytest.mark.slow
def test_qk_norm_attention_partition_search_runs_to_completion() -> None:
    """The held-out graph of issue 46: every partition of its derivation variants is evaluated (only the
    derivation's own bound on variants remains), and the operand pass runs (its best first-pass variants
    differ only where a constant sits and have no operand to cut; it walks the best ones that have)."""
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
    assert walked and all(planner._has_operand_cuts(v) for v in walked)


@pytest.mark.slow
def test_scaled_attention_backward_is_not_cut() -> None:
    from pyrunner.planner.saves import choose_saves

    graph = choose_saves(catalog.get("ScaledAttention"), "bfloat16").graph
    plan = search(graph, "bf16")[0]
    assert not plan.provenance.search_cut, plan.provenance.search_cut
