"""The op table: every operation of the graph IR, declared once.

Each elementwise op and reduction carries everything the pipeline needs to know about it: its
arity, its float64 numpy meaning (the reference interpreter; the CPU plan executor runs the same
function in float32), its PyTorch form (the baselines), its TileLang emission (the renderer), its
symbolic meaning (sympy, for the rule checks), its cost class (the planner) and the name of its
Lean constructor (``Superopt/Graph.lean``). Adding an op is one entry here plus its Lean
constructor; ``tests/test_ops.py`` fails when an entry lacks a field or its forms disagree.

``TERM_KINDS`` describes the term constructors themselves (input, const, axis size, unary,
binary, reduce, matmul): their Lean name, operand count and shape rule (the named axes of the
result given the operands' axes). Sympy is never imported here: symbolic forms receive the
``sympy`` module as their first argument, so the runtime does not depend on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

_GELU_C = math.sqrt(2.0 / math.pi)


@dataclass(frozen=True)
class Elementwise:
    """A unary or binary elementwise function on scalars, broadcast by axis name.

    ``torch`` and ``tilelang`` are source templates with ``{0}`` (and ``{1}``) for the operands.
    With ``helper`` set, ``tilelang`` is instead the return expression (in ``x``) of a
    module-level helper ``def <name>(x)`` that the rendered code calls, documented by ``doc``.
    ``torch_scalar`` (binary ops only, may be empty) is the form used when one operand is a
    Python number, with ``{t}`` for the tensor and ``{c}`` for the number.
    """

    name: str
    arity: int
    doc: str
    numpy: Callable[..., Any]
    torch: str
    tilelang: str
    helper: bool
    sympy: Callable[..., Any]
    lean: str
    sfu: bool
    """Costed as a transcendental evaluation (special-function unit)."""
    torch_scalar: str = ""
    commutative: bool = False
    """f(a, b) = f(b, a): a caller may order the operands (the frontend puts the one with more axes first, so the
    result's axes keep that operand's order: ``weight * x`` is stored as ``x`` is)."""

    def emit_tilelang(self, args: list[str]) -> str:
        """TileLang source applying this op to float32 operand expressions."""
        if self.helper:
            return f"{self.name}({', '.join(args)})"
        return self.tilelang.format(*args)


@dataclass(frozen=True)
class Reduction:
    """A reduction along one named axis.

    ``tile`` is the tile-level reduction the kernel plan uses for it (``mean`` is a ``sum``
    divided by the axis extent afterwards); ``identity`` initialises a streamed accumulator and
    ``combine`` (an elementwise op) merges a tile's partial result into it.
    """

    name: str
    doc: str
    numpy: Callable[[np.ndarray, int], np.ndarray]
    torch: str
    sympy: Callable[..., Any]
    lean: str
    tile: str
    identity: float
    combine: str


@dataclass(frozen=True)
class TermKind:
    """A term constructor of the graph IR: Lean name, operand count, and shape rule."""

    name: str
    lean: str
    arity: int
    axes: Callable[[Any, list[tuple[str, ...]]], tuple[str, ...]]
    """(term, operand axes) -> result axes, in canonical memory order."""


def _u(name: str, doc: str, numpy: Callable, torch: str, tilelang: str, sympy: Callable, sfu: bool,
       helper: bool = False) -> Elementwise:
    return Elementwise(name, 1, doc, numpy, torch, tilelang, helper, sympy, name, sfu)


def _b(name: str, doc: str, numpy: Callable, torch: str, tilelang: str, sympy: Callable,
       torch_scalar: str = "", commutative: bool = False) -> Elementwise:
    return Elementwise(name, 2, doc, numpy, torch, tilelang, False, sympy, name, False, torch_scalar, commutative)


UNARY: dict[str, Elementwise] = {op.name: op for op in (
    _u("exp", "e^x.", np.exp, "torch.exp({0})", "T.exp({0})", lambda sp, x: sp.exp(x), True),
    _u("exp2", "2^x.", np.exp2, "torch.exp2({0})", "T.exp2({0})", lambda sp, x: sp.exp(x * sp.log(2)), True),
    _u("log", "Natural logarithm.", np.log, "torch.log({0})", "T.log({0})", lambda sp, x: sp.log(x), True),
    _u("neg", "-x.", np.negative, "torch.neg({0})", "(-{0})", lambda sp, x: -x, False),
    _u("recip", "1 / x.", lambda x: 1.0 / x, "torch.reciprocal({0})", "return T.float32(1.0) / x",
       lambda sp, x: 1 / x, True, helper=True),
    _u("sqrt", "Square root.", np.sqrt, "torch.sqrt({0})", "T.sqrt({0})", lambda sp, x: sp.sqrt(x), True),
    _u("rsqrt", "1 / sqrt(x).", lambda x: 1.0 / np.sqrt(x), "torch.rsqrt({0})", "T.rsqrt({0})",
       lambda sp, x: 1 / sp.sqrt(x), True),
    _u("square", "x * x.", np.square, "torch.square({0})", "return x * x", lambda sp, x: x**2, False, helper=True),
    _u("silu", "x * sigmoid(x).", lambda x: x / (1.0 + np.exp(-x)), "F.silu({0})",
       "return x / (T.float32(1.0) + T.exp(-x))", lambda sp, x: x / (1 + sp.exp(-x)), True, helper=True),
    _u("sigmoid", "1 / (1 + exp(-x)).", lambda x: 1.0 / (1.0 + np.exp(-x)), "torch.sigmoid({0})",
       "return T.float32(1.0) / (T.float32(1.0) + T.exp(-x))", lambda sp, x: 1 / (1 + sp.exp(-x)), True,
       helper=True),
    _u("tanh", "Hyperbolic tangent.", np.tanh, "torch.tanh({0})", "T.tanh({0})", lambda sp, x: sp.tanh(x), True),
    _u("gelu", "Tanh-approximated gelu: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).",
       lambda x: 0.5 * x * (1.0 + np.tanh(_GELU_C * (x + 0.044715 * x**3))), "F.gelu({0}, approximate='tanh')",
       f"return T.float32(0.5) * x * (T.float32(1.0) + T.tanh(T.float32({_GELU_C!r})"
       " * (x + T.float32(0.044715) * x * x * x)))",
       lambda sp, x: sp.Rational(1, 2) * x * (1 + sp.tanh(sp.sqrt(2 / sp.pi) * (x + sp.Float(0.044715) * x**3))),
       True, helper=True),
    _u("relu", "max(x, 0).", lambda x: np.maximum(x, 0.0), "torch.relu({0})", "return T.max(x, T.float32(0.0))",
       lambda sp, x: sp.Max(x, 0), False, helper=True),
    _u("abs", "|x|.", np.abs, "torch.abs({0})", "T.abs({0})", lambda sp, x: sp.Abs(x), False),
    _u("softplus", "log(1 + exp(x)), as max(x, 0) + log1p(exp(-|x|)): large |x| cannot overflow, and at very "
       "negative x, where the result is exp(x) itself, 1 + exp(x) does not round to 1 (an Ampere sweep draw, "
       "run 147: at x near -16, 1.2e-7 came out 8.8e-8 off through log).",
       lambda x: np.logaddexp(0.0, x), "F.softplus({0})",
       "return T.max(x, T.float32(0.0)) + T.log1p(T.exp(-T.abs(x)))",
       lambda sp, x: sp.log(1 + sp.exp(x)), True, helper=True),
)}

BINARY: dict[str, Elementwise] = {op.name: op for op in (
    _b("add", "a + b.", np.add, "{0} + {1}", "({0} + {1})", lambda sp, a, b: a + b, commutative=True),
    _b("sub", "a - b.", np.subtract, "{0} - {1}", "({0} - {1})", lambda sp, a, b: a - b),
    _b("mul", "a * b.", np.multiply, "{0} * {1}", "({0} * {1})", lambda sp, a, b: a * b, commutative=True),
    _b("div", "a / b.", np.divide, "{0} / {1}", "({0} / {1})", lambda sp, a, b: a / b),
    _b("max", "The larger of a and b.", np.maximum, "torch.maximum({0}, {1})", "T.max({0}, {1})",
       lambda sp, a, b: sp.Max(a, b), "torch.clamp_min({t}, {c})", commutative=True),
    _b("min", "The smaller of a and b.", np.minimum, "torch.minimum({0}, {1})", "T.min({0}, {1})",
       lambda sp, a, b: sp.Min(a, b), "torch.clamp_max({t}, {c})", commutative=True),
    # comparisons: masks are built from them (min/max of their 0/1 values are and/or)
    _b("lt", "1.0 where a < b, else 0.0.", lambda a, b: np.less(a, b).astype(np.float64),
       "({0} < {1}).to(torch.float32)", "T.if_then_else({0} < {1}, T.float32(1.0), T.float32(0.0))",
       lambda sp, a, b: sp.Piecewise((1, sp.Lt(a, b)), (0, True))),
    _b("le", "1.0 where a <= b, else 0.0.", lambda a, b: np.less_equal(a, b).astype(np.float64),
       "({0} <= {1}).to(torch.float32)", "T.if_then_else({0} <= {1}, T.float32(1.0), T.float32(0.0))",
       lambda sp, a, b: sp.Piecewise((1, sp.Le(a, b)), (0, True))),
)}

COMPARISONS: tuple[str, ...] = ("lt", "le")
"""Binary ops whose value is a 0/1 predicate. Their torch form is float32 (index-domain operands such as
FlexAttention's q_idx give it no other dtype); the eager baseline casts the mask to the graph's dtype
(``run.baselines``), since a float32 mask times a 0-d float64 tensor stays float32 in torch."""

TERNARY: dict[str, Elementwise] = {op.name: op for op in (
    Elementwise("where", 3, "x where c != 0, else y: where(c, x, y) (a mask: y = -inf).",
                lambda c, x, y: np.where(c != 0, x, y), "torch.where({0} != 0, {1}, {2})",
                "T.if_then_else({0} != T.float32(0.0), {1}, {2})", False,
                lambda sp, c, x, y: sp.Piecewise((x, sp.Ne(c, 0)), (y, True)), "select", False),
)}
"""``where`` is ``select`` in Lean, where ``where`` is a keyword."""

ELEMENTWISE: dict[str, Elementwise] = {**UNARY, **BINARY, **TERNARY}
"""Every function a plan's Map expression may call (unary, binary and ternary names are disjoint)."""

REDUCTIONS: dict[str, Reduction] = {r.name: r for r in (
    Reduction("sum", "Sum along the axis.", lambda x, i: np.sum(x, axis=i), "{0}.sum(dim={1})",
              lambda sp, items: sp.Add(*items), "sum", "sum", 0.0, "add"),
    Reduction("max", "Maximum along the axis.", lambda x, i: np.max(x, axis=i), "{0}.amax(dim={1})",
              lambda sp, items: sp.Max(*items), "max", "max", -math.inf, "max"),
    Reduction("mean", "Sum along the axis divided by its extent.", lambda x, i: np.mean(x, axis=i),
              "{0}.mean(dim={1})", lambda sp, items: sp.Add(*items) / len(items), "mean", "sum", 0.0, "add"),
)}

TILE_REDUCTIONS: tuple[str, ...] = tuple(dict.fromkeys(r.tile for r in REDUCTIONS.values()))
"""Reductions a kernel plan's Reduce op performs on a tile (TileLang ``T.reduce_<fn>``)."""


def _union(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    return a + tuple(x for x in b if x not in a)


def _matmul_axes(t: Any, ops: list[tuple[str, ...]]) -> tuple[str, ...]:
    left = tuple(x for x in ops[0] if x != t.axis)
    return left + tuple(x for x in ops[1] if x != t.axis and x not in left)


TERM_KINDS: dict[str, TermKind] = {k.name: k for k in (
    TermKind("input", "input", 0, lambda t, ops: t.axes),
    TermKind("const", "const", 0, lambda t, ops: ()),
    TermKind("axis_size", "axisSize", 0, lambda t, ops: ()),
    TermKind("iota", "iota", 0, lambda t, ops: (t.axis,)),
    TermKind("unary", "unary", 1, lambda t, ops: ops[0]),
    TermKind("binary", "binary", 2, lambda t, ops: _union(ops[0], ops[1])),
    # the selected values' axes lead, so a mask keeps its scores' layout
    TermKind("ternary", "ternary", 3, lambda t, ops: _union(_union(ops[1], ops[2]), ops[0])),
    TermKind("reduce", "reduce", 1, lambda t, ops: tuple(x for x in ops[0] if x != t.axis)),
    TermKind("matmul", "matmul", 2, _matmul_axes),
)}

UNARY_OPS: tuple[str, ...] = tuple(UNARY)
BINARY_OPS: tuple[str, ...] = tuple(BINARY)
TERNARY_OPS: tuple[str, ...] = tuple(TERNARY)
REDUCE_OPS: tuple[str, ...] = tuple(REDUCTIONS)
LEAF_OPS: tuple[str, ...] = tuple(k for k, v in TERM_KINDS.items() if v.arity == 0)
ALL_OPS: tuple[str, ...] = tuple(TERM_KINDS)


def entry_fields(cls: type) -> list[str]:
    """The fields every table entry of ``cls`` must fill (for the completeness test)."""
    optional = {"torch_scalar"}
    return [f.name for f in fields(cls) if f.name not in optional]
