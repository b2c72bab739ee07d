"""How a plan's tensors relate to the graph its author wrote.

A plan stores its tensors in its own layout: axes permuted (the planner picks memory orders) and,
with ``axis_merges``, adjacent axes merged into one (``ir.merge_axes``). Callers (the verifier, the
CPU executor, ``pyrunner.load`` and exported modules) hand tensors over and take them back in the
source graph's axis order; these two functions are the only conversion, for numpy and torch alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pyrunner.errors import GraphError, PlanError
from pyrunner.ir.graph import Graph
from pyrunner.ir.graph_json import graph_from_json
from pyrunner.ir.merge_axes import AxisMerge, expand_axes, merge
from pyrunner.plan.schema import Plan


def merges_of(plan: Plan) -> list[AxisMerge]:
    return [AxisMerge(m.axis, (m.parts[0], m.parts[1]), (m.sizes[0], m.sizes[1])) for m in plan.axis_merges]


def plan_graph(plan: Plan) -> Graph:
    """The plan's source graph, as its author wrote it (PlanError if it does not parse)."""
    try:
        return graph_from_json(plan.graph)
    except GraphError as e:
        raise PlanError(f"graph: {e}") from None


def kernel_graph(plan: Plan, source: Graph | None = None) -> Graph:
    """The graph the plan's tensors and kernels are written against: the source graph with the plan's
    axis merges applied (each checked: legal, named as the plan says, with the source's extents)."""
    g = plan_graph(plan) if source is None else source
    for i, m in enumerate(plan.axis_merges):
        outer, inner = m.parts
        have = (g.sizes.get(outer), g.sizes.get(inner))
        if have != tuple(m.sizes):
            raise PlanError(f"axis_merges[{i}]: parts {outer!r}, {inner!r} have extents {list(have)} in the "
                            f"graph, the plan says {m.sizes}")
        try:
            g, _ = merge(g, outer, inner, m.axis)
        except GraphError as e:
            raise PlanError(f"axis_merges[{i}]: {e}") from None
    return g


def _permute(x, perm: Sequence[int]):
    return x.transpose(list(perm)) if hasattr(x, "transpose") and not hasattr(x, "permute") else x.permute(list(perm))


def to_plan_layout(x, source_axes: Sequence[str], plan_axes: Sequence[str], merges: Sequence[AxisMerge]):
    """``x`` (axes ``source_axes``) in the plan tensor's layout (axes ``plan_axes``, merged axes included)."""
    flat = expand_axes(plan_axes, merges)
    if sorted(flat) != sorted(source_axes):
        raise PlanError(f"a tensor with axes {list(source_axes)} cannot be stored as {list(plan_axes)}")
    if tuple(flat) != tuple(source_axes):
        x = _permute(x, [list(source_axes).index(a) for a in flat])
    if len(flat) == len(plan_axes):
        return x
    extent = dict(zip(flat, x.shape, strict=True))
    shape = [math.prod(extent[a] for a in expand_axes([p], merges)) for p in plan_axes]
    return x.reshape(shape)


def to_source_layout(x, plan_axes: Sequence[str], source_axes: Sequence[str], merges: Sequence[AxisMerge]):
    """The inverse of ``to_plan_layout``: a plan tensor back in the source graph's axis order."""
    flat = expand_axes(plan_axes, merges)
    if sorted(flat) != sorted(source_axes):
        raise PlanError(f"a tensor stored as {list(plan_axes)} cannot be read as {list(source_axes)}")
    if len(flat) != len(plan_axes):
        part_size = {p: n for m in merges for p, n in zip(m.parts, m.sizes, strict=True)}
        extent = dict(zip(plan_axes, x.shape, strict=True))
        x = x.reshape([part_size[a] if a in part_size else extent[a] for a in flat])
    if tuple(flat) != tuple(source_axes):
        x = _permute(x, [list(flat).index(a) for a in source_axes])
    return x
