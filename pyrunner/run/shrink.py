"""CPU-check shapes: the plan at shapes the CPU executor can run in seconds.

The executor (``run.executor``) runs a plan as given; this module chooses what it runs: the plan at its
real shapes when they fit the CPU budget, else the same plan scaled down, keeping what the plan's
constants and tiles test (an axis a mask compares with a constant stays past it, a partial last tile
stays partial, every axis a distinct size so a swapped axis cannot hide).
"""

from __future__ import annotations

import math

from pyrunner.errors import PlanError
from pyrunner.plan.analysis import MMA_K_ALIGN, kernel_geometry
from pyrunner.plan.schema import BackwardOf, Call, Const, Expr, Index, Map, Plan, axis_sizes
from pyrunner.target.layout import padded_row


def _divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


TILED_SIZES = (32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256)
"""Sizes scale_down gives tiled axes: distinct multiples of 16 (any two share a tile of 16)."""
PADDED_SIZES = (24, 40, 56, 72)
"""Sizes for an axis held whole in a tile padded to whole MMA steps (``MMA_K_ALIGN``): none a multiple of 16, so
the padding stays exercised, and none equal to a tiled or indexed size."""
INDEXED_SIZES = (2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
"""Sizes scale_down gives axes that are only ever indexed (batch-like): small and distinct."""
CPU_BUDGET_ELEMENTS = 1 << 20
"""The CPU check runs at the plan's real shapes when its global tensors hold at most this many
elements in all, ..."""
CPU_BUDGET_BLOCK_STEPS = 4096
"""... its kernels run at most this many (block, loop step) pairs (each costs numpy calls), ..."""
CPU_BUDGET_ITERATIONS = 1 << 27
"""... and no kernel's iteration space (product of its axes' extents) exceeds this."""


def fits_cpu_budget(plan: Plan) -> bool:
    """Whether the executor can run the plan at its real shapes within the CPU budget."""
    sizes = axis_sizes(plan)
    if sum(math.prod(t.shape) for t in plan.tensors) > CPU_BUDGET_ELEMENTS:
        return False
    steps = 0
    for k in plan.kernels:
        geo = kernel_geometry(k, k.defaults, sizes)
        tiles = math.prod(geo.tiles[g.axis] for g in k.grid)
        loop = geo.tiles[k.loop.axis] if k.loop is not None else 1
        steps += tiles * loop
        axes = {a for t in plan.tensors if t.name in set(k.reads) | set(k.writes) for a in t.axes}
        axes |= {g.axis for g in k.grid} | ({k.loop.axis} if k.loop is not None else set())
        if math.prod(sizes[a] for a in axes) > CPU_BUDGET_ITERATIONS:
            return False
    return steps <= CPU_BUDGET_BLOCK_STEPS


def cpu_check_plan(plan: Plan) -> Plan:
    """The plan the CPU check runs: the plan itself at its real shapes when they fit the budget,
    else ``scale_down(plan)`` (every axis a distinct size, so a swapped axis cannot hide)."""
    return plan if fits_cpu_budget(plan) else scale_down(plan)


COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")


Comparison = tuple[set[str], float]
"""The index axes one comparison reads and the largest constant magnitude in it (0 when none)."""


def _graph_comparisons(plan: Plan, out: list[Comparison]) -> None:
    """The comparisons of the plan's source graph (iota axes and constants under a comparison)."""
    from pyrunner.plan.views import plan_graph

    try:
        terms = plan_graph(plan).terms()
    except PlanError:
        return
    for t in terms:
        if not (t.op == "binary" and t.fn in COMPARISONS):
            continue
        axes, consts, inner = set(), [0.0], list(t.args)
        while inner:
            x = inner.pop()
            if x.op == "iota":
                axes.add(x.axis)
            elif x.op == "const" and math.isfinite(x.value):
                consts.append(abs(x.value))
            inner.extend(x.args)
        if axes:
            out.append((axes, max(consts)))


def _plan_comparisons(plan: Plan, out: list[Comparison]) -> None:
    """The comparisons in the plan's expressions (maps and loop visibility) that read an index."""
    exprs: list[Expr] = [k.loop.visible for k in plan.kernels if k.loop is not None and k.loop.visible is not None]
    exprs += [op.expr for k in plan.kernels for op in (*k.prologue, *k.body, *k.epilogue) if isinstance(op, Map)]
    stack = list(exprs)
    while stack:
        e = stack.pop()
        args = getattr(e, "args", None) or []
        stack.extend(args)
        if not (isinstance(e, Call) and e.fn in COMPARISONS):
            continue
        axes, consts, inner = set(), [0.0], list(args)
        while inner:
            x = inner.pop()
            if isinstance(x, Index):
                axes.add(x.axis)
            elif isinstance(x, Const) and isinstance(x.value, float) and math.isfinite(x.value):
                consts.append(abs(x.value))
            inner.extend(getattr(x, "args", None) or [])
        if axes:
            out.append((axes, max(consts)))


def compared_constants(plan: Plan) -> dict[str, float]:
    """For each axis whose index a comparison reads (a mask: a window, a band, a causal offset), the
    largest constant in any comparison that reads it, in the plan or its source graph: scaled below
    that, the mask never bites, and a plan with its window dropped or changed would pass the CPU check
    (issue 46).

    Axes compared with one another (a causal mask's ``j <= i``) share their constants, through any chain
    of comparisons: lengthened alone past a constant (``i < 1023``), ``i`` would run far past a short
    ``j``, its last rows would see only distant keys (a retention decay makes them zero), and an edit
    zeroing those rows would pass; and in a mask like ``j < 1792 or j <= i`` (a prefix constant on ``j``
    alone) a short ``i`` would leave the causal part inside the prefix, where it never bites."""
    comparisons: list[Comparison] = []
    _graph_comparisons(plan, comparisons)
    _plan_comparisons(plan, comparisons)
    groups: list[Comparison] = []
    for axes, c in comparisons:  # merge every group sharing an axis with this comparison
        axes, linked = set(axes), [g for g in groups if g[0] & axes]
        for g in linked:
            groups.remove(g)
            axes |= g[0]
        groups.append((axes, max([c, *(g[1] for g in linked)])))
    return {a: c for axes, c in groups for a in axes}


def _tail_axes(plan: Plan, sizes: dict[str, int]) -> set[str]:
    """Axes some kernel tiles, at its default config, with a partial last tile (a tail) at the real shape."""
    out: set[str] = set()
    for k in plan.kernels:
        tiled = [(g.axis, g.block) for g in k.grid] + ([(k.loop.axis, k.loop.block)] if k.loop is not None else [])
        for a, b in tiled:
            if isinstance(b, str) and sizes[a] % k.defaults[b]:
                out.add(a)
    return out


MAX_MASKED_EXTENT = 4096
"""Longest extent ``scale_down`` keeps for an axis a mask compares with a constant (never past the real
extent either): a window wider than about 2700 is exercised only in part, bounding the check's time."""


def _longer_than(n: int, constant: float, used: set[int]) -> int:
    """``n``, or the smallest multiple of 16 past 1.5 x ``constant`` that no other axis has: half as many
    rows again see past the constant, so a window changed or dropped moves many outputs, not a few."""
    if n > 1.5 * constant + 16:
        return n
    m = (int(1.5 * constant) // 16 + 2) * 16
    while m in used:
        m += 16
    return m


def _keep_constants_and_tails(plan: Plan, sizes: dict[str, int], new_sizes: dict[str, int],
                              fixed: set[str]) -> set[str]:
    """Lengthen, in ``new_sizes``, every axis a mask compares with a constant (``compared_constants``)
    and give every axis with a tail at the real shape a remainder on 16 (axes in ``fixed`` keep their
    sizes); returns the tail axes, whose tiles ``scale_down`` then keeps at 16 or less."""
    used = set(new_sizes.values())
    for a, c in sorted(compared_constants(plan).items()):  # a mask's constants must still bite
        if a in new_sizes and a not in fixed:
            n = max(new_sizes[a], min(_longer_than(new_sizes[a], c, used), sizes[a], MAX_MASKED_EXTENT))
            while n != new_sizes[a] and n in used:
                n += 16
            new_sizes[a] = n
            used.add(n)
    tails = _tail_axes(plan, sizes) - fixed
    for a in sorted(tails):  # a partial last tile at the real shape stays partial: a remainder of 1..15 on 16
        if a in new_sizes:
            n = new_sizes[a] - new_sizes[a] % 16 + (sizes[a] % 16 or 7)
            while n in used:
                n += 16
            new_sizes[a] = n
            used.add(n)
    return tails


def _resized(plan: Plan, new_sizes: dict[str, int]) -> BackwardOf | None:
    """A backward plan's derivation record at the new sizes (its forward graph's axes are the backward's)."""
    rec = plan.provenance.backward_of
    if rec is None or not isinstance(rec.forward.get("axes"), dict):
        return rec
    axes = {a: new_sizes.get(a, n) for a, n in rec.forward["axes"].items()}
    return rec.model_copy(update={"forward": {**rec.forward, "axes": axes}})


def scale_down(plan: Plan, tile_cap: int = 16) -> Plan:
    """The same plan (kernels, ops, loop structure) at small shapes, every axis a distinct size.

    Tiled axes get distinct multiples of 16 from 32 up (``TILED_SIZES``), so each keeps at least
    two tiles and grid and loop logic are exercised; an axis a mask compares with a constant (a
    window, a band) stays two tiles longer than it (``compared_constants``), with tiles of about a
    sixteenth of it; axes only ever indexed (batch-like) get
    distinct small sizes (``INDEXED_SIZES``). No two axes share a size: a plan that reads the size
    or the data of the wrong axis (``d`` where ``m`` was meant) gives wrong numbers here, where equal
    sizes would hide it. A tile parameter shared by several axes gets a common divisor. The result's
    hash is cleared: it is a derived plan, not the one in the file.
    """
    sizes = axis_sizes(plan)
    roles: dict[str, set[str]] = {a: set() for a in sizes}
    for k in plan.kernels:
        for g in k.grid:
            roles[g.axis].add("indexed" if g.block == 1 else "param" if isinstance(g.block, str)
                              else "padded" if g.block > sizes[g.axis] else "full")
        if k.loop is not None:
            roles[k.loop.axis].add("param" if isinstance(k.loop.block, str) else "full")
    new_sizes: dict[str, int] = {}
    tiled = iter(TILED_SIZES)
    indexed = iter(INDEXED_SIZES)
    padded = iter(PADDED_SIZES)
    parts = {p for m in plan.axis_merges for p in m.parts} | {s.axis for s in plan.axis_splits}
    units = {u.axis for u in plan.axis_units}
    new_sizes.update((a, 1) for a in units)  # not the source's: it stays a view
    for a in sorted(set(sizes) - parts - set(new_sizes)):
        try:
            new_sizes[a] = (next(indexed) if roles[a] == {"indexed"} else next(padded) if "padded" in roles[a]
                            else next(tiled))
        except StopIteration:
            raise PlanError(f"plan has more than {len(TILED_SIZES)} axes; the CPU check cannot give each "
                            f"a distinct small size") from None
    for a in sorted(new_sizes):  # scaled down, never up: an axis shorter than its small size keeps its extent
        if a not in units and new_sizes[a] > sizes[a] and sizes[a] not in {
                n for b, n in new_sizes.items() if b != a}:
            new_sizes[a] = sizes[a]
    tails = _keep_constants_and_tails(plan, sizes, new_sizes, {a for a, r in roles.items() if r == {"padded"}}
                                      | units | parts)
    kernels = []
    for k in plan.kernels:
        params = dict(k.params)
        defaults = dict(k.defaults)
        grid = []
        for g in k.grid:
            if isinstance(g.block, int) and g.block != 1:  # held whole; a padded tile stays padded
                n = new_sizes[g.axis]
                if g.block > sizes[g.axis]:  # a padded row stays a power of two, a contraction whole K steps
                    n = max(padded_row(n), MMA_K_ALIGN) if g.block == padded_row(g.block) \
                        else -(-n // MMA_K_ALIGN) * MMA_K_ALIGN
                g = g.model_copy(update={"block": n})
            grid.append(g)
        users: dict[str, list[str]] = {}  # parameter -> axes whose block it is
        for g in k.grid:
            if isinstance(g.block, str):
                users.setdefault(g.block, []).append(g.axis)
        if k.loop is not None and isinstance(k.loop.block, str):
            users.setdefault(k.loop.block, []).append(k.loop.axis)
        for p, axes in users.items():
            if units & set(axes):  # a unit axis keeps a padded tile (block > 1): its tiles still carry it
                defaults[p] = min(defaults[p], tile_cap)
                params[p] = [defaults[p]]
                continue
            cap = max(tile_cap, max(new_sizes[a] for a in axes) // 16)  # an axis kept long: about 16 tiles
            if tails & set(axes):  # a tile of 16 (or the plan's, if smaller) leaves the remainder partial
                v = min(defaults[p], 16)
                defaults[p] = v
                params[p] = sorted({x for x in params[p] if x <= v} | {v})
                continue
            common = math.gcd(*(new_sizes[a] for a in axes))
            v = _divisor_at_most(common, min(defaults[p], cap))
            defaults[p] = v
            params[p] = sorted({x for x in params[p] if common % x == 0} | {v})
        loop = k.loop
        if loop is not None and isinstance(loop.block, int):
            loop = loop.model_copy(update={"block": new_sizes[loop.axis]})
        kernels.append(k.model_copy(update={"grid": grid, "loop": loop, "params": params, "defaults": defaults}))
    splits = []
    for sp in plan.axis_splits:  # the chunk and in-chunk axes got sizes of their own; the split axis is both
        new_sizes[sp.axis] = new_sizes[sp.parts[0]] * new_sizes[sp.parts[1]]
        splits.append(sp.model_copy(update={"sizes": [new_sizes[sp.parts[0]], new_sizes[sp.parts[1]]]}))
    merges = []  # after the splits: a merged axis reduced whole may be the axis a split reads as chunks
    for m in reversed(plan.axis_merges):  # a later merge may merge an earlier one's axis
        n = new_sizes[m.axis]
        outer = min((d for d in range(2, n + 1) if n % d == 0), default=1)
        new_sizes.update({m.parts[0]: outer, m.parts[1]: n // outer})
        merges.insert(0, m.model_copy(update={"sizes": [outer, n // outer]}))
    tensors = [t.model_copy(update={"shape": [new_sizes[a] for a in t.axes]}) for t in plan.tensors]
    graph = dict(plan.graph)
    if "axes" in graph:
        graph["axes"] = {a: new_sizes[a] for a in graph["axes"]}
    prov = plan.provenance.model_copy(update={"plan_hash": "", "backward_of": _resized(plan, new_sizes)})
    return plan.model_copy(update={"kernels": kernels, "tensors": tensors, "graph": graph, "provenance": prov,
                                   "axis_merges": merges, "axis_splits": splits})
