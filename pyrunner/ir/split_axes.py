"""Splitting a reduced axis into chunks reduced in two stages (split-K, flash-decoding).

A graph whose outputs are small and whose reduced or contracted axis is long leaves most SMs idle
when one block computes each output tile: a decode step's grouped-query attention (8 KV heads x 128
query rows against 4096 keys) fills 16 of 132 SMs. Splitting axis ``a`` (extent ``C * J``) into
chunks ``a_o`` (C of them) of ``a_i`` (J elements; element ``(c, j)`` is ``c * J + j``) lets each
chunk reduce in a block of its own, and a second, small reduction over ``a_o`` combine them:

* ``sum_a f = sum_{a_o} sum_{a_i} f`` (``max`` alike; ``mean`` too, the chunks being equal); a
  contraction over ``a`` is a sum over ``a_o`` of contractions over ``a_i``;
* ``E(s * (x - max_a x)) = E(s * (x - m_o)) * E(s * (m_o - M))`` for ``E`` in exp, exp2, with
  ``m_o = max_{a_i} x`` and ``M = max_{a_o} m_o``: the first factor is each chunk's own guarded
  exponential (its block keeps its online softmax); the second, free of ``a_i``, is taken out of
  the chunk's sums and contractions and rescales the chunk's partial result where the chunks are
  combined (the identity ``online_softmax_rescale`` uses across tiles, here across blocks).

No value changes (the Lean theorems ``split_reduction`` and, for exp/exp2 with a scale and weights,
``split_reduction_scaled``). Inputs carrying ``a`` are read as the row-major view ``(a_o, a_i)``; an
output may not carry ``a``, and no term may index ``a`` (``iota``).
A factor the split cannot take out of a chunk's sum (one that needs every chunk first) is left in:
the value is still right, and the planner prices the second pass it then needs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pyrunner.errors import GraphError
from pyrunner.ir.graph import Graph, Term, axis_size, binary, check, reduce, result_axes, subterms, unary
from pyrunner.ir.names import fresh_name, is_name

EXPONENTIALS = ("exp", "exp2")
SPLIT_REDUCTIONS = ("sum", "max", "mean")
"""Reductions that split into per-chunk and across-chunk stages of the same function."""


@dataclass(frozen=True)
class AxisSplit:
    """``axis`` = ``parts[0]`` (chunk, outer) x ``parts[1]`` (position in the chunk, inner)."""

    axis: str
    parts: tuple[str, str]
    sizes: tuple[int, int]

    def describe(self) -> str:
        return f"{self.axis} -> {self.parts[0]}, {self.parts[1]}"


def split_problem(g: Graph, axis: str, chunks: int) -> str | None:
    """Why ``axis`` of ``g`` cannot be split into ``chunks`` chunks (None when it can)."""
    if axis not in g.sizes:
        return f"{axis!r} is not an axis of the graph"
    if chunks < 2 or g.sizes[axis] % chunks:
        return f"{chunks} chunks do not divide axis {axis!r} of extent {g.sizes[axis]} into equal parts of 2 or more"
    memo: dict[Term, tuple[str, ...]] = {}
    for name, t in g.outputs:
        if axis in result_axes(t, memo):
            return f"output {name!r} carries axis {axis!r}"
    reduced = False
    for t in g.terms():
        if t.op == "iota" and t.axis == axis:
            return f"a term indexes axis {axis!r}"
        if t.op == "reduce" and t.axis == axis and t.fn not in SPLIT_REDUCTIONS:
            return f"a {t.fn} over {axis!r} does not split into chunks"
        reduced = reduced or (t.op in ("reduce", "matmul") and t.axis == axis)
    return None if reduced else f"nothing reduces or contracts axis {axis!r}"


def split_names(g: Graph, axis: str) -> tuple[str, str]:
    """Fresh names for the chunk and in-chunk axes of ``axis``."""
    chunk = fresh_name(f"{axis}_chunk", g.sizes, "chunk")
    return chunk, fresh_name(f"{axis}_in", {*g.sizes, chunk}, "chunk")


class _Splitter:
    """The operands-first rewrite of one graph's terms (one memo, so shared subterms stay shared)."""

    def __init__(self, s: AxisSplit) -> None:
        self.s = s
        self.new: dict[Term, Term] = {}
        self.late_memo: dict[Term, bool] = {}
        self.axes_memo: dict[Term, tuple[str, ...]] = {}

    def late(self, t: Term) -> bool:
        """Whether new term ``t`` needs every chunk (it depends on an across-chunk reduction)."""
        outer = self.s.parts[0]
        for u in subterms([t], lambda x: [a for a in x.args if a not in self.late_memo]):
            if u not in self.late_memo:
                self.late_memo[u] = (u.op in ("reduce", "matmul") and u.axis == outer) or any(
                    self.late_memo[a] for a in u.args)
        return self.late_memo[t]

    def factors(self, t: Term) -> tuple[list[Term], list[Term], list[Term]]:
        """``t`` as kept x pulled numerators / pulled divisors: a factor of its mul/div tree is pulled
        out of a chunk's sum when it needs every chunk and is free of the in-chunk axis."""
        if t.op == "binary" and t.fn == "mul":
            ka, na, da = self.factors(t.args[0])
            kb, nb, db = self.factors(t.args[1])
            return ka + kb, na + nb, da + db
        if t.op == "binary" and t.fn == "div":
            ka, na, da = self.factors(t.args[0])
            b = t.args[1]
            if self._pullable(b):
                return ka, na, da + [b]
            return [binary("div", _product(ka) or _one(), b)], na, da
        return ([], [t], []) if self._pullable(t) else ([t], [], [])

    def _pullable(self, t: Term) -> bool:
        return self.late(t) and self.s.parts[1] not in result_axes(t, self.axes_memo)

    def pulled(self, t: Term) -> tuple[Term, list[Term], list[Term]]:
        """``t`` = kept * prod(num) / prod(den), with the late factors out; ``t`` itself when none are."""
        keep, num, den = self.factors(t)
        if not num and not den:
            return t, [], []
        return (_product(keep) or _one()), num, den

    def outer(self, fn: str, inner_value: Term, num: list[Term], den: list[Term]) -> Term:
        """The across-chunk stage: the pulled factors applied to each chunk's value, then reduced over a_o."""
        x = inner_value
        for f in num:
            x = binary("mul", x, f)
        for f in den:
            x = binary("div", x, f)
        return reduce(fn, x, self.s.parts[0])

    def exponential(self, t: Term) -> Term | None:
        """E(s * (x - max_a x)) -> E(s * (x - m_o)) * E(s * (m_o - M)); None when t is not of that form.
        The scale path (negations, products, divisions of the difference) is rebuilt around both new
        differences: s * (x - m_o) + s * (m_o - M) = s * (x - M)."""
        path: list[tuple[Term, int]] = []
        x = t.args[0]
        while not (x.op == "binary" and x.fn == "sub"):
            if x.op == "unary" and x.fn == "neg":
                side = 0
            elif x.op == "binary" and x.fn in ("mul", "div"):
                side = 0 if _has_max_sub(x.args[0], self.s.axis) else 1
                if x.fn == "div" and side == 1:
                    return None
            else:
                return None
            path.append((x, side))
            x = x.args[side]
        if x.args[1] != reduce("max", x.args[0], self.s.axis):
            return None
        v = self.new[x.args[0]]
        m_chunk = reduce("max", v, self.s.parts[1])
        m_all = reduce("max", m_chunk, self.s.parts[0])
        own = unary(t.fn, self._rebuild(path, binary("sub", v, m_chunk)))
        rescale = unary(t.fn, self._rebuild(path, binary("sub", m_chunk, m_all)))
        return binary("mul", own, rescale)

    def _rebuild(self, path: list[tuple[Term, int]], core: Term) -> Term:
        x = core
        for node, side in reversed(path):
            if node.op == "unary":
                x = unary(node.fn, x)
            else:
                other = self.new[node.args[1 - side]]
                x = binary(node.fn, x, other) if side == 0 else binary(node.fn, other, x)
        return x

    def term(self, t: Term) -> Term:
        s = self.s
        if t.op == "input":
            return Term("input", name=t.name, axes=_split_axes(t.axes, s)) if s.axis in t.axes else t
        if t.op == "axis_size" and t.axis == s.axis:
            return binary("mul", axis_size(s.parts[0]), axis_size(s.parts[1]))
        if t.op == "unary" and t.fn in EXPONENTIALS:
            got = self.exponential(t)
            if got is not None:
                return got
        if not t.args:
            return t
        args = tuple(self.new[a] for a in t.args)
        if t.op == "reduce" and t.axis == s.axis:
            if t.fn == "max":
                return reduce("max", reduce("max", args[0], s.parts[1]), s.parts[0])
            kept, num, den = self.pulled(args[0])
            return self.outer(t.fn, reduce(t.fn, kept, s.parts[1]), num, den)
        if t.op == "matmul" and t.axis == s.axis:
            ka, na, da = self.pulled(args[0])
            kb, nb, db = self.pulled(args[1])
            return self.outer("sum", Term("matmul", (ka, kb), axis=s.parts[1]), na + nb, da + db)
        return t.replace_args(args)


def _has_max_sub(x: Term, axis: str) -> bool:
    """Whether the max-shifted difference x - max_axis(x) sits under x's mul/neg chain."""
    while True:
        if x.op == "binary" and x.fn == "sub":
            return x.args[1] == reduce("max", x.args[0], axis)
        if x.op == "unary" and x.fn == "neg":
            x = x.args[0]
        elif x.op == "binary" and x.fn in ("mul", "div"):
            x = x.args[0] if _has_max_sub(x.args[0], axis) else x.args[1]
        else:
            return False


def _one() -> Term:
    return Term("const", value=1.0)


def _product(xs: Sequence[Term]) -> Term | None:
    out: Term | None = None
    for x in xs:
        out = x if out is None else binary("mul", out, x)
    return out


def _split_axes(axes: Sequence[str], s: AxisSplit) -> tuple[str, ...]:
    out: list[str] = []
    for a in axes:
        out.extend(s.parts if a == s.axis else (a,))
    return tuple(out)


def split(g: Graph, axis: str, chunks: int, names: tuple[str, str] | None = None) -> tuple[Graph, AxisSplit]:
    """``g`` with ``axis`` split into ``chunks`` chunks reduced in two stages; GraphError where it cannot."""
    why = split_problem(g, axis, chunks)
    parts = names or split_names(g, axis)
    if why is None and (len(set(parts)) != 2 or any(p in g.sizes or not is_name(p) for p in parts)):
        why = f"the chunk axis names {list(parts)} are taken or not names"
    if why is not None:
        raise GraphError(f"cannot split axis {axis!r} of graph {g.name!r}: {why}")
    s = AxisSplit(axis, (parts[0], parts[1]), (chunks, g.sizes[axis] // chunks))
    return apply_split(g, s), s


def apply_split(g: Graph, s: AxisSplit) -> Graph:
    """``g`` with the split ``s`` applied (its names and extents as given); GraphError where it cannot."""
    why = split_problem(g, s.axis, s.sizes[0])
    if why is None and (s.sizes[0] * s.sizes[1] != g.sizes[s.axis] or any(p in g.sizes for p in s.parts)):
        why = f"{s.sizes[0]} x {s.sizes[1]} is not the extent {g.sizes[s.axis]}, or a part name is taken"
    if why is not None:
        raise GraphError(f"cannot split axis {s.axis!r} of graph {g.name!r}: {why}")
    sp = _Splitter(s)
    for t in g.terms():
        sp.new[t] = sp.term(t)
    sizes = {a: n for a, n in g.sizes.items() if a != s.axis}
    sizes.update(zip(s.parts, s.sizes, strict=True))
    labels = {sp.new[t]: lab for t, lab in g.labels.items() if t in sp.new}
    out = Graph(g.name, sizes, tuple((n, sp.new[t]) for n, t in g.outputs), labels)
    check(out)
    for (n, src), (_, dst) in zip(g.outputs, out.outputs, strict=True):
        if result_axes(dst) != result_axes(src):
            raise GraphError(f"cannot split axis {s.axis!r} of graph {g.name!r}: output {n!r} would change "
                             f"its axes to {list(result_axes(dst))}")
    return out


def source_axes(axes: Sequence[str], splits: Sequence[AxisSplit]) -> tuple[str, ...]:
    """A plan tensor's axes with every split's parts (adjacent, in order) read as the source axis;
    GraphError where a tensor stores the parts apart or reversed (no view of the source tensor)."""
    out = list(axes)
    for s in splits:
        if s.parts[0] not in out and s.parts[1] not in out:
            continue
        i = out.index(s.parts[0]) if s.parts[0] in out else -1
        if i < 0 or i + 1 >= len(out) or out[i + 1] != s.parts[1]:
            raise GraphError(f"axes {list(axes)} do not hold {s.parts[0]!r}, {s.parts[1]!r} adjacent and in order "
                             f"(a view of split axis {s.axis!r})")
        out[i:i + 2] = [s.axis]
    return tuple(out)


MIN_CHUNKS = 16
"""Fewest chunks a split makes: the chunk axis is then a whole 16-wide tile wherever a kernel tiles it
(8 chunks under a 16-wide tile left a partial tile in the middle of a 3-D load)."""
CHUNK_ALIGN = 64
"""A chunk is whole 64-element tiles: a chunk of 250 keys gave a shared-memory row stride no swizzled
layout takes (TileLang asks for a multiple of 8) and a partial tile in every chunk."""


def chunk_counts(extent: int, parallel: int, sms: int, min_chunk: int = 128) -> list[int]:
    """Chunk counts worth trying for an axis of ``extent`` when the outputs give ``parallel`` tiles: the
    two largest powers of two up to the smallest that fills the ``sms`` whose chunks keep ``min_chunk``
    or more elements, a multiple of ``CHUNK_ALIGN`` (a single decode row against 8192 keys: 64 and
    32 chunks, not the 256 that would fill the machine with 32-key chunks)."""
    want = 2 ** max(1, math.ceil(math.log2(max(2.0, sms / max(parallel, 1)))))
    out: list[int] = []
    c = want
    while c >= MIN_CHUNKS and len(out) < 2:
        if extent % c == 0 and extent // c >= min_chunk and (extent // c) % CHUNK_ALIGN == 0:
            out.append(c)
        c //= 2
    return sorted(out)
