"""Which planned regions stay: each measured against the fallback compiler's code for its own ops.

Split from ``compile`` (which partitions, plans and splices): the measurement is its own question, with its
own inputs (``region_inputs``), its own forms of a region's call (a forward op, or for a training region a
forward and backward step, ``training_step``) and its own cache (``decide``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pyrunner.frontend.decide import DecisionCache, Measure, decide_once, decision_key
from pyrunner.frontend.progress import Tracker
from pyrunner.frontend.region import RegionGraph
from pyrunner.frontend.report import Report
from pyrunner.frontend.runtime import Impl, kernels_only


def keep_winners(gm: Any, chosen: list[tuple[RegionGraph, Impl]], meta: Callable[[Any], Any], report: Report, *,
                 measure: Measure, compile_fallback: Callable[[Any, list], Callable[..., Any]], executor: str,
                 tracker: Tracker) -> list[tuple[RegionGraph, Impl]]:
    """The regions measured faster than the fallback compiler's code for their own ops (decided now, at compile
    time, on inputs of the regions' shapes; or read from the decision cache). A region that loses keeps its FX
    nodes, so the fallback compiler compiles them with the rest of the graph as one: no op call between, and
    its fusions across the region's edges kept. Deciding at the first call instead (a region op that runs the
    fallback's code inside) cost the Llama-3-8B-shaped layer 8% against torch.compile in run 111. A training
    region (``autograd``) is timed forward and backward (``training_step``) against the fallback's forward and
    backward, and its decision is cached apart from a forward-only one."""
    import copy

    import torch

    from pyrunner.frontend.cache import device_key
    from pyrunner.frontend.runtime import region_callable, region_module

    device = "cuda" if executor == "gpu" else "cpu"
    key_device = device_key() if executor == "gpu" else "cpu"
    cache = DecisionCache()
    kept: list[tuple[RegionGraph, Impl]] = []
    for rg, impl in chosen:
        choice = next((c for c in report.regions if c.region is rg), None)
        sub = region_module(gm, rg, tuple(src for _, src, _ in rg.inputs))
        if choice is not None and sub is None:
            # not measurable alone, so not shown to win: the fallback compiler's code runs (never slower)
            choice.decision, choice.reason = "fallback", ("not measured: the region's ops read values from outside "
                                                          "it; the fallback compiler's code runs")
            continue
        if choice is None:
            kept.append((rg, impl))
            continue
        dtype = choice.plan.dtype if choice.plan else str(meta(rg.inputs[0][1]).dtype).removeprefix("torch.")
        training = getattr(impl, "autograd_function", None) is not None
        # a training region is timed as a training step spends it: its forward and backward, against the
        # fallback compiler's forward and backward of the same ops (a forward timing decides neither)
        # (every floating input gets a gradient on both sides: the example values say nothing of requires_grad)
        wants = [meta(src).dtype.is_floating_point for _, src, _ in rg.inputs] if training else []
        fn = impl.autograd_function(rg, meta) if training else region_callable(rg, impl, meta)
        # Made at the first measurement only: a decision read from the cache (every decode step of a KV
        # bucket after the first) must not draw the region's inputs, weights included (three 4096 x 14336
        # random matrices for the Llama-3-8B-shaped MLP, seconds on a CPU), nor compile its fallback.
        xs: list[Any] = []
        compiled: list[Callable[..., Any]] = []

        def inputs(rg: RegionGraph = rg, xs: list = xs) -> list[Any]:
            if not xs:
                xs.extend(region_inputs(rg, meta, device))
            return xs

        def example(inputs: Callable[[], list] = inputs, wants: list = wants) -> list[Any]:
            return [x.detach().requires_grad_(w) for x, w in zip(inputs(), wants, strict=True)] if wants else inputs()

        def fallback_fn(sub: Any = sub, example: Callable[[], list] = example, compiled: list = compiled,
                        wants: list = wants) -> Any:
            if not compiled:
                # Compiled apart from the graph dynamo is compiling now: inside its tracing context the
                # fallback compiler would add guards on symbols of its own to dynamo's shape environment,
                # which then fails to build the graph's guards ("sources must not be empty for symbol").
                with torch._guards.tracing(None), eager_backward_lowering(bool(wants)):
                    compiled.append(compile_fallback(copy.deepcopy(sub), example()))
            return compiled[0]

        if training:
            ours: Callable[[], object] = training_step(fn, inputs, wants)
            theirs = training_step(lambda *xs, f=fallback_fn: f()(*xs), inputs, wants)
        else:
            ours = _timed_call(rg, impl, fn, inputs)

            def theirs(fallback_fn: Callable[[], Any] = fallback_fn, inputs: Callable[[], list] = inputs) -> object:
                return fallback_fn()(*inputs())

        key = decision_key(choice.planned or rg.graph, dtype, key_device)
        if training:  # a forward-only decision of the same graph is another question
            key = replace(key, method=f"{key.method}+backward")
        tracker.start("measure")
        try:
            # keyed by the planned graph: every shape of a bucket (a decode loop's KV lengths) shares one decision
            d, _ = decide_once(rg.label, key, measure, ours, theirs, cache)
        finally:
            tracker.done("measure")
        choice.decision = "superopt" if d.choice == "superopt" else "fallback"
        choice.reason = d.why
        if d.choice == "superopt":
            kept.append((rg, impl))
    return kept


def eager_backward_lowering(training: bool) -> Any:
    """A context in which the fallback compiler lowers a graph's backward with its forward (for ``training``).
    AOTAutograd lowers it lazily, at the first backward, and that compile records metrics (``is_forward``)
    in the per-thread context which the compile of the model's graph, still under way here when a region
    is measured, already holds: setting it twice raised."""
    import contextlib

    import torch._functorch.config as functorch_config

    if training and hasattr(functorch_config, "force_non_lazy_backward_lowering"):
        return functorch_config.patch(force_non_lazy_backward_lowering=True)
    return contextlib.nullcontext()


def training_step(fn: Callable[..., Any], inputs: Callable[[], list], wants: list[bool]) -> Callable[[], object]:
    """One forward and backward of ``fn`` on ``inputs()``: fresh leaves each call (those ``wants`` marks need a
    gradient; a leaf reused from an earlier call would carry its stream into a CUDA-graph capture), cotangents
    of ones made at the first call (the values do not change these kernels' time), the input gradients taken."""
    import torch

    cot: list[Any] = []

    def step() -> object:
        xs = [x.detach().requires_grad_(w) for x, w in zip(inputs(), wants, strict=True)]
        outs = fn(*xs)
        diff = [o for o in (outs if isinstance(outs, (tuple, list)) else (outs,)) if o.requires_grad]
        leaves = [x for x in xs if x.requires_grad]
        if not diff or not leaves:
            return outs
        if not cot:
            cot.extend(torch.ones_like(o) for o in diff)
        return torch.autograd.grad(diff, leaves, cot, allow_unused=True)

    return step


def _timed_call(rg: RegionGraph, impl: Impl, fn: Callable[..., tuple],
                inputs: Callable[[], list]) -> Callable[[], object]:
    """The region op's call on its timing inputs, carrying (as ``kernels_only``) its kernels alone on the same
    inputs where the impl is a plain plan, built only when a measure calls it."""

    def call() -> object:
        return fn(*inputs())

    if getattr(impl, "loaded", None) is not None:
        built: list[Callable[[], None] | None] = []

        def kernels() -> None:
            if not built:
                built.append(kernels_only(rg, impl, inputs()))
            run = built[0]
            if run is not None:
                run()

        call.kernels_only = kernels  # type: ignore[attr-defined]
    return call


def region_inputs(rg: RegionGraph, meta: Callable[[Any], Any], device: str) -> list[Any]:
    """Inputs of the region's shapes and dtypes for timing it (fixed seed; values do not change the time of
    these kernels): N(0, 0.5) floats, random masks, zero integers (always valid indices), each laid out as the
    model's tensor is where that is dense (a head-split view: the region reads it as it lies, as in the model)."""
    import torch

    from pyrunner.frontend.strides import dense

    g = torch.Generator().manual_seed(0)
    out = []
    for _, src, _ in rg.inputs:
        m = meta(src)
        if m.dtype.is_floating_point:
            t = (0.5 * torch.randn(tuple(m.shape), generator=g, dtype=torch.float32)).to(m.dtype)
        elif m.dtype == torch.bool:
            t = torch.rand(tuple(m.shape), generator=g) < 0.5
        else:
            t = torch.zeros(tuple(m.shape), dtype=m.dtype)
        stride = tuple(m.stride())
        if dense(tuple(m.shape), stride):
            t = torch.empty_strided(tuple(m.shape), stride, dtype=t.dtype).copy_(t)
        out.append(t.to(device))
    return out

