"""What a plan expects from its caller and gives back, in the graph's own axis order.

A plan may store a tensor with its axes permuted (the planner picks memory
orders); the caller never sees that: inputs arrive and outputs leave in the
order the graph declares. Shared by ``load`` and ``export`` so both present the
same function.
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass
from functools import cached_property

from pyrunner.errors import PlanError
from pyrunner.ir.graph import Graph, result_axes
from pyrunner.plan.schema import Plan
from pyrunner.plan.views import View, to_plan_layout, to_source_layout, view_of

RESERVED = frozenset({"config"})
"""Names a wrapper needs for itself; a graph input may not take them."""


@dataclass(frozen=True)
class TensorSpec:
    """One argument or result: graph axes, shape, dtype, and how the plan stores it (``plan_axes``, with
    the plan's axis merges and splits)."""

    name: str
    axes: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    plan_axes: tuple[str, ...]
    view: View = View()

    @cached_property
    def flat_axes(self) -> tuple[str, ...]:
        """The plan's memory order in graph axis names (merged axes expanded, split axes whole)."""
        return self.view.source_axes(self.plan_axes)

    @cached_property
    def flat_shape(self) -> tuple[int, ...]:
        """The shape in ``flat_axes`` order, before the reshape to ``plan_shape``."""
        size = dict(zip(self.axes, self.shape, strict=True))
        return tuple(size[a] for a in self.flat_axes)

    @cached_property
    def plan_shape(self) -> tuple[int, ...]:
        size = dict(zip(self.axes, self.shape, strict=True))
        return tuple(self.view.plan_shape(self.plan_axes, size))

    @cached_property
    def _layout(self) -> tuple[list[int] | None, list[int] | None, list[int] | None, list[int] | None]:
        """(permute, reshape) into the plan's layout and (reshape, permute) back, worked out once per spec
        from its own shape: the same steps ``to_plan_layout``/``to_source_layout`` take, without redoing
        the axis bookkeeping at every call (a region op is called at every step of a model)."""
        flat = self.flat_axes
        if sorted(flat) != sorted(self.axes):
            raise PlanError(f"a tensor with axes {list(self.axes)} cannot be stored as {list(self.plan_axes)}")
        into = [list(self.axes).index(a) for a in flat] if tuple(flat) != self.axes else None
        back = [list(flat).index(a) for a in self.axes] if tuple(flat) != self.axes else None
        if not self.view.reshapes(self.plan_axes):
            return into, None, None, back
        return into, list(self.plan_shape), list(self.flat_shape), back

    def to_plan(self, x):
        """A caller's tensor (graph axis order) as the plan stores it."""
        if tuple(x.shape) != self.shape:
            return to_plan_layout(x, self.axes, self.plan_axes, self.view).contiguous()
        into, shape, _, _ = self._layout
        if into is not None:
            x = x.permute(into)
        return (x.reshape(shape) if shape is not None else x).contiguous()

    def from_plan(self, x, contiguous: bool = True):
        """A plan's tensor back in the graph's axis order (``contiguous=False``: a view of the plan's storage
        where the reshapes allow one)."""
        if tuple(x.shape) != self.plan_shape:
            return to_source_layout(x, self.plan_axes, self.axes, self.view).contiguous()
        _, _, flat, back = self._layout
        if flat is not None:
            x = x.reshape(flat)
        x = x.permute(back) if back is not None else x
        return x.contiguous() if contiguous else x

    def describe(self) -> str:
        return f"{self.name}[{', '.join(f'{a}={n}' for a, n in zip(self.axes, self.shape, strict=True))}] {self.dtype}"


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.outputs)


def input_order(plan: Plan, graph: Graph) -> list[str]:
    """Inputs in the order the plan's graph declares them (its JSON ``inputs`` object)."""
    declared = plan.graph.get("inputs") if isinstance(plan.graph, dict) else None
    used = {t.name for t in graph.inputs()}
    order = [n for n in declared if n in used] if isinstance(declared, dict) else []
    return order + sorted(used - set(order))


def signature(plan: Plan, graph: Graph) -> Signature:
    """The call signature of a plan; PlanError if a name cannot be a Python parameter."""
    view = view_of(plan)
    by_name = {t.name: t for t in plan.tensors}
    graph_axes = {t.name: t.axes for t in graph.inputs()}
    ins = []
    for name in input_order(plan, graph):
        if not name.isidentifier() or keyword.iskeyword(name) or name in RESERVED or name.startswith("_"):
            raise PlanError(f"input {name!r} cannot be a Python parameter name (not an identifier, a keyword, "
                            f"private, or one of {sorted(RESERVED)})")
        gt = by_name.get(name)
        if gt is None or gt.role != "input":
            raise PlanError(f"graph input {name!r} is not an input tensor of the plan")
        axes = graph_axes[name]
        ins.append(TensorSpec(name, axes, tuple(graph.sizes[a] for a in axes), gt.dtype, tuple(gt.axes), view))
    outs = []
    for name, term in graph.outputs:
        gt = by_name.get(name)
        if gt is None or gt.role != "output":
            raise PlanError(f"graph output {name!r} is not an output tensor of the plan")
        axes = result_axes(term)
        outs.append(TensorSpec(name, axes, tuple(graph.sizes[a] for a in axes), gt.dtype, tuple(gt.axes), view))
    return Signature(tuple(ins), tuple(outs))


def bind(sig: Signature, args: tuple, kwargs: dict) -> dict[str, object]:
    """Positional (graph order) and keyword arguments -> name -> value, with Python's own rules."""
    from pyrunner.frontend.errors import FrontendError

    names = sig.input_names
    if len(args) > len(names):
        raise FrontendError(f"takes {len(names)} input(s) ({', '.join(names)}), got {len(args)} positional")
    bound = dict(zip(names, args, strict=False))
    for k, v in kwargs.items():
        if k not in names:
            raise FrontendError(f"unexpected input {k!r}; the inputs are {', '.join(names)}")
        if k in bound:
            raise FrontendError(f"input {k!r} given twice (positionally and by keyword)")
        bound[k] = v
    missing = [n for n in names if n not in bound]
    if missing:
        raise FrontendError(f"missing input(s) {', '.join(missing)}; expected {', '.join(names)}")
    return bound


def plan_inputs(sig: Signature, feed: dict[str, object]) -> dict[str, object]:
    """The region's values a plan takes: ``feed`` less the inputs the plan's graph never reads.

    A region input can reach no output of its graph (a value the captured code reads only for its shape
    or dtype: ``type_as``, ``view_as``), and the plan's signature lists only the inputs its graph reads
    (``input_order``). Run 154's Llama-3-8B training step fed one and failed; which op of its capture read
    it was not kept. Such an input cannot change an output, and its gradient is zero; an input the plan
    needs and ``feed`` lacks is still ``bind``'s error."""
    names = set(sig.input_names)  # the property builds its tuple anew: once per call, not once per input
    return {k: v for k, v in feed.items() if k in names}


def check_tensor(spec: TensorSpec, value: object) -> None:
    """Type, dtype and shape of one argument (the device is checked once a GPU is known)."""
    import torch

    from pyrunner.frontend.errors import FrontendError

    if not isinstance(value, torch.Tensor):
        raise FrontendError(f"input {spec.name!r} must be a torch.Tensor, got {type(value).__name__}")
    if str(value.dtype).removeprefix("torch.") != spec.dtype:
        raise FrontendError(f"input {spec.name!r} has dtype {value.dtype}, the plan needs torch.{spec.dtype} "
                            f"({spec.describe()})")
    if tuple(value.shape) != spec.shape:
        raise FrontendError(f"input {spec.name!r} has shape {tuple(value.shape)}, the plan needs {spec.shape} "
                            f"({spec.describe()})")
