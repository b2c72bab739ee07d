"""The schedule rules' side conditions on a plan's kernel loops (the Python twin of Superopt/Schedule.lean).

A kernel cites the schedule rules its loop relies on (``fused_rules``); each rule's Lean theorem holds
for loops of a certain form. These checks read the loop from the plan's JSON exactly as
``Superopt/Schedule.lean`` does, so ``validate`` refuses what ``lake exe superopt`` refuses:

* every cited rule needs a loop over a streamed axis ``s`` tiled by ``block``;
* ``reduction_tiling``: the body reduces over ``s``, and the tiles cover the axis (``block`` divides the
  extent, or the body masks the partial last tile);
* ``online_softmax_rescale``: an accumulating max over ``s``, a sum over ``s``, and a rescale by an
  exponential of that running max;
* ``shared_operand_fusion``: two or more contractions over ``s`` in the loop, sharing an operand;
* ``reduction_in_contraction_loop``: a contraction and a reduction over ``s`` in the loop;
* ``shared_accumulator``: two contractions over ``s`` in the loop accumulating into one tile;
* ``masked_tile_skip``: cited exactly where the loop has ``visible``; each conjunct of ``visible`` is a
  conjunct of a ``where`` condition of the kernel's certificate terms, and per block of the grid axes
  it names, every loop step outside the run range (first to last step whose tile is not all false) is
  all false (Lean's ``skippedOk``, proved to mean every skipped element is masked);
* axis views: a merge's or split's parts multiply to the axis's extent; a unit axis has extent 1.

Each failure is one ``PlanError`` naming the kernel. Why one module: the conditions are one table
mirrored from one Lean file, and ``tests/test_lean_sources.py`` runs the Lean file's examples here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import TypeAdapter

from pyrunner.errors import PlanError
from pyrunner.plan import masks
from pyrunner.plan.schema import Expr, Plan, axis_sizes
from pyrunner.rules.kernel_match import mask_exprs
from pyrunner.rules.terms_table import decode_nodes, node_term

_EXPR: TypeAdapter = TypeAdapter(Expr)
Json = dict[str, Any]


def _nodes(e: Json) -> list[Json]:
    out, stack = [], [e]
    while stack:
        x = stack.pop()
        out.append(x)
        stack.extend(x.get("args", []) if isinstance(x, dict) else [])
    return out


def _has(e: Json, kind: str, field: str, value: str) -> bool:
    return any(n.get("kind") == kind and n.get(field) == value for n in _nodes(e))


def _reduce_over(s: str, fn: str, op: Json) -> bool:
    return op.get("op") == "reduce" and op.get("axis") == s and (fn == "" or op.get("fn") == fn)


def _gemm_over(s: str, op: Json) -> bool:
    return op.get("op") == "gemm" and op.get("contract") == s


def masks_tail(body: Sequence[Json], s: str) -> bool:
    """The body masks the partial last tile of ``s``, or only loaded tiles feed sums and products over it."""
    if any(op.get("op") == "map" and _has(op["expr"], "size", "axis", s) and _has(op["expr"], "index", "axis", s)
           for op in body):
        return True
    loaded = {op["dst"] for op in body if op.get("op") == "load"}
    return all(op.get("fn") == "sum" and op.get("src") in loaded for op in body if _reduce_over(s, "", op)) \
        and all(op.get("a") in loaded and op.get("b") in loaded for op in body if _gemm_over(s, op))


def loop_rule_ok(body: Sequence[Json], s: str, n: int, block: int, rule: str) -> bool:
    """The side condition of one schedule rule at a loop over ``s`` (extent ``n``, tiles of ``block``)."""
    if rule == "reduction_tiling":
        return any(_reduce_over(s, "", op) for op in body) and block > 0 and (n % block == 0 or masks_tail(body, s))
    if rule == "online_softmax_rescale":
        maxes = [op["dst"] for op in body if _reduce_over(s, "max", op) and op.get("accumulate") is True]
        # the running max, or a map of it (its -inf-safe copy): what the rescale's exponential reads
        maxes += [op["dst"] for op in body if op.get("op") == "map" and any(_has(op["expr"], "ref", "buf", m)
                                                                           for m in maxes)]
        return any(_reduce_over(s, "sum", op) for op in body) and any(
            op.get("op") == "map" and (_has(op["expr"], "call", "fn", "exp") or _has(op["expr"], "call", "fn", "exp2"))
            and any(_has(op["expr"], "ref", "buf", m) for m in maxes) for op in body)
    if rule == "shared_operand_fusion":
        gemms = [op for op in body if op.get("op") == "gemm"]
        return sum(_gemm_over(s, op) for op in gemms) >= 2 and (
            len({op["a"] for op in gemms}) < len(gemms) or len({op["b"] for op in gemms}) < len(gemms))
    if rule == "reduction_in_contraction_loop":
        return any(_gemm_over(s, op) for op in body) and any(_reduce_over(s, "", op) for op in body)
    if rule == "shared_accumulator":
        accs = [op.get("c") for op in body if _gemm_over(s, op)]
        return len(set(accs)) < len(accs)
    return rule == "masked_tile_skip"


def _block(kernel: Json, b: object) -> int | None:
    v = kernel.get("defaults", {}).get(b) if isinstance(b, str) else b
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _all_false(p: masks.Pred, box: masks.Box) -> bool:
    test = masks.tile_test(p, box, masks.IntArith())
    return test.all_false is not None and test.all_false > 0


def _conjuncts(p: masks.Pred) -> list[masks.Pred]:
    return [c for part in p.parts for c in _conjuncts(part)] if isinstance(p, masks.All) else [p]


def run_range(p: masks.Pred, box: masks.Box, s: str, block: int, steps: int) -> tuple[int, int]:
    """The steps a block runs: from the first whose tile is not all false to the last (Lean's ``runRange``)."""
    runs = [j for j in range(steps) if not _all_false(p, {**box, s: (j * block, j * block + block - 1)})]
    return (runs[0], runs[-1] + 1) if runs else (steps, steps)


def masked_skip_ok(p: masks.Pred, mask_preds: Sequence[masks.Pred], grid: Sequence[tuple[str, int, int]], s: str,
                   block: int, steps: int, sizes: Mapping[str, int]) -> bool:
    """Lean's ``maskedSkipOk``: ``visible``'s conjuncts are the masks', and per block of the grid axes every
    step outside the run range is all false (``skippedOk``)."""
    if not all(any(c in _conjuncts(m) for m in mask_preds) for c in _conjuncts(p)):
        return False
    fixed = {masks.size_symbol(a): (n, n) for a, n in sizes.items()}
    boxes: list[masks.Box] = [dict(fixed)]
    for a, b, n in grid:
        boxes = [{**bx, a: (i * b, i * b + b - 1)} for bx in boxes for i in range(-(-n // b))]
    for box in boxes:
        lo, hi = run_range(p, box, s, block, steps)
        if any(not lo <= j < hi and not _all_false(p, {**box, s: (j * block, j * block + block - 1)})
               for j in range(steps)):
            return False
    return True


def kernel_problem(kernel: Json, sizes: Mapping[str, int], mask_exprs: Sequence[Json]) -> str | None:
    """What is wrong with a kernel's loop against the rules it cites (None: nothing); ``mask_exprs`` are the
    plan expressions of the ``where`` conditions of the terms the kernel computes (Lean's ``kernelProblem``)."""
    rules = [r if isinstance(r, str) else "" for r in kernel.get("fused_rules", [])]
    loop = kernel.get("loop")
    if loop is None:
        return f"cites {rules} but has no loop" if rules else None
    s, n, block = loop.get("axis", ""), sizes.get(loop.get("axis", "")), _block(kernel, loop.get("block"))
    if n is None or block is None:
        return f"the loop's axis {s!r} or its block is unknown"
    body = kernel.get("body", [])
    bad = next((r for r in rules if not loop_rule_ok(body, s, n, block, r)), None)
    if bad is not None:
        return f"the loop over {s!r} (block {block}, extent {n}) is not of the form {bad} needs"
    visible = loop.get("visible")
    if visible is None:
        return "cites masked_tile_skip but skips no tile" if "masked_tile_skip" in rules else None
    pred = masks.predicate(_EXPR.validate_python(visible))
    if not masks.is_index_predicate(_EXPR.validate_python(visible)):
        return "loop.visible is not an index predicate"
    if "masked_tile_skip" not in rules:
        return "skips tiles without citing masked_tile_skip"
    named = list(dict.fromkeys(a for a in _pred_axes(pred) if a != s and not a.startswith("#size:")))
    grid = {g["axis"]: _block(kernel, g["block"]) for g in kernel.get("grid", [])}
    blocks = [(a, grid[a], sizes[a]) for a in named if grid.get(a) is not None and a in sizes]
    if len(blocks) != len(named):
        return "loop.visible names an index the kernel does not iterate"
    if block == 0:
        return "the loop block is 0"
    mask_preds = [masks.predicate(_EXPR.validate_python(e)) for e in mask_exprs]
    if masked_skip_ok(pred, mask_preds, blocks, s, block, -(-n // block), sizes):
        return None
    return "a tile the loop leaves out is not masked by the kernel's masks (masked_tile_skip)"


def _pred_axes(p: masks.Pred) -> list[str]:
    if isinstance(p, masks.Atom):
        return [a for a, _ in p.coef]
    return [a for part in getattr(p, "parts", ()) for a in _pred_axes(part)]


def view_problem(doc: Json, sizes: Mapping[str, int]) -> str | None:
    """What is wrong with the plan's axis views (Lean's ``viewProblem``)."""
    def pair_ok(v: Json) -> bool:
        a, b = v["sizes"]
        return v["axis"] not in sizes or sizes[v["axis"]] == a * b

    for key, what in (("axis_merges", "the parts of {!r} do not multiply to its extent"),
                      ("axis_splits", "the chunks of {!r} do not cover it")):
        bad = next((v for v in doc.get(key, []) if not pair_ok(v)), None)
        if bad is not None:
            return f"{key}: " + what.format(bad["axis"])
    graph_axes = doc.get("graph", {}).get("axes", {}) if isinstance(doc.get("graph"), dict) else {}
    bad = next((u for u in doc.get("axis_units", []) if u["axis"] in graph_axes or sizes.get(u["axis"], 1) != 1), None)
    return None if bad is None else f"axis_units: {bad['axis']!r} is not a new axis of extent 1"


def certificate_masks(plan: Plan) -> list[list[Json]]:
    """Per kernel, the plan expressions of the ``where`` conditions of the terms its certificate says it
    computes (none without a certificate; Lean's ``kernelMasks``)."""
    cert = plan.certificate
    if cert is None:
        return [[] for _ in plan.kernels]
    terms = decode_nodes(cert.nodes)
    return [mask_exprs([node_term(terms, ix, f"certificate.kernels[{ki}]") for ix in kt.writes])
            for ki, kt in enumerate(cert.kernels)]


def check_schedule_rules(plan: Plan) -> None:
    """PlanError at the first kernel whose loop does not have the form its cited rules need, or a bad view
    (Lean's ``checkSchedule``)."""
    doc = plan.model_dump(mode="json")
    sizes = axis_sizes(plan)
    kernel_masks = certificate_masks(plan)
    for ki, k in enumerate(doc["kernels"]):
        found = kernel_masks[ki] if ki < len(kernel_masks) else []
        problem = kernel_problem(k, sizes, found)
        if problem is not None:
            raise PlanError(f"kernels[{ki}] {k['name']!r}: {problem}")
    problem = view_problem(doc, sizes)
    if problem is not None:
        raise PlanError(problem)
