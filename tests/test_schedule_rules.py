"""The schedule rules' side conditions on real plans: validate refuses a loop edited out of its rule's form.

``pyrunner.plan.schedule_rules`` (the twin of ``Superopt/Schedule.lean``) checks each kernel's loop against
the schedule rules it cites. Here: the planner's own plans pass, and plans hand-edited so a loop no longer
has its cited rule's form are refused by ``validate`` with no Lean involved: fused contractions moved to
different axes, a skipped-tile window narrowed, a skip whose mask is gone, an unmasked partial tile, a split
whose chunks miss part of the axis. ``tests/lean/SuperoptTest.lean`` carries the same kinds of edit with
the answer ``false`` (``tests/test_lean_sources.py`` checks the two sides agree).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from certificate_mutations import accepted, mutations

from pyrunner.errors import PlanError
from pyrunner.ir import catalog
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.plan.schedule_rules import certificate_masks, kernel_problem, view_problem
from pyrunner.plan.schema import Plan, axis_sizes, plan_document
from pyrunner.plan.validate import validate_plan
from pyrunner.planner.search import search

ROOT = Path(__file__).resolve().parents[1]
QKV = ROOT / "tests" / "data" / "multi_qkv_projection.json"


def _doc(plan: Plan) -> dict:
    doc = plan_document(plan)
    doc["provenance"]["plan_hash"] = ""
    return doc


@pytest.fixture(scope="module")
def window_plan() -> Plan:
    g = catalog.get("SlidingWindowAttention").with_sizes({"h": 2, "t_q": 512, "t_kv": 512, "d": 64})
    return search(g, "fp16", top=1, tuning=False)[0]


@pytest.fixture(scope="module")
def qkv_plan() -> Plan:
    return search(load_graph_file(QKV), "bf16", top=1, tuning=False)[0]


def _looped(doc: dict) -> tuple[int, dict]:
    return next((i, k) for i, k in enumerate(doc["kernels"]) if k.get("loop"))


def test_the_planners_loops_have_their_rules_form(window_plan: Plan, qkv_plan: Plan) -> None:
    for plan in (window_plan, qkv_plan):
        validate_plan(_doc(plan))
        masks = certificate_masks(plan)
        for ki, k in enumerate(plan_document(plan)["kernels"]):
            assert kernel_problem(k, axis_sizes(plan), masks[ki]) is None
    _, k = _looped(_doc(window_plan))
    assert "masked_tile_skip" in k["fused_rules"] and k["loop"].get("visible") is not None
    _, k = _looped(_doc(qkv_plan))
    assert "shared_operand_fusion" in k["fused_rules"]


def test_fused_contractions_over_different_axes_are_refused(qkv_plan: Plan) -> None:
    doc = _doc(qkv_plan)
    ki, k = _looped(doc)
    s = k["loop"]["axis"]
    other = next(g["axis"] for g in k["grid"] if g["axis"] != s)
    gemms = [op for op in k["body"] if op["op"] == "gemm" and op["contract"] == s]
    for op in gemms[1:]:
        op["contract"] = other
    assert "shared_operand_fusion" in kernel_problem(k, axis_sizes(qkv_plan), certificate_masks(qkv_plan)[ki])
    with pytest.raises(PlanError, match=rf"kernels\[{ki}\]"):
        validate_plan(doc)


def test_a_narrowed_window_or_a_lost_mask_is_refused(window_plan: Plan) -> None:
    doc = _doc(window_plan)
    ki, k = _looped(doc)
    masks = certificate_masks(window_plan)[ki]
    sizes = axis_sizes(window_plan)
    narrowed = json.loads(json.dumps(k).replace("1024.0", "128.0"))
    assert narrowed != k and "not masked" in kernel_problem(narrowed, sizes, masks)
    assert "not masked" in kernel_problem(k, sizes, [])  # the same skip with no mask to justify it
    edited = copy.deepcopy(doc)
    edited["kernels"][ki] = narrowed
    with pytest.raises(PlanError, match=rf"kernels\[{ki}\]"):
        validate_plan(edited)


def test_a_skip_must_cite_its_rule_and_a_citation_must_skip(window_plan: Plan) -> None:
    doc = _doc(window_plan)
    ki, k = _looped(doc)
    sizes, masks = axis_sizes(window_plan), certificate_masks(window_plan)[ki]
    uncited = dict(k, fused_rules=[r for r in k["fused_rules"] if r != "masked_tile_skip"])
    assert "without citing" in kernel_problem(uncited, sizes, masks)
    unskipping = dict(k, loop={a: v for a, v in k["loop"].items() if a != "visible"})
    assert "skips no tile" in kernel_problem(unskipping, sizes, masks)


def test_an_unmasked_partial_tile_is_refused() -> None:
    k = {"name": "rows", "grid": [{"axis": "m", "block": 16}], "loop": {"axis": "d", "block": 48},
         "body": [{"op": "load", "src": "X", "dst": "X_s"},
                  {"op": "map", "dst": "sq",
                   "expr": {"kind": "call", "fn": "square", "args": [{"kind": "ref", "buf": "X_s"}]}},
                  {"op": "reduce", "fn": "sum", "src": "sq", "dst": "ss", "axis": "d", "accumulate": True}],
         "fused_rules": ["reduction_tiling"]}
    assert "reduction_tiling" in kernel_problem(k, {"m": 64, "d": 64}, [])
    assert kernel_problem(k, {"m": 64, "d": 96}, []) is None  # 48 divides 96
    masked = copy.deepcopy(k)
    masked["body"][1]["expr"] = {"kind": "call", "fn": "where", "args": [
        {"kind": "call", "fn": "lt", "args": [{"kind": "index", "axis": "d"}, {"kind": "size", "axis": "d"}]},
        masked["body"][1]["expr"], {"kind": "const", "value": 0.0}]}
    assert kernel_problem(masked, {"m": 64, "d": 64}, []) is None  # the tail masked in the body


def test_a_split_that_misses_part_of_the_axis_is_refused() -> None:
    split = {"axis": "t_kv", "parts": ["c", "i"], "sizes": [16, 128]}
    doc = {"graph": {"axes": {"t_kv": 4096}}, "axis_splits": [split]}
    assert "do not cover" in view_problem(doc, {"t_kv": 4096})
    doc["axis_splits"][0]["sizes"] = [16, 256]
    assert view_problem(doc, {"t_kv": 4096}) is None


def test_mutated_loop_plans_are_rejected(window_plan: Plan, qkv_plan: Plan) -> None:
    """The certificate mutations (tests/certificate_mutations.py), loop-form edits included, on plans whose
    kernels loop: none is accepted."""
    total, wrong = 0, []
    for plan in (window_plan, qkv_plan):
        for label, bad in mutations(_doc(plan)):
            total += 1
            if accepted(bad, validate_plan):
                wrong.append(label)
    assert total >= 20 and not wrong, (total, wrong[:5])
