"""Kernel-IR rewrites the renderer applies before emitting TileLang (same results, faster code).

They keep the plan's meaning (each is an exact algebraic identity over the reals) and change
only where work happens, so the CPU executor's check of the plan still speaks for the kernel:

- ``defer_loop_reductions``: a row sum or running max accumulated inside the streamed loop
  (RMSNorm's sum of squares, a column sum of a loaded tile, a variance's masked sum of squares,
  an absmax) becomes an elementwise per-thread partial in the loop, reduced across threads once
  in the epilogue: no shuffle or barrier per loop step.
"""

from __future__ import annotations

import math

from pyrunner.ir.names import fresh_name
from pyrunner.ir.ops import REDUCTIONS
from pyrunner.plan.analysis import expr_refs, op_reads_writes
from pyrunner.plan.schema import Buffer, Call, Fill, Kernel, Load, Map, Plan, Reduce, Ref


def _mentions(op, name: str) -> bool:
    r, w = op_reads_writes(op)
    return name in r or name in w


def defer_loop_reductions(kernel: Kernel) -> Kernel:
    """Move accumulating loop reductions to the epilogue, keeping per-thread partials.

    Applies to a body ``reduce_f(t -> r, accumulate)`` (f a sum or a max, ``ir.ops.REDUCTIONS``)
    whose ``r`` is not read or written elsewhere in the loop. f over steps of the row results = row
    f of the elementwise f over steps, so the reduction moves to the front of the epilogue and the
    loop keeps one running value per element (sums below; a max takes ``max`` and ``-inf``):

    - where ``t`` is a float32 fragment written by one Map that does not read it and used nowhere
      else, that Map accumulates in place (prologue ``t = 0``; body ``t = t + f(...)``): no new
      buffer;
    - otherwise, where ``t`` is a tile the loop loads or a fragment only Maps write (a sum of
      squares that a tail mask rewrites, a value another op also reads), a float32 partial ``p``
      of ``t``'s shape takes the sum (body ``p = p + t``). Not for a fragment a GEMM writes: a
      partial of an accumulator doubles the registers the fit check budgets for it.
    """
    if kernel.loop is None:
        return kernel
    bufs = {b.name: b for b in kernel.buffers}
    body = list(kernel.body)
    loaded = {op.dst for op in body if isinstance(op, Load)}
    moved: list[Reduce] = []
    state: dict[str, float | str] = {}  # buffer -> the value it starts from
    extra: list[Buffer] = []
    for red in [op for op in kernel.body if isinstance(op, Reduce)]:
        t, r = red.src, red.dst
        if red.fn not in _COMBINE or not red.accumulate or t not in bufs:
            continue
        combine, identity = _COMBINE[red.fn]
        if any(_mentions(op, r) for op in body if op is not red):
            continue
        if _accumulate_in_place(kernel, body, red):
            w = next(i for i, op in enumerate(body) if isinstance(op, Map) and op.dst == t)
            body[w] = Map(dst=t, expr=Call(fn=combine, args=[Ref(buf=t), body[w].expr]))
            body = [op for op in body if op is not red]
            moved.append(red)
            state[t] = identity
            continue
        map_written = bufs[t].scope == "fragment" and all(isinstance(op, Map) for op in body
                                                          if t in op_reads_writes(op)[1])
        if t not in loaded and not map_written:
            continue
        part = fresh_name(f"{t}_partial", {*bufs, *(b.name for b in extra)}, "partial")
        extra.append(Buffer(name=part, axes=list(bufs[t].axes), scope="fragment", dtype="float32", state=True))
        body[body.index(red)] = Map(dst=part, expr=Call(fn=combine, args=[Ref(buf=part), Ref(buf=t)]))
        moved.append(red.model_copy(update={"src": part}))
        state[part] = identity
    if not moved:
        return kernel
    buffers = [b.model_copy(update={"state": True}) if b.name in state else b for b in kernel.buffers] + extra
    prologue = list(kernel.prologue) + [Fill(dst=t, value=state[t]) for t in sorted(state)]
    return kernel.model_copy(update={"buffers": buffers, "prologue": prologue, "body": body,
                                     "epilogue": moved + list(kernel.epilogue)})


def _fill(identity: float) -> float | str:
    return {-math.inf: "-inf", math.inf: "inf"}.get(identity, identity)


_COMBINE: dict[str, tuple[str, float | str]] = {
    r.tile: (r.combine, _fill(r.identity)) for r in REDUCTIONS.values() if r.name == r.tile}
"""Tile reduction -> (the elementwise op that merges a value into a running one, its start value)."""


def _accumulate_in_place(kernel: Kernel, body: list, red: Reduce) -> bool:
    """Whether ``red``'s source can take its own running sum: a float32 fragment, not loop state,
    written by one Map that does not read it, read only by ``red``, unused outside the loop."""
    t = red.src
    buf = next(b for b in kernel.buffers if b.name == t)
    if buf.scope != "fragment" or buf.dtype != "float32" or buf.state:
        return False
    writers = [op for op in body if isinstance(op, Map) and op.dst == t]
    users = [op for op in body if _mentions(op, t)]
    if len(writers) != 1 or len(users) != 2 or t in expr_refs(writers[0].expr):
        return False
    return not any(_mentions(op, t) for op in kernel.prologue + kernel.epilogue)


def optimize(plan: Plan) -> Plan:
    """The plan with every kernel rewritten by the passes above (a new object; the input is unchanged)."""
    kernels = [defer_loop_reductions(k) for k in plan.kernels]
    if all(a is b for a, b in zip(kernels, plan.kernels, strict=True)):
        return plan
    return plan.model_copy(update={"kernels": kernels})
