"""Giving a one-sided contraction a row axis of extent 1: a batched GEMV onto the tensor cores.

Decode attention over many heads, ``Q[b, h, d] @d K[b, h, t, d]``, contracts a vector per head
against a matrix per head: every axis of ``Q`` but ``d`` is also ``K``'s, so the product has no row
axis of its own and no tensor-core tile; the planner can only sum it on CUDA cores
(``matmul_as_sum``), in fragments of three or more axes that read ``K``'s tile across its rows
(run 84: 3.0 ms where the bytes take 0.6). Reading ``Q`` as ``Q[b, h, u, d]`` with a new axis ``u``
of extent 1 changes no value and no byte (an axis of extent 1 adds 0 to every row-major offset:
the Lean theorem ``unit_axis``), yet gives the product a row axis: the tensor-core path pads it to
one 64-row tile, the way it runs a decode step whose graph has a query axis of length 1, and every
value computed from ``Q`` carries ``u`` up to the outputs, which store it (again a view of the
caller's tensor).

A unit axis goes on an input that the operand reads and the other operand does not (the one with
the most axes): where the operand has no free axis and the contraction has batch axes. Without batch
axes a GEMV's two-axis product reads its tile along the rows and streams at bandwidth on CUDA
cores (run 84: the 32000 x 2048 decode GEMV, 40.0 us), so it is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyrunner.errors import GraphError
from pyrunner.ir.graph import Graph, Term, check, result_axes, subterms
from pyrunner.ir.names import fresh_name, is_name


@dataclass(frozen=True)
class AxisUnit:
    """Axis ``axis`` of extent 1 inserted into each input of ``inputs`` at the paired position."""

    axis: str
    inputs: tuple[tuple[str, int], ...]

    def describe(self) -> str:
        return f"{self.axis} (extent 1) in " + ", ".join(f"{n}[{p}]" for n, p in self.inputs)


def _one_sided(t: Term, memo: dict[Term, tuple[str, ...]]) -> list[Term]:
    """The operand of contraction ``t`` with no free axis, where ``t`` has batch axes and the other
    operand a free axis (a batched dot product, free of both, would still have no tile)."""
    a, b = (set(result_axes(x, memo)) for x in t.args)
    if not (a & b) - {t.axis}:
        return []
    free = [bool(a - b - {t.axis}), bool(b - a - {t.axis})]
    return [x for x, mine, theirs in ((t.args[0], free[0], free[1]), (t.args[1], free[1], free[0]))
            if not mine and theirs]


def _leaves(x: Term) -> list[Term]:
    return [u for u in subterms([x]) if u.op == "input"]


def _carrier(x: Term, other: Term) -> Term | None:
    """An input of ``x``'s cone that ``other`` does not read, with the most axes (the first of those):
    the unit axis inserted there reaches ``x`` (no op drops an axis it does not reduce) and not
    ``other``. A query read directly, through a norm or through a projection all find their input."""
    theirs = {u.name for u in _leaves(other)}
    mine = [u for u in _leaves(x) if u.name not in theirs]
    return max(mine, key=lambda u: len(u.axes), default=None)


def unit_candidate(g: Graph) -> AxisUnit | None:
    """The unit axis that gives every one-sided batched contraction of ``g`` a row axis (None: none has)."""
    memo: dict[Term, tuple[str, ...]] = {}
    inputs: list[tuple[str, int]] = []
    for t in g.terms():
        if t.op != "matmul":
            continue
        for x in _one_sided(t, memo):
            if {u.name for u in _leaves(x)} & {n for n, _ in inputs}:
                continue  # it reads an input that takes the axis already (P of attention reads Q)
            src = _carrier(x, t.args[1] if x is t.args[0] else t.args[0])
            if src is None:
                continue
            # before the innermost axis, so the input's contiguous axis stays its last
            inputs.append((src.name, max(0, len(src.axes) - 1)))
    if not inputs:
        return None
    return AxisUnit(fresh_name("unit", g.sizes, "unit"), tuple(inputs))


def _inserted(axes: Sequence[str], axis: str, position: int) -> tuple[str, ...]:
    return (*axes[:position], axis, *axes[position:])


def add_unit(g: Graph, unit: AxisUnit) -> Graph:
    """``g`` with ``unit`` inserted into its inputs (GraphError where the spec does not fit ``g``)."""
    if not is_name(unit.axis) or unit.axis in g.sizes:
        raise GraphError(f"unit axis {unit.axis!r} is taken or not a name in graph {g.name!r}")
    where = dict(unit.inputs)
    if len(where) != len(unit.inputs) or not where:
        raise GraphError(f"unit axis {unit.axis!r}: name each input once, at least one")
    ins = {t.name: t for t in g.inputs()}
    for name, pos in where.items():
        if name not in ins:
            raise GraphError(f"unit axis {unit.axis!r}: {name!r} is not an input of graph {g.name!r}")
        if not 0 <= pos <= len(ins[name].axes):
            raise GraphError(f"unit axis {unit.axis!r}: position {pos} is outside input {name!r}'s "
                             f"{len(ins[name].axes)} axes")
    new: dict[Term, Term] = {}
    for t in subterms(r for _, r in g.outputs):
        if t.op == "input":
            axes = _inserted(t.axes, unit.axis, where[t.name]) if t.name in where else t.axes
            new[t] = Term("input", name=t.name, axes=axes)
        elif t.args:
            new[t] = t.replace_args(tuple(new[a] for a in t.args))
        else:
            new[t] = t
    labels = {new[t]: lab for t, lab in g.labels.items() if t in new}
    out = Graph(g.name, {**g.sizes, unit.axis: 1}, tuple((n, new[t]) for n, t in g.outputs), labels)
    check(out)
    for (n, src), (_, dst) in zip(g.outputs, out.outputs, strict=True):
        if drop_units(result_axes(dst), [unit]) != result_axes(src):
            raise GraphError(f"unit axis {unit.axis!r}: output {n!r} would change its axis order")
    return out


def drop_units(axes: Sequence[str], units: Sequence[AxisUnit]) -> tuple[str, ...]:
    """``axes`` without the unit axes: the source graph's axes of a plan tensor."""
    gone = {u.axis for u in units}
    return tuple(a for a in axes if a not in gone)
