"""Result axes of terms, memoised and computed without recursion.

The planner asks for the axes of the same terms again and again, across
candidate partitions and kernels; graphs may be 1000-op chains (too deep for
recursion) or share sub-graphs (exponential when walked as trees). One table,
filled operands-first, answers each term in O(1) after its first visit.
"""

from __future__ import annotations

from pyrunner.ir.graph import Term, result_axes

_MEMO: dict[Term, tuple[str, ...]] = {}
_LIMIT = 1 << 20
"""Entries kept before the table is dropped (bounds memory across many searches)."""


def axes_of(t: Term) -> tuple[str, ...]:
    """Named axes of t's value, as ``graph.result_axes`` defines them."""
    got = _MEMO.get(t)
    if got is not None:
        return got
    if len(_MEMO) > _LIMIT:
        _MEMO.clear()
    stack = [t]
    while stack:
        cur = stack[-1]
        if cur in _MEMO:
            stack.pop()
            continue
        missing = [a for a in cur.args if a not in _MEMO]
        if missing:
            stack.extend(missing)
            continue
        _MEMO[cur] = result_axes(cur, _MEMO)  # operands are in the table: no recursion
        stack.pop()
    return _MEMO[t]
