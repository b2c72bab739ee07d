"""Does the rendered source follow the plan op by op? Compares the emulator's trace of each kernel's
first block (``emulate.py``) with the plan: buffers (shape, dtype, scope), the sequence of loads,
stores, fills, gemms, reductions and map writes (the renderer's layout-bridge copies aside), the
global region every copy touches and the dim every reduction takes."""

from __future__ import annotations

from pyrunner.backend.tilelang.emulate import Emulation
from pyrunner.plan import masks
from pyrunner.plan.analysis import kernel_axes, resolve, resolve_config
from pyrunner.plan.passes import optimize
from pyrunner.plan.schedule import AsyncSchedule, async_schedule, issue_order
from pyrunner.plan.schema import Fill, Gemm, Load, Map, Plan, Reduce, Store, axis_sizes


def _steps(plan: Plan, k, cfg: dict[str, int]) -> int:
    """Loop steps the first block runs: all, or those its masked bounds leave (``plan.masks``)."""
    if k.loop is None:
        return 1
    size = next(n for t in plan.tensors for a, n in zip(t.axes, t.shape, strict=True) if a == k.loop.axis)
    block = resolve(k.loop.block, cfg)
    if k.loop.visible is None:
        return size // block
    sizes = axis_sizes(plan)
    box = {a: (0, resolve(r.block, cfg) - 1) for a, r in kernel_axes(k, sizes).items() if a != k.loop.axis}
    box.update({masks.size_symbol(a): (n, n) for a, n in sizes.items()})
    return len(masks.visible_steps(masks.predicate(k.loop.visible), k.loop.axis, block, size // block, box))


def _event(op, scalars: set[str]) -> tuple | None:
    if isinstance(op, Load):  # a scalar tensor is copied by an element assignment
        return ("copy", op.src, op.dst) if op.src not in scalars else ("map", op.dst)
    if isinstance(op, Store):
        return ("copy", op.src, op.dst) if op.dst not in scalars else None
    if isinstance(op, Fill):
        return ("fill", op.dst)
    if isinstance(op, Gemm):
        return ("gemm", op.a, op.b, op.c)
    if isinstance(op, Reduce):
        return ("reduce", op.fn, op.src, op.dst)
    if isinstance(op, Map):
        return ("map", op.dst)
    return None  # pragma: no cover - the schema admits no other op


def _expected_events(plan: Plan, k, cfg: dict[str, int], sched: AsyncSchedule | None = None) -> list[tuple]:
    """The plan's ops as the first block runs them; with an asynchronous schedule, the
    consumers' order (``plan.schedule.issue_order``) without the producer's loads."""
    steps = _steps(plan, k, cfg)
    scalars = {t.name for t in plan.tensors if not t.axes}
    if sched is None:
        ops = [*k.prologue, *(op for _ in range(steps) for op in k.body), *k.epilogue]
    else:
        ops = [*k.prologue, *(k.body[i] for _, i in issue_order(sched, steps)), *k.epilogue]
    return [e for op in ops if (e := _event(op, scalars)) is not None]


def structure_problems(plan: Plan, em: Emulation, config: dict | None = None) -> list[str]:
    """Where the rendered source's first block disagrees with the plan: buffers (shape, dtype, scope),
    the sequence of ops (loads, stores, fills, gemms, reductions, map writes; the renderer's layout
    bridge copies aside), the global region each copy touches and the dim each reduction takes."""
    plan = optimize(plan)  # the renderer's own plan-to-plan passes: the source follows their result
    cfg = resolve_config(plan, config)
    problems: list[str] = []
    sizes = {a: n for t in plan.tensors for a, n in zip(t.axes, t.shape, strict=True)}
    for k in plan.kernels:
        tr = em.traces[k.name]
        kc = cfg[k.name]
        blocks = {g.axis: (kc[g.block] if isinstance(g.block, str) else g.block) for g in k.grid}
        if k.loop is not None:
            blocks[k.loop.axis] = kc[k.loop.block] if isinstance(k.loop.block, str) else k.loop.block
        ident: dict[str, str] = {}
        sched = None
        if ("async",) in tr.events:  # rendered by render_ws: the producer's loads go into rings of slots
            sched = async_schedule(k)
            if sched is None:
                problems.append(f"{k.name}: rendered with a producer warpgroup, but the plan has no asynchronous "
                                "schedule")
                continue
        ring = {k.body[i].dst for i in sched.loads} if sched else set()
        stages = (kc[k.loop.stages] if isinstance(k.loop.stages, str) else k.loop.stages) if ring else 0
        for b, (name, shape, dtype, scope) in zip(k.buffers, tr.allocs, strict=False):
            want = tuple(blocks[a] for a in b.axes) or (1,)
            if b.name in ring:
                want = (stages, *want)
            ident[name] = b.name
            if (shape, dtype, scope) != (want, b.dtype, b.scope):
                problems.append(f"{k.name}: buffer {b.name!r} rendered as {scope} {dtype} {shape}, "
                                f"plan says {b.scope} {b.dtype} {want}")
        if len(tr.allocs) < len(k.buffers):
            problems.append(f"{k.name}: {len(tr.allocs)} buffers allocated, the plan has {len(k.buffers)}")
        bridges = {name for name, *_ in tr.allocs[len(k.buffers):]}
        got: list[tuple] = []
        loads: list[tuple] = []
        seen: dict[str, int] = {}
        for ev in tr.events:
            if ev == ("async",):
                continue
            # buffers the renderer adds (layout bridges, staged epilogues): writes into them are its
            # own steps; a copy out of one into a global tensor stands for the plan's store
            if (ev[0] == "copy" and ev[2] in bridges) or (ev[0] == "map" and ev[1] in bridges):
                continue
            if ev[0] == "copy" and ev[1] in bridges:
                if ev[2] in bridges or ev[2] in ident:
                    continue
                ev = ("copy", "*", *ev[2:])
            ev = tuple(ident.get(x, x) if isinstance(x, str) else x for x in ev)
            if ev[0] == "reduce":
                src = next(b for b in k.buffers if b.name == ev[2])
                op = next(o for o in k.prologue + k.body + k.epilogue if isinstance(o, Reduce) and o.src == ev[2]
                          and o.dst == ev[3])
                if src.axes.index(op.axis) != ev[4]:
                    problems.append(f"{k.name}: reduction of {ev[2]!r} over dim {ev[4]}, plan reduces axis "
                                    f"{op.axis!r} = dim {src.axes.index(op.axis)}")
                ev = ev[:4]
            if ev[0] == "copy":
                problems += _region_problems(plan, k, ev, blocks, sizes, seen)
                ev = ev[:3]
            (loads if ev[0] == "copy" and ev[2] in ring else got).append(ev)
        if sched is not None:
            want_loads = [_event(k.body[i], set()) for _ in range(_steps(plan, k, kc)) for i in sched.loads]
            if loads != want_loads:
                problems.append(f"{k.name}: the producer loads {loads[:4]}..., the plan's steps load "
                                f"{want_loads[:4]}...")
        want = _expected_events(plan, k, kc, sched)
        got = [w if g[:1] == ("copy",) and g[1] == "*" and w[:1] == ("copy",) and w[2] == g[2] else g
               for g, w in zip(got, want, strict=False)] + got[len(want):]
        if got != want:
            i = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            problems.append(f"{k.name}: op {i} of the first block is {got[i] if i < len(got) else 'missing'}, "
                            f"the plan says {want[i] if i < len(want) else 'nothing more'}")
    return problems


def _region_problems(plan: Plan, k, ev: tuple, blocks: dict[str, int], sizes: dict[str, int],
                     seen: dict[str, int]) -> list[str]:
    """The first block (every grid coordinate 0) touches tile 0 of each tiled grid axis, the whole
    extent of a held axis, element 0 of an indexed one, and step ``i`` of the loop axis on the
    ``i``-th copy of that tensor in the loop."""
    tensors = {t.name: t for t in plan.tensors}
    g = ev[1] if ev[1] in tensors else ev[2]
    region = ev[3]
    t = tensors.get(g)
    if t is None or region is None or not t.axes:
        return []
    if len(region) != len(t.axes):
        return [f"{k.name}: copy of {g!r} indexes {len(region)} dims, the tensor has {len(t.axes)}"]
    loop = k.loop.axis if k.loop is not None else None
    per_step = sum(1 for op in k.body if isinstance(op, (Load, Store)) and g in (op.src, op.dst))
    step = 0
    if loop in t.axes and per_step:
        step = seen.get(g, 0) // per_step
        seen[g] = seen.get(g, 0) + 1
    out = []
    for a, r in zip(t.axes, region, strict=True):
        b = blocks.get(a, sizes[a])
        want: tuple[int, int] | int = 0 if b == 1 and a != loop else ((step * b, (step + 1) * b) if a == loop
                                                                      else (0, b))
        if r != want and not (isinstance(want, int) and r == (0, 1)):
            out.append(f"{k.name}: copy of {g!r} along axis {a!r} touches {r} in the first block, expected {want}")
    return out

