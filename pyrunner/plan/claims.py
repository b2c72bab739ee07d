"""What a plan says about itself, checked: its provenance (the graph it names and hashes, the rules it
claims), its cost numbers, its free text, and sizes the renderer and the CPU check can take.

A plan file is untrusted: an edited plan with its hash recomputed must not be logged as the planner's
(issue 46 relabelled workloads, set ``graph_hash`` to a path, named rules that do not exist, and
carried a NUL into an exported module). ``plan.validate.check_plan`` runs these with the kernel checks.
"""

from __future__ import annotations

import hashlib

from pyrunner.errors import PlanError
from pyrunner.ir.graph_json import graph_to_json
from pyrunner.plan.schema import Map, Plan, canonical_json
from pyrunner.plan.views import plan_graph

MAX_TENSOR_RANK = 32
"""Most axes a plan tensor may carry (the CPU check's numpy arrays stop at 64)."""
MAX_EXPR_DEPTH = 96
"""Deepest elementwise expression a Map may hold: rendered, each level is a pair of parentheses, and
Python's parser stops at 200 (a 240-deep expression exported as a module that does not compile)."""
MAX_FREE_TEXT = 4096
"""Longest free-text field (a derivation step's ``at``/``result``, provenance strings) a plan may carry."""


def free_text_problem(text: str) -> str | None:
    """Why a free-text field cannot be printed into a report or an exported module's docstring, or None:
    control characters (NUL, newlines), lone surrogates (UTF-8 cannot write them), or excessive length."""
    if len(text) > MAX_FREE_TEXT:
        return f"is {len(text)} characters long; the limit is {MAX_FREE_TEXT}"
    bad = next((c for c in text if ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF), None)
    if bad is not None:
        return f"holds the character {bad!a}, which free text may not carry"
    return None


def _depth(expr: object) -> int:
    """Nesting depth of an expression, without recursion."""
    deepest, stack = 0, [(expr, 1)]
    while stack:
        e, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((a, d + 1) for a in getattr(e, "args", None) or ())
    return deepest


def check_bounds(plan: Plan) -> None:
    """Sizes the renderer and the CPU check can take: tensor ranks and expression depths."""
    for i, t in enumerate(plan.tensors):
        if len(t.axes) > MAX_TENSOR_RANK:
            raise PlanError(f"tensors[{i}]: {len(t.axes)} axes; the limit is {MAX_TENSOR_RANK}")
    for ki, k in enumerate(plan.kernels):
        for section in ("prologue", "body", "epilogue"):
            for oi, op in enumerate(getattr(k, section)):
                if isinstance(op, Map) and _depth(op.expr) > MAX_EXPR_DEPTH:
                    raise PlanError(f"kernels[{ki}].{section}[{oi}]: expression nested {_depth(op.expr)} deep; "
                                    f"the limit is {MAX_EXPR_DEPTH}")


def check_costs(plan: Plan) -> None:
    """The cost block's numbers are times, FLOPs and bytes: never negative (finite by the schema)."""
    cost = plan.cost
    fields = [("cost.total_us", cost.total_us), ("cost.launches", cost.launches)]
    for i, kc in enumerate(cost.kernels):
        fields += [(f"cost.kernels[{i}].{f}", getattr(kc, f)) for f in ("flops", "bytes", "time_us")]
    fields += [(f"cost.model[{k!r}]", v) for k, v in cost.model.items()]
    for path, v in fields:
        if v < 0:
            raise PlanError(f"{path}: {v} is negative")


def check_provenance(plan: Plan) -> None:
    """The plan's account of itself holds: every rule it names is a rule of the registry, its workload is
    its graph's name, and ``provenance.graph_hash`` is the hash of its graph (so a relabelled workload or
    a hash set to anything else is refused, not logged as given)."""
    from pyrunner.rules.registry import RULES

    for i, st in enumerate(plan.derivation):
        if st.rule not in RULES:
            raise PlanError(f"derivation[{i}].rule: {st.rule!r} is not a rule of the registry")
        for f in ("at", "result"):
            problem = free_text_problem(getattr(st, f))
            if problem:
                raise PlanError(f"derivation[{i}].{f}: {problem}")
    for ki, k in enumerate(plan.kernels):
        for j, r in enumerate(k.fused_rules):
            if r not in RULES:
                raise PlanError(f"kernels[{ki}].fused_rules[{j}]: {r!r} is not a rule of the registry")
    prov = plan.provenance
    for f, text in [("planner", prov.planner), ("version", prov.version)] + [
            (f"search_cut[{i}]", n) for i, n in enumerate(prov.search_cut)]:
        problem = free_text_problem(text)
        if problem:
            raise PlanError(f"provenance.{f}: {problem}")
    graph = plan_graph(plan)
    if plan.workload != graph.name:
        raise PlanError(f"workload: the plan says {plan.workload!r}, but its graph is named {graph.name!r}")
    want = hashlib.sha256(canonical_json(graph_to_json(graph)).encode()).hexdigest()[:16]
    if prov.graph_hash != want:
        raise PlanError(f"provenance.graph_hash: the plan says {prov.graph_hash[:40]!r}, but its graph hashes to "
                        f"{want!r}")
