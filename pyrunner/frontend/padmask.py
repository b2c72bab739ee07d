"""Padding a softmax's axis (attention's keys) exactly: padded positions masked to -inf, never included.

A free axis (``buckets``) can be zero-padded as it is. An axis a softmax runs
over cannot: a padded key scores 0 and would take part in the softmax. This
module pads such an axis anyway, when it can prove the padded positions never
reach a kept value: with an input ``padmask_<axis>`` (1 at the real positions,
0 at the padded ones; ``mask_values``) it masks what a ``max`` over the axis
reads, or the argument of an ``exp`` a ``sum`` over the axis reads, in the IR's
own mask form ``where(padmask, x, -inf)`` (the input stays finite, as the
planner assumes of inputs, and the infinite constant is what its lowering
guards running maxima for), then checks every reduction and contraction over
the axis by a small abstract interpretation of the values at padded positions
(``_Pad``):

* inputs are zero-padded (the mask is 0 there: -inf is selected); constants are themselves;
  ``iota`` of the axis is a positive integer there; ``axis_size`` of it fails;
* an element-wise op maps the set of possible kinds (zero, finite non-zero,
  -inf, +inf, NaN) through representatives (0, +-1.5, +-1e300, +-1e-300, inf,
  NaN), so overflow and 0 * inf show up as the kinds they make;
* a ``sum`` or a contraction over the axis needs zero there (one operand of a
  contraction zero, the other finite), a ``max`` needs -inf, a ``mean`` fails.

At a real position the mask selects ``x`` itself, so the outputs at real positions
are exactly the unpadded graph's, provided the values the model computes
without the axis (a row's maximum, a scale) are finite -- where one is not, the
kept output is not finite either. The axis is then planned at its bucket size
(``bucket``: the next power of two below the tile, then the next multiple of
it), so a decode loop whose KV length grows by one each step shares one plan
per bucket.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pyrunner.ir import graph as ir
from pyrunner.ir.ops import BINARY, UNARY

MASK_PREFIX = "padmask_"
TILE = 64
ZERO, FIN, NEG, POS, NAN = "zero", "finite", "-inf", "+inf", "nan"
Kinds = frozenset
_REPS = {ZERO: (0.0, -0.0), FIN: (1.5, -1.5, 1e300, -1e300, 1e-300, -1e-300), NEG: (-math.inf,),
         POS: (math.inf,), NAN: (math.nan,)}
OK: Kinds = frozenset({ZERO, FIN})
"""What a value without the padded axis is taken to be (the model's own values, finite)."""


def bucket(n: int, tile: int = TILE) -> int:
    """A softmax axis rounds up to the next power of two below ``tile``, then to the next multiple of it: a
    decode loop's growing keys plan once per bucket (16, 32, 64, 128, 192, ...), a small softmax (8 experts
    of a router) stays as it is."""
    if n >= tile:
        return -(-n // tile) * tile
    return 1 << (n - 1).bit_length()


def mask_name(axis: str) -> str:
    return f"{MASK_PREFIX}{axis}"


def kind_of(v: float) -> str:
    if math.isnan(v):
        return NAN
    if math.isinf(v):
        return NEG if v < 0 else POS
    return ZERO if v == 0 else FIN


def _map(fn: Any, *sets: Kinds) -> Kinds:
    """The kinds ``fn`` gives on every combination of representatives of the argument kinds."""
    out: set[str] = set()
    with np.errstate(all="ignore"):
        stack: list[tuple[float, ...]] = [()]
        for s in sets:
            stack = [p + (v,) for p in stack for k in s for v in _REPS[k]]
        for p in stack:
            out.add(kind_of(float(fn(*(np.float64(v) for v in p)))))
    return frozenset(out)


def _closure_add(s: Kinds) -> Kinds:
    """What a sum of any number of values of kinds ``s`` can be."""
    add = BINARY["add"].numpy
    while True:
        t = s | _map(add, s, s)
        if t == s:
            return s
        s = t


class Unsafe(Exception):
    """Padding the axis would let a padded position reach a kept value (the term says where)."""

    def __init__(self, term: ir.Term, why: str) -> None:
        super().__init__(why)
        self.term = term


class _Pad:
    """Kinds of each term's values at positions where ``axis`` is padded (``OK`` where the term lacks the
    axis: then it is the model's own value)."""

    def __init__(self, axis: str) -> None:
        self.axis, self.memo, self.axes = axis, {}, {}

    def has(self, t: ir.Term) -> bool:
        return self.axis in ir.result_axes(t, self.axes)

    def of(self, t: ir.Term) -> Kinds:
        """Kinds at padded positions, or what a value without the axis is (``OK``; a constant exactly)."""
        k = self.memo.get(t)
        if k is None:
            for u in ir.subterms([t], lambda x: [a for a in x.args if a not in self.memo]):
                if u not in self.memo:
                    self.memo[u] = self._kinds(u)
            k = self.memo[t]
        return k

    def _kinds(self, t: ir.Term) -> Kinds:
        a = self.axis
        if t.op == "const":
            return frozenset({kind_of(t.value)})
        if t.op == "axis_size" and t.axis == a:
            raise Unsafe(t, f"the size of axis {a} is read")
        if t.op in ("reduce", "matmul") and t.axis == a:
            self._check_over_axis(t)
            return OK
        if not self.has(t):
            return OK  # the model's own value, the same at every padded position as at the real ones
        if t.op == "iota":
            return frozenset({FIN})  # n, n+1, ...
        if t.op == "input":
            return frozenset({ZERO})  # zero-padded (the mask input too: 0 means padded)
        args = [self.memo[x] for x in t.args]
        if t.op == "unary":
            return _map(UNARY[t.fn].numpy, *args)
        if t.op == "binary":
            if t.fn == "div" and not self.has(t.args[1]) and t.args[1].op != "const":
                args[1] = frozenset({FIN})  # a divisor the real positions share: 0 would make them inf/nan
            return _map(BINARY[t.fn].numpy, *args)
        if t.op == "ternary":  # where(c, x, y)
            c, x, y = args
            return (x if c - {ZERO} else frozenset()) | (y if ZERO in c else frozenset())
        if t.op == "reduce":  # over another axis
            return args[0] if t.fn == "max" else _closure_add(args[0])
        if t.op == "matmul":  # over another axis: a sum of products
            return _closure_add(_map(BINARY["mul"].numpy, *args))
        raise Unsafe(t, f"unknown op {t.op}")

    def _check_over_axis(self, t: ir.Term) -> None:
        """A reduction or contraction over the padded axis: the padded positions must add nothing."""
        a = self.axis
        if t.op == "reduce":
            x = self.memo[t.args[0]]
            need = {"sum": {ZERO}, "max": {NEG}}.get(t.fn)
            if need is None or not x <= need:
                raise Unsafe(t, f"{t.fn} over {a} would read padded values of kinds {sorted(x)}")
            return
        l, r = (self.memo[x] for x in t.args)
        if not ((l <= {ZERO} and r <= OK) or (r <= {ZERO} and l <= OK)):
            raise Unsafe(t, f"a contraction over {a} would read padded values ({sorted(l)} x {sorted(r)})")


def softmax_axes(graph: ir.Graph) -> set[str]:
    """Axes a ``max`` runs over, or a ``sum`` of an ``exp``: a softmax's (attention's keys)."""
    out = set()
    for t in ir.subterms(u for _, u in graph.outputs):
        if t.op == "reduce" and (t.fn == "max" or (t.fn == "sum" and t.args[0].op == "unary"
                                                   and t.args[0].fn == "exp")):
            out.add(t.axis)
    return out


def _substitute(graph: ir.Graph, old: ir.Term, new: ir.Term) -> ir.Graph:
    """``graph`` with every occurrence of ``old`` replaced by ``new`` (``new`` itself reads ``old``)."""
    memo: dict[ir.Term, ir.Term] = {old: new}
    for u in ir.subterms([t for _, t in graph.outputs], lambda x: [a for a in x.args if a not in memo]):
        if u not in memo:
            args = tuple(memo[a] for a in u.args)
            memo[u] = u if args == u.args else u.replace_args(args)
    outs = tuple((n, memo[t]) for n, t in graph.outputs)
    return ir.Graph(graph.name, graph.sizes, outs, {memo.get(t, t): v for t, v in graph.labels.items()})


def _target(t: ir.Term, axis: str) -> ir.Term | None:
    """Where the mask goes for the reduction ``t`` that failed: a ``max``'s operand, a ``sum``'s ``exp``'s."""
    if t.op != "reduce" or t.axis != axis:
        return None
    if t.fn == "max":
        return t.args[0]
    if t.fn == "sum" and t.args[0].op == "unary" and t.args[0].fn == "exp":
        return t.args[0].args[0]
    return None


def masked(graph: ir.Graph, axis: str, size: int) -> ir.Graph | None:
    """``graph`` with ``axis`` at ``size`` (> its size) and the mask added where the softmax reads it, or
    None when padding cannot be proved exact (an ``axis_size``, a ``mean``, a reduction the mask does not fix)."""
    mask = ir.inp(mask_name(axis), (axis,))
    g = graph
    for _ in range(16):  # each round masks one more reduction's operand
        try:
            pad = _Pad(axis)
            for _, t in g.outputs:
                pad.of(t)
        except Unsafe as e:
            at = _target(e.term, axis)
            if at is None:  # not a softmax's reduction: a mask cannot fix it
                return None
            g = _substitute(g, at, ir.where(mask, at, ir.const(-math.inf)))
            continue
        return g.with_sizes({axis: size})
    return None


def mask_values(n: int, size: int, like: Any) -> Any:
    """The mask input for an axis of real size ``n`` padded to ``size``: 1 then 0 (``like``'s dtype/device)."""
    import torch

    m = torch.zeros((size,), dtype=like.dtype, device=like.device)
    m[:n] = 1
    return m
