"""Vector-Jacobian products of every op of the op table (``ir.ops``), as graph terms.

One entry per op, keyed like the forward semantics: ``UNARY_VJP``/``BINARY_VJP``/``TERNARY_VJP``/
``REDUCE_VJP`` by function name, ``KIND_VJP`` by term kind. A VJP maps (operand values, result value,
result cotangent ``g``) to one cotangent contribution per operand (None: no gradient flows there),
built from the same terms the search plans. A contribution may carry axes its operand lacks (the
caller, ``ir.grad``, sums them away) or lack axes it has (it broadcasts by name).
``tests/test_grad.py`` fails when an op of the table has no entry here.

Non-smooth points follow PyTorch's autograd, so the float64 autograd check is exact there too:
``max``/``min`` of two tensors split the gradient evenly at ties (``torch.maximum``), against a
constant the tie goes to the tensor (``torch.clamp_min``/``clamp_max``, the baseline's form); the
``max`` reduction shares it evenly among tied maxima (``amax``); ``relu``/``abs`` have slope 0 at 0;
comparisons (``lt``/``le``) and ``where``'s predicate are piecewise constant (no gradient), so a
masked position (``where(keep, s, -inf)``) gets gradient 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pyrunner.ir.graph import Term, axis_size, binary, const, matmul, reduce, subterms, unary, where

AxesOf = Callable[[Term], tuple[str, ...]]


@dataclass(frozen=True)
class Shapes:
    """What a VJP may ask of the graph: a term's named axes and the axes' extents."""

    axes: AxesOf
    sizes: Mapping[str, int]

_LN2 = math.log(2.0)
_GELU_C = math.sqrt(2.0 / math.pi)


# --- small term helpers --------------------------------------------------------------------------

def _add(a: Term, b: Term) -> Term:
    return binary("add", a, b)


def _sub(a: Term, b: Term) -> Term:
    return binary("sub", a, b)


def _mul(a: Term, b: Term) -> Term:
    """a * b; a masked cotangent (``where(c, g, 0)``, ``where``'s VJP) keeps its mask outermost."""
    if (m := _masked(a, b)) is not None:
        return m(lambda u: _mul(u, b))
    if (m := _masked(b, a)) is not None:
        return m(lambda u: _mul(a, u))
    return binary("mul", a, b)


def _div(a: Term, b: Term) -> Term:
    """a / b; a masked numerator keeps its mask outermost (as ``_mul``)."""
    if (m := _masked(a, b)) is not None:
        return m(lambda u: _div(u, b))
    return binary("div", a, b)


def _masked(t: Term, factor: Term) -> Callable[[Callable[[Term], Term]], Term] | None:
    """Where ``t`` is a cotangent that is 0 outside a mask (``where(c, g, 0)`` or ``where(c, 0, g)``) and
    ``factor`` is not a constant: a builder putting ``f(g)`` back under the same mask. The chain rule then
    multiplies the local derivative only where the forward selected the value: outside, the forward
    computed and discarded it, and its derivative may overflow there (retention's decay exp2((j - i) g) at
    j > i, infinite in float32 at 128 positions, made 0 * inf = NaN in d_g, run 127). Equal wherever the
    factor is finite; a finite constant factor is left outside (nothing to guard)."""
    if not (t.op == "ternary" and t.fn == "where") or _is_constant(factor):
        return None
    c, x, y = t.args
    zero = _c(0.0)
    if y == zero and x != zero:
        return lambda f: where(c, f(x), zero)
    if x == zero and y != zero:
        return lambda f: where(c, zero, f(y))
    return None


def _c(v: float) -> Term:
    return const(v)


def _is_constant(t: Term) -> bool:
    """No input and no index in t: the baselines fold it to a Python number (``torch_scalar`` forms)."""
    return all(s.op not in ("input", "iota") for s in subterms([t]))


# --- the VJP tables ----------------------------------------------------------------------------------

UnaryVjp = Callable[[Term, Term, Term], Term]
"""(x, y = f(x), g = cotangent of y) -> cotangent contribution to x."""

UNARY_VJP: dict[str, UnaryVjp] = {
    "exp": lambda x, y, g: _mul(g, y),
    "exp2": lambda x, y, g: _mul(g, _mul(y, _c(_LN2))),
    "log": lambda x, y, g: _div(g, x),
    "neg": lambda x, y, g: unary("neg", g),
    "recip": lambda x, y, g: unary("neg", _mul(g, unary("square", y))),
    "sqrt": lambda x, y, g: _div(_mul(g, _c(0.5)), y),
    "rsqrt": lambda x, y, g: _mul(g, _mul(_c(-0.5), _mul(y, unary("square", y)))),
    "square": lambda x, y, g: _mul(g, _mul(_c(2.0), x)),
    # silu' = s (1 + x (1 - s)), s = sigmoid(x)
    "silu": lambda x, y, g: _mul(g, _mul(unary("sigmoid", x),
                                         _add(_c(1.0), _mul(x, _sub(_c(1.0), unary("sigmoid", x)))))),
    "sigmoid": lambda x, y, g: _mul(g, _mul(y, _sub(_c(1.0), y))),
    "tanh": lambda x, y, g: _mul(g, _sub(_c(1.0), unary("square", y))),
    "gelu": lambda x, y, g: _mul(g, _gelu_slope(x)),
    "relu": lambda x, y, g: _mul(g, binary("lt", _c(0.0), x)),  # torch: slope 0 at x = 0
    "abs": lambda x, y, g: _mul(g, _sub(binary("lt", _c(0.0), x), binary("lt", x, _c(0.0)))),
    "softplus": lambda x, y, g: _mul(g, unary("sigmoid", x)),
}


def _gelu_slope(x: Term) -> Term:
    """d/dx of 0.5 x (1 + tanh(u)), u = c (x + 0.044715 x^3): 0.5 (1 + t) + 0.5 x (1 - t^2) u'."""
    x2 = unary("square", x)
    t = unary("tanh", _mul(_c(_GELU_C), _add(x, _mul(_c(0.044715), _mul(x, x2)))))
    du = _mul(_c(_GELU_C), _add(_c(1.0), _mul(_c(3 * 0.044715), x2)))
    return _add(_mul(_c(0.5), _add(_c(1.0), t)),
                _mul(_mul(_c(0.5), x), _mul(_sub(_c(1.0), unary("square", t)), du)))


BinaryVjp = Callable[[Term, Term, Term, Term], tuple["Term | None", "Term | None"]]
"""(a, b, y = f(a, b), g) -> (contribution to a, contribution to b)."""


def _extremum(larger: bool) -> BinaryVjp:
    """torch.maximum/minimum: the gradient goes to the winner, split evenly at a tie; against a
    constant (clamp_min/clamp_max in the baseline) the tensor keeps it at a tie."""
    def wins(p: Term, q: Term) -> Term:  # 1 where p beats q, 0.5 at a tie, 0 where q wins
        strict, weak = (binary("lt", q, p), binary("le", q, p)) if larger else \
            (binary("lt", p, q), binary("le", p, q))
        if _is_constant(q):
            return weak
        return _mul(_c(0.5), _add(strict, weak))

    def vjp(a: Term, b: Term, y: Term, g: Term) -> tuple[Term | None, Term | None]:
        return _mul(g, wins(a, b)), _mul(g, wins(b, a))
    return vjp


BINARY_VJP: dict[str, BinaryVjp] = {
    "add": lambda a, b, y, g: (g, g),
    "sub": lambda a, b, y, g: (g, unary("neg", g)),
    "mul": lambda a, b, y, g: (_mul(g, b), _mul(g, a)),
    "div": lambda a, b, y, g: (_div(g, b), unary("neg", _div(_mul(g, y), b))),
    "max": _extremum(larger=True),
    "min": _extremum(larger=False),
    "lt": lambda a, b, y, g: (None, None),  # piecewise constant
    "le": lambda a, b, y, g: (None, None),
}

TernaryVjp = Callable[[Term, Term, Term, Term, Term], tuple["Term | None", "Term | None", "Term | None"]]
"""(c, x, y, result, g) -> contributions to (c, x, y)."""

TERNARY_VJP: dict[str, TernaryVjp] = {
    # the predicate is piecewise constant; a masked position (x not selected) gets 0
    "where": lambda c, x, y, r, g: (None, where(c, g, _c(0.0)), where(c, _c(0.0), g)),
}

ReduceVjp = Callable[[Term, Term, Term, str], Term]
"""(x, y = r_axis(x), g, axis) -> contribution to x (may lack ``axis``: it broadcasts)."""


def _max_vjp(x: Term, y: Term, g: Term, axis: str) -> Term:
    """amax's: g shared evenly among the positions equal to the maximum (m <= x only there).

    m is the maximum of x as the backward computes x, not ``y`` (which may be a saved output): a
    stored maximum is rounded, may exceed every recomputed element, and would leave 0 / 0."""
    hit = binary("le", reduce("max", x, axis), x)
    return _mul(g, _div(hit, reduce("sum", hit, axis)))


REDUCE_VJP: dict[str, ReduceVjp] = {
    "sum": lambda x, y, g, axis: g,
    "max": _max_vjp,
    "mean": lambda x, y, g, axis: _div(g, axis_size(axis)),
}


def _contract_with(g: Term, other: Term, free: tuple[str, ...], shapes: Shapes, want: tuple[str, ...]) -> Term:
    """sum over ``free`` of g * other: a contraction over the longest of them g carries, else a product
    (the caller sums the rest away). Longest: with several (a grouped query's group and t_q), the
    contraction shrinks the product most, and what is left to sum is smallest.

    The contraction's operands go in the order whose result lists its axes as ``want`` (the operand the
    gradient is of) does: a weight stored (d, n) gets its gradient written (d, n), not (n, d) and then
    transposed by a copy on every training step."""
    have = shapes.axes(g)
    for r in sorted(free, key=lambda a: -shapes.sizes[a]):
        if r in have:
            first = matmul(g, other, contract=r)
            if _in_order(shapes.axes(first), want):
                return first
            swapped = matmul(other, g, contract=r)
            return swapped if _in_order(shapes.axes(swapped), want) else first
    return _mul(g, other)


def _in_order(axes: tuple[str, ...], want: tuple[str, ...]) -> bool:
    """Whether the axes ``axes`` shares with ``want`` come in ``want``'s order."""
    common = set(axes) & set(want)
    return [a for a in axes if a in common] == [a for a in want if a in common]


def _matmul_vjp(t: Term, vals: tuple[Term, ...], y: Term, g: Term, shapes: Shapes) -> tuple[Term | None, ...]:
    """y = a @_c b: da = g contracted with b over b's free axes (those a lacks), db likewise."""
    a, b = t.args
    ax_a, ax_b = shapes.axes(a), shapes.axes(b)
    free_b = tuple(x for x in ax_b if x != t.axis and x not in ax_a)
    free_a = tuple(x for x in ax_a if x != t.axis and x not in ax_b)
    return (_contract_with(g, vals[1], free_b, shapes, ax_a), _contract_with(g, vals[0], free_a, shapes, ax_b))


def _elementwise_vjp(t: Term, vals: tuple[Term, ...], y: Term, g: Term, shapes: Shapes) -> tuple[Term | None, ...]:
    if t.op == "unary":
        return (UNARY_VJP[t.fn](vals[0], y, g),)
    if t.op == "binary":
        return BINARY_VJP[t.fn](vals[0], vals[1], y, g)
    return TERNARY_VJP[t.fn](vals[0], vals[1], vals[2], y, g)


def _reduce_vjp(t: Term, vals: tuple[Term, ...], y: Term, g: Term, shapes: Shapes) -> tuple[Term | None, ...]:
    return (REDUCE_VJP[t.fn](vals[0], y, g, t.axis),)


def _leaf_vjp(t: Term, vals: tuple[Term, ...], y: Term, g: Term, shapes: Shapes) -> tuple[Term | None, ...]:
    return ()


KindVjp = Callable[[Term, tuple[Term, ...], Term, Term, Shapes], tuple["Term | None", ...]]
"""(forward term, its operands' values, its value, its cotangent, shapes) -> one contribution per operand."""

KIND_VJP: dict[str, KindVjp] = {
    "input": _leaf_vjp,  # an input's cotangent is its gradient, collected by the caller
    "const": _leaf_vjp,
    "axis_size": _leaf_vjp,
    "iota": _leaf_vjp,
    "unary": _elementwise_vjp,
    "binary": _elementwise_vjp,
    "ternary": _elementwise_vjp,
    "reduce": _reduce_vjp,
    "matmul": _matmul_vjp,
}
