"""Finishing a region: name its axes, merge input uses, build and check its graph-IR ``Graph``."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
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
    outputs: list[tuple[str, Any, list[int], tuple[int, ...]]]
    """IR output name, the FX node it replaces, the permutation from IR order, the node's shape."""
    label: str = ""
    """For messages; the graph itself is named ``region`` with inputs ``in<k>`` and outputs ``out<k>``,
    so equal regions (the layers of a model, or two traces of one function) give one plan and one
    cached binary."""


def ident(name: str) -> str:
    s = re.sub(r"\W", "_", str(name)).strip("_") or "t"
    return ("t_" + s) if s[0].isdigit() else s


def finish(rt: RegionTrace, outputs: list[Any], name: str,
           axis_names: dict[str, tuple[str, ...]] | None = None) -> RegionGraph:
    """Name the axes, merge input uses that ended up alike, and build the checked IR graph."""
    _merge_uses(rt)
    names = _name_axes(rt, axis_names or {})
    final: dict[str, str] = {v: names[rt.axes.find(v)] for v in rt.axes.parent}
    # input uses: one IR input per (node, final axes)
    use_name: dict[int, str] = {}
    by_key: dict[tuple, str] = {}
    taken: set[str] = set()
    inputs: list[tuple[str, Any, tuple[int, ...]]] = []
    for i, u in enumerate(rt.uses):
        axes = tuple(final[d] for d in u.dims if d)
        key = (u.node, axes)
        if key not in by_key:
            nm = f"in{len(by_key)}"
            taken.add(nm)
            by_key[key] = nm
            inputs.append((nm, u.node, tuple(rt.extent(d) for d in u.dims if d)))
        use_name[i] = by_key[key]
    use_axes = {f"__use{i}": (use_name[i], tuple(final[d] for d in u.dims if d)) for i, u in enumerate(rt.uses)}
    memo: dict[Term, Term] = {}

    def rename(t: Term) -> Term:
        if t in memo:
            return memo[t]
        if t.op == "input":
            nm, axes = use_axes[t.name]
            out = ir.inp(nm, axes)
        else:
            out = Term(t.op, tuple(rename(x) for x in t.args), t.fn, final.get(t.axis, t.axis), t.name,
                       t.axes, t.value)
        memo[t] = out
        return out

    outs = []
    out_specs = []
    for node in outputs:
        v = rt.values[node]
        term = rename(v.term)
        nm = f"out{len(outs)}"
        have = ir.result_axes(term)
        want = tuple(final[d] for d in v.dims if d)
        if sorted(have) != sorted(want) or not have:
            raise unmappable(node, f"internal: output axes {have} but the value has {want}")
        outs.append((nm, term))
        out_specs.append((nm, node, [have.index(a) for a in want], tuple(rt.meta(node).shape)))
    sizes = {names[r]: rt.axes.size[r] for r in {rt.axes.find(v) for v in rt.axes.parent}}
    labels = {t: nm for nm, t in outs}
    g = Graph("region", sizes, tuple(outs), labels)
    check(g)
    return RegionGraph(g, list(rt.nodes), inputs, out_specs, name)


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
            if d is None:
                continue
            r = rt.axes.find(d)
            if r not in names and n not in used:
                if not str(n).isidentifier():
                    raise FrontendError(f"axes for {u.node.name!r}: {n!r} is not an identifier")
                names[r] = str(n)
                used.add(str(n))
    letters = iter([c for c in LETTERS if c not in used] + [f"a{i}" for i in range(1000)])
    order = [d for u in rt.uses for d in u.dims if d] + [d for v in rt.values.values() for d in v.dims if d]
    for d in order:
        r = rt.axes.find(d)
        if r not in names:
            names[r] = next(letters)
    return names
