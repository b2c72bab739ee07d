"""Each algebraic rule as a replay: a sub-term and the rule's instantiation -> the rewritten sub-term.

Where ``registry`` searches for a way to apply a rule (which operand is the scale, which axis the
max runs over), a replay is told the choice (``Inst``) and only checks it: the term has the rule's
shape, the side conditions hold (an axis not in a term, a factor without axes, an exact constant),
and the result keeps the term's axis order. A failed check is a ``ReplayError`` saying which; the
replayed result is then compared with the certificate's. ``instantiate`` finds the instantiation of
a rewrite the search made, by trying the finitely many choices a term offers, so the planner
records it without the registry having to report it.

Why one module: one replay per algebraic rule, each a few lines over the same helpers (shape tests,
the axis-order check); ``RULE_REPLAYS`` is the table the plan replay and the mutation tests use.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from pyrunner.ir.axes import axes_of
from pyrunner.ir.graph import LOG2E, Term, axis_size, binary, const, matmul, positive_constant, reduce, subterms, unary


class ReplayError(Exception):
    """A step that does not replay: the term lacks the rule's shape or a side condition fails."""


@dataclass(frozen=True)
class Inst:
    """A rule's instantiation (``schema.Instance`` with the scale as a term)."""

    axis: str = ""
    fn: str = ""
    scale: Term | None = None
    constant: float | None = None
    choice: tuple[int, ...] = ()
    factors: tuple[tuple[int, ...], ...] = field(default=())


def _need(ok: bool, why: str) -> None:
    if not ok:
        raise ReplayError(why)


def _binary(t: Term, fn: str, what: str) -> tuple[Term, Term]:
    _need(t.op == "binary" and t.fn == fn, f"{what} is not a {fn}")
    return t.args[0], t.args[1]


def _bit(inst: Inst, k: int, n: int = 2) -> int:
    _need(len(inst.choice) > k and inst.choice[k] < n, f"the instance needs choice[{k}] in 0..{n - 1}")
    return inst.choice[k]


def _kept(t: Term, new: Term) -> Term:
    _need(axes_of(new) == axes_of(t), f"the result has axes {list(axes_of(new))}, the term {list(axes_of(t))}")
    return new


def _scale(inst: Inst, actual: Term, what: str) -> Term:
    _need(inst.scale is not None and inst.scale == actual, f"{what} is not the instance's scale term")
    return actual


def _constant_along(s: Term, a: str, what: str) -> None:
    _need(a not in axes_of(s), f"{what} has the axis {a!r} (it must be constant along it)")


def _exp_fn(t: Term, inst: Inst, fns: Sequence[str] = ("exp", "exp2")) -> Term:
    _need(t.op == "unary" and t.fn in fns and t.fn == inst.fn, f"the term is not {inst.fn or 'E'}(...)")
    return t.args[0]


def _softmax_parts(t: Term, inst: Inst) -> tuple[Term, Term]:
    """t = div(E(x), sum_a E(x)) with E = inst.fn and a = inst.axis: (E(x), x)."""
    num, den = _binary(t, "div", "the term")
    x = _exp_fn(num, inst)
    _need(den.op == "reduce" and den.fn == "sum" and den.axis == inst.axis and den.args[0] == num,
          f"the divisor is not sum over {inst.axis!r} of the numerator")
    _need(inst.axis in axes_of(x), f"the exponent has no axis {inst.axis!r}")
    return num, x


def softmax_max_shift(t: Term, inst: Inst) -> Term:
    _, x = _softmax_parts(t, inst)
    shifted = unary(inst.fn, binary("sub", x, reduce("max", x, inst.axis)))
    return _kept(t, binary("div", shifted, reduce("sum", shifted, inst.axis)))


def softmax_scaled_max_shift(t: Term, inst: Inst) -> Term:
    _need(inst.fn == "exp", "the scaled shift is stated for exp")
    _, x = _softmax_parts(t, inst)
    side = _bit(inst, 0)  # which operand of the product is the scale c
    c = _scale(inst, _binary(x, "mul", "the exponent")[side], "the exponent's factor")
    y = x.args[1 - side]
    _need(positive_constant(c), "the scale is not a positive constant")
    _need(inst.axis in axes_of(y), f"the scaled term has no axis {inst.axis!r}")
    centred = binary("sub", y, reduce("max", y, inst.axis))
    e = unary("exp", binary("mul", centred, c) if side == 1 else binary("mul", c, centred))
    return _kept(t, binary("div", e, reduce("sum", e, inst.axis)))


def _matmul(t: Term) -> tuple[Term, Term, str]:
    _need(t.op == "matmul", "the term is not a matmul")
    return t.args[0], t.args[1], t.axis


def matmul_div_commute(t: Term, inst: Inst) -> Term:
    side = _bit(inst, 0)  # which matmul operand is the quotient
    ops = _matmul(t)
    p, lv = _binary(ops[side], "div", "the matmul operand")
    _constant_along(_scale(inst, lv, "the divisor"), ops[2], "the divisor")
    mm = matmul(p, ops[1], ops[2]) if side == 0 else matmul(ops[0], p, ops[2])
    return _kept(t, binary("div", mm, lv))


def matmul_row_scale_commute(t: Term, inst: Inst) -> Term:
    side, at, first = _bit(inst, 0), _bit(inst, 1), _bit(inst, 2)  # operand, scale's place, result order
    ops = _matmul(t)
    prod = _binary(ops[side], "mul", "the matmul operand")
    s = _scale(inst, prod[at], "the product's factor")
    _constant_along(s, ops[2], "the scale")
    x = prod[1 - at]
    mm = matmul(x, ops[1], ops[2]) if side == 0 else matmul(ops[0], x, ops[2])
    return _kept(t, binary("mul", s, mm) if first else binary("mul", mm, s))


def exp_to_exp2(t: Term, inst: Inst) -> Term:
    _need(inst.constant == LOG2E, f"the constant must be LOG2E = {LOG2E!r} exactly, got {inst.constant!r}")
    x = _exp_fn(t, Inst(fn="exp"), ("exp",))
    return _kept(t, unary("exp2", binary("mul", x, const(LOG2E))))


def _mean(t: Term, inst: Inst) -> Term:
    _need(t.op == "reduce" and t.fn == "mean" and t.axis == inst.axis, f"the term is not mean over {inst.axis!r}")
    return t.args[0]


def mean_to_sum_div(t: Term, inst: Inst) -> Term:
    x = _mean(t, inst)
    return _kept(t, binary("div", reduce("sum", x, inst.axis), axis_size(inst.axis)))


def variance_sum_of_squares(t: Term, inst: Inst) -> Term:
    sq = _mean(t, inst)
    _need(sq.op == "unary" and sq.fn == "square", "the mean is not of a square")
    x, m = _binary(sq.args[0], "sub", "the squared term")
    _need(m == reduce("mean", x, inst.axis), f"the subtrahend is not mean over {inst.axis!r} of the minuend")
    return _kept(t, binary("sub", reduce("mean", unary("square", x), inst.axis), unary("square", m)))


def _at(t: Term, path: Sequence[int]) -> Term:
    for k in path:
        _need(k < len(t.args), f"factor path {list(path)} leaves the term")
        t = t.args[k]
    return t


def product_factors(t: Term, paths: Sequence[Sequence[int]]) -> list[Term]:
    """The factors of the product tree of t whose leaves are at ``paths`` (left to right); every node
    above a leaf must be a ``mul`` and the leaves must be all of the tree's."""
    want = [tuple(p) for p in paths]
    _need(len(want) >= 2 and len(set(want)) == len(want), "a product needs two or more distinct factor paths")
    prefixes = {p[:k] for p in want for k in range(len(p))}
    _need(not prefixes & set(want), "a factor path lies inside another factor")
    got: list[tuple[int, ...]] = []
    stack: list[tuple[int, ...]] = [()]
    while stack:
        p = stack.pop()
        if p in prefixes:
            _binary(_at(t, p), "mul", f"the node at {list(p)}")
            stack.extend((p + (1,), p + (0,)))
        else:
            got.append(p)
    _need(got == want, f"the factor paths {[list(p) for p in want]} are not the product's leaves in order")
    return [_at(t, p) for p in want]


def left_product(factors: Sequence[Term]) -> Term:
    out = factors[0]
    for f in factors[1:]:
        out = binary("mul", out, f)
    return out


def elementwise_mul_assoc(t: Term, inst: Inst) -> Term:
    """The product tree regrouped left-nested, its factors in order."""
    return _kept(t, left_product(product_factors(t, inst.factors)))


def elementwise_mul_comm(t: Term, inst: Inst) -> Term:
    """The product tree's factors rebuilt left-nested in the order ``choice`` (a permutation)."""
    fs = product_factors(t, inst.factors)
    _need(sorted(inst.choice) == list(range(len(fs))), f"choice {list(inst.choice)} is not a permutation")
    return _kept(t, left_product([fs[i] for i in inst.choice]))


def matmul_as_sum(t: Term, inst: Inst) -> Term:
    x, w, a = _matmul(t)
    _need(a == inst.axis, f"the matmul contracts {a!r}, not {inst.axis!r}")
    own_x = set(axes_of(x)) - {a} - set(axes_of(w))
    own_w = set(axes_of(w)) - {a} - set(axes_of(x))
    _need(not (own_x and own_w), "both operands have axes of their own (a GEMM, not a dot product)")
    return _kept(t, reduce("sum", binary("mul", w, x) if _bit(inst, 0) else binary("mul", x, w), a))


def matmul_assoc(t: Term, inst: Inst) -> Term:
    side, b_at, bc_swap, out_swap = (_bit(inst, k) for k in range(4))
    ops = _matmul(t)
    k = ops[2]
    inner, other = ops[side], ops[1 - side]
    _need(inner.op == "matmul", "the chosen operand is not a matmul")
    j = inner.axis
    _need(j != k, f"the inner and outer products both contract {k!r}")
    b, a = inner.args[b_at], inner.args[1 - b_at]
    _need(j not in axes_of(other), f"the outer operand has the inner contraction {j!r}")
    _need(k not in axes_of(a) and k in axes_of(b), f"{k!r} must be an axis of B and not of A")
    bc = matmul(other, b, k) if bc_swap else matmul(b, other, k)
    return _kept(t, matmul(bc, a, j) if out_swap else matmul(a, bc, j))


def exp_shift_to_max(t: Term, inst: Inst) -> Term:
    d = _exp_fn(t, inst)
    c = None
    if inst.scale is not None:
        d, c = _binary(d, "mul", "the exponent")
        _scale(inst, c, "the exponent's factor")
        _need(positive_constant(c), "the scale is not a positive constant")
    x, n = _binary(d, "sub", "the exponent")
    a = inst.axis
    _need(a in axes_of(x), f"the shifted term has no axis {a!r}")
    m = reduce("max", x, a)
    _need(n != m, "the shift is the max itself")
    _constant_along(n, a, "the shift")
    _need(m in set(subterms([n])), f"the shift is not built from max over {a!r}")

    def e(arg: Term) -> Term:
        return unary(inst.fn, binary("mul", arg, c) if c is not None else arg)

    return _kept(t, binary("mul", e(binary("sub", x, m)), e(binary("sub", m, n))))


def sum_scale_commute(t: Term, inst: Inst) -> Term:
    _need(t.op == "reduce" and t.fn == "sum" and t.axis == inst.axis, f"the term is not sum over {inst.axis!r}")
    _need(inst.fn in ("mul", "div"), "the instance's function must be mul or div")
    at, first = _bit(inst, 0), _bit(inst, 1)
    _need(inst.fn == "mul" or (at, first) == (1, 0), "a divisor is the quotient's right operand and stays there")
    inner = _binary(t.args[0], inst.fn, "the summand")
    s, x = _scale(inst, inner[at], "the summand's factor"), inner[1 - at]
    _constant_along(s, inst.axis, "the factor")
    _need(inst.axis in axes_of(x), f"the other operand has no axis {inst.axis!r}")
    total = reduce("sum", x, inst.axis)
    return _kept(t, binary(inst.fn, s, total) if first else binary(inst.fn, total, s))


Replay = Callable[[Term, Inst], Term]

RULE_REPLAYS: dict[str, Replay] = {
    "softmax_max_shift": softmax_max_shift,
    "softmax_scaled_max_shift": softmax_scaled_max_shift,
    "matmul_div_commute": matmul_div_commute,
    "matmul_row_scale_commute": matmul_row_scale_commute,
    "exp_to_exp2": exp_to_exp2,
    "mean_to_sum_div": mean_to_sum_div,
    "variance_sum_of_squares": variance_sum_of_squares,
    "elementwise_mul_comm": elementwise_mul_comm,
    "elementwise_mul_assoc": elementwise_mul_assoc,
    "matmul_assoc": matmul_assoc,
    "matmul_as_sum": matmul_as_sum,
    "exp_shift_to_max": exp_shift_to_max,
    "sum_scale_commute": sum_scale_commute,
}


USES: dict[str, tuple[frozenset[str], int | None]] = {
    "softmax_max_shift": (frozenset({"axis", "fn"}), 0),
    "softmax_scaled_max_shift": (frozenset({"axis", "fn", "scale"}), 1),
    "matmul_div_commute": (frozenset({"scale"}), 1),
    "matmul_row_scale_commute": (frozenset({"scale"}), 3),
    "exp_to_exp2": (frozenset({"constant"}), 0),
    "mean_to_sum_div": (frozenset({"axis"}), 0),
    "variance_sum_of_squares": (frozenset({"axis"}), 0),
    "elementwise_mul_comm": (frozenset({"factors"}), None),
    "elementwise_mul_assoc": (frozenset({"factors"}), 0),
    "matmul_assoc": (frozenset(), 4),
    "matmul_as_sum": (frozenset({"axis"}), 1),
    "exp_shift_to_max": (frozenset({"axis", "fn", "scale"}), 0),
    "sum_scale_commute": (frozenset({"axis", "fn", "scale"}), 2),
}
"""The instance fields each rule reads, and how many operand choices (None: one per factor)."""

_EMPTY = Inst()


def replay(rule: str, t: Term, inst: Inst) -> Term:
    """The rule applied to t as ``inst`` says; ReplayError when it does not apply so or the instance
    sets a field the rule does not read (each certificate has one spelling)."""
    if rule not in RULE_REPLAYS:
        raise ReplayError(f"{rule!r} is not an algebraic rule")
    uses, n = USES[rule]
    for name in ("axis", "fn", "scale", "constant", "factors"):
        if name not in uses and getattr(inst, name) != getattr(_EMPTY, name):
            raise ReplayError(f"the instance sets {name!r}, which {rule} does not read")
    want = len(inst.factors) if n is None else n
    _need(len(inst.choice) == want, f"{rule} takes {want} operand choice(s), the instance has {len(inst.choice)}")
    return RULE_REPLAYS[rule](t, inst)


def _operand(t: Term, k: int) -> Term | None:
    return t.args[k] if k < len(t.args) else None


def _candidates(rule: str, t: Term) -> Iterator[Inst]:
    """The instantiations a term offers the rule (a few; the replay rejects the ones that do not fit)."""
    fn = t.fn if t.op == "unary" else _operand(t, 0).fn if t.args and t.args[0].op == "unary" else ""
    axis = t.axis or (t.args[1].axis if len(t.args) > 1 else "")
    bits = itertools.product((0, 1), repeat=4)
    if rule == "softmax_max_shift":
        yield Inst(axis=axis, fn=fn)
    elif rule == "softmax_scaled_max_shift":
        x = t.args[0].args[0] if t.args and t.args[0].args else t
        for side in (0, 1):
            yield Inst(axis=axis, fn=fn, scale=_operand(x, side), choice=(side,))
    elif rule == "matmul_div_commute":
        for side in (0, 1):
            op = _operand(t, side)
            yield Inst(scale=_operand(op, 1) if op is not None else None, choice=(side,))
    elif rule == "matmul_row_scale_commute":
        for side, at, first, _ in bits:
            op = _operand(t, side)
            yield Inst(scale=_operand(op, at) if op is not None else None, choice=(side, at, first))
    elif rule == "exp_to_exp2":
        yield Inst(constant=LOG2E)
    elif rule in ("mean_to_sum_div", "variance_sum_of_squares"):
        yield Inst(axis=t.axis)
    elif rule == "matmul_as_sum":
        yield from (Inst(axis=t.axis, choice=(b,)) for b in (0, 1))
    elif rule == "matmul_assoc":
        yield from (Inst(choice=c) for c in bits)
    elif rule == "exp_shift_to_max":
        d = _operand(t, 0)
        scale = _operand(d, 1) if d is not None and d.op == "binary" and d.fn == "mul" else None
        x = _operand(d if scale is None else d.args[0], 0) if d is not None else None
        for a in axes_of(x) if x is not None else ():
            yield Inst(axis=a, fn=t.fn, scale=scale)
    elif rule == "sum_scale_commute" and t.args:
        for f, (at, first, _, _) in itertools.product(("mul", "div"), bits):
            yield Inst(axis=t.axis, fn=f, scale=_operand(t.args[0], at), choice=(at, first))


def instantiate(rule: str, old: Term, new: Term) -> Inst | None:
    """The instantiation under which the rule's replay turns ``old`` into ``new`` (None: none does)."""
    for inst in _candidates(rule, old):
        try:
            if replay(rule, old, inst) == new:
                return inst
        except ReplayError:
            continue
    return None
