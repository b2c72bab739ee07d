"""Kernel-IR rewrites the renderer applies before emitting TileLang (same results, faster code).

They keep the plan's meaning (each is an exact algebraic identity over the reals) and change
only where work happens, so the CPU executor's check of the plan still speaks for the kernel:

- ``defer_linear_reductions``: a row sum accumulated inside the streamed loop (RMSNorm's
  sum of squares, a column sum of a loaded tile) becomes an elementwise per-thread partial in
  the loop, reduced across threads once in the epilogue: no shuffle or barrier per loop step.
"""

from __future__ import annotations

from pyrunner.ir.names import fresh_name
from pyrunner.plan.analysis import expr_refs, op_reads_writes
from pyrunner.plan.schema import Buffer, Call, Fill, Kernel, Load, Map, Plan, Reduce, Ref


def _mentions(op, name: str) -> bool:
    r, w = op_reads_writes(op)
    return name in r or name in w


def defer_linear_reductions(kernel: Kernel) -> Kernel:
    """Move accumulating loop sums of a Map's result to the epilogue, keeping per-thread partials.

    Applies to body ops ``t = f(...)`` then ``reduce_sum(t -> r, accumulate)`` where ``t`` is a
    float32 fragment used nowhere else and ``r`` is not read or written elsewhere in the loop.
    Rewritten: prologue ``t = 0``; body ``t = t + f(...)``; epilogue first ``reduce_sum(t -> r,
    accumulate)``. Sum over steps of the row sums = row sum of the elementwise sum over steps.
    A sum straight over a tile the loop loads, ``reduce_sum(x_s -> r, accumulate)``, gets a partial
    of its own: body ``p = p + x_s``, the same epilogue reduction of ``p``.
    """
    if kernel.loop is None:
        return kernel
    bufs = {b.name: b for b in kernel.buffers}
    body = list(kernel.body)
    loaded = {op.dst for op in body if isinstance(op, Load)}
    moved: list[Reduce] = []
    state: set[str] = set()
    extra: list[Buffer] = []
    for red in [op for op in kernel.body if isinstance(op, Reduce)]:
        t, r = red.src, red.dst
        if red.fn == "sum" and red.accumulate and t in loaded and not any(_mentions(op, r) for op in body
                                                                           if op is not red):
            part = fresh_name(f"{t}_partial", {*bufs, *(b.name for b in extra)}, "partial")
            extra.append(Buffer(name=part, axes=list(bufs[t].axes), scope="fragment", dtype="float32", state=True))
            at = body.index(red)
            body[at] = Map(dst=part, expr=Call(fn="add", args=[Ref(buf=part), Ref(buf=t)]))
            moved.append(red.model_copy(update={"src": part}))
            state.add(part)
            continue
        if red.fn != "sum" or not red.accumulate or t not in bufs or bufs[t].scope != "fragment" \
                or bufs[t].dtype != "float32" or bufs[t].state:
            continue
        writers = [i for i, op in enumerate(body) if isinstance(op, Map) and op.dst == t]
        users = [op for op in body if _mentions(op, t)]
        if len(writers) != 1 or len(users) != 2 or any(_mentions(op, t) for op in kernel.prologue + kernel.epilogue):
            continue
        if any(_mentions(op, r) for op in body if op is not red):
            continue
        w = body[writers[0]]
        if t in expr_refs(w.expr):
            continue
        body[writers[0]] = Map(dst=t, expr=Call(fn="add", args=[Ref(buf=t), w.expr]))
        body = [op for op in body if op is not red]
        moved.append(red)
        state.add(t)
    if not moved:
        return kernel
    buffers = [b.model_copy(update={"state": True}) if b.name in state else b for b in kernel.buffers] + extra
    prologue = list(kernel.prologue) + [Fill(dst=t, value=0.0) for t in sorted(state)]
    return kernel.model_copy(update={"buffers": buffers, "prologue": prologue, "body": body,
                                     "epilogue": moved + list(kernel.epilogue)})


def optimize(plan: Plan) -> Plan:
    """The plan with every kernel rewritten by the passes above (a new object; the input is unchanged)."""
    kernels = [defer_linear_reductions(k) for k in plan.kernels]
    if all(a is b for a, b in zip(kernels, plan.kernels, strict=True)):
        return plan
    return plan.model_copy(update={"kernels": kernels})
