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
from pyrunner.frontend.partition import Partition, partition, region_of, split, stages
from pyrunner.frontend.region import RegionGraph
from pyrunner.frontend.runtime import Impl, assemble, plan_impl, reference_impl
from pyrunner.frontend.trace import op_name, where
from pyrunner.plan.schema import Plan

log = logging.getLogger("pyrunner.frontend")
KERNEL_DTYPES = ("float16", "bfloat16")


@dataclass
class RegionChoice:
    """A region that runs as Superopt kernels."""

    region: RegionGraph
    plan: Plan | None
    naive_us: float | None = None
    check: str = ""


@dataclass
class Report:
    """What happened to a graph: the regions replaced by kernels and what stayed with PyTorch, with why."""

    regions: list[RegionChoice] = field(default_factory=list)
    fallbacks: list[tuple[str, str]] = field(default_factory=list)

    def fallback(self, nodes: list[Any], why: str) -> None:
        why = " ".join(str(why).split())[:600]
        what = ", ".join(f"{op_name(n)} ({where(n)})" for n in nodes[:3]) + (" ..." if len(nodes) > 3 else "")
        self.fallbacks.append((what, why))
        log.warning("superopt: left to PyTorch: %s: %s", what, why)

    def summary(self) -> str:
        lines = [f"{len(self.regions)} region(s) as Superopt kernels, {len(self.fallbacks)} fallback(s)"]
        for c in self.regions:
            label = c.region.label
            est = f"{c.plan.cost.total_us:g} us est. (unfused {c.naive_us:g} us)" if c.plan and c.naive_us else ""
            k = f"{len(c.plan.kernels)} kernel(s) plan {c.plan.provenance.plan_hash}" if c.plan else "reference"
            lines.append(f"  {label}: {len(c.region.nodes)} op(s) -> {k} {est} {c.check}".rstrip())
        lines += [f"  fallback: {why if why.startswith('cannot map') else f'{what}: {why}'}"
                  for what, why in self.fallbacks]
        return "\n".join(lines)


@dataclass
class Options:
    executor: str = "gpu"
    """``gpu``: plan, compile and verify kernels; ``reference``: float64 interpreter per region (CPU checks);
    ``plan``: plan only, change nothing (to know the plans ahead, e.g. to compile them in parallel)."""
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


def region_dtype(rg: RegionGraph, meta: Callable[[Any], Any], forced: str | None) -> str:
    if forced:
        if forced not in KERNEL_DTYPES:
            raise UserError(f"dtype {forced!r}: kernels are planned in {' or '.join(KERNEL_DTYPES)}")
        return forced
    dts = {str(meta(src).dtype).removeprefix("torch.") for _, src, _ in rg.inputs}
    if len(dts) == 1 and next(iter(dts)) in KERNEL_DTYPES:
        return next(iter(dts))
    raise UserError(f"region inputs are {sorted(dts)}; kernels are planned in one of {', '.join(KERNEL_DTYPES)} "
                    f"(pass dtype= to cast)")


def compile_segment(nodes: list[Any], meta: Callable[[Any], Any], opts: Options, report: Report,
                    counter: list[int]) -> list[tuple[RegionGraph, Impl]]:
    """Kernels for one segment, splitting it where the planner finds no plan."""
    counter[0] += 1
    rg = region_of(nodes, meta, f"{opts.name}_r{counter[0]}", opts.axis_names)
    if rg is None:
        return []
    say = opts.progress or (lambda s: None)
    if opts.executor == "reference":
        report.regions.append(RegionChoice(rg, None))
        return [(rg, reference_impl(rg))]
    from pyrunner.planner import search

    try:
        dtype = region_dtype(rg, meta, opts.dtype)
        t0 = time.perf_counter()
        say(f"planning {rg.label}: {len(nodes)} op(s), axes {rg.graph.sizes}")
        plan = search(rg.graph, dtype)[0]
        say(f"  plan {plan.provenance.plan_hash}: {len(plan.kernels)} kernel(s), {plan.cost.total_us:g} us est., "
            f"{time.perf_counter() - t0:.2f} s")
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
            naive = search(rg.graph, dtype, naive=True)[0].cost.total_us
        except Exception:  # noqa: BLE001 - the ops have no unfused plan either: nothing to compare with
            naive = None
        if naive is not None and plan.cost.total_us >= naive:
            report.fallback(nodes, f"the cost model predicts no gain over unfused ops ({plan.cost.total_us:g} us "
                                   f"vs {naive:g} us)")
            return []
    if opts.executor == "plan":
        report.regions.append(RegionChoice(rg, plan, naive))
        return []
    impl = plan_impl(plan, verify=False)
    try:
        say(f"  compiling {len(plan.kernels)} kernel(s)")
        loaded = impl.loaded  # type: ignore[attr-defined]
        device = "cuda"
        loaded.compile(device)
        check = ""
        if opts.verify:
            res = loaded.check(device)
            check = f"verified ({res.message})"
            say(f"  {check}")
    except Exception as e:  # noqa: BLE001 - compile or check failed: the ops stay with PyTorch
        report.fallback(nodes, str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}")
        return []
    report.regions.append(RegionChoice(rg, plan, naive, check))
    if opts.log is not None:
        _record(opts, rg, plan, loaded, nodes)
    return [(rg, impl)]


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
    part: Partition = partition(gm, meta, strict=strict)
    for node, why in part.fallbacks:
        report.fallback([node], why)
    chosen: list[tuple[RegionGraph, Impl]] = []
    counter = [0]
    for seg in part.segments:
        for piece in (stages(seg) if opts.executor != "reference" else [seg]):
            chosen += compile_segment(piece, meta, opts, report, counter)
    return assemble(gm, chosen, meta), report
