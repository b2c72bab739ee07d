"""Merging two adjacent axes into one: a free reshape that gives a GEMM more rows.

Grouped-query attention's query heads share K and V. With the group axis merged into the query-row
axis, one tile of rows spans several heads of a group, so those heads share every K/V tile a CTA
loads, and a short query axis (decode, chunked prefill) still fills a tensor-core tile. The same
move turns a batched product ``X[b, m, d] @ W[d, n]`` into one GEMM over ``b*m`` rows.

Merging ``(outer, inner)`` into ``merged`` (extent ``|outer| * |inner|``, index
``i_outer * |inner| + i_inner``) is a row-major reshape of every tensor that carries them. It
changes no value when:

* every input and output that has either axis has both, adjacent and in that order (so the
  reshape of the caller's tensor is a view);
* no term reduces, contracts, indexes (``iota``) or sizes either axis (their meaning is per axis),
  except a *pair contraction*: ``sum_x(c)`` where ``c`` contracts (or sums) the other part ``y`` of
  operands that carry both axes adjacent and in order, and nothing else reads ``c``. That is one
  contraction over the merged axis (``matmul``, or ``sum``), the Lean theorem ``merge_contraction``;
* every term's axes, with ``merged`` expanded, are the source term's axes (the axis order of
  every value is kept).

The planner offers a merge only where it can pay: some GEMM has one operand carrying both axes
and the other carrying neither (a shared operand, like K and V in grouped-query attention), or a
pair contraction, which unmerged is a GEMM per ``x`` index writing a tensor ``|x|`` times the
output before it is summed (the input gradient of a projection split into heads, ``Q[i, h, d] =
X[i, j] W[h, d, j]``, sums over ``h`` and ``d``: a Llama layer's query projection wrote 512 MiB
there). The Lean theorem ``merge_axes`` proves the index map a bijection; ``source_graph`` undoes
a merge, so a caller always sees the graph it wrote.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pyrunner.errors import GraphError
from pyrunner.ir.graph import Graph, Term, check, result_axes, subterms
from pyrunner.ir.names import fresh_name, is_name


@dataclass(frozen=True)
class AxisMerge:
    """``axis`` = ``parts[0]`` (outer) x ``parts[1]`` (inner), with the parts' extents."""

    axis: str
    parts: tuple[str, str]
    sizes: tuple[int, int]

    def describe(self) -> str:
        return f"{self.parts[0]}, {self.parts[1]} -> {self.axis}"


def _expand(axes: Sequence[str], merges: Sequence[AxisMerge]) -> tuple[str, ...]:
    by_axis = {m.axis: m.parts for m in merges}
    out: list[str] = []
    for a in axes:
        out.extend(by_axis.get(a, (a,)))
    return tuple(out)


def _merged_axes(axes: Sequence[str], m: AxisMerge) -> tuple[str, ...] | None:
    """``axes`` with the parts of ``m`` replaced by ``m.axis``; None where they are not adjacent in order."""
    outer, inner = m.parts
    if outer not in axes and inner not in axes:
        return tuple(axes)
    if outer not in axes or inner not in axes:
        return None
    i = list(axes).index(outer)
    if i + 1 >= len(axes) or axes[i + 1] != inner:
        return None
    return (*axes[:i], m.axis, *axes[i + 2:])


def _per_axis_use(t: Term) -> str:
    """The axis a term uses by name (reduced, contracted, indexed or sized), or ''."""
    return t.axis if t.op in ("reduce", "matmul", "iota", "axis_size") else ""


def _readers(g: Graph) -> dict[Term, int]:
    """How many terms of ``g`` read each term (an output counts as one more reader)."""
    n: dict[Term, int] = {}
    for t in g.terms():
        for a in set(t.args):
            n[a] = n.get(a, 0) + 1
    for _, t in g.outputs:
        n[t] = n.get(t, 0) + 1
    return n


def pair_contractions(g: Graph, outer: str, inner: str) -> dict[Term, Term]:
    """The pair contractions of ``(outer, inner)`` in ``g``: ``sum_x(c)`` -> ``c``, where ``c`` contracts
    (``matmul``) or sums the other part over operands that each carry ``outer`` and ``inner`` adjacent
    and in that order, and only that sum reads ``c``. Merged, each is one contraction over the merged
    axis: ``sum_x(sum_y(f))`` over the pairs ``(x, y)`` is the sum over their row-major index."""
    probe = AxisMerge("_", (outer, inner), (g.sizes.get(outer, 1), g.sizes.get(inner, 1)))
    readers = _readers(g)
    memo: dict[Term, tuple[str, ...]] = {}
    out: dict[Term, Term] = {}
    for t in g.terms():
        if t.op != "reduce" or t.fn != "sum" or t.axis not in (outer, inner):
            continue
        c = t.args[0]
        other = inner if t.axis == outer else outer
        pairs = c.op == "matmul" or (c.op == "reduce" and c.fn == "sum")
        if not pairs or c.axis != other or readers.get(c, 0) != 1:
            continue
        carried = [result_axes(x, memo) for x in c.args]
        if all(outer in ax and inner in ax and _merged_axes(ax, probe) is not None for ax in carried):
            out[t] = c
    return out


def merge_problem(g: Graph, outer: str, inner: str) -> str | None:
    """Why ``(outer, inner)`` cannot be merged in ``g`` (None when it can)."""
    if outer == inner or outer not in g.sizes or inner not in g.sizes:
        return f"axes {outer!r} and {inner!r} are not two axes of the graph"
    memo: dict[Term, tuple[str, ...]] = {}
    probe = AxisMerge("_", (outer, inner), (g.sizes[outer], g.sizes[inner]))
    pairs = pair_contractions(g, outer, inner)
    inside = set(pairs.values())  # a pair contraction's inner step: merged away with its sum
    for t in g.terms():
        if t in pairs or t in inside:
            continue
        if _per_axis_use(t) in (outer, inner):
            return f"a {t.op} uses axis {_per_axis_use(t)!r} on its own"
        if _merged_axes(result_axes(t, memo), probe) is None:
            return f"a value has axes {list(result_axes(t, memo))}: {outer!r}, {inner!r} not adjacent in order"
    return None


def shares_operand(g: Graph, outer: str, inner: str) -> bool:
    """Whether some GEMM has one operand with both axes and the other with neither."""
    memo: dict[Term, tuple[str, ...]] = {}
    for t in g.terms():
        if t.op != "matmul":
            continue
        carries = [{outer, inner} <= set(result_axes(x, memo)) for x in t.args]
        lacks = [not ({outer, inner} & set(result_axes(x, memo))) for x in t.args]
        if (carries[0] and lacks[1]) or (carries[1] and lacks[0]):
            return True
    return False


def _fresh_name(g: Graph, outer: str, inner: str) -> str:
    return fresh_name(f"{outer}_{inner}", g.sizes, "merged")


Rebuild = Callable[[dict[Term, Term]], Term]
"""A term's replacement, built from the rewritten terms below it (old term -> new term)."""


def _rewrite_inputs(g: Graph, axes_of_input: dict[str, tuple[str, ...]], sizes: dict[str, int],
                    name: str, replace: dict[Term, Rebuild] | None = None) -> Graph:
    """``g`` with its inputs' axes replaced; ``replace`` rebuilds the terms that change form (a pair
    contraction and its merged contraction, either way)."""
    new: dict[Term, Term] = {}
    for t in subterms(r for _, r in g.outputs):
        if t.op == "input":
            new[t] = Term("input", name=t.name, axes=axes_of_input[t.name])
        elif replace and t in replace:
            new[t] = replace[t](new)
        elif t.args:
            new[t] = t.replace_args(tuple(new[a] for a in t.args))
        else:
            new[t] = t
    labels = {new[t]: lab for t, lab in g.labels.items() if t in new}
    out = Graph(name, sizes, tuple((n, new[t]) for n, t in g.outputs), labels)
    check(out)
    return out


def merge(g: Graph, outer: str, inner: str, name: str | None = None) -> tuple[Graph, AxisMerge]:
    """``g`` with ``(outer, inner)`` merged into one new axis (``name``, else a fresh one); GraphError
    where that would change a value."""
    why = merge_problem(g, outer, inner)
    if why is None and name is not None and (name in g.sizes or not is_name(name)):
        why = f"the merged axis name {name!r} is taken or not a name"
    if why is not None:
        raise GraphError(f"cannot merge axes {outer!r}, {inner!r} of graph {g.name!r}: {why}")
    m = AxisMerge(name or _fresh_name(g, outer, inner), (outer, inner), (g.sizes[outer], g.sizes[inner]))
    sizes = {a: n for a, n in g.sizes.items() if a not in m.parts}
    sizes[m.axis] = math.prod(m.sizes)
    ins = {t.name: _merged_axes(t.axes, m) for t in g.inputs()}
    pairs = {t: _merged_contraction(c, m.axis) for t, c in pair_contractions(g, outer, inner).items()}
    out = _rewrite_inputs(g, ins, sizes, g.name, pairs)  # type: ignore[arg-type]
    for (n, src), (_, dst) in zip(g.outputs, out.outputs, strict=True):
        if _expand(result_axes(dst), [m]) != result_axes(src):
            raise GraphError(f"cannot merge axes {outer!r}, {inner!r} of graph {g.name!r}: output {n!r} would "
                             f"change its axis order")
    return out, m


def candidate_pairs(g: Graph) -> list[tuple[str, str]]:
    """Adjacent axis pairs of the graph's inputs that can be merged and that a shared GEMM operand or
    a pair contraction makes worth merging, in input order."""
    seen: list[tuple[str, str]] = []
    for t in g.inputs():
        for outer, inner in zip(t.axes, t.axes[1:], strict=False):
            if (outer, inner) in seen or merge_problem(g, outer, inner):
                continue
            if shares_operand(g, outer, inner) or pair_contractions(g, outer, inner):
                seen.append((outer, inner))
    return seen


def merge_all(g: Graph, limit: int = 3) -> tuple[Graph, list[AxisMerge]]:
    """``g`` with every candidate pair merged, repeatedly (a run of axes becomes one), at most ``limit``
    merges; the merges in the order applied."""
    merges: list[AxisMerge] = []
    while len(merges) < limit:
        pairs = candidate_pairs(g)
        if not pairs:
            break
        g, m = merge(g, *pairs[0])
        merges.append(m)
    return g, merges


def source_graph(g: Graph, merges: Iterable[AxisMerge]) -> Graph:
    """Undo ``merges`` (applied in the given order) on ``g``: the graph its author wrote."""
    for m in reversed(list(merges)):
        if m.axis not in g.sizes or any(p in g.sizes for p in m.parts):
            raise GraphError(f"axis merge {m.describe()!r} does not match the graph's axes {sorted(g.sizes)}")
        if g.sizes[m.axis] != math.prod(m.sizes):
            raise GraphError(f"axis merge {m.describe()!r}: {m.sizes[0]} x {m.sizes[1]} is not "
                             f"{m.axis}'s extent {g.sizes[m.axis]}")
        pairs: dict[Term, Rebuild] = {}
        for t in g.terms():
            if _per_axis_use(t) != m.axis:
                continue
            if t.op != "matmul" and not (t.op == "reduce" and t.fn == "sum"):
                raise GraphError(f"axis merge {m.describe()!r}: a {t.op} uses the merged axis on its own")
            pairs[t] = _pair_contraction(t, m)
        sizes = {a: n for a, n in g.sizes.items() if a != m.axis}
        sizes.update(zip(m.parts, m.sizes, strict=True))
        ins = {t.name: _expand(t.axes, [m]) for t in g.inputs()}
        g = _rewrite_inputs(g, ins, sizes, g.name, pairs)
    return g


def _merged_contraction(c: Term, axis: str) -> Rebuild:
    """``sum_x(c)`` of a pair contraction rebuilt as ``c``'s op over the merged ``axis``."""
    return lambda new: Term(c.op, tuple(new[a] for a in c.args), fn=c.fn, axis=axis)


def _pair_contraction(t: Term, m: AxisMerge) -> Rebuild:
    """A contraction over the merged axis rebuilt over its parts: the inner one contracted, the outer summed."""
    return lambda new: Term("reduce", (Term(t.op, tuple(new[a] for a in t.args), fn=t.fn, axis=m.parts[1]),),
                            fn="sum", axis=m.parts[0])


def expand_axes(axes: Sequence[str], merges: Sequence[AxisMerge]) -> tuple[str, ...]:
    """Axes of a plan tensor in source-graph terms (merged axes replaced by their parts, repeatedly)."""
    out = tuple(axes)
    for m in reversed(list(merges)):
        out = _expand(out, [m])
    return out
