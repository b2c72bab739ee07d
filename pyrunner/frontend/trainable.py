"""``pyrunner.load(plan, backward=True)``: a plan as a differentiable function of torch tensors.

The plan's graph is derived (``ir.grad``, saves by ``planner.saves`` as ``superopt --with-saves`` and
``--backward`` choose them); the forward that also writes the saved tensors and the backward graph are
planned by the same door as every plan (``compile.cached_plan``). The plan given is used as the forward
where its graph already writes every saved tensor (a ``--with-saves`` plan, or a graph whose backward
reads only its outputs); otherwise the forward-with-saves plan replaces it. A call returns the graph's
outputs like ``load``; ``backward()`` on anything computed from them runs the backward plan's kernels.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from pyrunner.frontend.autograd import Run, _to_input, plan_run, reference_run
from pyrunner.frontend.training import TrainingPlans
from pyrunner.ir.graph import Graph
from pyrunner.plan.schema import Plan


class Trainable:
    """The callable ``load(plan, backward=True)`` returns; ``.plans`` holds both halves' plans.

    ``executor``: ``gpu`` (the compiled kernels, each half verified against float64 on the first call
    when ``verify``) or ``reference`` (both halves of ``ir.grad.derive``'s derivation in the float64
    interpreter, nothing planned, any device: checks the autograd wiring)."""

    def __init__(self, plan: Plan, *, verify: bool = False, config: dict | None = None,
                 executor: str = "gpu") -> None:
        from pyrunner.frontend.load import LoadedPlan
        from pyrunner.frontend.training import derivation, training_plans
        from pyrunner.plan.validate import plan_graph

        graph: Graph = plan_graph(plan)
        self.graph, self.verify, self.executor = graph, verify, executor
        self.loaded = LoadedPlan(plan, config=config)
        self.input_names = list(self.loaded.sig.input_names)
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in self.input_names])
        self.__name__ = plan.workload
        self._runs: tuple[Run, Run] | None = None
        self._apply: Any = None
        if executor == "reference":  # the derivation alone: nothing is planned or compiled
            self.plans = TrainingPlans(derivation(graph, None))
            return
        self.plans = training_plans(plan)
        if self.plans.forward is not plan:
            self.loaded = LoadedPlan(self.plans.forward)
        self.loaded_backward = LoadedPlan(self.plans.backward)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        b = self.plans.backward
        return (f"<superopt trainable {self.loaded.hash} {self.__name__}: backward {b.workload if b else '-'} "
                f"reads saved {', '.join(self.plans.bwd.saved) or 'nothing'}>")

    def runs(self, device: Any) -> tuple[Run, Run]:
        """Both halves as ``Run``s, compiled (and verified, when asked) on first use."""
        if self._runs is None:
            if self.executor == "reference":
                self._runs = (reference_run(self.plans.bwd.forward), reference_run(self.plans.bwd.graph))
            else:
                from pyrunner.frontend.training import gpu_check_backward

                self.loaded.compile(device)
                self.loaded_backward.compile(device)
                if self.verify:
                    self.loaded.check(device)
                    gpu_check_backward(self.loaded_backward, self.plans.bwd, str(device))
                self._runs = (plan_run(self.loaded), plan_run(self.loaded_backward))
        return self._runs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from pyrunner.frontend.load import require_gpu
        from pyrunner.frontend.signature import bind, check_tensor

        bound = bind(self.loaded.sig, args, kwargs)
        for spec in self.loaded.sig.inputs:
            check_tensor(spec, bound[spec.name])
        if self.executor == "gpu" and self._runs is None:
            require_gpu()
        xs = [bound[n] for n in self.input_names]
        if self._apply is None:
            self._apply = _function(self)
        outs = self._apply(*xs)
        return outs[0] if len(outs) == 1 else outs


def _function(t: Trainable) -> Any:
    """The ``torch.autograd.Function`` of ``t``: forward-with-saves, then the backward plan."""
    import torch

    bwd, names = t.plans.bwd, t.input_names
    fwd_names = [n for n, _ in bwd.forward.outputs]
    own = [n for n, _ in t.graph.outputs]
    axes = {n: bwd.forward.axes_of(x) for n, x in bwd.forward.outputs}
    in_axes = {x.name: tuple(x.axes) for x in t.graph.inputs()}
    back_in = {x.name for x in bwd.graph.inputs()}
    back_axes = {n: bwd.graph.axes_of(x) for n, x in bwd.graph.outputs}
    grad_of = {i: g for g, i in bwd.gradients.items()}
    cot_of = {out: c for c, out in bwd.cotangents.items()}

    class PlanFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *xs: Any) -> Any:
            fwd, _ = t.runs(xs[0].device)
            res = dict(zip(fwd_names, fwd(dict(zip(names, xs, strict=True))), strict=True))
            # added saves as the plan writes them (a log-sum-exp in float32, a contraction in the plan's dtype);
            # the float64 interpreter's in float32
            extra = [res[n] if n in own or t.executor == "gpu" else res[n].float() for n in bwd.saved]
            ctx.save_for_backward(*xs, *extra)
            return tuple(res[n] for n in own)

        @staticmethod
        def backward(ctx: Any, *gs: Any) -> Any:
            _, back = t.runs(gs[0].device)
            saved = ctx.saved_tensors
            feed = {n: x for n, x in zip(names, saved[:len(names)], strict=True) if n in back_in}
            feed.update(zip(bwd.saved, saved[len(names):], strict=True))
            feed.update({cot_of[n]: g for n, g in zip(own, gs, strict=True) if n in cot_of})
            res = dict(zip(back_axes, back({k: v for k, v in feed.items() if k in back_in}), strict=True))
            out = []
            for n, x in zip(names, saved[:len(names)], strict=True):
                g = grad_of.get(n)
                if g is None or not ctx.needs_input_grad[names.index(n)]:
                    out.append(None)
                elif g in bwd.aliases:
                    c = bwd.aliases[g]
                    out.append(_to_input(feed[c], axes[bwd.cotangents[c]], in_axes[n], x.shape, x.dtype))
                else:
                    out.append(_to_input(res[g], back_axes[g], in_axes[n], x.shape, x.dtype))
            return tuple(out)

    return PlanFunction.apply


def load(plan: Plan | dict | str | os.PathLike, *, verify: bool = False, config: dict | None = None,
         backward: bool = False) -> Any:
    """``pyrunner.load``: ``load.load`` (the plan as a function of torch CUDA tensors), or with ``backward=True``
    a ``Trainable``: a differentiable function whose backward runs the derived backward graph's plan."""
    from pyrunner.frontend.load import load as load_forward
    from pyrunner.frontend.load import read_plan

    if not backward:
        return load_forward(plan, verify=verify, config=config)
    p = read_plan(plan)
    if config:
        from pyrunner.run.runner import resolve

        config = resolve(p, config)
    return Trainable(p, verify=verify, config=config)
