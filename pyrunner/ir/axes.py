"""Result axes of terms, for the planner, which asks for them again and again.

``graph.result_axes`` keeps each term's axes on the term itself (``Term._axes``), filled operands-first
without recursion, so a 1000-op chain or a shared sub-graph is typed once and every later question is
O(1) by object: no table of its own here (equal terms built apart are each typed once, mostly sharing
their already-typed operands).
"""

from __future__ import annotations

from pyrunner.ir.graph import Term, result_axes


def axes_of(t: Term) -> tuple[str, ...]:
    """Named axes of t's value, as ``graph.result_axes`` defines them."""
    return result_axes(t)
