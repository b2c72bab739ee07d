"""How a plan's tensors relate to the graph its author wrote.

A plan stores its tensors in its own layout: axes permuted (the planner picks memory orders) and,
with ``axis_units``, an axis of extent 1 inserted (``ir.unit_axes``), with ``axis_merges``, adjacent
axes merged into one (``ir.merge_axes``) and, with ``axis_splits``, a reduced axis read as chunks
(``ir.split_axes``). Callers (the verifier, the
CPU executor, ``pyrunner.load`` and exported modules) hand tensors over and take them back in the
source graph's axis order; these two functions are the only conversion, for numpy and torch alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pyrunner.errors import GraphError, PlanError
from pyrunner.ir.graph import Graph
from pyrunner.ir.graph_json import graph_from_json
from pyrunner.ir.merge_axes import AxisMerge, expand_axes, merge
from pyrunner.ir.split_axes import AxisSplit, apply_split, source_axes
from pyrunner.ir.unit_axes import AxisUnit, add_unit, drop_units
from pyrunner.plan.schema import Plan


def merges_of(plan: Plan) -> list[AxisMerge]:
    return [AxisMerge(m.axis, (m.parts[0], m.parts[1]), (m.sizes[0], m.sizes[1])) for m in plan.axis_merges]


def units_of(plan: Plan) -> list[AxisUnit]:
    for i, u in enumerate(plan.axis_units):
        if len(u.inputs) != len(u.positions):
            raise PlanError(f"axis_units[{i}]: {len(u.inputs)} inputs but {len(u.positions)} positions")
    return [AxisUnit(u.axis, tuple(zip(u.inputs, u.positions, strict=True))) for u in plan.axis_units]


def splits_of(plan: Plan) -> list[AxisSplit]:
    return [AxisSplit(s.axis, (s.parts[0], s.parts[1]), (s.sizes[0], s.sizes[1])) for s in plan.axis_splits]


@dataclass(frozen=True)
class View:
    """How a plan's tensor axes read as the source graph's: merged axes expand into their parts, a split
    axis's chunk and in-chunk parts (adjacent, in order) read as the axis they split, a unit axis
    (extent 1) is not the source's at all."""

    merges: tuple[AxisMerge, ...] = ()
    splits: tuple[AxisSplit, ...] = ()
    units: tuple[AxisUnit, ...] = ()

    def source_axes(self, plan_axes: Sequence[str]) -> tuple[str, ...]:
        """``plan_axes`` in source-graph axis names, in the plan's memory order (PlanError: no view)."""
        try:
            collapsed = source_axes(plan_axes, self.splits)
        except GraphError as e:
            raise PlanError(str(e)) from None
        return drop_units(expand_axes(collapsed, self.merges), self.units)

    def plan_shape(self, plan_axes: Sequence[str], extent: dict[str, int]) -> list[int]:
        """The plan tensor's shape from the source axes' extents."""
        part = {p: n for s in self.splits for p, n in zip(s.parts, s.sizes, strict=True)}
        part.update((u.axis, 1) for u in self.units)
        return [part[p] if p in part else math.prod(extent[a] for a in expand_axes([p], self.merges))
                for p in plan_axes]

    def source_shape(self, plan_axes: Sequence[str], shape: Sequence[int]) -> list[int]:
        """The shape in ``source_axes(plan_axes)`` order from the plan tensor's shape."""
        part = {p: n for m in self.merges for p, n in zip(m.parts, m.sizes, strict=True)}
        extent = {a: n for a, n in zip(plan_axes, shape, strict=True) if a not in {u.axis for u in self.units}}
        for s in self.splits:
            if s.parts[0] in extent:
                extent[s.axis] = extent[s.parts[0]] * extent[s.parts[1]]
        return [part[a] if a in part else extent[a] for a in self.source_axes(plan_axes)]

    def reshapes(self, plan_axes: Sequence[str]) -> bool:
        """Whether the tensor is a reshape of the source's (it carries a merged axis or a split's parts)."""
        special = ({m.axis for m in self.merges} | {p for s in self.splits for p in s.parts}
                   | {u.axis for u in self.units})
        return any(a in special for a in plan_axes)


def view_of(plan: Plan) -> View:
    return View(tuple(merges_of(plan)), tuple(splits_of(plan)), tuple(units_of(plan)))


def plan_graph(plan: Plan) -> Graph:
    """The plan's source graph, as its author wrote it (PlanError if it does not parse)."""
    try:
        g = graph_from_json(plan.graph)
    except GraphError as e:
        raise PlanError(f"graph: {e}") from None
    wide = frozenset(t.name for t in plan.tensors if t.role != "intermediate" and t.dtype == "float32")
    return replace(g, float32_io=wide) if wide else g


def kernel_graph(plan: Plan, source: Graph | None = None) -> Graph:
    """The graph the plan's tensors and kernels are written against: the source graph with the plan's
    unit axes, its axis merges, then its axis splits, applied (each checked: legal, named as the plan says, with the
    source's extents). A split graph stands for the plan's axes and interface; the plan's derivation
    may have reached a different form of it."""
    g = merged_graph(plan, source)
    for i, s in enumerate(splits_of(plan)):
        try:
            g = apply_split(g, s)
        except GraphError as e:
            raise PlanError(f"axis_splits[{i}]: {e}") from None
    return g


def merged_graph(plan: Plan, source: Graph | None = None) -> Graph:
    """The source graph with the plan's unit axes, then its axis merges, applied (the graph its splits
    apply to)."""
    g = plan_graph(plan) if source is None else source
    for i, u in enumerate(units_of(plan)):
        try:
            g = add_unit(g, u)
        except GraphError as e:
            raise PlanError(f"axis_units[{i}]: {e}") from None
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


def to_plan_layout(x, source_axes: Sequence[str], plan_axes: Sequence[str], view: View):
    """``x`` (axes ``source_axes``) in the plan tensor's layout (axes ``plan_axes``, merged and split axes
    included)."""
    flat = view.source_axes(plan_axes)
    if sorted(flat) != sorted(source_axes):
        raise PlanError(f"a tensor with axes {list(source_axes)} cannot be stored as {list(plan_axes)}")
    if tuple(flat) != tuple(source_axes):
        x = _permute(x, [list(source_axes).index(a) for a in flat])
    if not view.reshapes(plan_axes):
        return x
    return x.reshape(view.plan_shape(plan_axes, dict(zip(flat, x.shape, strict=True))))


def to_source_layout(x, plan_axes: Sequence[str], source_axes: Sequence[str], view: View):
    """The inverse of ``to_plan_layout``: a plan tensor back in the source graph's axis order."""
    flat = view.source_axes(plan_axes)
    if sorted(flat) != sorted(source_axes):
        raise PlanError(f"a tensor stored as {list(plan_axes)} cannot be read as {list(source_axes)}")
    if view.reshapes(plan_axes):
        x = x.reshape(view.source_shape(plan_axes, x.shape))
    if tuple(flat) != tuple(source_axes):
        x = _permute(x, [list(flat).index(a) for a in source_axes])
    return x
