"""From an FX graph to a callable: partition, plan each region, compile and verify it, splice it back.

Shared by ``optimize`` (everything must map; a region without a plan stays a
PyTorch op, with a warning) and the ``torch.compile`` backend (anything may
fall back; the rest of the graph goes to inductor). Every decision that leaves
work to PyTorch is logged with its reason and kept in ``Report.fallbacks``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyrunner.errors import UserError
from pyrunner.frontend.buckets import bucketed, padded_impl
from pyrunner.frontend.decide import Measure
from pyrunner.frontend.flops import node_flops
from pyrunner.frontend.partcache import cached_partition
from pyrunner.frontend.partition import Partition, cheaper_cut, region_of, split, stages
from pyrunner.frontend.progress import NullTracker, Tracker
from pyrunner.frontend.region import RegionGraph
from pyrunner.frontend.region_plans import cached_plan, cpu_check, loaded_impl, naive_plan
from pyrunner.frontend.report import RegionChoice, Report
from pyrunner.frontend.runtime import Impl, assemble, reference_impl
from pyrunner.frontend.trace import op_name
from pyrunner.frontend.winners import keep_winners
from pyrunner.plan.schema import Plan

log = logging.getLogger("pyrunner.frontend")
KERNEL_DTYPES = ("float16", "bfloat16")


@dataclass
class Options:
    executor: str = "gpu"
    """``gpu``: plan, compile and verify kernels; ``reference``: float64 interpreter per region (CPU checks);
    ``plan``: plan and CPU-check each region, change nothing (no GPU: PyTorch runs the ops)."""
    dtype: str | None = None
    verify: bool = True
    must_beat_unfused: bool = False
    """Backend rule: keep a region only if the cost model predicts it beats the unfused (one kernel per op) plan."""
    axis_names: dict[str, tuple[str, ...]] | None = None
    progress: Callable[[str], None] | None = None
    name: str = "fn"
    log: Path | None = None
    """Results log (JSON Lines) that gets one record per region kept as kernels (the chosen plan)."""
    source: str = "optimize"
    measure: Measure | None = None
    """Times a region's kernels against ``fallback_compile``'s code for its ops when the graph is compiled
    (``decide``); the faster is kept. None: no measurement (every planned region is kept)."""
    fallback_compile: Callable[[Any, list], Callable] | None = None
    """The fallback compiler (``gm, example_inputs -> callable``) a region is measured against."""
    bucket: bool = True
    """Plan free axes (no reduce/contract over them) at their bucket size (``buckets``): shapes share plans."""
    tracker: Tracker = field(default_factory=NullTracker)
    """Progress display: one item per region in the plan, check, compile and measure stages."""
    segment: Callable[..., list] | None = None
    """Compiles one segment in place of ``compile_segment`` (same arguments): under autograd,
    ``autograd.training_segment`` (each region with its derived backward)."""
    device: str | None = None
    """The device (``backend.tilelang.backend.BACKENDS`` key) regions are planned, rendered and compiled for;
    None: the GPU found at run time (``backend.local_backend_name``), h200 without one."""
    needs_grad: frozenset[Any] | None = None
    """Under autograd, the FX nodes whose values need gradients (``autograd.grad_nodes``); a region derives
    gradients for its inputs among them only. None: every input's."""


def region_dtype(rg: RegionGraph, meta: Callable[[Any], Any], forced: str | None) -> str:
    """The kernels' dtype: ``forced``, else the one floating dtype of the region's inputs (masks aside)."""
    if forced:
        if forced not in KERNEL_DTYPES:
            raise UserError(f"dtype {forced!r}: kernels are planned in {' or '.join(KERNEL_DTYPES)}")
        return forced
    dts = {str(meta(src).dtype).removeprefix("torch.") for _, src, _ in rg.inputs} - {"bool"}
    if len(dts) == 1 and next(iter(dts)) in KERNEL_DTYPES:
        return next(iter(dts))
    raise UserError(f"region inputs are {sorted(dts)}; kernels are planned in one of {', '.join(KERNEL_DTYPES)} "
                    f"(pass dtype= to cast)")


def _no_kernel_dtype(nodes: list[Any], meta: Callable[[Any], Any]) -> str | None:
    """Why none of ``nodes`` can be planned as they are: no floating value among them is in a kernel dtype."""
    import torch

    dts = set()
    for n in nodes:
        v = meta(n)
        for t in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                dts.add(str(t.dtype).removeprefix("torch."))
    if not dts or dts & set(KERNEL_DTYPES):
        return None
    return (f"no plan: the ops compute in {', '.join(sorted(dts))}; kernels are planned in "
            f"{' or '.join(KERNEL_DTYPES)} (pass dtype= to cast)")


def _kernel_dtype_inside(rg: RegionGraph, meta: Callable[[Any], Any]) -> bool:
    """Whether any input of the region is in a kernel dtype (so a piece of it might be planned)."""
    return any(str(meta(src).dtype).removeprefix("torch.") in KERNEL_DTYPES for _, src, _ in rg.inputs)


def compile_segment(nodes: list[Any], meta: Callable[[Any], Any], opts: Options, report: Report,
                    counter: list[int]) -> list[tuple[RegionGraph, Impl]]:
    """Kernels for one segment, splitting it where the planner finds no plan."""
    counter[0] += 1
    try:
        rg = region_of(nodes, meta, f"{opts.name}_r{counter[0]}", opts.axis_names)
    except Exception as e:  # noqa: BLE001 - a piece that does not translate alone: smaller pieces, else PyTorch
        if isinstance(e, UserError) and "axes for" in str(e):
            raise  # the user's axes= names are wrong: say so
        if len(nodes) > 1:
            a, b = split(nodes)
            return compile_segment(a, meta, opts, report, counter) + compile_segment(b, meta, opts, report, counter)
        report.fallback(nodes, str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}")
        return []
    if rg is None:
        return []
    say = opts.progress or (lambda s: None)
    flops = sum(node_flops(n, meta) for n in nodes)
    if opts.executor == "reference":  # the float64 interpreter on the graph a plan would be made for
        graph, pads = bucketed(rg.graph) if opts.bucket else (rg.graph, {})
        impl = reference_impl(graph)
        report.chose(RegionChoice(rg, None, decision="reference", reason="float64 interpreter"
                                  + _bucket_note(graph, pads), flops=flops, planned=graph if pads else None))
        return [(rg, padded_impl(impl, graph, pads) if pads else impl)]
    try:
        dtype = region_dtype(rg, meta, opts.dtype)
    except UserError as e:
        if len(nodes) > 1 and _kernel_dtype_inside(rg, meta):
            a, b = split(nodes)  # mixed dtypes: a smaller piece may be all bf16/fp16
            return compile_segment(a, meta, opts, report, counter) + compile_segment(b, meta, opts, report, counter)
        report.fallback(nodes, f"no plan: {e}")  # no piece of it is in a kernel dtype: one line for all of it
        return []
    cut = cheaper_cut(nodes, lambda piece: _modelled_us(piece, meta, opts))
    if cut is not None:
        say(f"  {rg.label}: {cut.describe()}")
        return (compile_segment(cut.head, meta, opts, report, counter)
                + compile_segment(cut.tail, meta, opts, report, counter))
    try:
        t0 = time.perf_counter()
        opts.tracker.start("plan")
        graph, pads = bucketed(rg.graph) if opts.bucket else (rg.graph, {})
        say(f"planning {rg.label}: {len(nodes)} op(s), axes {rg.graph.sizes}"
            + (f"; bucket {', '.join(f'{a} {n} -> {graph.sizes[a]}' for a, n in pads.items())}" if pads else ""))
        try:
            plan, hit = cached_plan(graph, dtype, opts.device)
        finally:
            opts.tracker.done("plan")
        say(f"  plan {plan.provenance.plan_hash}: {len(plan.kernels)} kernel(s), {plan.cost.total_us:g} us est., "
            + ("planned before (same region graph)" if hit else f"{time.perf_counter() - t0:.2f} s"))
    except Exception as e:  # noqa: BLE001 - a planner failure (or bug) leaves the ops to PyTorch, never wrong
        if not isinstance(e, UserError):
            e = UserError(f"planner failed: {type(e).__name__}: {e}")
        if len(nodes) > 1:
            a, b = split(nodes)
            say(f"  no plan for {rg.label} ({e}); splitting {len(a)} + {len(b)} op(s)")
            return compile_segment(a, meta, opts, report, counter) + compile_segment(b, meta, opts, report, counter)
        report.fallback(nodes, f"no plan: {e}")
        return []
    naive = None
    if opts.must_beat_unfused:
        try:
            naive = naive_plan(graph, dtype, opts.device).cost.total_us
        except Exception:  # noqa: BLE001 - the ops have no unfused plan either: nothing to compare with
            naive = None
        if naive is not None and plan.cost.total_us >= naive:
            report.fallback(nodes, f"the cost model predicts no gain over unfused ops ({plan.cost.total_us:g} us "
                                   f"vs {naive:g} us)")
            return []
    if opts.executor == "plan":
        check = ""
        if opts.verify:
            opts.tracker.start("check")
            try:
                check = cpu_check(plan)
            except Exception as e:  # noqa: BLE001 - a plan that fails its check is not counted as mapped
                report.fallback(nodes, str(e) if isinstance(e, UserError) else f"CPU check: {type(e).__name__}: {e}")
                return []
            finally:
                opts.tracker.done("check")
        report.chose(RegionChoice(rg, plan, naive, check, decision="planned",
                                           reason="planned, not measured (no GPU): PyTorch runs these ops"
                                                  + (f"; {check}" if check else "") + _bucket_note(graph, pads),
                                           flops=flops))
        return []
    impl = loaded_impl(plan, opts.device)
    if pads:  # planned at the bucket size: pad the inputs' free axes, slice the outputs back
        whole = impl
        impl = padded_impl(impl, graph, pads)
        impl.loaded = whole.loaded  # type: ignore[attr-defined]
    stage = "compile"
    try:
        say(f"  compiling {len(plan.kernels)} kernel(s)")
        loaded = impl.loaded  # type: ignore[attr-defined]
        device = "cuda"
        opts.tracker.start("compile")
        loaded.compile(device)
        opts.tracker.done("compile")
        check = ""
        if opts.verify:
            stage = "check"
            opts.tracker.start("check")
            res = loaded.verified if loaded.verified is not None and loaded.verified.ok else loaded.check(device)
            opts.tracker.done("check")
            check = f"verified ({res.message})"
            say(f"  {check}")
    except Exception as e:  # noqa: BLE001 - compile or check failed: the ops stay with PyTorch
        opts.tracker.done(stage)
        report.fallback(nodes, str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}")
        return []
    report.chose(RegionChoice(rg, plan, naive, check, reason=(check or "kernels compiled") + _bucket_note(graph, pads),
                              flops=flops, planned=graph if pads else None))
    if opts.log is not None:
        _record(opts, rg, plan, loaded, nodes)
    return [(rg, impl)]


def _modelled_us(nodes: list[Any], meta: Callable[[Any], Any], opts: Options) -> float:
    """The modelled time of the plan ``compile_segment`` would make for ``nodes`` (0 where they only view their
    inputs); raises where there is none. Plans are cached, so the piece chosen is not planned twice."""
    rg = region_of(nodes, meta, "piece", opts.axis_names)
    if rg is None:
        return 0.0
    graph, _ = bucketed(rg.graph) if opts.bucket else (rg.graph, {})
    return cached_plan(graph, region_dtype(rg, meta, opts.dtype), opts.device)[0].cost.total_us


def _bucket_note(graph: Any, pads: dict[str, int]) -> str:
    return "; planned at bucket " + ", ".join(f"{a}={graph.sizes[a]} (is {n})" for a, n in pads.items()) if pads else ""


def _record(opts: Options, rg: RegionGraph, plan: Plan, loaded: Any, nodes: list[Any]) -> None:
    """One results-log record for a chosen plan: what it replaced, its estimate, its check."""
    from pyrunner.log.results import append_record, make_record
    from pyrunner.run.timing import device_name

    res = loaded.verified
    append_record(opts.log, make_record(
        plan_hash=loaded.hash, workload=f"{opts.source}:{rg.label}", graph_hash=plan.provenance.graph_hash,
        shapes=dict(rg.graph.sizes), dtype=plan.dtype, device=device_name(), status="ok",
        message=f"chosen by pyrunner.frontend ({opts.source}) for {len(nodes)} op(s): "
                + ", ".join(op_name(n) for n in nodes[:8]),
        seed=getattr(res, "seed", None), predicted_us=plan.cost.total_us,
        error=getattr(res, "error", None), error_bound=getattr(res, "bound", None),
        extra={"frontend": opts.source, "region": rg.label, "ops": [n.name for n in nodes]}))


def compile_graph(gm: Any, meta: Callable[[Any], Any], opts: Options, strict: bool) -> tuple[Any, Report]:
    """Partition ``gm``, compile its regions, splice them in (in place); returns gm and the report."""
    report = Report()
    report.flops_total = sum(node_flops(n, meta) for n in gm.graph.nodes)
    part: Partition = cached_partition(gm, meta, strict=strict)[0]  # a decode loop cuts its graph once
    for node, why in part.fallbacks:
        report.fallback([node], why)
    chosen: list[tuple[RegionGraph, Impl]] = []
    counter = [0]
    dtype_check = opts.executor != "reference" and not opts.dtype
    everything = [n for seg in part.segments for n in seg]
    why = _no_kernel_dtype(everything, meta) if dtype_check else None
    if why:  # a float32 model, say: one line for the whole graph, not one per region
        report.fallback(everything, why)
    segment = opts.segment or compile_segment
    for seg in part.segments if not why else []:
        why = _no_kernel_dtype(seg, meta) if dtype_check else None
        if why:  # no piece of the segment could be planned: one line for all of it, not one per stage
            report.fallback(seg, why)
            continue
        for piece in (stages(seg) if opts.executor != "reference" else [seg]):
            chosen += segment(piece, meta, opts, report, counter)
    if opts.measure is not None and opts.fallback_compile is not None:
        chosen = keep_winners(gm, chosen, meta, report, measure=opts.measure, compile_fallback=opts.fallback_compile,
                              executor=opts.executor, tracker=opts.tracker)
    return assemble(gm, chosen, meta), report
