"""Kernel-IR rewrites the renderer applies before emitting TileLang (same results, faster code).

They keep the plan's meaning (each is an exact algebraic identity over the reals) and change
only where work happens, so the CPU executor's check of the plan still speaks for the kernel:

- ``defer_loop_reductions``: a row sum or running max accumulated inside the streamed loop
  (RMSNorm's sum of squares, a column sum of a loaded tile, a variance's masked sum of squares,
  an absmax) becomes an elementwise per-thread partial in the loop, reduced across threads once
  in the epilogue: no shuffle or barrier per loop step.
- ``defer_online_sums``: a running max with sums rescaled to it every step (a softmax's statistics
  streamed over its row) becomes an elementwise running max and rescaled sum per tile position,
  combined across threads once in the epilogue.

- ``sink_late_inputs``: prologue ops that only feed the epilogue, one of them a load of a tensor
  an earlier kernel writes (RMSNorm's row statistics), move to the epilogue, so the dependent
  launch's wait for the kernels ahead comes after the loop.

``rendered_kernel`` applies them in that order: the kernel as the renderer emits it and (without
the plan's other kernels, so nothing sinks) as the fit check budgets it.
"""

from __future__ import annotations

import math

from pyrunner.ir.names import fresh_name
from pyrunner.ir.ops import REDUCTIONS
from pyrunner.plan.analysis import expr_refs, op_reads_writes, substitute_refs
from pyrunner.plan.dependent_launch import dependent_launches
from pyrunner.plan.schema import (
    Buffer,
    Call,
    Const,
    Expr,
    Fill,
    Gemm,
    Kernel,
    Load,
    Map,
    Plan,
    Reduce,
    Ref,
    Store,
)


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


def _finite_or_zero(name: str) -> Expr:
    """``name`` where it is finite, else 0: a running max that is still -inf (every value so far
    masked) is subtracted as 0, so exp(-inf - m) is 0 rather than exp(-inf + inf) = NaN."""
    return Call(fn="where", args=[Call(fn="lt", args=[Const(value="-inf"), Ref(buf=name)]),
                                  Ref(buf=name), Const(value=0.0)])


def _online_sums(kernel: Kernel) -> tuple | None:
    """The online-softmax pattern of a loop body, or None.

    ``prev = m``; ``reduce_max(a -> m, accumulate)``; optionally ``safe = where(-inf < m, m, 0)``;
    scale maps ``sc = f(prev, m)``; tile maps reading ``m`` (or ``safe``); and per sum
    ``reduce_sum(t -> st)`` with ``s = s * sc + st``. Returns (max reduce, the ``prev = m`` map, safe, scale maps,
    [(sum reduce, update map)]) when ``m``, ``prev``, ``safe``, the scales and the partial sums are
    mentioned nowhere else in the loop, every tile involved holds the max's source's axes, and
    each sum keeps its tile's axes but the loop's (a softmax-weighted sum over the loop axis, such
    as attention pooling's ``sum_t x[b, t, c] * softmax_t(s[b, t])``, keeps ``c``).
    """
    body = kernel.body
    if kernel.loop is None or any(isinstance(op, Gemm) for op in body):
        return None
    bufs = {b.name: b for b in kernel.buffers}
    maxes = [op for op in body if isinstance(op, Reduce) and op.fn == "max" and op.accumulate]
    if len(maxes) != 1:
        return None
    red = maxes[0]
    m, tile_axes = red.dst, bufs[red.src].axes
    if not bufs[m].state or red.axis != kernel.loop.axis:
        return None
    copies = [op for op in body if isinstance(op, Map) and op.expr == Ref(buf=m)]
    if len(copies) != 1 or body.index(copies[0]) > body.index(red):
        return None
    prev = copies[0].dst
    safe = next((op for op in body if isinstance(op, Map) and op.expr == _finite_or_zero(m)), None)
    scales = [op for op in body if isinstance(op, Map) and op is not copies[0] and prev in expr_refs(op.expr)
              and not bufs[op.dst].state]
    if not scales or any(set(expr_refs(op.expr)) - {prev, m} - {safe.dst if safe else m}
                         - {b for b in bufs if bufs[b].axes != tile_axes and not bufs[b].state} for op in scales):
        return None
    scale_names = {op.dst for op in scales}
    sums = []
    for up in body:
        if isinstance(up, Map) and up.dst != prev and up.dst in bufs and bufs[up.dst].state and up.dst != m:
            e = up.expr
            ok = (isinstance(e, Call) and e.fn == "add" and len(e.args) == 2 and isinstance(e.args[1], Ref)
                  and isinstance(e.args[0], Call) and e.args[0].fn == "mul"
                  and e.args[0].args[0] == Ref(buf=up.dst) and isinstance(e.args[0].args[1], Ref)
                  and e.args[0].args[1].buf in scale_names)
            if not ok:
                continue
            part = e.args[1].buf
            tiles = [op for op in body if isinstance(op, Reduce) and op.dst == part]
            if len(tiles) != 1 or tiles[0].fn != "sum" or tiles[0].accumulate or tiles[0].axis != red.axis:
                return None
            src_axes = bufs[tiles[0].src].axes
            if not set(tile_axes) <= set(src_axes) or bufs[up.dst].axes != [a for a in src_axes if a != red.axis]:
                return None
            sums.append((tiles[0], up))
    if not sums:
        return None
    owned = {id(op) for op in (red, copies[0], *scales, *(x for pair in sums for x in pair))}
    if safe is not None:
        owned.add(id(safe))
    private = {prev, *scale_names, *(r.dst for r, _ in sums), *(u.dst for _, u in sums)}
    temporaries = {prev, *scale_names, *(r.dst for r, _ in sums)}
    if any(temporaries & {*op_reads_writes(op)[0], *op_reads_writes(op)[1]} for op in kernel.epilogue):
        return None
    for op in body:
        if id(op) in owned:
            continue
        r, w = op_reads_writes(op)
        if private & {*r, *w} or m in w or (safe is not None and safe.dst in w):
            return None
        if (m in r or (safe is not None and safe.dst in r)) and not (
                isinstance(op, Map) and set(tile_axes) <= set(bufs[op.dst].axes) and body.index(op) > body.index(red)):
            return None
    return red, copies[0], safe, scales, sums


def defer_online_sums(kernel: Kernel) -> Kernel:
    """Keep a streamed softmax's running max and rescaled sums per tile position, not per row.

    The lowering's online softmax (``online_softmax_rescale``) reduces each step's tile to a row
    max across threads, rescales the row sums to it and reduces each step's exponentials across
    threads again: two cross-thread reductions per row and step (run 52: a 512 x 50257 softmax's
    statistics kernel took 88 us for 51 MB, 3.5 us per step). Instead every tile position keeps
    its own running max ``mp`` and sum ``sp`` (``mn = max(mp, a)``; ``sp = sp * f(mp, mn) + t``
    with ``t`` read against ``mn``), and the epilogue combines them once: ``m = max_v mp``,
    ``s = sum_v sp * f(mp, m)``. The same identity as the per-row form (sums rescaled to a common
    max add up), per position; a max still -inf is subtracted as 0, so masked positions add 0.
    """
    found = _online_sums(kernel)
    if found is None:
        return kernel
    red, copy, safe, scales, sums = found
    prev = copy.dst
    bufs = {b.name: b for b in kernel.buffers}
    axes = list(bufs[red.src].axes)
    taken = {b.name for b in kernel.buffers}

    def new(base: str, state: bool, axes: list[str] = axes) -> str:
        name = fresh_name(base, taken, "t")
        taken.add(name)
        extra.append(Buffer(name=name, axes=list(axes), scope="fragment", dtype="float32", state=state))
        return name

    extra: list[Buffer] = []
    m = red.dst
    mp, mn = new(f"{m}_pos", True), new(f"{m}_pos_new", False)
    sp = {up.dst: new(f"{up.dst}_pos", True, bufs[r.src].axes) for r, up in sums}  # a sum keeps its tile's axes
    scale_of = {op.dst: new(f"{op.dst}_pos", False) for op in scales}
    read_max = {m: _finite_or_zero(mn)}
    if safe is not None:
        read_max[safe.dst] = _finite_or_zero(mn)
    owned = {id(op) for op in (red, *scales, *(x for pair in sums for x in pair))}
    body: list = []
    for op in kernel.body:
        if op is copy or (safe is not None and op is safe):
            continue
        if op is red:
            body.append(Map(dst=mn, expr=Call(fn="max", args=[Ref(buf=mp), Ref(buf=red.src)])))
        elif id(op) in owned and isinstance(op, Map) and op.dst in scale_of:
            body.append(Map(dst=scale_of[op.dst], expr=substitute_refs(op.expr, {prev: Ref(buf=mp), **read_max})))
        elif id(op) in owned and isinstance(op, Reduce):
            continue
        elif id(op) in owned:  # a sum's update: s = s * sc + st  ->  sp = sp * sc_pos + t
            (t,) = [r.src for r, up in sums if up is op]
            sc = op.expr.args[0].args[1].buf
            body.append(Map(dst=sp[op.dst], expr=Call(fn="add", args=[
                Call(fn="mul", args=[Ref(buf=sp[op.dst]), Ref(buf=scale_of[sc])]), Ref(buf=t)])))
        elif isinstance(op, Map):
            body.append(op.model_copy(update={"expr": substitute_refs(op.expr, read_max)}))
        else:
            body.append(op)
    body.append(Map(dst=mp, expr=Ref(buf=mn)))
    # epilogue: the row max over positions, each position's sums rescaled to it, summed over positions
    epi: list = [Reduce(fn="max", src=mp, dst=m, axis=red.axis, accumulate=False)]
    final_max = {prev: Ref(buf=mp), m: _finite_or_zero(m), **({safe.dst: _finite_or_zero(m)} if safe else {})}
    for op in scales:
        epi.append(Map(dst=scale_of[op.dst], expr=substitute_refs(op.expr, final_max)))
    for r, up in sums:
        sc = up.expr.args[0].args[1].buf
        epi.append(Map(dst=sp[up.dst], expr=Call(fn="mul", args=[Ref(buf=sp[up.dst]), Ref(buf=scale_of[sc])])))
        epi.append(Reduce(fn="sum", src=sp[up.dst], dst=up.dst, axis=red.axis, accumulate=False))
    if safe is not None and any(safe.dst in op_reads_writes(op)[0] for op in kernel.epilogue):
        epi.append(safe)
    dead = {prev, *(op.dst for op in scales), *(r.dst for r, _ in sums)} - {mp, mn}
    if safe is not None and safe not in epi:
        dead.add(safe.dst)
    buffers = [b for b in kernel.buffers if b.name not in dead] + extra
    prologue = list(kernel.prologue) + [Fill(dst=mp, value="-inf")] + [Fill(dst=x, value=0.0) for x in sp.values()]
    return kernel.model_copy(update={"buffers": buffers, "prologue": prologue, "body": body,
                                     "epilogue": epi + list(kernel.epilogue)})


def sink_late_inputs(kernel: Kernel, earlier: frozenset[str]) -> Kernel:
    """Move the prologue ops that only feed the epilogue to its front, where one of them loads a
    tensor an earlier kernel of the plan writes (``earlier``).

    A dependently launched kernel waits for the kernels ahead before its first such load. RMSNorm's
    GEMM reads its row statistics in the prologue (``t = rsqrt(s + eps)``) but uses them only to
    scale the accumulator after the loop: sunk into the epilogue, the loop runs while the
    statistics kernel finishes, and the wait comes after it. An op moves when the loop neither
    reads nor writes what it writes nor writes what it reads, and no prologue op after it that
    stays touches what it writes or writes what it reads (so the order of what stays is kept).
    Without a load of ``earlier`` nothing moves: a load in the prologue overlaps the first steps.
    """
    if kernel.loop is None or not kernel.prologue or not earlier:
        return kernel
    body_reads = {x for op in kernel.body for x in op_reads_writes(op)[0]}
    body_writes = {x for op in kernel.body for x in op_reads_writes(op)[1]}
    pro = kernel.prologue
    sunk: set[int] = set()
    for i in reversed(range(len(pro))):
        if isinstance(pro[i], Store):
            continue
        r, w = (set(x) for x in op_reads_writes(pro[i]))
        if w & (body_reads | body_writes) or r & body_writes:
            continue
        later = [op_reads_writes(pro[j]) for j in range(i + 1, len(pro)) if j not in sunk]
        if any(w & (set(lr) | set(lw)) or r & set(lw) for lr, lw in later):
            continue
        sunk.add(i)
    if not any(isinstance(pro[i], Load) and pro[i].src in earlier for i in sunk):
        return kernel
    return kernel.model_copy(update={"prologue": [op for i, op in enumerate(pro) if i not in sunk],
                                     "epilogue": [pro[i] for i in sorted(sunk)] + list(kernel.epilogue)})


def rendered_kernel(kernel: Kernel, earlier: frozenset[str] = frozenset()) -> Kernel:
    """The kernel as the renderer emits it: the passes above (``earlier``: tensors the kernels ahead
    of it in its plan write, for ``sink_late_inputs``)."""
    return sink_late_inputs(defer_loop_reductions(defer_online_sums(kernel)), earlier)


def optimize(plan: Plan) -> Plan:
    """The plan with every kernel rewritten by the passes above (a new object; the input is unchanged)."""
    launches = dependent_launches(plan)
    kernels = [rendered_kernel(k, launches[k.name].earlier) for k in plan.kernels]
    if all(a is b for a, b in zip(kernels, plan.kernels, strict=True)):
        return plan
    return plan.model_copy(update={"kernels": kernels})
