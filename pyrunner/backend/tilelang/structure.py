"""Does the rendered source follow the plan op by op? Compares the emulator's trace of each kernel's
first block (``emulate.py``) with the plan: buffers (shape, dtype, scope), the sequence of loads,
stores, fills, gemms, reductions and map writes (the renderer's layout-bridge copies aside), the
global region every copy touches and the dim every reduction takes."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pyrunner.backend.tilelang.emulate import Emulation
from pyrunner.plan import masks
from pyrunner.plan.analysis import block_box, kernel_axes, resolve, resolve_config
from pyrunner.plan.passes import optimize
from pyrunner.plan.schedule import (
    AsyncSchedule,
    async_schedule,
    gemm_operand_loads,
    issue_order,
    longest_first_axes,
)
from pyrunner.plan.schema import Fill, Gemm, Load, Map, Plan, Reduce, Store, axis_sizes


@dataclass(frozen=True)
class _FirstBlock:
    """The first block the emulator runs (and traces): its coordinate along each grid axis (the last
    tile of an axis launched longest-first, ``plan.schedule.longest_first_axes``, else 0), the loop
    steps it runs (all of them, or those its masked bounds leave) and the kernel's blocks."""

    coord: dict[str, int]
    visible: range
    blocks: dict[str, int]
    sizes: dict[str, int]
    loop: str | None = None

    def box(self, step: int | None = None) -> dict[str, tuple[int, int]]:
        """Its tile's index box, at loop step ``step`` (None: without the loop axis)."""
        coord = self.coord if step is None else {**self.coord, self.loop: step}
        return block_box(coord, self.blocks, self.sizes)


def _first_block(plan: Plan, k, cfg: dict[str, int]) -> _FirstBlock:
    sizes = axis_sizes(plan)
    roles = kernel_axes(k, sizes)
    blocks = {a: resolve(r.block, cfg) for a, r in roles.items()}
    longest = longest_first_axes(k, sizes)
    coord = {a: -(-sizes[a] // blocks[a]) - 1 if a in longest else 0 for a, r in roles.items() if r.kind != "loop"}
    if k.loop is None:
        return _FirstBlock(coord, range(1), blocks, sizes)
    first = _FirstBlock(coord, range(sizes[k.loop.axis] // blocks[k.loop.axis]), blocks, sizes, k.loop.axis)
    if k.loop.visible is None:
        return first
    return replace(first, visible=masks.visible_steps(masks.predicate(k.loop.visible), k.loop.axis,
                                                      blocks[k.loop.axis], len(first.visible), first.box()))


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


def _expected_events(plan: Plan, k, first: _FirstBlock, sched: AsyncSchedule | None = None) -> list[tuple]:
    """The plan's ops as the first block runs them; with an asynchronous schedule, the
    consumers' order (``plan.schedule.issue_order``) without the producer's loads. A masked Map
    runs only on the tiles its mask does not show whole (the renderer's ``if``)."""
    steps = first.visible
    scalars = {t.name for t in plan.tensors if not t.axes}
    if not steps:  # every step masked: the loop's ops never run
        order = []
    elif sched is None:
        order = [(j, i) for j in range(len(steps)) for i in range(len(k.body))]
    else:
        order = issue_order(sched, len(steps))
    ops = [(None, op) for op in k.prologue] + [(steps[j], k.body[i]) for j, i in order]
    ops += [(None, op) for op in k.epilogue]
    return [e for step, op in ops if _runs(first, step, op) and (e := _event(op, scalars)) is not None]


def _runs(first: _FirstBlock, step: int | None, op) -> bool:
    """Whether the first block runs ``op`` (at loop step ``step``; None outside the loop)."""
    pred = masks.mask_predicate(op) if isinstance(op, Map) else None
    if pred is None:
        return True
    test = masks.tile_test(pred, first.box(step), masks.IntArith())
    return test.all_true is None or test.all_true > 0


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
        first = _first_block(plan, k, kc)
        blocks = first.blocks
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
                problems += _region_problems(plan, k, ev, blocks, sizes, seen, first)
                ev = ev[:3]
            (loads if ev[0] == "copy" and ev[2] in ring else got).append(ev)
        if sched is not None:
            want_loads = [_event(k.body[i], set()) for _ in first.visible for i in sched.loads]
            if loads != want_loads:
                problems.append(f"{k.name}: the producer loads {loads[:4]}..., the plan's steps load "
                                f"{want_loads[:4]}...")
        want = _expected_events(plan, k, first, sched)
        if sched is not None:  # tiles the producer may load by TMA beside the ring: no place in the order
            once = {k.prologue[i].dst for i in gemm_operand_loads(k)}
            moved_got = sorted(e for e in got if e[0] == "copy" and e[2] in once)
            moved_want = sorted(e for e in want if e[0] == "copy" and e[2] in once)
            if moved_got != moved_want:
                problems.append(f"{k.name}: the prologue loads {moved_got}, the plan loads {moved_want}")
            got = [e for e in got if not (e[0] == "copy" and e[2] in once)]
            want = [e for e in want if not (e[0] == "copy" and e[2] in once)]
        got = [w if g[:1] == ("copy",) and g[1] == "*" and w[:1] == ("copy",) and w[2] == g[2] else g
               for g, w in zip(got, want, strict=False)] + got[len(want):]
        if got != want:
            i = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            problems.append(f"{k.name}: op {i} of the first block is {got[i] if i < len(got) else 'missing'}, "
                            f"the plan says {want[i] if i < len(want) else 'nothing more'}")
    return problems


def _region_problems(plan: Plan, k, ev: tuple, blocks: dict[str, int], sizes: dict[str, int],
                     seen: dict[str, int], first: _FirstBlock) -> list[str]:
    """The first block touches its tile of each tiled grid axis (tile 0, or the last one of an axis
    launched longest-first), the whole extent of a held axis, element 0 of an indexed one, and its
    ``i``-th visible step of the loop axis on the ``i``-th copy of that tensor in the loop."""
    coord, visible = first.coord, first.visible
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
        i = seen.get(g, 0) // per_step
        step = visible[i] if i < len(visible) else visible.start + i
        seen[g] = seen.get(g, 0) + 1
    out = []
    for a, r in zip(t.axes, region, strict=True):
        b = blocks.get(a, sizes[a])
        c = step if a == loop else coord.get(a, 0)
        want: tuple[int, int] | int = 0 if b == 1 and a != loop else (c * b, (c + 1) * b)
        if r != want and not (isinstance(want, int) and r == (0, 1)):
            out.append(f"{k.name}: copy of {g!r} along axis {a!r} touches {r} in the first block, expected {want}")
    return out

