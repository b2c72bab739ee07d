"""--explain: a plan's derivation and cost in a kernel engineer's words."""

from __future__ import annotations

from pyrunner.plan.analysis import default_value, kernel_ops
from pyrunner.plan.schema import Gemm, Kernel, Plan, Reduce
from pyrunner.planner.cost import UNFITTED


def _kernel_words(k: Kernel, tensors: dict[str, list[str]]) -> list[str]:
    grid = ", ".join(g.axis + ("" if g.block == 1 else f"/{default_value(k, g.block)}") for g in k.grid)
    lines = [f"kernel {k.name}: grid over ({grid}), {default_value(k, k.threads)} threads"]
    if k.loop is not None:
        lines.append(f"  streams {k.loop.axis} in tiles of {default_value(k, k.loop.block)}, "
                     f"{default_value(k, k.loop.stages)}-stage pipeline")
    state = [b.name for b in k.buffers if b.state]
    if state:
        lines.append(f"  on-chip state across the loop: {', '.join(state)}")
    gemms = [op for op in kernel_ops(k) if isinstance(op, Gemm)]
    if gemms:
        lines.append("  tensor-core GEMMs: " + "; ".join(
            f"{g.c} {'=' if g.clear else '+='} {g.a} @ {g.b} over {g.contract}" for g in gemms))
    reds = [op for op in kernel_ops(k) if isinstance(op, Reduce)]
    if reds:
        lines.append("  reductions: " + "; ".join(f"{r.fn} of {r.src} over {r.axis} -> {r.dst}" for r in reds))
    lines.append(f"  reads {', '.join(k.reads)}; writes {', '.join(k.writes)}")
    if k.fused_rules:
        lines.append(f"  loop rules: {', '.join(k.fused_rules)}")
    return lines


def time_words(plan: Plan) -> str:
    """The plan's time, saying whether it is the cost model's prediction or a tuning-database measurement
    (never a measurement called "predicted")."""
    if not plan.cost.model.get("measured"):
        modelled = (" (modelled from the device description alone: no run of this backend on this GPU exists)"
                    if plan.cost.model.get(UNFITTED) else "")
        return f"predicted {plan.cost.total_us:.1f} us by the cost model{modelled}"
    model = plan.cost.model.get("model_total_us")
    return (f"measured {plan.cost.total_us:.1f} us (tuning database, at its tuned config)"
            + (f"; the cost model predicted {model:.1f} us" if model is not None else ""))


def explain(plan: Plan) -> str:
    """Readable summary: derivation steps, kernels, materialized tensors, predicted cost."""
    out = [f"plan {plan.provenance.plan_hash} for {plan.workload} ({plan.dtype}), "
           f"{len(plan.kernels)} kernel(s), {time_words(plan)}"]
    if plan.provenance.planner.endswith("-naive"):
        out.append("the naive plan: every op its own kernel, no rewrites (asked for with --naive, or the "
                   "search found no fused plan within its budget)")
    if plan.provenance.search_cut:
        out.append("search cut short by its work budgets (deterministic; a larger budget may find a better plan); "
                   "not explored:")
        out.extend(f"  - {note}" for note in plan.provenance.search_cut)
    out.append("derivation:")
    if not plan.derivation:
        out.append("  (none: the graph as written)")
    for i, s in enumerate(plan.derivation, 1):
        out.append(f"  {i}. {s.rule} at {s.at}")
    inter = [t for t in plan.tensors if t.role == "intermediate"]
    out.append("global memory: " + (", ".join(f"{t.name}{t.shape}" for t in inter) + " materialized between kernels"
                                    if inter else "only inputs and outputs (no intermediate reaches HBM)"))
    tensors = {t.name: t.axes for t in plan.tensors}
    for k in plan.kernels:
        out.extend(_kernel_words(k, tensors))
    out.append("cost model (predictions per kernel):")
    for kc in plan.cost.kernels:
        out.append(f"  {kc.kernel}: {kc.time_us:.1f} us, {kc.bound}-bound, "
                   f"{kc.flops / 1e9:.2f} GFLOP, {kc.bytes / 1e6:.1f} MB moved")
    summed = sum(kc.time_us for kc in plan.cost.kernels)
    if "measured" not in plan.cost.model and plan.cost.total_us < summed - 0.05:
        out.append(f"  total {plan.cost.total_us:.1f} us, under the kernels' sum {summed:.1f}: a kernel runs beside "
                   "the next on the SMs that kernel leaves idle, which waits for it after its loop "
                   "(planner.coschedule)")
    return "\n".join(out)
