"""Finishing a region: name its axes, merge input uses, build and check its graph-IR ``Graph``."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from pyrunner.frontend.errors import FrontendError
from pyrunner.frontend.trace import AxisConflict, InputUse, RegionTrace, unmappable
from pyrunner.ir import graph as ir
from pyrunner.ir.graph import Graph, Term, check

LETTERS = "ijklmnpqrsuvwxyzabcdefgho"


@dataclass
class RegionGraph:
    """A translated region: its IR graph and how torch tensors enter and leave it."""

    graph: Graph
    nodes: list[Any]
    inputs: list[tuple[str, Any, tuple[int, ...]]]
    """IR input name, the FX node that feeds it, the shape it is viewed as (size-1 dims dropped)."""
    outputs: list[tuple[str, Any, tuple[list[int], tuple[int, ...], tuple[int, ...]], tuple[int, ...]]]
    """IR output name, the FX node it replaces, its layout (the permutation from IR order to the value's
    leaf axes, the leaf shape with 1 where the value only broadcasts an axis, the full leaf shape), and the
    node's shape."""
    label: str = ""
    """For messages; the graph itself is named ``region`` with inputs ``in<k>`` and outputs ``out<k>``,
    so equal regions (the layers of a model, or two traces of one function) give one plan and one
    cached binary."""
    selects: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Output index -> (axis position in its graph output, index): that output is one chunk of a graph output
    (the parts of a ``split``), taken as a view of it rather than computed by a kernel of its own."""
    input_perms: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Input index -> the permutation of its viewed shape that gives its IR axis order (absent: none): an input
    is declared in the order its tensor is stored in, so a permuted view (heads split by ``transpose``) is
    read as it lies, without a copy, and the region's results follow that order."""

    def feed(self, xs: Any) -> dict[str, Any]:
        """IR input name -> tensor in its IR axis order (views of ``xs``, the op's arguments in input order)."""
        out = {}
        for i, ((name, _, shape), x) in enumerate(zip(self.inputs, xs, strict=True)):
            x = x.reshape(shape)
            perm = self.input_perms.get(i)
            out[name] = x.permute(perm) if perm is not None else x
        return out


def ident(name: str) -> str:
    s = re.sub(r"\W", "_", str(name)).strip("_") or "t"
    return ("t_" + s) if s[0].isdigit() else s


def finish(rt: RegionTrace, outputs: list[Any], name: str,
           axis_names: dict[str, tuple[str, ...]] | None = None, views: bool = True) -> RegionGraph:
    """Name the axes, merge input uses that ended up alike, and build the checked IR graph.

    Terms are built over axis variables; here each variable becomes its leaves' names: an input's
    split or merged dimension is read as the row-major view of its leaves, a reduction over a
    refined variable reduces each leaf, a contraction over one contracts its largest leaf and sums
    the rest, an index (``iota``) is the row-major combination of the leaves' indices.

    ``views`` (a forward-only region op; under autograd each graph output has its own cotangent and each
    input its gradient in the model's axis order, so False there):

    * outputs that are every chunk of one computed value (GPT-2's ``c_attn(x).split(n, dim=2)`` feeding the
      head split) become that value, one graph output, each chunk a view of it (``RegionGraph.selects``): the
      chunk selection, an index predicate summed over the chunk axis, would otherwise be a kernel that reads
      the whole value back to copy it out (24-38 us on the H100 for GPT-2-medium's Q, K and V);
    * an input's axes are declared in the order its tensor is stored in (``RegionGraph.input_perms``), so a
      head-split view is read without a copy, and the results built from it come out in that order too
      (attention's output token-major, as ``transpose(1, 2).reshape(t, h * d)`` needs it: no copy there)."""
    _merge_uses(rt)
    names = _name_axes(rt, axis_names or {})
    ax = rt.axes

    def leaf_names(v: str) -> list[str]:
        return [names[leaf] for leaf in ax.leaves(v)]

    # input uses: one IR input per (node, final axes)
    use_name: dict[int, str] = {}
    by_key: dict[tuple, str] = {}
    inputs: list[tuple[str, Any, tuple[int, ...]]] = []
    input_perms: dict[int, tuple[int, ...]] = {}
    use_axes: dict[str, tuple[str, tuple[str, ...]]] = {}
    for i, u in enumerate(rt.uses):
        logical = tuple(n for d in u.dims if d for n in leaf_names(d))
        order = _stored_order(u.dims, tuple(rt.meta(u.node).stride())) if views else None
        axes = tuple(n for k in order for n in leaf_names(u.dims[k])) if order else logical
        key = (u.node, axes)
        if key not in by_key:
            by_key[key] = f"in{len(by_key)}"
            if axes != logical:
                input_perms[len(inputs)] = tuple(logical.index(a) for a in axes)
            inputs.append((by_key[key], u.node, tuple(ax.size[leaf] for d in u.dims if d for leaf in ax.leaves(d))))
        use_name[i] = by_key[key]
        use_axes[f"__use{i}"] = (use_name[i], axes)
    memo: dict[Term, Term] = {}
    size_of = {names[leaf]: ax.size[leaf] for leaf in names}

    def rename(t: Term) -> Term:
        if t in memo:
            return memo[t]
        args = tuple(rename(x) for x in t.args)
        if t.op == "input":
            nm, axes = use_axes[t.name]
            out = ir.inp(nm, axes)
        elif t.op in ("reduce", "matmul", "iota", "axis_size"):
            out = _expand_axis(t, args, leaf_names(t.axis), size_of)
        else:
            out = Term(t.op, args, t.fn, t.axis, t.name, t.axes, t.value)
        memo[t] = out
        return out

    outs: list[tuple[str, Term]] = []
    out_specs = []
    selects: dict[int, tuple[int, int]] = {}
    terms = [rename(rt.values[node].term) for node in outputs]
    peeled = _peeled(terms, size_of) if views else {}
    named: dict[Term, str] = {}
    for node, term in zip(outputs, terms, strict=True):
        v = rt.values[node]
        pick = peeled.get(term)
        whole = pick[0] if pick else term
        have = ir.result_axes(whole)
        if pick:
            selects[len(out_specs)] = (have.index(pick[1]), pick[2])
            have = tuple(a for a in have if a != pick[1])
        if whole not in named:
            named[whole] = f"out{len(outs)}"
            outs.append((named[whole], whole))
        nm = named[whole]
        want = tuple(n for d in v.dims if d for n in leaf_names(d))
        if not set(have) <= set(want) or not have:
            raise unmappable(node, f"internal: output axes {have} but the value has {want}")
        layout = ([have.index(a) for a in want if a in have],
                  tuple(size_of[a] if a in have else 1 for a in want), tuple(size_of[a] for a in want))
        out_specs.append((nm, node, layout, tuple(rt.meta(node).shape)))
    labels = {t: nm for nm, t in outs}
    used = {a for t in ir.subterms([t for _, t in outs]) for a in _term_axes(t)}
    g = Graph("region", {a: size_of[a] for a in sorted(used, key=list(size_of).index)}, tuple(outs), labels)
    check(g)
    return RegionGraph(g, list(rt.nodes), inputs, out_specs, name, selects, input_perms)


def _stored_order(dims: tuple[str | None, ...], stride: tuple[int, ...]) -> list[int] | None:
    """The positions of ``dims`` (size one: None, left out) from the largest stride to the smallest, when their
    strides tell one order (all distinct and nonzero); None otherwise (the dims' own order is kept)."""
    at = [k for k, d in enumerate(dims) if d is not None]
    strides = [stride[k] for k in at]
    if len(set(strides)) != len(strides) or 0 in strides:
        return None
    return sorted(at, key=lambda k: -stride[k])


def chunk_of(t: Term) -> tuple[Term, str, int] | None:
    """(x, a, c) when ``t`` is ``sum_a where(iota(a) <= c and c <= iota(a), x, 0)``: chunk ``c`` of ``x`` along
    ``a``, as ``torchops._select_chunk`` writes a ``split`` part."""
    if t.op != "reduce" or t.fn != "sum" or t.args[0].op != "ternary" or t.args[0].fn != "where":
        return None
    keep, x, zero = t.args[0].args
    a = t.axis
    if zero != ir.const(0.0) or keep.op != "binary" or keep.fn != "mul":
        return None
    lo, hi = keep.args
    if not (lo.op == hi.op == "binary" and lo.fn == hi.fn == "le" and lo.args[0] == ir.iota(a) == hi.args[1]
            and lo.args[1].op == "const" and lo.args[1] == hi.args[0]):
        return None
    return x, a, int(lo.args[1].value)


def _peeled(terms: list[Term], size_of: dict[str, int]) -> dict[Term, tuple[Term, str, int]]:
    """Output term -> (whole, axis, index) for the outputs that together are every chunk of one computed value
    (not an input: that would be an output equal to an input); the rest stay as they are."""
    groups: dict[tuple[Term, str], list[Term]] = {}
    found = {}
    for t in terms:
        got = chunk_of(t)
        if got is not None and got[0].op != "input":
            found[t] = got
            groups.setdefault(got[:2], []).append(t)
    return {t: found[t] for (x, a), ts in groups.items() if {found[t][2] for t in ts} == set(range(size_of[a]))
            for t in ts}


def _term_axes(t: Term) -> tuple[str, ...]:
    if t.op == "input":
        return tuple(t.axes)
    return (t.axis,) if t.axis else ()


def _expand_axis(t: Term, args: tuple[Term, ...], leaves: list[str], size_of: dict[str, int]) -> Term:
    """A term over one axis variable, over its leaves instead."""
    if t.op == "reduce":
        out = args[0]
        for leaf in reversed(leaves):
            out = ir.reduce(t.fn, out, leaf)
        return out
    if t.op == "matmul":
        big = max(leaves, key=lambda a: size_of[a])
        out = ir.matmul(args[0], args[1], big)
        for leaf in leaves:
            if leaf != big:
                out = ir.reduce("sum", out, leaf)
        return out
    if t.op == "iota":
        out: Term | None = None
        stride = 1
        for leaf in reversed(leaves):
            part = ir.iota(leaf) if stride == 1 else ir.binary("mul", ir.iota(leaf), ir.const(float(stride)))
            out = part if out is None else ir.binary("add", part, out)
            stride *= size_of[leaf]
        assert out is not None
        return out
    out = ir.axis_size(leaves[0])
    for leaf in leaves[1:]:
        out = ir.binary("mul", out, ir.axis_size(leaf))
    return out


def _merge_uses(rt: RegionTrace) -> None:
    """Give later uses of one input the axes of an earlier use wherever no value then holds an axis twice."""
    first: dict[Any, list[InputUse]] = {}
    for u in rt.uses:
        for prev in first.setdefault(u.node, []):
            saved = copy.deepcopy(rt.axes)
            try:
                for a, b in zip(prev.dims, u.dims, strict=True):
                    if a is not None and b is not None:
                        rt.axes.unify(a, b)
                rt.check_distinct()
                break
            except AxisConflict:
                rt.axes = saved
        first[u.node].append(u)


def _user_names(node_name: str) -> list[str]:
    """Names a user may give an input by: the node's, and the argument's under dynamo (``l_x_`` is ``x``)."""
    m = re.fullmatch(r"[lL]_(?:kwargs_)?(\w+?)_", node_name)
    return [node_name, ident(node_name)] + ([m.group(1)] if m else [])


def _name_axes(rt: RegionTrace, axis_names: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """Class root -> axis name: the user's names for an input's dims first, then i, j, k, ..."""
    names: dict[str, str] = {}
    used: set[str] = set()
    for u in rt.uses:
        given = next((axis_names[k] for k in _user_names(u.node.name) if k in axis_names), None)
        if not given:
            continue
        if len(given) != len(u.dims):
            raise FrontendError(f"axes for {u.node.name!r}: {len(given)} names for {len(u.dims)} dimensions")
        for d, n in zip(u.dims, given, strict=True):
            if d is None or len(rt.axes.leaves(d)) != 1:
                continue
            r = rt.axes.find(d)
            if r not in names and n not in used:
                if not str(n).isidentifier():
                    raise FrontendError(f"axes for {u.node.name!r}: {n!r} is not an identifier")
                names[r] = str(n)
                used.add(str(n))
    letters = iter([c for c in LETTERS if c not in used] + [f"a{i}" for i in range(1000)])
    order = [d for u in rt.uses for d in u.dims if d] + [d for v in rt.values.values() for d in v.dims if d]
    order += [d for dims in rt.inner for d in dims if d] + list(rt.axes.parent)
    for d in order:
        for r in rt.axes.leaves(d):
            if r not in names:
                names[r] = next(letters)
    return names
