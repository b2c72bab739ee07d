"""How large a plan TileLang is asked to lower: a bound checked before any lowering starts.

TileLang's lowering grows faster than linearly with the ops of a kernel (a 90-node elementwise DAG
fused into one kernel took 22 CPU-s and 2.0 GB, a 200-node one 46 CPU-s and 2.4 GB, then crashed)
and linearly with the kernels of a plan (the naive plan of a 200-deep softmax chain holds 600
kernels, minutes to lower). One op can be large too: a Map's expression is a tree of any width within
``plan.claims.MAX_EXPR_DEPTH`` (a 4,096-leaf tree, 250 KB of plan, took 50 CPU-s to lower and run on the
CPU; three of them 140 CPU-s), and the CPU check evaluates every expression node once per
tile. A plan file under 1 MB can ask for any of these, so the renderer refuses such plans with one line
naming the limit instead of running out of time or memory. The largest catalog or corpus plan holds 3
kernels of at most 21 ops; of the top-3 plans of every catalog and corpus graph at the sweep's small
shape, the largest kernel's Maps hold 43 expression nodes and the largest plan's 56, far inside these limits.
"""

from __future__ import annotations

from pyrunner.plan.schema import Kernel, Map, Plan

MAX_KERNEL_OPS = 64
"""Most tile ops (loads, maps, reductions, GEMMs, stores) one kernel may hold."""
MAX_PLAN_KERNELS = 64
"""Most kernels one plan may hold."""
MAX_PLAN_OPS = 1024
"""Most tile ops of all a plan's kernels together."""
MAX_KERNEL_EXPR_NODES = 512
"""Most expression nodes (calls, refs, constants, indices) one kernel's Maps and loop predicate may hold."""
MAX_PLAN_EXPR_NODES = 1024
"""Most expression nodes of all a plan's kernels together: with the CPU check's budget of 4,096 tiles
(``run.shrink.CPU_BUDGET_BLOCK_STEPS``) that keeps the check within seconds."""


def expr_nodes(kernel: Kernel) -> int:
    """Expression nodes of a kernel's Maps and loop predicate, counted without recursion."""
    stack = [op.expr for sec in (kernel.prologue, kernel.body, kernel.epilogue) for op in sec if isinstance(op, Map)]
    if kernel.loop is not None and kernel.loop.visible is not None:
        stack.append(kernel.loop.visible)
    n = 0
    while stack:
        e = stack.pop()
        n += 1
        stack.extend(getattr(e, "args", None) or ())
    return n


def size_problem(plan: Plan) -> str | None:
    """One line saying which lowering limit ``plan`` exceeds, or None."""
    if len(plan.kernels) > MAX_PLAN_KERNELS:
        return (f"the plan has {len(plan.kernels)} kernels; TileLang is asked to lower at most {MAX_PLAN_KERNELS} "
                "(a graph this deep or wide needs a smaller graph per plan)")
    total = total_nodes = 0
    for k in plan.kernels:
        ops = len(k.prologue) + len(k.body) + len(k.epilogue)
        if ops > MAX_KERNEL_OPS:
            return (f"kernel {k.name!r} has {ops} ops; TileLang is asked to lower at most {MAX_KERNEL_OPS} "
                    "per kernel")
        nodes = expr_nodes(k)
        if nodes > MAX_KERNEL_EXPR_NODES:
            return (f"kernel {k.name!r} has {nodes} expression nodes; TileLang is asked to lower at most "
                    f"{MAX_KERNEL_EXPR_NODES} per kernel")
        total += ops
        total_nodes += nodes
    if total > MAX_PLAN_OPS:
        return f"the plan has {total} ops; TileLang is asked to lower at most {MAX_PLAN_OPS} per plan"
    if total_nodes > MAX_PLAN_EXPR_NODES:
        return (f"the plan has {total_nodes} expression nodes; TileLang is asked to lower at most "
                f"{MAX_PLAN_EXPR_NODES} per plan")
    return None
