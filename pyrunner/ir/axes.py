"""Result axes of terms, memoised and computed without recursion.

The planner asks for the axes of the same terms again and again, across
candidate partitions and kernels; graphs may be 1000-op chains (too deep for
recursion) or share sub-graphs (exponential when walked as trees). One table,
filled operands-first, answers each term in O(1) after its first visit.

The table is asked by object first (``_BY_ID``): terms are not interned, so the rewrites of a search
build many equal terms as distinct objects, and a structural lookup of one compares it with the
stored one node by node (a third of a derived backward's planning time went there). Equal terms have
equal axes, so which lookup answers changes nothing.
"""

from __future__ import annotations

from pyrunner.ir.graph import Term, result_axes

_MEMO: dict[Term, tuple[str, ...]] = {}
_BY_ID: dict[int, tuple[Term, tuple[str, ...]]] = {}
"""id(term) -> (the term, its axes): the term is held, so its id is not reused while the entry lives."""
_LIMIT = 1 << 20
"""Entries kept before the table is dropped (bounds memory across many searches)."""


def axes_of(t: Term) -> tuple[str, ...]:
    """Named axes of t's value, as ``graph.result_axes`` defines them."""
    hit = _BY_ID.get(id(t))
    if hit is not None and hit[0] is t:
        return hit[1]
    got = _MEMO.get(t)
    if got is not None:
        _remember(t, got)
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
    got = _MEMO[t]
    _remember(t, got)
    return got


def _remember(t: Term, axes: tuple[str, ...]) -> None:
    if len(_BY_ID) > _LIMIT:
        _BY_ID.clear()
    _BY_ID[id(t)] = (t, axes)
