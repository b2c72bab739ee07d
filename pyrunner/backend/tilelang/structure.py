"""Does the rendered source follow the plan op by op? Compares the emulator's trace of each kernel's
first block (``emulate.py``) with the plan: buffers (shape, dtype, scope), the sequence of loads,
stores, fills, gemms, reductions and map writes (the renderer's layout-bridge copies aside), the
global region every copy touches and the dim every reduction takes."""

from __future__ import annotations

from pyrunner.backend.tilelang.emulate import Emulation
from pyrunner.plan.analysis import resolve_config
from pyrunner.plan.passes import optimize
from pyrunner.plan.schema import Fill, Gemm, Load, Map, Plan, Reduce, Store


def _expected_events(plan: Plan, k, cfg: dict[str, int]) -> list[tuple]:
    steps = 1
    if k.loop is not None:
        size = next(n for t in plan.tensors for a, n in zip(t.axes, t.shape, strict=True) if a == k.loop.axis)
        block = cfg[k.loop.block] if isinstance(k.loop.block, str) else k.loop.block
        steps = size // block
    scalars = {t.name for t in plan.tensors if not t.axes}
    out: list[tuple] = []
    for ops, times in ((k.prologue, 1), (k.body, steps), (k.epilogue, 1)):
        for _ in range(times):
            for op in ops:
                if isinstance(op, Load):  # a scalar tensor is copied by an element assignment
                    out.append(("copy", op.src, op.dst) if op.src not in scalars else ("map", op.dst))
                elif isinstance(op, Store):
                    if op.dst not in scalars:
                        out.append(("copy", op.src, op.dst))
                elif isinstance(op, Fill):
                    out.append(("fill", op.dst))
                elif isinstance(op, Gemm):
                    out.append(("gemm", op.a, op.b, op.c))
                elif isinstance(op, Reduce):
                    out.append(("reduce", op.fn, op.src, op.dst))
                elif isinstance(op, Map):
                    out.append(("map", op.dst))
    return out


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
        for b, (name, shape, dtype, scope) in zip(k.buffers, tr.allocs, strict=False):
            want = tuple(blocks[a] for a in b.axes) or (1,)
            ident[name] = b.name
            if (shape, dtype, scope) != (want, b.dtype, b.scope):
                problems.append(f"{k.name}: buffer {b.name!r} rendered as {scope} {dtype} {shape}, "
                                f"plan says {b.scope} {b.dtype} {want}")
        if len(tr.allocs) < len(k.buffers):
            problems.append(f"{k.name}: {len(tr.allocs)} buffers allocated, the plan has {len(k.buffers)}")
        bridges = {name for name, *_ in tr.allocs[len(k.buffers):]}
        got: list[tuple] = []
        seen: dict[str, int] = {}
        for ev in tr.events:
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
            got.append(ev)
        want = _expected_events(plan, k, kc)
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

