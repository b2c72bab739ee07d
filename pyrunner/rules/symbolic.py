"""Symbolic checks of the rewrite rules (sympy for algebra, z3 for max).

The Lean theorems are the proofs of record, but Lean cannot run here
(DESIGN section 3), so CI checks every rule in Python instead (for all sizes
where sympy can, ``ALL_SIZES``; otherwise at small fixed sizes, and each
result says which):

* algebraic rules: the rule's own ``apply`` rewrites a small pattern graph;
  both sides are evaluated over symbolic entries at small fixed sizes and
  their difference must simplify to zero (plus the abstract identity where it
  is more general, e.g. any shift m in softmax);
* schedule rules: the tiled / online / fused loop is run over symbolic tiles
  and must give exactly the direct value; max goes through z3 over the reals.

Before simplifying, each claimed equality is probed numerically at random
points, so a false identity is REFUTED with a counterexample rather than
merely "not proved". ``WRONG_VARIANTS`` are deliberately false rules that the
same machinery must reject (tests check that it does).

Why one module: the checking machinery (probe, simplify, z3) and the check of each rule are read
side by side, one check per rule name of ``rules.registry``.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import sympy as sp
import z3

from pyrunner.ir.graph import (
    LOG2E,
    Graph,
    Term,
    axis_size,
    binary,
    const,
    inp,
    matmul,
    reduce,
    result_axes,
    subterms,
    unary,
)
from pyrunner.ir.ops import ELEMENTWISE, REDUCTIONS
from pyrunner.rules.products import canonical_products
from pyrunner.rules.registry import RULE_NAMES, RULES, RuleError


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one check: ok, and a one-paragraph account of what was shown (or refuted)."""

    ok: bool
    detail: str


class _Refuted(Exception):
    """A claimed equality is false at a concrete point (carries the message)."""


class _Unproved(Exception):
    """A claimed equality survived probing but did not simplify to zero."""


# --- core machinery -------------------------------------------------------------------

def exp2(y: sp.Expr) -> sp.Expr:
    """2**y written as exp(y ln 2), its definition, so exp/exp2 mix in one normal form."""
    return sp.exp(y * sp.log(2))


_PROBE_SEED = 20240601


def _probe(diff: sp.Expr, what: str, points: int = 4) -> None:
    """Evaluate diff at random positive points; raise _Refuted where it is clearly nonzero."""
    syms = sorted(diff.free_symbols, key=lambda s: s.name)
    if not syms:
        val = complex(sp.N(diff))
        if abs(val) > 1e-9:
            raise _Refuted(f"{what}: constant difference {val:.6g}")
        return
    f = sp.lambdify(syms, diff, modules=["math"])
    rng = random.Random(_PROBE_SEED)
    for _ in range(points):
        point = [rng.uniform(0.3, 2.0) for _ in syms]
        val = f(*point)
        if abs(val) > 1e-9:
            at = ", ".join(f"{s}={v:.3f}" for s, v in list(zip(syms, point))[:6])
            raise _Refuted(f"{what}: differs by {val:.6g} at {at}{', ...' if len(syms) > 6 else ''}")


def _is_zero(diff: sp.Expr) -> bool:
    d = sp.expand(diff, power_exp=True)
    if d == 0 or sp.cancel(sp.together(d)) == 0:
        return True
    return sp.simplify(d) == 0


def assert_equal(lhs: sp.Expr, rhs: sp.Expr, what: str) -> None:
    """Probe, then simplify lhs - rhs to zero; raises _Refuted or _Unproved."""
    diff = sp.sympify(lhs) - sp.sympify(rhs)
    _probe(diff, what)
    if not _is_zero(diff):
        raise _Unproved(f"{what}: lhs - rhs did not simplify to 0")


def assert_valid(claim: z3.BoolRef, what: str) -> None:
    """z3: the claim holds for all values of its free variables (its negation is unsat)."""
    s = z3.Solver()
    s.add(z3.Not(claim))
    res = s.check()
    if res == z3.sat:
        raise _Refuted(f"{what}: z3 counterexample {s.model()}")
    if res != z3.unsat:
        raise _Unproved(f"{what}: z3 answered {res}")


def _run(checks: Callable[[], list[str]]) -> CheckResult:
    """Run a check body that returns what it showed; turn failures into a not-ok result."""
    try:
        shown = checks()
    except _Refuted as e:
        return CheckResult(False, f"refuted: {e}")
    except _Unproved as e:
        return CheckResult(False, f"not proved: {e}")
    return CheckResult(True, "; ".join(shown))


# --- symbolic evaluation of graph terms ---------------------------------------------------

def _sym_const(value: float) -> sp.Expr:
    """Exact value of a graph constant; LOG2E stands for log2(e) itself (checked separately)."""
    if value == LOG2E:
        return 1 / sp.log(2)
    if math.isinf(value):
        return sp.oo if value > 0 else -sp.oo
    return sp.Rational(value)


@dataclass(frozen=True)
class SymTensor:
    """A tensor over named axes with one sympy expression per index tuple."""

    axes: tuple[str, ...]
    vals: dict[tuple[int, ...], sp.Expr]

    def at(self, env: dict[str, int]) -> sp.Expr:
        return self.vals[tuple(env[a] for a in self.axes)]


def sym_evaluate(roots: Sequence[Term], sizes: dict[str, int]) -> dict[Term, SymTensor]:
    """Evaluate terms over symbolic inputs: input X's entry (i, j) is the real symbol X[i,j]."""
    memo: dict[Term, SymTensor] = {}
    for t in subterms(roots):
        axes = result_axes(t)
        vals: dict[tuple[int, ...], sp.Expr] = {}
        for idx in itertools.product(*(range(sizes[a]) for a in axes)):
            env = dict(zip(axes, idx))
            vals[idx] = _sym_entry(t, env, memo, sizes)
        memo[t] = SymTensor(axes, vals)
    return memo


def _sym_entry(t: Term, env: dict[str, int], memo: dict[Term, SymTensor], sizes: dict[str, int]) -> sp.Expr:
    if t.op == "input":
        return sp.Symbol(f"{t.name}[{','.join(str(env[a]) for a in t.axes)}]", real=True)
    if t.op == "const":
        return _sym_const(t.value)
    if t.op == "axis_size":
        return sp.Integer(sizes[t.axis])
    if t.op == "iota":
        return sp.Integer(env[t.axis])
    args = [memo[a] for a in t.args]
    if t.op in ("unary", "binary", "ternary"):
        return ELEMENTWISE[t.fn].sympy(sp, *(a.at(env) for a in args))
    n = sizes[t.axis]
    if t.op == "reduce":
        return REDUCTIONS[t.fn].sympy(sp, [args[0].at({**env, t.axis: i}) for i in range(n)])
    if t.op == "matmul":
        return sp.Add(*(args[0].at({**env, t.axis: i}) * args[1].at({**env, t.axis: i}) for i in range(n)))
    raise ValueError(f"cannot evaluate op {t.op!r} symbolically")


def assert_terms_equal(lhs: Term, rhs: Term, sizes: dict[str, int], what: str) -> None:
    """Both terms have the same axes and entrywise equal symbolic values at these sizes."""
    la, ra = result_axes(lhs), result_axes(rhs)
    if la != ra:
        raise _Refuted(f"{what}: the two sides have different axes {list(la)} and {list(ra)}")
    memo = sym_evaluate([lhs, rhs], sizes)
    for idx, v in memo[lhs].vals.items():
        assert_equal(v, memo[rhs].vals[idx], f"{what}, entry {idx}")


def assert_rule_instance(rule_name: str, lhs: Term, sizes: dict[str, int], what: str) -> Term:
    """Apply the registered rule to lhs (it must fire) and check the result equals lhs."""
    apply = RULES[rule_name].apply
    assert apply is not None
    rhs = apply(lhs)
    if rhs is None:
        raise _Unproved(f"{what}: the rule did not apply to {lhs}")
    assert_terms_equal(lhs, rhs, sizes, what)
    return rhs


# --- algebraic rules --------------------------------------------------------------------

def _syms(prefix: str, n: int) -> list[sp.Symbol]:
    return [sp.Symbol(f"{prefix}{i}", real=True) for i in range(n)]


def _softmax_shift_identity(shift_per_element: bool) -> Callable[[], list[str]]:
    """E(x_i - m)/sum_j E(x_j - m) == E(x_i)/sum_j E(x_j); wrong variant: m_i varies with i."""
    def body() -> list[str]:
        for n in (2, 3, 4):
            x = _syms("x", n)
            m = _syms("m", n) if shift_per_element else [sp.Symbol("m", real=True)] * n
            for name, e in (("exp", sp.exp), ("exp2", exp2)):
                den_s = sp.Add(*(e(x[j] - m[j]) for j in range(n)))
                den = sp.Add(*(e(xj) for xj in x))
                for i in range(n):
                    assert_equal(e(x[i] - m[i]) / den_s, e(x[i]) / den, f"{name} ratio, n={n}, i={i}")
        return ["E(x_i - m)/sum E(x_j - m) = E(x_i)/sum E(x_j) for symbolic m, E in {exp, exp2}, n = 2..4"]
    return body


def _check_softmax_max_shift() -> list[str]:
    shown = _softmax_shift_identity(False)()
    for e in ("exp", "exp2"):
        x = inp("x", ("i", "a"))
        ex = unary(e, x)
        lhs = binary("div", ex, reduce("sum", ex, "a"))
        assert_rule_instance("softmax_max_shift", lhs, {"i": 2, "a": 3}, f"rule instance with {e}")
    # the max makes every exponent <= 0 (no overflow) and one of them 0 (denominator >= 1)
    xs = z3.Reals("x0 x1 x2 x3")
    m = xs[0]
    for v in xs[1:]:
        m = z3.If(v > m, v, m)
    assert_valid(z3.And(*(v - m <= 0 for v in xs), z3.Or(*(v - m == 0 for v in xs))), "max bound")
    return shown + ["rule.apply on div(E(x), sum_a E(x)) (i=2, a=3) equals the input term",
                    "z3: x_i - max(x) <= 0 with equality at some i"]


def _matmul_scale_identity(op: str, scale_on_contracted_axis: bool) -> Callable[[], list[str]]:
    """(X op s) @ W == (X @ W) op s entrywise over symbolic matrices (rows 2, contracted 3, cols 3).

    Wrong variant: s is indexed by the contracted axis k (a column scale of X)
    and, having nowhere else to go, is applied to the output column j of the
    same position: X diag(s) W == (X W) diag(s), which is false.
    """
    def body() -> list[str]:
        rows, inner, cols = 2, 3, 3
        x = sp.Matrix(rows, inner, lambda i, k: sp.Symbol(f"X{i}{k}", real=True))
        w = sp.Matrix(inner, cols, lambda k, j: sp.Symbol(f"W{k}{j}", real=True))
        s = _syms("s", max(rows, inner, cols))
        f = (lambda a, b: a * b) if op == "mul" else (lambda a, b: a / b)
        for i, j in itertools.product(range(rows), range(cols)):
            scale_in = s[:inner] if scale_on_contracted_axis else [s[i]] * inner  # s as seen at (i, k)
            scale_out = s[j] if scale_on_contracted_axis else s[i]
            lhs = sp.Add(*(f(x[i, k], scale_in[k]) * w[k, j] for k in range(inner)))
            rhs = f(sp.Add(*(x[i, k] * w[k, j] for k in range(inner))), scale_out)
            assert_equal(lhs, rhs, f"{op} scale, entry ({i},{j})")
        return [f"(X {op} s) @ W = (X @ W) {op} s for symbolic 2x3 @ 3x3 with s constant along the contraction"]
    return body


def _check_softmax_scaled_max_shift() -> list[str]:
    for n in (2, 3, 4):
        x = _syms("x", n)
        m, c = sp.Symbol("m", real=True), sp.Symbol("c", positive=True)
        den_s = sp.Add(*(sp.exp((xj - m) * c) for xj in x))
        den = sp.Add(*(sp.exp(xj * c) for xj in x))
        for i in range(n):
            assert_equal(sp.exp((x[i] - m) * c) / den_s, sp.exp(x[i] * c) / den, f"scaled ratio, n={n}, i={i}")
    x = inp("x", ("i", "a"))
    for c in (const(0.125), unary("rsqrt", axis_size("a"))):
        ex = unary("exp", binary("mul", x, c))
        lhs = binary("div", ex, reduce("sum", ex, "a"))
        assert_rule_instance("softmax_scaled_max_shift", lhs, {"i": 2, "a": 3}, f"rule instance with scale {c}")
    # with c > 0 the shifted exponents stay <= 0, one of them 0
    xs = z3.Reals("x0 x1 x2")
    cz = z3.Real("c")
    mz = xs[0]
    for v in xs[1:]:
        mz = z3.If(v > mz, v, mz)
    bound = z3.And(*((v - mz) * cz <= 0 for v in xs), z3.Or(*((v - mz) * cz == 0 for v in xs)))
    assert_valid(z3.Implies(cz > 0, bound), "scaled max bound")
    return ["exp((x_i - m) c)/sum exp((x_j - m) c) = exp(x_i c)/sum exp(x_j c) for symbolic m, c > 0, n = 2..4",
            "rule.apply on div(exp(x * c), sum_a exp(x * c)) for c = 0.125 and rsqrt(|a|) equals the input term",
            "z3: c > 0 implies (x_i - max(x)) c <= 0 with equality at some i"]


def _check_matmul_div_commute() -> list[str]:
    shown = _matmul_scale_identity("div", False)()
    sizes = {"i": 2, "a": 3, "j": 2, "b": 2}
    p, l_, v = inp("P", ("i", "a")), inp("l", ("i",)), inp("V", ("a", "j"))
    assert_rule_instance("matmul_div_commute", matmul(binary("div", p, l_), v, "a"), sizes, "div on the left")
    pr, vr = inp("P", ("a", "i")), inp("V", ("j", "a"))
    assert_rule_instance("matmul_div_commute", matmul(vr, binary("div", pr, l_), "a"), sizes, "div on the right")
    pb, lb, vb = inp("P", ("b", "i", "a")), inp("l", ("b", "i")), inp("V", ("b", "a", "j"))
    assert_rule_instance("matmul_div_commute", matmul(binary("div", pb, lb), vb, "a"), sizes, "batched")
    return shown + ["rule.apply on left, right and batched instances equals the input term"]


def _check_matmul_row_scale_commute() -> list[str]:
    shown = _matmul_scale_identity("mul", False)()
    sizes = {"i": 2, "a": 3, "j": 2, "b": 2}
    x, s, w = inp("X", ("i", "a")), inp("s", ("i",)), inp("W", ("a", "j"))
    assert_rule_instance("matmul_row_scale_commute", matmul(binary("mul", x, s), w, "a"), sizes, "X * s")
    assert_rule_instance("matmul_row_scale_commute", matmul(binary("mul", s, x), w, "a"), sizes, "s * X")
    xr, wr = inp("X", ("a", "i")), inp("W", ("j", "a"))
    assert_rule_instance("matmul_row_scale_commute", matmul(wr, binary("mul", xr, s), "a"), sizes, "right operand")
    sb = inp("s", ("b",))
    wb = inp("W", ("b", "a", "j"))
    assert_rule_instance("matmul_row_scale_commute", matmul(binary("mul", x, sb), wb, "a"), sizes,
                         "scale on the other operand's batch axis")
    return shown + ["rule.apply on X*s, s*X, right-operand and batch-axis instances equals the input term"]


def _check_exp_to_exp2() -> list[str]:
    x = sp.Symbol("x", real=True)
    assert_equal(sp.exp(x), exp2(x * sp.log(sp.E, 2)), "exp(x) = 2^(x log2 e)")
    assert_rule_instance("exp_to_exp2", unary("exp", inp("x", ("i",))), {"i": 3}, "rule instance")
    if abs(LOG2E - 1 / math.log(2)) > 2 * math.ulp(LOG2E):
        raise _Refuted(f"LOG2E = {LOG2E!r} is not log2(e) to float64 precision")
    return ["exp(x) = exp2(x * log2 e) for symbolic real x",
            "rule.apply on exp(x) equals it", "LOG2E is log2(e) within 2 ulp"]


def _check_mean_to_sum_div() -> list[str]:
    i, n = sp.symbols("i n", integer=True, positive=True)
    xs, c = sp.IndexedBase("x"), sp.Symbol("c", real=True)
    # the mean is the c with sum_i (x_i - c) = 0; solve it for any n
    sol = sp.solve(sp.Sum(xs[i] - c, (i, 1, n)).expand().doit(), c)
    if len(sol) != 1:
        raise _Unproved(f"mean characterisation solved to {sol}")
    assert_equal(sol[0], sp.Sum(xs[i], (i, 1, n)) / n, "mean for symbolic n")
    for size in (2, 3, 5):
        assert_rule_instance("mean_to_sum_div", reduce("mean", inp("x", ("r", "a")), "a"),
                             {"r": 2, "a": size}, f"rule instance, |a|={size}")
    return ["the c with sum_{i<=n} (x_i - c) = 0 is sum x_i / n for symbolic n",
            "rule.apply on mean_a(x) equals it for |a| = 2, 3, 5"]


def _variance_identity(square_the_mean: bool) -> Callable[[], list[str]]:
    """mean((x - mean x)^2) == mean(x^2) - mean(x)^2; wrong variant: the mean is not squared."""
    def body() -> list[str]:
        i, n = sp.symbols("i n", integer=True, positive=True)
        xs, c = sp.IndexedBase("x"), sp.Symbol("c", real=True)
        s1, s2 = sp.Symbol("S", real=True), sp.Symbol("Q", real=True)
        # for any n and any c: sum_i (x_i - c)^2 = Q - 2 c S + n c^2, with S = sum x_i, Q = sum x_i^2
        expanded = sp.expand(sp.Sum(sp.expand((xs[i] - c) ** 2), (i, 1, n)).doit())
        target = sp.expand((sp.Sum(xs[i] ** 2, (i, 1, n)) - 2 * c * sp.Sum(xs[i], (i, 1, n))).doit() + n * c ** 2)
        if not _is_zero(expanded - target):  # no numeric probe: the sums run to a symbolic n
            raise _Unproved("sum of squares about c, symbolic n: lhs - rhs did not simplify to 0")
        # then c = S / n: (Q - 2 c S + n c^2) / n = Q / n - (S / n)^2
        mean = s1 / n
        rhs = s2 / n - (mean ** 2 if square_the_mean else mean)
        assert_equal((s2 - 2 * mean * s1 + n * mean ** 2) / n, rhs, "variance from S and Q, symbolic n")
        for size in (1, 2, 3, 4):
            x = _syms("x", size)
            mu = sp.Add(*x) / size
            direct = sp.Add(*((v - mu) ** 2 for v in x)) / size
            msq = sp.Add(*(v ** 2 for v in x)) / size
            assert_equal(direct, msq - (mu ** 2 if square_the_mean else mu), f"variance, n={size}")
        return ["sum_{i<=n} (x_i - c)^2 = sum x_i^2 - 2 c sum x_i + n c^2 for symbolic n and c",
                "with c = sum x_i / n, divided by n: mean(x^2) - mean(x)^2 (symbolic n), and directly at n = 1..4"]
    return body


def _check_variance_sum_of_squares() -> list[str]:
    shown = _variance_identity(True)()
    for size in (2, 3, 5):
        x = inp("x", ("r", "a"))
        lhs = reduce("mean", unary("square", binary("sub", x, reduce("mean", x, "a"))), "a")
        assert_rule_instance("variance_sum_of_squares", lhs, {"r": 2, "a": size}, f"rule instance, |a|={size}")
    return shown + ["rule.apply on mean_a(square(x - mean_a(x))) equals it for |a| = 2, 3, 5"]


def _matmul_assoc(tie_shared_axis: bool) -> Callable[[], list[str]]:
    """(A @_j B) @_k C == A @_j (B @_k C) over symbolic entries: a low-rank chain both ways, linear
    attention, a chain with a batch axis, and each operand order, at |j|, |k| = 1..3. Wrong variant:
    re-associating where C carries j too, which ties C's j to A's (compared with the left side summed
    over j, so the axes agree): not equal."""
    def body() -> list[str]:
        if tie_shared_axis:
            a, b, c = inp("A", ("m", "j")), inp("B", ("j", "k")), inp("C", ("k", "j"))
            lhs = reduce("sum", matmul(matmul(a, b, "j"), c, "k"), "j")
            assert_terms_equal(lhs, matmul(a, matmul(b, c, "k"), "j"), {"m": 2, "j": 2, "k": 2},
                               "C carries j")
            return []
        x, a, b = inp("X", ("m", "d")), inp("A", ("d", "r")), inp("B", ("r", "n"))
        q, k, v = inp("Q", ("t", "d")), inp("K", ("s", "d")), inp("V", ("s", "e"))
        qb, kb, vb = inp("Q", ("b", "t", "d")), inp("K", ("b", "s", "d")), inp("V", ("b", "s", "e"))
        chains = (
            ("low rank, merged weight", matmul(x, matmul(a, b, "r"), "d")),
            ("low rank, thin first", matmul(matmul(x, a, "d"), b, "r")),
            ("linear attention", matmul(matmul(q, k, "d"), v, "s")),
            ("batched", matmul(matmul(qb, kb, "d"), vb, "s")),
            ("inner product on the right", matmul(v, matmul(q, k, "d"), "s")),
        )
        for what, lhs in chains:
            for n in (1, 2, 3):
                sizes = {"m": 2, "n": 2, "t": 2, "e": 2, "b": 2, "d": n, "r": 4 - n, "s": n}
                assert_rule_instance("matmul_assoc", lhs, sizes, f"{what}, contracted extents {n}, {4 - n}")
        return [f"rule.apply equals the chain for {', '.join(w for w, _ in chains)} at contracted extents 1..3"]
    return body


def _matmul_as_sum(product_of_sums: bool) -> Callable[[], list[str]]:
    """x @_a w == sum_a(x * w) for a matrix-vector, a vector-matrix and a row-wise dot product.
    Wrong variant: the product of the two sums, sum_a(x) * sum_a(w)."""
    def body() -> list[str]:
        shapes = ((("r", "a"), ("a",)), (("a",), ("a", "n")), (("r", "a"), ("r", "a")))
        for xa, wa in shapes:
            for size in (1, 2, 3, 4):
                x, w = inp("x", xa), inp("w", wa)
                lhs, sizes = matmul(x, w, "a"), {"r": 2, "n": 3, "a": size}
                if product_of_sums:
                    rhs = binary("mul", reduce("sum", x, "a"), reduce("sum", w, "a"))
                    assert_terms_equal(lhs, rhs, sizes, f"product of sums, {xa} @ {wa}, |a|={size}")
                else:
                    assert_rule_instance("matmul_as_sum", lhs, sizes, f"rule instance, {xa} @ {wa}, |a|={size}")
        gemm = matmul(inp("x", ("r", "a")), inp("w", ("a", "n")), "a")
        if not product_of_sums and RULES["matmul_as_sum"].apply(gemm):
            raise _Refuted("the rule rewrote a matrix product that has a tile row and a tile column")
        return ["rule.apply equals the contraction for x[r, a] @ w[a], x[a] @ w[a, n] and x[r, a] @ w[r, a] "
                "at |a| = 1..4", "it declines x[r, a] @ w[a, n]"]
    return body


def _exp_shift_to_max(flip_second: bool) -> Callable[[], list[str]]:
    """E((x - n) c) == E((x - m) c) * E((m - n) c) for symbolic x, n, m, c and E in {exp, exp2}; rule
    instances on a softmax shifted by max(max_a x, sink), with and without a scale, in exp and exp2
    form; it declines the bare max shift. Wrong variant: the second factor's difference reversed,
    E((n - m) c)."""
    def body() -> list[str]:
        x, n, m = (sp.Symbol(v, real=True) for v in "xnm")
        c = sp.Symbol("c", positive=True)
        for name, e in (("exp", sp.exp), ("exp2", exp2)):
            second = e((n - m) * c) if flip_second else e((m - n) * c)
            assert_equal(e((x - n) * c), e((x - m) * c) * second, f"{name} shift exchange")
        if flip_second:
            return []
        xs, sink = inp("x", ("i", "a")), inp("sink", ("i",))
        shift = binary("max", reduce("max", xs, "a"), sink)
        sizes = {"i": 2, "a": 3}
        for e in ("exp", "exp2"):
            for scale in (None, const(0.125), const(LOG2E)):
                d = binary("sub", xs, shift)
                lhs = unary(e, binary("mul", d, scale) if scale is not None else d)
                assert_rule_instance("exp_shift_to_max", lhs, sizes, f"{e}, scale {scale}")
        bare = unary("exp", binary("sub", xs, reduce("max", xs, "a")))
        if RULES["exp_shift_to_max"].apply(bare) is not None:
            raise _Refuted("the rule rewrote exp(x - max_a x), which is already max-shifted")
        return ["E((x - n) c) = E((x - m) c) E((m - n) c) for symbolic x, n, m, c > 0, E in {exp, exp2}",
                "rule.apply on E((x - max(max_a x, sink)) c) for exp and exp2, no scale, 0.125 and log2 e "
                "(i=2, a=3) equals the input term; it declines exp(x - max_a x)"]
    return body


def _sum_scale_commute(scale_on_summed_axis: bool) -> Callable[[], list[str]]:
    """sum_a(x * s), sum_a(s * x) and sum_a(x / s) with s constant along a: the rule's result equals
    the input. Wrong variant: s carries a (a weighted sum is not the sum times a weight)."""
    def body() -> list[str]:
        x = inp("x", ("i", "a"))
        if scale_on_summed_axis:
            s = inp("s", ("a",))
            lhs = reduce("sum", binary("mul", x, s), "a")
            assert_terms_equal(lhs, binary("mul", reduce("sum", x, "a"), reduce("max", s, "a")),
                               {"i": 2, "a": 3}, "s along a")
            return []
        s, sb = inp("s", ("i",)), inp("s", ("b",))
        xb = inp("x", ("b", "i", "a"))
        cases = (("x * s", reduce("sum", binary("mul", x, s), "a")),
                 ("s * x", reduce("sum", binary("mul", s, x), "a")),
                 ("x / s", reduce("sum", binary("div", x, s), "a")),
                 ("batched, s on the batch axis", reduce("sum", binary("mul", xb, sb), "a")))
        for what, lhs in cases:
            for n in (1, 2, 3):
                assert_rule_instance("sum_scale_commute", lhs, {"i": 2, "b": 2, "a": n}, f"{what}, |a|={n}")
        return [f"rule.apply equals the sum for {', '.join(w for w, _ in cases)} at |a| = 1..3"]
    return body


# --- schedule rules -----------------------------------------------------------------------

_TILINGS = ((4, 2), (6, 2), (6, 3), (4, 4), (8, 2))


def _tiles(n: int, k: int) -> list[range]:
    return [range(j, j + k) for j in range(0, n, k)]


def _z3_max(vals: Iterable[z3.ArithRef]) -> z3.ArithRef:
    it = iter(vals)
    m = next(it)
    for v in it:
        m = z3.If(v > m, v, m)
    return m


def _reduction_tiling(max_combine: str) -> Callable[[], list[str]]:
    """Tiled sum == sum; tiled max == max (z3). Wrong variant: partial maxima combined by add."""
    def body() -> list[str]:
        for n, k in _TILINGS:
            x = _syms("x", n)
            acc = sp.Integer(0)
            for tile in _tiles(n, k):
                acc = acc + sp.Add(*(x[i] for i in tile))
            assert_equal(acc, sp.Add(*x), f"tiled sum n={n}, k={k}")
            xz = z3.Reals(" ".join(f"x{i}" for i in range(n)))
            run = None
            for tile in _tiles(n, k):
                part = _z3_max(xz[i] for i in tile)
                if run is None:
                    run = part  # max's identity -inf: the first tile starts the state
                elif max_combine == "max":
                    run = z3.If(part > run, part, run)
                else:
                    run = run + part
            assert_valid(run == _z3_max(xz), f"tiled max n={n}, k={k}")
        return [(f"sum and max over n elements equal the tile-by-tile update for (n, k) in {list(_TILINGS)} "
                "(sympy for sum, z3 over the reals for max)")]
    return body


def _online_softmax(rescale_o: bool) -> Callable[[], list[str]]:
    """The (m, l, o) recurrence with arbitrary running shifts gives exactly softmax(x) @ v.

    The shifts m_1..m_T are free symbols: the identity does not need them to be
    the maxima (z3 separately shows the running max is the max and keeps every
    exponent <= 0). v has two columns, so o is a row vector as in attention;
    v stands for any cofactor of exp(x - m) in a streamed sum.
    Wrong variant: o is not rescaled by exp(m - m').
    """
    def body() -> list[str]:
        for n_tiles, k in ((2, 2), (3, 2)):
            n = n_tiles * k
            x = _syms("x", n)
            v = [[sp.Symbol(f"v{i}_{c}", real=True) for c in range(2)] for i in range(n)]
            shifts = _syms("m", n_tiles + 1)
            for name, e in (("exp", sp.exp), ("exp2", exp2)):
                m, l_, o = shifts[0], sp.Integer(0), [sp.Integer(0)] * 2
                for j, tile in enumerate(_tiles(n, k)):
                    m_new = shifts[j + 1]
                    alpha = e(m - m_new)
                    l_ = l_ * alpha + sp.Add(*(e(x[i] - m_new) for i in tile))
                    o = [(o[c] * alpha if rescale_o else o[c]) + sp.Add(*(e(x[i] - m_new) * v[i][c] for i in tile))
                         for c in range(2)]
                    m = m_new
                den = sp.Add(*(e(xi) for xi in x))
                for c in range(2):
                    direct = sp.Add(*(e(x[i]) * v[i][c] for i in range(n))) / den
                    assert_equal(o[c] / l_, direct, f"{name}, {n_tiles} tiles of {k}, column {c}")
        # with m the running max: it ends at the global max, never decreases, bounds every exponent
        xz = z3.Reals(" ".join(f"x{i}" for i in range(6)))
        run: list[z3.ArithRef] = []
        for tile in _tiles(6, 2):
            part = _z3_max(xz[i] for i in tile)
            run.append(part if not run else z3.If(part > run[-1], part, run[-1]))
        facts = [run[-1] == _z3_max(xz)]
        facts += [run[j] <= run[j + 1] for j in range(len(run) - 1)]
        facts += [xz[i] <= run[j] for j, tile in enumerate(_tiles(6, 2)) for i in tile]
        assert_valid(z3.And(*facts), "running max")
        return [("o/l of the rescaled (m, l, o) recurrence = softmax(x) @ v for 2 and 3 tiles of 2, "
                "two v columns, arbitrary shifts, exp and exp2"),
                "z3: running max ends at max(x), is monotone, bounds every exponent (alpha, p <= 1)"]
    return body


def _sym_matrix(name: str, rows: int, cols: int) -> sp.Matrix:
    return sp.Matrix(rows, cols, lambda i, j: sp.Symbol(f"{name}{i}_{j}", real=True))


def _assert_matrices_equal(a: sp.Matrix, b: sp.Matrix, what: str) -> None:
    for (i, j) in itertools.product(range(a.rows), range(a.cols)):
        assert_equal(a[i, j], b[i, j], f"{what}, entry ({i},{j})")


def _check_shared_operand_fusion() -> list[str]:
    m, n = 2, 2
    for d, k in ((4, 2), (6, 3)):
        x, w1, w2 = _sym_matrix("X", m, d), _sym_matrix("A", d, n), _sym_matrix("B", d, n)
        acc1, acc2 = sp.zeros(m, n), sp.zeros(m, n)
        for tile in _tiles(d, k):
            xt = x[:, tile.start:tile.stop]  # loaded once, used by both products
            acc1 += xt * w1[tile.start:tile.stop, :]
            acc2 += xt * w2[tile.start:tile.stop, :]
        _assert_matrices_equal(acc1, x * w1, f"shared left, first product, d={d}, k={k}")
        _assert_matrices_equal(acc2, x * w2, f"shared left, second product, d={d}, k={k}")
        x1, x2, w = _sym_matrix("P", m, d), _sym_matrix("Q", m, d), _sym_matrix("W", d, n)
        acc1, acc2 = sp.zeros(m, n), sp.zeros(m, n)
        for tile in _tiles(d, k):
            wt = w[tile.start:tile.stop, :]
            acc1 += x1[:, tile.start:tile.stop] * wt
            acc2 += x2[:, tile.start:tile.stop] * wt
        _assert_matrices_equal(acc1, x1 * w, f"shared right, first product, d={d}, k={k}")
        _assert_matrices_equal(acc2, x2 * w, f"shared right, second product, d={d}, k={k}")
    return [("one loop over tiles of the contracted axis with the shared operand's tile loaded once "
            "gives both products exactly (shared left or right operand, d/k = 4/2, 6/3)")]


def _shared_accumulator(keep: bool) -> Callable[[], list[str]]:
    """X @_d W + Y @_d V accumulated in one tile over tiles of d equals the sum. Wrong: each step's
    second product overwrites the tile (a GEMM that clears the accumulator it shares)."""
    def body() -> list[str]:
        m, n = 2, 2
        for d, k in ((4, 2), (6, 3)):
            x, w = _sym_matrix("X", m, d), _sym_matrix("W", d, n)
            y, v = _sym_matrix("Y", m, d), _sym_matrix("V", d, n)
            acc = sp.zeros(m, n)
            for tile in _tiles(d, k):
                acc += x[:, tile.start:tile.stop] * w[tile.start:tile.stop, :]
                second = y[:, tile.start:tile.stop] * v[tile.start:tile.stop, :]
                acc = acc + second if keep else second
            _assert_matrices_equal(acc, x * w + y * v, f"one accumulator for both products, d={d}, k={k}")
        return [("both products added into one tile step by step give their sum exactly (d/k = 4/2, 6/3)")]
    return body


def _reduction_in_loop(accumulate: bool) -> Callable[[], list[str]]:
    """sum_d X^2 accumulated inside X @_d W's loop equals the direct sum. Wrong: reset per tile."""
    def body() -> list[str]:
        m, n = 2, 2
        for d, k in ((4, 2), (6, 3), (6, 2)):
            x, w = _sym_matrix("X", m, d), _sym_matrix("W", d, n)
            acc, ss = sp.zeros(m, n), [sp.Integer(0)] * m
            for tile in _tiles(d, k):
                xt = x[:, tile.start:tile.stop]
                acc += xt * w[tile.start:tile.stop, :]
                part = [sp.Add(*(xt[r, c] ** 2 for c in range(xt.cols))) for r in range(m)]
                ss = [(ss[r] if accumulate else 0) + part[r] for r in range(m)]
            _assert_matrices_equal(acc, x * w, f"contraction, d={d}, k={k}")
            for r in range(m):
                assert_equal(ss[r], sp.Add(*(x[r, c] ** 2 for c in range(d))), f"sum of squares, d={d}, k={k}, row {r}")
        return [("sum_d X^2 accumulated from the contraction loop's X tiles equals the direct sum, and the "
                "contraction is unchanged (d/k = 4/2, 6/3, 6/2)")]
    return body


def _product_law(law: str, op: str) -> Callable[[], list[str]]:
    """Commutativity or associativity of an elementwise op on symbolic reals (mul: the rules;
    div and sub: the wrong variants, which must be refuted)."""
    def f(x: sp.Expr, y: sp.Expr) -> sp.Expr:
        return ELEMENTWISE[op].sympy(sp, x, y)

    def body() -> list[str]:
        a, b, c = _syms("a", 3)
        if law == "comm":
            assert_equal(f(a, b), f(b, a), f"{op}(a, b) = {op}(b, a)")
            return [f"{op}(a, b) = {op}(b, a) for symbolic reals"]
        assert_equal(f(f(a, b), c), f(a, f(b, c)), f"{op}({op}(a, b), c) = {op}(a, {op}(b, c))")
        return [f"{op}({op}(a, b), c) = {op}(a, {op}(b, c)) for symbolic reals"]
    return body


def _check_elementwise_mul_comm() -> list[str]:
    shown = _product_law("comm", "mul")()
    sizes = {"i": 2, "a": 3}
    x, y, s = inp("X", ("i", "a")), inp("Y", ("i", "a")), inp("s", ("i",))
    assert_rule_instance("elementwise_mul_comm", binary("mul", x, y), sizes, "same axes")
    assert_rule_instance("elementwise_mul_comm", binary("mul", s, x), sizes, "broadcast operand first")
    if RULES["elementwise_mul_comm"].apply(binary("mul", x, inp("g", ("a",)))) is not None:
        raise _Refuted("commuting X[i,a] * g[a] would reorder the axes to (a, i); the rule must decline")
    return shown + ["rule.apply on same-axis and broadcast instances equals the input term",
                    "declines where the swap would reorder the axes"]


def _check_elementwise_mul_assoc() -> list[str]:
    shown = _product_law("assoc", "mul")()
    sizes = {"i": 2, "a": 3, "j": 2}
    x, s, g, w = inp("X", ("i", "a")), inp("s", ("i",)), inp("g", ("a",)), inp("W", ("a", "j"))
    assert_rule_instance("elementwise_mul_assoc", binary("mul", binary("mul", x, s), g), sizes, "broadcast factors")
    for written in (binary("mul", binary("mul", x, s), g), binary("mul", x, binary("mul", g, s))):
        root = matmul(written, w, "a")
        canon = canonical_products(Graph("p", sizes, (("out", root),)))
        if canon is None:
            raise _Unproved(f"canonical_products left {root} as written")
        assert_terms_equal(root, canon[0].outputs[0][1], sizes, "canonical factor order")
    return shown + ["rule.apply on (X * s) * g equals the input term",
                    "canonical_products of ((X * s) * g) @ W and (X * (g * s)) @ W equals the input"]
def _masked_tile_skip(slack: int) -> Callable[[], list[str]]:
    """Skipping the tiles the loop bounds leave out changes no state.

    1. sympy: the online-softmax state (m, l, o) updated with a tile whose every score is -inf equals
       the state without that tile (its max is -inf, its exponentials 0, its rescale factor 1).
    2. z3, over symbolic block coordinates, block sizes and window: for the causal, sliding-window
       and prefix-LM predicates, every loop step outside ``pyrunner.plan.masks.step_range``'s bounds
       has the predicate false at every element of its tile, and ``tile_test``'s all-true proof
       implies the predicate at every element. Wrong variant: the upper bound lowered by ``slack``.
    """
    def body() -> list[str]:
        from pyrunner.plan import masks
        from pyrunner.plan.schema import Call, Const, Index

        v = _syms("v", 2)
        m0, l0, o0 = sp.Symbol("m0", real=True), sp.Symbol("l0", positive=True), sp.Symbol("o0", real=True)
        hidden = [-sp.oo, -sp.oo]
        m1 = sp.Max(m0, *hidden)
        alpha = sp.exp(m0 - m1)
        l1 = l0 * alpha + sp.Add(*(sp.exp(h - m1) for h in hidden))
        o1 = o0 * alpha + sp.Add(*(sp.exp(h - m1) * vi for h, vi in zip(hidden, v)))
        assert_equal(m1, m0, "masked tile: running max unchanged")
        assert_equal(l1, l0, "masked tile: denominator unchanged")
        assert_equal(o1, o0, "masked tile: output unchanged")

        ar = _Z3Arith()
        qb, kb, q_blk, step = z3.Ints("block_q block_kv q_blk step")
        qi, ki = z3.Ints("q kv")
        kv, tq = Index(axis="kv"), Index(axis="q")
        preds = {
            "causal": (Call(fn="le", args=[kv, tq]), qi >= ki),
            "sliding": (Call(fn="min", args=[Call(fn="le", args=[kv, tq]),
                                             Call(fn="lt", args=[Call(fn="sub", args=[tq, Const(value=7)]), kv])]),
                        z3.And(ki <= qi, qi - 7 < ki)),
            "prefix": (Call(fn="max", args=[Call(fn="le", args=[kv, tq]), Call(fn="lt", args=[kv, Const(value=5)])]),
                       z3.Or(ki <= qi, ki < 5)),
        }
        steps = z3.Int("steps")
        for name, (expr, meaning) in preds.items():
            pred = masks.predicate(expr)
            q_lo = q_blk * qb
            box = {"q": (q_lo, q_lo + qb - 1)}
            lo, hi = masks.step_range(pred, "kv", kb, steps, box, ar)
            hi = hi - slack
            in_tile = z3.And(q_lo <= qi, qi <= q_lo + qb - 1, step * kb <= ki, ki <= step * kb + kb - 1)
            assume = z3.And(qb >= 1, kb >= 1, q_blk >= 0, step >= 0, step < steps, ki >= 0, qi >= 0)
            outside = z3.Or(step < lo, step >= hi)
            assert_valid(z3.Implies(z3.And(assume, outside, in_tile), z3.Not(meaning)),
                         f"{name}: steps outside the loop bounds are fully masked")
            test = masks.tile_test(pred, {**box, "kv": (step * kb, step * kb + kb - 1)}, ar)
            if test.all_true is not None:
                assert_valid(z3.Implies(z3.And(assume, test.all_true <= 0, in_tile), meaning),
                             f"{name}: a tile proven all-visible has every element visible")
            if test.all_false is not None:
                assert_valid(z3.Implies(z3.And(assume, test.all_false > 0, in_tile), z3.Not(meaning)),
                             f"{name}: a tile proven all-masked has every element masked")
        return ["sympy: a tile of -inf scores leaves the online-softmax state (m, l, o) unchanged",
                "z3: for causal, sliding-window (w=7) and prefix-LM (5) predicates over symbolic block sizes and "
                "coordinates, steps outside the derived loop bounds are fully masked, and the all-visible and "
                "all-masked tile tests are sound"]
    return body


class _Z3Arith:
    """``pyrunner.plan.masks`` bound formulas over z3 integers (z3's div floors for positive divisors)."""

    def const(self, v: int) -> z3.ArithRef:
        return z3.IntVal(v)

    def add(self, a, b):
        return a + b

    def scale(self, a, k: int):
        return a * k

    def mul(self, a, b):
        return a * b

    def floordiv(self, a, k):
        return a / k

    def max(self, a, b):
        return z3.If(a >= b, a, b)

    def min(self, a, b):
        return z3.If(a <= b, a, b)


# --- registries -------------------------------------------------------------------------

ALL_SIZES = ("exp_to_exp2", "mean_to_sum_div", "elementwise_mul_comm", "elementwise_mul_assoc",
             "variance_sum_of_squares", "exp_shift_to_max")
"""Rules whose check is shown for symbolic x and n (every size; the elementwise laws and the shift
exchange pointwise).
The other checks evaluate both sides at the fixed sizes they name (n = 2..4 elements or tiles,
2x3 and 3x3 matrices, ...): evidence that catches wrong rules (``WRONG_VARIANTS``), not proofs for all sizes; the Lean
theorems are the proofs."""


def _scoped(name: str, body: Callable[[], list[str]]) -> Callable[[], CheckResult]:
    """Run a rule's check; its detail starts by saying whether it holds for all sizes or fixed ones."""
    def run() -> CheckResult:
        res = _run(body)
        scope = "for all sizes" if name in ALL_SIZES else "at fixed sizes"
        return CheckResult(res.ok, f"{scope}: {res.detail}") if res.ok else res
    return run


def _merge_axes(transposed: bool) -> Callable[[], list[str]]:
    """The merged index map is a bijection (every split of extents up to 6 x 6), and grouped-query
    attention evaluated on the merged graph is the source graph's output reshaped. Wrong variant:
    the caller's tensors reshaped with the two axes swapped (inner-major), which the rule does not say."""
    def body() -> list[str]:
        import numpy as np

        from pyrunner.ir.graph import GraphBuilder
        from pyrunner.ir.merge_axes import merge_all
        from pyrunner.ir.reference import evaluate, random_inputs

        for na, nb in itertools.product(range(1, 7), repeat=2):
            for j, ll in itertools.product(range(na), range(nb)):
                k = ll * na + j if transposed else j * nb + ll
                if divmod(k, nb) != (j, ll):
                    raise _Refuted(f"index {(j, ll)} of a {na} x {nb} merge maps to {k}, which splits back "
                                   f"to {divmod(k, nb)}")
        gb = GraphBuilder("gqa")
        q = gb.input("Q", h=2, g=3, t=4, d=5)
        k_, v = gb.input("K", h=2, s=6, d=5), gb.input("V", h=2, s=6, d=5)
        gb.output("O", gb.matmul(gb.softmax(gb.matmul(q, k_, contract="d"), axis="s"), v, contract="s"))
        src = gb.build()
        merged, merges = merge_all(src)
        if [m.parts for m in merges] != [("g", "t")]:
            raise _Unproved(f"expected the query group and row axes to merge, got {merges}")
        x = random_inputs(src, 7)
        qm = x["Q"].transpose(0, 2, 1, 3) if transposed else x["Q"]
        out = evaluate(merged, {**x, "Q": qm.reshape(2, 12, 5)})["O"]
        back = out.reshape(2, 4, 3, 5).transpose(0, 2, 1, 3) if transposed else out.reshape(2, 3, 4, 5)
        err = float(np.max(np.abs(back - evaluate(src, x)["O"])))
        if err > 1e-12:
            raise _Refuted(f"grouped-query attention on the merged graph differs by {err:.3g}")
        # a pair contraction (an output projection over heads and head dims): one contraction merged
        gb = GraphBuilder("heads_out")
        o, w = gb.input("O", t=4, h=3, d=5), gb.input("W", h=3, d=5, n=6)
        gb.output("Y", gb.reduce("sum", gb.matmul(o, w, contract="d"), axis="h"))
        src = gb.build()
        merged, merges = merge_all(src)
        if [m.parts for m in merges] != [("h", "d")]:
            raise _Unproved(f"expected the head and head-dim axes to merge, got {merges}")
        x = random_inputs(src, 8)
        got = evaluate(merged, {"O": x["O"].reshape(4, 15), "W": x["W"].reshape(15, 6)})["Y"]
        err = float(np.max(np.abs(got - evaluate(src, x)["Y"])))
        if err > 1e-12:
            raise _Refuted(f"the pair contraction on the merged graph differs by {err:.3g}")
        return ["(j, l) -> j * nb + l splits back to (j, l) for every na, nb <= 6",
                "grouped-query attention on the merged (group, t) axis equals the source graph reshaped",
                "sum_h(O @_d W) equals one contraction over the merged (h, d) axis"]
    return body


def _unit_axis(extent: int) -> Callable[[], list[str]]:
    """An axis of extent 1 inserted into an input moves no element (every offset up to 6 x 6), and
    batched decode attention evaluated with the axis on its query is the source graph's output with
    the axis on it. Wrong variant: the inserted axis read at extent 2, which moves every row but the
    first."""
    def body() -> list[str]:
        import numpy as np

        from pyrunner.ir.graph import GraphBuilder
        from pyrunner.ir.reference import evaluate, random_inputs
        from pyrunner.ir.unit_axes import add_unit, unit_candidate

        for nj, nl in itertools.product(range(1, 7), repeat=2):
            for j, ll in itertools.product(range(nj), range(nl)):
                if (j * extent + 0) * nl + ll != j * nl + ll:
                    raise _Refuted(f"element {(j, 0, ll)} with a unit axis of extent {extent} sits at "
                                   f"{(j * extent) * nl + ll}, not at its source offset {j * nl + ll}")
        gb = GraphBuilder("decode")
        q = gb.input("Q", b=2, h=3, d=5)
        k_, v = gb.input("K", b=2, h=3, t=6, d=5), gb.input("V", b=2, h=3, t=6, d=5)
        gb.output("O", gb.matmul(gb.softmax(gb.matmul(q, k_, contract="d"), axis="t"), v, contract="t"))
        src = gb.build()
        unit = unit_candidate(src)
        if unit is None or [n for n, _ in unit.inputs] != ["Q"]:
            raise _Unproved(f"expected the query to take a unit axis, got {unit}")
        widened = add_unit(src, unit)
        x = random_inputs(src, 7)
        out = evaluate(widened, {**x, "Q": x["Q"].reshape(2, 3, 1, 5)})["O"]
        err = float(np.max(np.abs(out.reshape(2, 3, 5) - evaluate(src, x)["O"])))
        if err > 1e-12:
            raise _Refuted(f"decode attention with a unit query axis differs by {err:.3g}")
        return ["(j, 0, l) -> (j * 1 + 0) * nl + l is j * nl + l for every nj, nl <= 6",
                "batched decode attention with a unit axis on Q equals the source graph, same bytes"]
    return body


def _split_reduction(rescale: bool) -> Callable[[], list[str]]:
    """Chunks reduced under their own shifts, rescaled to a common one and summed, equal the unsplit sums.

    1. sympy: for 2 and 3 chunks of 2 keys, arbitrary per-chunk shifts m_c and a free common shift M,
       sum_c E(m_c - M) * sum_{j in c} E(x_j - m_c) * v_j = sum_j E(x_j - M) * v_j (v = 1: the
       denominator), E in exp, exp2.
    2. numpy: ``ir.split_axes.split`` of grouped-query attention (max-shifted and as written), of a
       split-K product and of an RMS-normalised product (the row scale needs every chunk, so it is taken
       out of each chunk's contraction) evaluates to the source graph's outputs.
    Wrong variant: the chunks summed without the rescale factor E(m_c - M).
    """
    def body() -> list[str]:
        import numpy as np

        from pyrunner.ir.graph import GraphBuilder
        from pyrunner.ir.reference import evaluate, random_inputs
        from pyrunner.ir.split_axes import split
        from pyrunner.plan.views import View, to_plan_layout
        from pyrunner.rules.registry import RULES, iter_rewrites

        for n_chunks, k in ((2, 2), (3, 2)):
            x, v = _syms("x", n_chunks * k), _syms("v", n_chunks * k)
            shifts, big = _syms("m", n_chunks), sp.Symbol("M", real=True)
            for name, e in (("exp", sp.exp), ("exp2", exp2)):
                for what, w in (("denominator", [sp.Integer(1)] * len(v)), ("output", v)):
                    combined = sp.Add(*((e(shifts[c] - big) if rescale else 1)
                                        * sp.Add(*(e(x[i] - shifts[c]) * w[i] for i in tile))
                                        for c, tile in enumerate(_tiles(n_chunks * k, k))))
                    direct = sp.Add(*(e(x[i] - big) * w[i] for i in range(n_chunks * k)))
                    assert_equal(combined, direct, f"{name}, {n_chunks} chunks of {k}, {what}")
        if not rescale:
            return ["unreachable: the unrescaled sum was accepted"]
        gb = GraphBuilder("gqa")
        q = gb.input("Q", h=2, t=3, d=5)
        k_, vv = gb.input("K", h=2, s=8, d=5), gb.input("V", h=2, s=8, d=5)
        gb.output("O", gb.matmul(gb.softmax(gb.matmul(q, k_, contract="d"), axis="s"), vv, contract="s"))
        attention = gb.build()
        shifted = next(g2 for g2, _ in iter_rewrites(attention, RULES["softmax_max_shift"]))
        gb = GraphBuilder("norm_matmul")
        xx, ww = gb.input("X", m=3, d=8), gb.input("W", d=8, n=4)
        gb.output("Y", gb.matmul(gb.rmsnorm(xx, axis="d"), ww, contract="d"))
        normed = gb.build()
        gb = GraphBuilder("split_k")
        gb.output("C", gb.matmul(gb.input("A", m=3, k=8), gb.input("B", k=8, n=2), contract="k"))
        cases = [(attention, "s"), (shifted, "s"), (normed, "d"), (gb.build(), "k")]
        for g, axis in cases:
            for chunks in (2, 4):
                gs, s = split(g, axis, chunks)
                x = random_inputs(g, 11)
                written = {t.name: t.axes for t in g.inputs()}  # the caller's tensors, viewed as chunks
                xs = {t.name: to_plan_layout(x[t.name], written[t.name], t.axes, View(splits=(s,)))
                      for t in gs.inputs()}
                ref, got = evaluate(g, x), evaluate(gs, xs)
                err = max(float(np.max(np.abs(ref[n] - got[n]))) for n in ref)
                if err > 1e-12:
                    raise _Refuted(f"{g.name} split {s.describe()} into {chunks} differs by {err:.3g}")
        return ["sympy: 2 and 3 chunks of 2 keys, arbitrary chunk shifts and common shift, exp and exp2: the "
                "rescaled chunk sums (denominator and output) equal the direct sums",
                "numpy: attention (as written and max-shifted), an RMS-normalised product and a split-K product, "
                "split into 2 and 4 chunks, equal the source graph"]
    return body


RULE_CHECKS: dict[str, Callable[[], CheckResult]] = {
    "softmax_max_shift": _scoped("softmax_max_shift", _check_softmax_max_shift),
    "softmax_scaled_max_shift": _scoped("softmax_scaled_max_shift", _check_softmax_scaled_max_shift),
    "matmul_div_commute": _scoped("matmul_div_commute", _check_matmul_div_commute),
    "matmul_row_scale_commute": _scoped("matmul_row_scale_commute", _check_matmul_row_scale_commute),
    "exp_to_exp2": _scoped("exp_to_exp2", _check_exp_to_exp2),
    "mean_to_sum_div": _scoped("mean_to_sum_div", _check_mean_to_sum_div),
    "variance_sum_of_squares": _scoped("variance_sum_of_squares", _check_variance_sum_of_squares),
    "reduction_tiling": _scoped("reduction_tiling", _reduction_tiling("max")),
    "online_softmax_rescale": _scoped("online_softmax_rescale", _online_softmax(rescale_o=True)),
    "shared_operand_fusion": _scoped("shared_operand_fusion", _check_shared_operand_fusion),
    "reduction_in_contraction_loop": _scoped("reduction_in_contraction_loop", _reduction_in_loop(accumulate=True)),
    "elementwise_mul_comm": _scoped("elementwise_mul_comm", _check_elementwise_mul_comm),
    "elementwise_mul_assoc": _scoped("elementwise_mul_assoc", _check_elementwise_mul_assoc),
    "masked_tile_skip": _scoped("masked_tile_skip", _masked_tile_skip(slack=0)),
    "merge_axes": _scoped("merge_axes", _merge_axes(transposed=False)),
    "unit_axis": _scoped("unit_axis", _unit_axis(extent=1)),
    "split_reduction": _scoped("split_reduction", _split_reduction(rescale=True)),
    "matmul_assoc": _scoped("matmul_assoc", _matmul_assoc(tie_shared_axis=False)),
    "matmul_as_sum": _scoped("matmul_as_sum", _matmul_as_sum(product_of_sums=False)),
    "exp_shift_to_max": _scoped("exp_shift_to_max", _exp_shift_to_max(flip_second=False)),
    "sum_scale_commute": _scoped("sum_scale_commute", _sum_scale_commute(scale_on_summed_axis=False)),
    "shared_accumulator": _scoped("shared_accumulator", _shared_accumulator(keep=True)),
}

WRONG_VARIANTS: dict[str, Callable[[], CheckResult]] = {
    "row_scale_column_scale": lambda: _run(_matmul_scale_identity("mul", True)),
    "delayed_norm_contracted_l": lambda: _run(_matmul_scale_identity("div", True)),
    "online_softmax_no_rescale_o": lambda: _run(_online_softmax(rescale_o=False)),
    "max_shift_per_element": lambda: _run(_softmax_shift_identity(True)),
    "tiled_max_combined_by_add": lambda: _run(_reduction_tiling("add")),
    "reduction_in_loop_reset": lambda: _run(_reduction_in_loop(accumulate=False)),
    "division_commuted": lambda: _run(_product_law("comm", "div")),
    "subtraction_reassociated": lambda: _run(_product_law("assoc", "sub")),
    "masked_tile_skip_bound_too_tight": lambda: _run(_masked_tile_skip(slack=1)),
    "variance_mean_not_squared": lambda: _run(_variance_identity(False)),
    "merge_axes_inner_major": lambda: _run(_merge_axes(transposed=True)),
    "unit_axis_extent_two": lambda: _run(_unit_axis(extent=2)),
    "split_reduction_no_rescale": lambda: _run(_split_reduction(rescale=False)),
    "matmul_as_product_of_sums": lambda: _run(_matmul_as_sum(product_of_sums=True)),
    "matmul_assoc_shared_axis": lambda: _run(_matmul_assoc(tie_shared_axis=True)),
    "exp_shift_reversed": lambda: _run(_exp_shift_to_max(flip_second=True)),
    "sum_scale_along_summed_axis": lambda: _run(_sum_scale_commute(scale_on_summed_axis=True)),
    "shared_accumulator_overwritten": lambda: _run(_shared_accumulator(keep=False)),
}

assert set(RULE_CHECKS) == set(RULE_NAMES), "every rule needs a symbolic check"


def check_rule(name: str) -> CheckResult:
    """Run the symbolic check of rule `name` (RuleError if there is no such rule)."""
    check = RULE_CHECKS.get(name)
    if check is None:
        raise RuleError(f"no rule {name!r} to check; known rules: {', '.join(RULE_NAMES)}")
    return check()


def check_rewrite(lhs: Term, rhs: Term, sizes: dict[str, int]) -> CheckResult:
    """Check any claimed rewrite lhs -> rhs at these sizes with the same machinery (e.g. a wrong one)."""
    def body() -> list[str]:
        assert_terms_equal(lhs, rhs, sizes, f"{lhs} -> {rhs}")
        return [f"{lhs} = {rhs} at sizes {sizes}"]
    return _run(body)


__all__ = [
    "RULE_CHECKS",
    "ALL_SIZES",
    "WRONG_VARIANTS",
    "CheckResult",
    "assert_equal",
    "assert_valid",
    "check_rewrite",
    "check_rule",
    "sym_evaluate",
]
