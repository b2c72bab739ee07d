"""A kernel's loop body as the planner's lowering sees it: which terms a kernel computes (its cone, leaves
excluded), which phase of a loop over an axis each runs in (before it, per tile, as its accumulator, after
it), which running maxima the body reads, and which mask predicates' all-false tiles the loop may skip.

Why one module below the planner: ``planner.lower`` builds kernels from these answers and ``validate``
(``rules.kernel_match``) re-asks them of a hand-edited plan, and a plan check may not import the planner.
"""

from __future__ import annotations

from pyrunner.ir.axes import axes_of
from pyrunner.ir.graph import Term
from pyrunner.rules.masking import skippable_predicates

LEAF_OPS = ("input", "const", "axis_size", "iota")

class Infeasible(Exception):
    """This sub-graph cannot be one kernel with this loop structure."""



Roots = Term | tuple[Term, ...]
"""What a kernel stores: one term, or several (a multi-output kernel)."""


def as_roots(root: Roots) -> tuple[Term, ...]:
    return root if isinstance(root, tuple) else (root,)


def is_leaf(t: Term, root: Roots, boundary: dict[Term, str]) -> bool:
    if isinstance(root, tuple):
        return all(t is not r for r in root) and (t in boundary or t.op in LEAF_OPS)
    return t is not root and (t in boundary or t.op in LEAF_OPS)


def cone(root: Roots, boundary: dict[Term, str]) -> list[Term]:
    """Terms the kernel touches (operands first): what it computes plus the leaves it
    reads (materialized tensors, constants), whose operands it does not visit. Several
    roots: the union of their cones, each term once."""
    out: list[Term] = []
    seen: set[Term] = set()
    stack: list[tuple[Term, bool]] = [(r, False) for r in reversed(as_roots(root))]
    while stack:
        t, done = stack.pop()
        if done:
            out.append(t)
            continue
        if t in seen:
            continue
        seen.add(t)
        stack.append((t, True))
        if is_leaf(t, root, boundary):
            continue
        for a in reversed(t.args):
            stack.append((a, False))
    return out


def kernel_computes(root: Roots, terms: list[Term], boundary: dict[Term, str]) -> list[Term]:
    """The terms of a kernel's cone it computes (not the tensors and constants it reads)."""
    return [t for t in terms if not is_leaf(t, root, boundary)]



def is_acc(t: Term, s: str | None) -> bool:
    return s is not None and t.op in ("reduce", "matmul") and t.axis == s



def phases(computed: list[Term], s: str | None) -> dict[Term, str]:
    cset = set(computed)
    phase: dict[Term, str] = {}
    for t in computed:
        if is_acc(t, s):
            phase[t] = "acc"
        elif s is not None and s in axes_of(t):
            phase[t] = "tile"
        elif any(phase.get(a) in ("acc", "post") for a in t.args if a in cset):
            phase[t] = "post"
        else:
            phase[t] = "pre"
    return phase


def online_sources(computed: list[Term], phase: dict[Term, str]) -> list[Term]:
    """Running maxima the loop body reads; any other finished reduction it reads is infeasible."""
    cset = set(computed)
    src: list[Term] = []
    for t in computed:
        if phase[t] == "tile":
            for a in t.args:
                if a not in cset or phase[a] not in ("acc", "post"):
                    continue
                if phase[a] == "acc" and a.op == "reduce" and a.fn == "max":
                    if a not in src:
                        src.append(a)
                else:
                    raise Infeasible("the loop body would need a finished reduction (two passes)")
        if phase[t] == "pre" and any(a in cset and phase[a] == "tile" for a in t.args):
            raise Infeasible("internal: pre term after tile term")
    return src



def skip_predicates(root: Roots, s: str) -> list[Term]:
    """The mask predicates a loop over ``s`` may skip all-false tiles of (``masked_tile_skip``'s side
    condition, as ``_visible`` applies it), for a kernel computing ``root`` from the tensors it reads
    (inputs); ``validate`` re-checks a plan's ``loop.visible`` against them."""
    computed = kernel_computes(root, cone(root, {}), {})
    phase = phases(computed, s)
    try:
        sources = online_sources(computed, phase)
    except Infeasible:
        return []
    return skippable_predicates([t for t in computed if phase[t] == "tile"],
                                [t for t in computed if is_acc(t, s)], set(sources), s)
