"""Rewrite-rule registry: named equalities with side conditions.

Each rule's ``name`` equals the Lean theorem that proves it. Algebraic rules
rewrite a graph term into an equal term (``apply`` at a root, ``rewrites``
over a whole graph). Schedule rules say how a loop may compute a term (tiles,
online state, fused loops); the planner cites them when it forms loops, so they
have no ``apply``. Every rule has a symbolic check in ``pyrunner.rules.symbolic``.

Matching is by structure and axes only. A rewrite must also keep the matched
term's axis order, so that every user of the term (and every output layout)
is unchanged; where an operand order decides the order, the rule picks the one
that keeps it, and otherwise declines.

Why one module: the registry is the one table of rules (name, statement, rewrite), and the
rewrites share their matching helpers (axis-order keeping, max-shift and positivity tests);
the Lean catalog and the symbolic checks are keyed by this table's order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from pyrunner.errors import UserError
from pyrunner.ir.axes import axes_of
from pyrunner.ir.graph import (
    LOG2E,
    Graph,
    Term,
    axis_size,
    binary,
    const,
    matmul,
    positive_constant,
    positive_scalings,
    reduce,
    result_axes,
    scaled_by,
    subterms,
    unary,
)


class RuleError(UserError):
    """A rule name that the registry does not know."""


@dataclass(frozen=True)
class Rule:
    """One proven rewrite: name (= Lean theorem), kind, statement, and for algebraic rules `apply`."""

    name: str
    kind: Literal["algebraic", "schedule"]
    statement: str
    apply: Callable[[Term], Term | None] | None
    saturate: bool = True
    """Whether the search applies the rule blindly; False for rules it applies through
    a normal form instead (commutativity and associativity: see ``canonical_products``)."""


# --- helpers -------------------------------------------------------------------

def _keeps_axes(old: Term, new: Term) -> Term | None:
    """`new` if it has exactly old's axes in old's order, else None (the rewrite declines)."""
    return new if result_axes(new) == result_axes(old) else None


def _is_binary(t: Term, fn: str) -> bool:
    return t.op == "binary" and t.fn == fn


def strip_positive_scale(x: Term) -> Term:
    """x without the positive constant factors and divisors around it (``(y - m) * c / c'``)."""
    while True:
        if _is_binary(x, "mul") and positive_constant(x.args[1]):
            x = x.args[0]
        elif _is_binary(x, "mul") and positive_constant(x.args[0]):
            x = x.args[1]
        elif _is_binary(x, "div") and positive_constant(x.args[1]):
            x = x.args[0]
        else:
            return x


def _is_max_shifted(x: Term, a: str) -> bool:
    """Whether x is already y - max_a(y), possibly scaled by a positive constant.

    Such an x has max_a(x) == 0, so shifting it again gains nothing; refusing
    here keeps repeated rule application finite (also after exp_to_exp2 turns
    exp(y - m) into exp2((y - m) * LOG2E)).
    """
    x = strip_positive_scale(x)
    return _is_binary(x, "sub") and x.args[1] == reduce("max", x.args[0], a)


# --- algebraic rules -------------------------------------------------------------

def softmax_max_shift(t: Term) -> Term | None:
    """div(E(x), sum_a E(x)) -> div(E(x - max_a x), sum_a E(x - max_a x)), E in {exp, exp2}."""
    if not _is_binary(t, "div"):
        return None
    num, den = t.args
    if num.op != "unary" or num.fn not in ("exp", "exp2"):
        return None
    if den.op != "reduce" or den.fn != "sum" or den.args[0] != num:
        return None
    x, a = num.args[0], den.axis
    if a not in result_axes(x) or _is_max_shifted(x, a):
        return None
    shifted = unary(num.fn, binary("sub", x, reduce("max", x, a)))
    return _keeps_axes(t, binary("div", shifted, reduce("sum", shifted, a)))


def softmax_scaled_max_shift(t: Term) -> Term | None:
    """div(exp(y * c), sum_a exp(y * c)) -> div(exp((y - max_a y) * c), sum_a ...) for a positive constant c.

    The shift is c * max_a(y) = max_a(y * c), so the exponents stay at most 0 as with
    ``softmax_max_shift``; but the max is taken of y itself and c stays on the exponent's argument,
    where the renderer folds it into exp2's constant (one FMA per score) instead of scaling every
    score first (that extra pass cost ScaledAttention 30 us of 214 on the Hopper GPU).
    """
    if not _is_binary(t, "div"):
        return None
    num, den = t.args
    if num.op != "unary" or num.fn != "exp" or den.op != "reduce" or den.fn != "sum" or den.args[0] != num:
        return None
    x, a = num.args[0], den.axis
    for y, c, y_first in positive_scalings(x, a):
        if _is_max_shifted(y, a):
            continue
        e = unary("exp", scaled_by(binary("sub", y, reduce("max", y, a)), c, y_first))
        new = _keeps_axes(t, binary("div", e, reduce("sum", e, a)))
        if new is not None:
            return new
    return None


def _pull_out_of_matmul(t: Term, fn: str, scale_side: Literal["right", "either"]) -> Term | None:
    """matmul(op(X, s), W, a) -> op(matmul(X, W, a), s) when a is not an axis of s.

    `fn` is the elementwise op (mul or div); the op may be either matmul operand.
    `scale_side` says which operand of the op may be the scale s: only the
    right one for div (l in P / l), either one for the commutative mul.
    """
    if t.op != "matmul":
        return None
    a = t.axis
    for side in (0, 1):
        inner, other = t.args[side], t.args[1 - side]
        if not _is_binary(inner, fn):
            continue
        p, q = inner.args
        candidates = [(p, q)] if scale_side == "right" else [(p, q), (q, p)]
        for x, s in candidates:
            if a in result_axes(s):
                continue
            mm = matmul(x, other, a) if side == 0 else matmul(other, x, a)
            orders = [(mm, s)] if fn == "div" else [(mm, s), (s, mm)]
            for first, second in orders:
                new = _keeps_axes(t, binary(fn, first, second))
                if new is not None:
                    return new
    return None


def matmul_div_commute(t: Term) -> Term | None:
    """matmul(div(P, l), V, a) -> div(matmul(P, V, a), l) when a is not an axis of l (either operand)."""
    return _pull_out_of_matmul(t, "div", "right")


def matmul_row_scale_commute(t: Term) -> Term | None:
    """matmul(mul(X, s), W, a) -> mul(matmul(X, W, a), s) when a is not an axis of s (either order/operand)."""
    return _pull_out_of_matmul(t, "mul", "either")


def exp_to_exp2(t: Term) -> Term | None:
    """exp(x) -> exp2(x * LOG2E)."""
    if t.op != "unary" or t.fn != "exp":
        return None
    return _keeps_axes(t, unary("exp2", binary("mul", t.args[0], const(LOG2E))))


def mean_to_sum_div(t: Term) -> Term | None:
    """mean_a(x) -> sum_a(x) / |a|."""
    if t.op != "reduce" or t.fn != "mean":
        return None
    return _keeps_axes(t, binary("div", reduce("sum", t.args[0], t.axis), axis_size(t.axis)))


def variance_sum_of_squares(t: Term) -> Term | None:
    """mean_a(square(x - mean_a(x))) -> mean_a(square(x)) - square(mean_a(x)).

    The variance as the mean of squares minus the squared mean: both means are sibling reductions
    of x over a, so one streaming pass computes them (where the centred form needs the mean
    before the squares). Numerical caveat: in floating point the difference cancels when
    |mean| is large against the standard deviation (relative error about (mean^2 / var) u of the
    accumulation, and a negative result is possible where var is near 0); the plan accumulates in
    float32, and the search weighs the rule like any other (correctness checks bound its error).
    """
    if t.op != "reduce" or t.fn != "mean":
        return None
    sq = t.args[0]
    if sq.op != "unary" or sq.fn != "square" or not _is_binary(sq.args[0], "sub"):
        return None
    x, m = sq.args[0].args
    a = t.axis
    if m.op != "reduce" or m.fn != "mean" or m.axis != a or m.args[0] != x:
        return None
    return _keeps_axes(t, binary("sub", reduce("mean", unary("square", x), a), unary("square", m)))


def elementwise_mul_comm(t: Term) -> Term | None:
    """a * b -> b * a (elementwise, broadcasting by axis name) where the product keeps its axis order."""
    if not _is_binary(t, "mul"):
        return None
    a, b = t.args
    return _keeps_axes(t, binary("mul", b, a))


def elementwise_mul_assoc(t: Term) -> Term | None:
    """(a * b) * c -> a * (b * c) where the product keeps its axis order."""
    if not _is_binary(t, "mul") or not _is_binary(t.args[0], "mul"):
        return None
    (a, b), c = t.args[0].args, t.args[1]
    return _keeps_axes(t, binary("mul", a, binary("mul", b, c)))


def matmul_as_sum(t: Term) -> Term | None:
    """x @_a w -> sum_a(x * w) when an operand has no axis of its own besides a.

    Such a product has no tile row or no tile column (a matrix-vector product, a row-wise dot
    product): the tensor cores cannot take it, and as a reduction of an elementwise product it
    streams like any other sum. Declined elsewhere, where the GEMM is the better form.
    """
    if t.op != "matmul":
        return None
    x, w = t.args
    own_x = set(axes_of(x)) - {t.axis} - set(axes_of(w))
    own_w = set(axes_of(w)) - {t.axis} - set(axes_of(x))
    if own_x and own_w:
        return None
    return (_keeps_axes(t, reduce("sum", binary("mul", x, w), t.axis))
            or _keeps_axes(t, reduce("sum", binary("mul", w, x), t.axis)))


def matmul_assoc(t: Term) -> Term | None:
    """(A @_j B) @_k C -> A @_j (B @_k C), either operand of either product, where k is B's and not
    A's and j is not C's: both sides are sum_j sum_k A * B * C.

    It lets the cost model pick the cheaper order of a chain of contractions: a low-rank product
    written as ``X @ (A @ B)`` multiplies X by a full d x n matrix, ``(X @ A) @ B`` by two thin
    ones; linear attention ``(Q @ K) @ V`` is ``Q @ (K @ V)``, d x e instead of t x t. Declined where
    the re-associated product would change the term's axis order.
    """
    if t.op != "matmul":
        return None
    k = t.axis
    for inner, other in ((t.args[0], t.args[1]), (t.args[1], t.args[0])):
        if inner.op != "matmul":
            continue
        j = inner.axis
        other_axes = set(axes_of(other))
        if j in other_axes:
            continue
        for a, b in ((inner.args[0], inner.args[1]), (inner.args[1], inner.args[0])):
            if k in axes_of(a) or k not in axes_of(b):
                continue
            for bc in (matmul(b, other, k), matmul(other, b, k)):
                for out in (matmul(a, bc, j), matmul(bc, a, j)):
                    if _keeps_axes(t, out) is not None:
                        return out
    return None


def _exp_of_difference(t: Term) -> tuple[str, Term, Term, Term | None] | None:
    """t = E(x - n) or E((x - n) * c) with E in {exp, exp2} and c a positive constant: (E, x, n, c)."""
    if t.op != "unary" or t.fn not in ("exp", "exp2"):
        return None
    d, c = t.args[0], None
    if _is_binary(d, "mul") and positive_constant(d.args[1]):
        d, c = d.args
    if not _is_binary(d, "sub"):
        return None
    return t.fn, d.args[0], d.args[1], c


def exp_shift_to_max(t: Term) -> Term | None:
    """E((x - n) c) -> E((x - max_a x) c) * E((max_a x - n) c) where n is built from max_a(x) and is
    constant along a (c a positive constant, or none; E in {exp, exp2}).

    A softmax whose shift is not the bare row max (attention sinks: ``n = max(max_t S, sink)``, an
    extra ``exp(sink - n)`` in the denominator; "softmax + 1": ``n = max(max_t S, 0)``) reads a
    finished value inside the loop over ``a``. Split this way, the first factor is the online
    softmax's ``E(x - max_a x)``, and the second, free of ``a``, leaves every sum and contraction
    over ``a`` (``sum_scale_commute``, ``matmul_row_scale_commute``) for the epilogue: one kernel.
    Declined where ``n`` is the max itself or does not mention it (nothing to gain), so saturation
    stays finite.
    """
    parts = _exp_of_difference(t)
    if parts is None:
        return None
    fn, x, n, c = parts
    inside = None
    for a in result_axes(x):
        m = reduce("max", x, a)
        if n == m or a in result_axes(n):
            continue
        if inside is None:
            inside = set(subterms([n]))
        if m not in inside:
            continue

        def e(arg: Term) -> Term:
            return unary(fn, binary("mul", arg, c) if c is not None else arg)

        new = _keeps_axes(t, binary("mul", e(binary("sub", x, m)), e(binary("sub", m, n))))
        if new is not None:
            return new
    return None


def sum_scale_commute(t: Term) -> Term | None:
    """sum_a(x * s) -> sum_a(x) * s (either product order) and sum_a(x / s) -> sum_a(x) / s when a is
    not an axis of s: a factor constant along the summed axis leaves the sum (``matmul_row_scale_commute``
    for a sum), so the loop over a no longer reads it."""
    if t.op != "reduce" or t.fn != "sum":
        return None
    a, inner = t.axis, t.args[0]
    for fn in ("mul", "div"):
        if not _is_binary(inner, fn):
            continue
        p, q = inner.args
        pairs = [(p, q, False)] if fn == "div" else [(p, q, False), (q, p, True)]
        for x, s, scale_left in pairs:
            if a in result_axes(s) or a not in result_axes(x):
                continue
            total = reduce("sum", x, a)
            orders = [(total, s)] if fn == "div" else ([(s, total), (total, s)] if scale_left else [(total, s)])
            for first, second in orders:
                new = _keeps_axes(t, binary(fn, first, second))
                if new is not None:
                    return new
    return None


# --- the registry ------------------------------------------------------------------

_RULE_LIST = (
    Rule(
        "softmax_max_shift", "algebraic",
        "E(x) / sum_a E(x) = E(x - m) / sum_a E(x - m) with m = max_a(x), for E in {exp, exp2}, "
        "when a is an axis of x (holds for any m constant along a; the max keeps E(x - m) <= 1). "
        "Not applied to an x that is already y - max_a(y) (or that times a positive constant).",
        softmax_max_shift,
    ),
    Rule(
        "softmax_scaled_max_shift", "algebraic",
        "exp(y * c) / sum_a exp(y * c) = exp((y - m) * c) / sum_a exp((y - m) * c) with m = max_a(y), "
        "for a positive constant c (no axes) and a an axis of y: the shift m * c, with the max taken "
        "before the scale. Not applied to a y that is already max-shifted.",
        softmax_scaled_max_shift,
    ),
    Rule(
        "matmul_div_commute", "algebraic",
        "(P / l) @_a V = (P @_a V) / l, and V @_a (P / l) = (V @_a P) / l, "
        "when the contracted axis a is not an axis of l (delayed normalisation).",
        matmul_div_commute,
    ),
    Rule(
        "matmul_row_scale_commute", "algebraic",
        "(X * s) @_a W = (X @_a W) * s, for either operand order of the product and either matmul "
        "operand, when the contracted axis a is not an axis of s (row-scale commutation).",
        matmul_row_scale_commute,
    ),
    Rule(
        "exp_to_exp2", "algebraic",
        "exp(x) = exp2(x * log2(e)); LOG2E is log2(e) rounded to float64.",
        exp_to_exp2,
    ),
    Rule(
        "mean_to_sum_div", "algebraic",
        "mean_a(x) = sum_a(x) / |a|, where |a| is the size of axis a.",
        mean_to_sum_div,
    ),
    Rule(
        "variance_sum_of_squares", "algebraic",
        "mean_a((x - mean_a(x))^2) = mean_a(x^2) - mean_a(x)^2 (|a| > 0): the variance from the sum and "
        "the sum of squares, two sibling reductions one pass computes. Exact in real arithmetic; in "
        "floating point the difference cancels when |mean_a(x)| is large against the spread of x.",
        variance_sum_of_squares,
    ),
    Rule(
        "reduction_tiling", "schedule",
        "A sum or max over axis a of size T*k equals the same reduction over T tiles of k elements, "
        "combined by the associative update: running sum r' = r + sum(tile) from r = 0, "
        "running max r' = max(r, max(tile)) from r = -inf.",
        None,
    ),
    Rule(
        "online_softmax_rescale", "schedule",
        "Streaming axis a in tiles with state (m, l, o), m = -inf, l = 0, o = 0: after tile j, "
        "m' = max(m, max_j x), l' = l * exp(m - m') + sum_j exp(x - m'), "
        "o' = o * exp(m - m') + sum_j exp(x - m') * v; at the end o / l = softmax_a(x) @_a v. "
        "The rescaled state equals the direct one for any running shifts m (the max only bounds the "
        "exponent), so any sum over a whose summand carries exp(x - m) may be kept this way, and "
        "likewise exp2 with a prescaled x.",
        None,
    ),
    Rule(
        "shared_operand_fusion", "schedule",
        "Two matmuls X @_a W1 and X @_a W2 (or X1 @_a W and X2 @_a W) that contract the same axis a "
        "with a shared operand are computed in one loop over tiles of a: each step loads the shared "
        "operand's tile once and updates both accumulators; the results equal the separate matmuls.",
        None,
    ),
    Rule(
        "reduction_in_contraction_loop", "schedule",
        "A reduction over the axis a that a matmul contracts (e.g. sum_a f(X) beside X @_a W) is "
        "accumulated tile by tile inside the matmul's loop over a, from the same loaded tile of X; "
        "the accumulated value equals the direct reduction.",
        None,
    ),
    Rule(
        "elementwise_mul_comm", "algebraic",
        "a * b = b * a for the elementwise product, operands broadcast by axis name; applied only where "
        "the product keeps its axis order (the order of a product is its first operand's axes, then the "
        "second's new ones). The search applies it through canonical_products, not blindly.",
        elementwise_mul_comm, saturate=False,
    ),
    Rule(
        "elementwise_mul_assoc", "algebraic",
        "(a * b) * c = a * (b * c) for the elementwise product, operands broadcast by axis name; applied "
        "only where the product keeps its axis order. The search applies it through canonical_products.",
        elementwise_mul_assoc, saturate=False,
    ),
    Rule(
        "masked_tile_skip", "schedule",
        "A streamed loop may leave out a tile whose contribution to every accumulator is that "
        "accumulator's identity (-inf for a running max, 0 for a sum or a contraction), as a tile whose "
        "scores a where(c, x, -inf) mask hides entirely gives; which tiles are hidden entirely follows from "
        "interval reasoning over the mask's affine index predicate c.",
        None,
    ),
    Rule(
        "merge_axes", "schedule",
        "Two adjacent axes a (outer, extent na) and b (inner, extent nb) that every tensor carrying them "
        "stores together, in that order, and that no term reduces, contracts, indexes or sizes, may be "
        "read as one axis of extent na * nb: element (j, l) sits at j * nb + l, and that index map is a "
        "bijection ((j * nb + l) / nb = j, (j * nb + l) % nb = l for l < nb), so every value is the same "
        "row-major reshape of the source graph's. A pair contraction sum_a(c), c contracting or summing b "
        "over operands that carry a and b adjacent in order and read by that sum alone, becomes one "
        "contraction over the merged axis: sum_{j < na} sum_{l < nb} f(j, l) = sum_{m < na * nb} "
        "f(m / nb, m % nb) (Lean: merge_contraction).",
        None,
    ),
    Rule(
        "unit_axis", "schedule",
        "An input x may be read with a new axis u of extent 1 inserted among its axes: every index of u "
        "is 0, so element (j, u, l) sits at (j * 1 + u) * nl + l = j * nl + l, x's own offset, and every "
        "value computed from x carries u with the same values; an output carrying u is the source's "
        "output at u = 0, the same bytes. It gives a contraction whose operand has no axis of its own a "
        "row axis (a batched matrix-vector product on a one-row tensor-core tile).",
        None,
    ),
    Rule(
        "split_reduction", "schedule",
        "An axis a of extent C * J that no output carries and no term indexes may be read as chunks "
        "(c, j), element c * J + j: sum_a f = sum_c sum_j f, max and mean alike (equal chunks), a "
        "contraction over a is a sum over c of contractions over j, and E(s * (x - max_a x)) = "
        "E(s * (x - m_c)) * E(s * (m_c - M)) with m_c = max_j x and M = max_c m_c, for E in {exp, exp2}: "
        "each chunk keeps its own max-shifted sums, and the factor E(s * (m_c - M)), free of j, is taken out "
        "of them and rescales each chunk's partial result where the chunks are summed.",
        None,
    ),
    Rule(
        "matmul_assoc", "algebraic",
        "(A @_j B) @_k C = A @_j (B @_k C), operands broadcast by axis name, when k is an axis of B and "
        "not of A, and j is not an axis of C: both are sum_j sum_k A * B * C (the sums swap and the "
        "products distribute). Applied in either direction and to either operand order, where the result "
        "keeps the term's axis order; the cost model picks the cheaper association.",
        matmul_assoc,
    ),
    Rule(
        "matmul_as_sum", "algebraic",
        "x @_a w = sum_a(x * w), the contraction as the sum of the elementwise product (operands "
        "broadcast by axis name); applied where an operand has no axis but a and the other's (a "
        "matrix-vector or row-wise dot product, which has no tensor-core tile).",
        matmul_as_sum,
    ),
    Rule(
        "exp_shift_to_max", "algebraic",
        "E((x - n) * c) = E((x - m) * c) * E((m - n) * c) with m = max_a(x), for E in {exp, exp2} and c a "
        "positive constant or none (holds for any m; the max keeps the first factor <= 1), when n is built "
        "from max_a(x), is not max_a(x) itself, and a is not an axis of n (a softmax shifted by "
        "max(max_a x, sink)).",
        exp_shift_to_max,
    ),
    Rule(
        "sum_scale_commute", "algebraic",
        "sum_a(x * s) = sum_a(x) * s (s * x likewise) and sum_a(x / s) = sum_a(x) / s when a is not an "
        "axis of s.",
        sum_scale_commute,
    ),
    Rule(
        "shared_accumulator", "schedule",
        "Two matmuls X @_a W and Y @_a V contracting the same axis a, summed (X @_a W + Y @_a V, read "
        "nowhere else), are computed in one loop over tiles of a into one accumulator: each step adds "
        "both tiles' products to it; the result equals the sum of the separate matmuls.",
        None,
    ),
)

RULES: dict[str, Rule] = {r.name: r for r in _RULE_LIST}
RULE_NAMES: tuple[str, ...] = tuple(RULES)
ALGEBRAIC_RULE_NAMES: tuple[str, ...] = tuple(r.name for r in _RULE_LIST if r.kind == "algebraic")
SCHEDULE_RULE_NAMES: tuple[str, ...] = tuple(r.name for r in _RULE_LIST if r.kind == "schedule")


def get_rule(name: str) -> Rule:
    """The rule called `name`; a RuleError listing the known names otherwise."""
    rule = RULES.get(name)
    if rule is None:
        raise RuleError(f"unknown rule {name!r}; known rules: {', '.join(RULE_NAMES)}")
    return rule


# --- applying rules to graphs ---------------------------------------------------------

def substitution_map(roots: Iterable[Term], old: Term, new: Term) -> dict[Term, Term]:
    """Each term reachable from roots mapped to its rebuilt version with `old` replaced by `new`.

    Every occurrence of `old` in the DAG is replaced (shared subterms are one
    value); `new` itself is inserted as is, not searched.
    """
    mapping: dict[Term, Term] = {}
    for t in subterms(roots):
        if t == old:
            mapping[t] = new
            continue
        args = tuple(mapping[a] for a in t.args)
        mapping[t] = t if args == t.args else t.replace_args(args)
    return mapping


def substitute(roots: Iterable[Term], old: Term, new: Term) -> tuple[Term, ...]:
    """The roots with every occurrence of `old` replaced by `new`."""
    roots = tuple(roots)
    mapping = substitution_map(roots, old, new)
    return tuple(mapping[r] for r in roots)


def replace_in_graph(g: Graph, old: Term, new: Term) -> Graph:
    """g with `old` replaced by `new` everywhere; labels follow the terms they named."""
    mapping = substitution_map(g.key(), old, new)
    labels: dict[Term, str] = {}
    for t, name in g.labels.items():
        labels.setdefault(mapping.get(t, t), name)
    outputs = tuple((n, mapping[t]) for n, t in g.outputs)
    return Graph(g.name, g.sizes, outputs, labels)


def iter_rewrites(g: Graph, rule: Rule) -> Iterator[tuple[Graph, Term]]:
    """Each graph from applying `rule` at one subterm of g, paired with the matched term,
    built only when asked for (a bounded search stops early on large graphs).

    Each distinct subterm is one position (a shared subterm is rewritten
    everywhere it occurs). Graphs equal to one already produced are dropped.
    Schedule rules have no `apply` and give no rewrites.
    """
    if rule.apply is None:
        return
    seen: set[tuple[Term, ...]] = {g.key()}
    for t in g.terms():
        new = rule.apply(t)
        if new is None or new == t or axes_of(new) != axes_of(t):
            continue
        g2 = replace_in_graph(g, t, new)
        if g2.key() in seen:
            continue
        seen.add(g2.key())
        yield g2, t


def rewrites(g: Graph, rule: Rule) -> list[tuple[Graph, Term]]:
    """Every graph from applying `rule` at one subterm of g (``iter_rewrites``, as a list)."""
    return list(iter_rewrites(g, rule))
