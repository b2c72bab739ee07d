"""Which mask predicates let a streamed loop skip tiles: the planner's ``masked_tile_skip`` proof.

A loop step may be left out when its tile changes no loop state: every accumulator's contribution
from that tile is the identity of its combine (``-inf`` for a running max, ``0`` for a sum or a
contraction), and a running max that does not grow leaves every online-rescaled sum as it was.
For each predicate ``c`` that selects in a ``where(c, x, y)`` of the loop body, this module
evaluates the body abstractly with ``c`` false everywhere: ``where(c, x, y)`` becomes ``y``,
constants fold (``exp(-inf - m) = 0``), and ``0 * finite = 0``. If every accumulator then receives
its identity, a tile where ``c`` is false at every element is skippable. Which tiles those are is
interval reasoning over the predicate (``pyrunner.plan.masks``).

Assumption (stated, relied on): graph inputs, tensors read from memory and values computed before
the loop are finite, and a running max as the loop body reads it is finite (the lowering guards a
still-empty max to 0).
"""

from __future__ import annotations

import math

import numpy as np

from pyrunner.ir.graph import Term, subterms
from pyrunner.ir.ops import ELEMENTWISE

FINITE = "finite"
Value = float | str | None
"""A number (possibly infinite), FINITE (some finite number), or None (unknown)."""


def _fold_elementwise(t: Term, args: list[Value]) -> Value:
    if all(isinstance(a, float) for a in args):
        with np.errstate(all="ignore"):
            v = float(ELEMENTWISE[t.fn].numpy(*(np.float64(a) for a in args)))
        return None if math.isnan(v) else v
    if t.op == "ternary" and t.fn == "where":
        c, x, y = args
        if isinstance(c, float):
            return x if c != 0 else y
        if x == y:
            return x
        return FINITE if x is not None and y is not None and not _inf(x) and not _inf(y) else None
    if any(a is None for a in args):
        return None
    fn = t.fn
    if t.op == "binary":
        a, b = args
        if fn in ("add", "sub"):
            if _inf(a):
                return a
            if _inf(b):
                return b if fn == "add" else -b  # type: ignore[operator]
        if fn == "mul":
            for p, q in ((a, b), (b, a)):
                if p == 0.0 and q == FINITE:
                    return 0.0
                if _inf(p) and isinstance(q, float) and q > 0:
                    return p
        if fn == "div" and _inf(a) and isinstance(b, float) and b > 0:
            return a
        if fn in ("add", "sub", "mul", "max", "min", "lt", "le"):
            return FINITE if not any(_inf(x) for x in args) else None
    return None


def _inf(v: Value) -> bool:
    return isinstance(v, float) and math.isinf(v)


def contributes_identity(tile_terms: list[Term], accs: list[Term], online_max: set[Term], s: str,
                         false_pred: Term) -> bool:
    """Whether, with ``false_pred`` zero everywhere, every accumulator over ``s`` gets its identity."""
    val: dict[Term, Value] = {false_pred: 0.0}
    body = set(tile_terms)

    def value(t: Term) -> Value:
        if t in val:
            return val[t]
        if t.op == "const":
            v: Value = float(t.value)
        elif t.op == "iota":
            v = FINITE
        elif t in online_max:
            v = FINITE  # guarded in the body
        elif t.op == "axis_size":
            v = None
        elif t not in body and not _static(t):
            v = FINITE  # an input, a tensor read from memory, or a prologue value
        elif t.op in ("unary", "binary", "ternary"):
            v = _fold_elementwise(t, [value(a) for a in t.args])
        else:
            v = None
        val[t] = v
        return v

    for acc in accs:
        if acc.op == "matmul":
            a, b = (value(x) for x in acc.args)
            if not any(p == 0.0 and (q == FINITE or (isinstance(q, float) and not _inf(q)))
                       for p, q in ((a, b), (b, a))):
                return False
        elif acc.fn == "max":
            if value(acc.args[0]) != -math.inf:
                return False
        elif value(acc.args[0]) != 0.0:  # sum, mean
            return False
    return True


def _static(t: Term) -> bool:
    return all(x.op in ("iota", "const", "axis_size", "unary", "binary", "ternary") for x in subterms([t]))


def skippable_predicates(tile_terms: list[Term], accs: list[Term], online_max: set[Term], s: str) -> list[Term]:
    """Predicates of the loop body's masks whose all-false tiles leave every accumulator unchanged."""
    out: list[Term] = []
    for t in tile_terms:
        if t.op == "ternary" and t.fn == "where" and _static(t.args[0]) and t.args[0] not in out:
            if accs and contributes_identity(tile_terms, accs, online_max, s, t.args[0]):
                out.append(t.args[0])
    return out
