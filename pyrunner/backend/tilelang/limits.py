"""How large a plan TileLang is asked to lower: a bound checked before any lowering starts.

TileLang's lowering grows faster than linearly with the ops of a kernel (a 90-node elementwise DAG
fused into one kernel took 22 CPU-s and 2.0 GB, a 200-node one 46 CPU-s and 2.4 GB, then crashed)
and linearly with the kernels of a plan (the naive plan of a 200-deep softmax chain holds 600
kernels, minutes to lower). A plan file
under 1 MB can ask for either, so the renderer refuses such plans with one line naming the limit
instead of running out of time or memory. The largest catalog or corpus plan holds 3 kernels of at
most 21 ops, far inside these limits.
"""

from __future__ import annotations

from pyrunner.plan.schema import Plan

MAX_KERNEL_OPS = 64
"""Most tile ops (loads, maps, reductions, GEMMs, stores) one kernel may hold."""
MAX_PLAN_KERNELS = 64
"""Most kernels one plan may hold."""
MAX_PLAN_OPS = 1024
"""Most tile ops of all a plan's kernels together."""


def size_problem(plan: Plan) -> str | None:
    """One line saying which lowering limit ``plan`` exceeds, or None."""
    if len(plan.kernels) > MAX_PLAN_KERNELS:
        return (f"the plan has {len(plan.kernels)} kernels; TileLang is asked to lower at most {MAX_PLAN_KERNELS} "
                "(a graph this deep or wide needs a smaller graph per plan)")
    total = 0
    for k in plan.kernels:
        ops = len(k.prologue) + len(k.body) + len(k.epilogue)
        if ops > MAX_KERNEL_OPS:
            return (f"kernel {k.name!r} has {ops} ops; TileLang is asked to lower at most {MAX_KERNEL_OPS} "
                    "per kernel")
        total += ops
    if total > MAX_PLAN_OPS:
        return f"the plan has {total} ops; TileLang is asked to lower at most {MAX_PLAN_OPS} per plan"
    return None
