"""CPU plan executor: runs a plan's kernels tile by tile in numpy.

It follows the plan's loop structure exactly (grid blocks, the streamed
loop, on-chip state and its updates) and emulates the storage precision of
every buffer (float16/bfloat16 rounding on write, float32 accumulation), so
the mathematics of a plan is checked on the CPU against the float64
reference. ``scale_down`` gives the same plan at small shapes.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from pyrunner.errors import PlanError
from pyrunner.ir.ops import ELEMENTWISE, REDUCTIONS
from pyrunner.ir.reference import align
from pyrunner.plan import masks
from pyrunner.plan.analysis import MMA_K_ALIGN, kernel_geometry, resolve_config
from pyrunner.plan.schema import (
    AxisSize,
    Buffer,
    Call,
    Const,
    Expr,
    Fill,
    Gemm,
    Index,
    Kernel,
    Load,
    Map,
    Plan,
    Reduce,
    Ref,
    Store,
    axis_sizes,
)
from pyrunner.plan.views import to_plan_layout, to_source_layout, view_of
from pyrunner.target.layout import padded_row
from pyrunner.target.rounding import round_to  # noqa: F401 - re-exported: callers import it from here


class _Block:
    """State of one thread block while it runs."""

    def __init__(self, k: Kernel, blocks: dict[str, int], coord: dict[str, int], sizes: dict[str, int],
                 exact: bool, audit: bool = False) -> None:
        self.k, self.blocks, self.coord, self.sizes, self.exact = k, blocks, coord, sizes, exact
        self.audit = audit
        self.buf: dict[str, np.ndarray] = {}
        self.info: dict[str, Buffer] = {b.name: b for b in k.buffers}
        for b in k.buffers:
            self.buf[b.name] = np.full([blocks[a] for a in b.axes], np.nan, dtype=np.float32)
        self.step = 0

    def box(self) -> dict[str, tuple[int, int]]:
        """Least and greatest global index of the current tile along each iterated axis."""
        out: dict[str, tuple[int, int]] = {}
        for a, b in self.blocks.items():
            c = self.step if self.k.loop is not None and a == self.k.loop.axis else self.coord.get(a, 0)
            out[a] = (c * b, c * b + b - 1)
        for a, n in self.sizes.items():
            out[masks.size_symbol(a)] = (n, n)
        return out

    def region(self, axes: list[str]) -> tuple:
        idx: list[object] = []
        for a in axes:
            if self.k.loop is not None and a == self.k.loop.axis:
                b = self.blocks[a]
                idx.append(slice(self.step * b, (self.step + 1) * b))
            elif self.blocks.get(a) == 1:
                idx.append(self.coord[a])
            else:
                b = self.blocks[a]
                idx.append(slice(self.coord[a] * b, (self.coord[a] + 1) * b))
        return tuple(idx)

    def write(self, name: str, value: np.ndarray) -> None:
        info = self.info[name]
        shape = self.buf[name].shape
        dtype = "float32" if self.exact else info.dtype
        self.buf[name] = round_to(np.broadcast_to(value, shape), dtype).copy()

    def expr(self, e: Expr, dst_axes: list[str]) -> np.ndarray:
        if isinstance(e, Ref):
            return align(self.buf[e.buf], tuple(self.info[e.buf].axes), tuple(dst_axes))
        if isinstance(e, Const):
            return np.float32(e.number())
        if isinstance(e, AxisSize):
            return np.float32(self.sizes[e.axis])
        if isinstance(e, Index):
            lo, _ = self.box()[e.axis] if e.axis in self.box() else (None, None)
            if lo is None:
                raise PlanError(f"kernel {self.k.name}: index of axis {e.axis!r}, which the kernel does not iterate")
            if e.axis not in dst_axes:
                if self.blocks.get(e.axis) != 1:
                    raise PlanError(f"kernel {self.k.name}: index of axis {e.axis!r}, which the destination "
                                    f"{dst_axes} lacks")
                return np.float32(lo)
            idx = np.arange(lo, lo + self.blocks[e.axis], dtype=np.float32)
            return align(idx, (e.axis,), tuple(dst_axes))
        if isinstance(e, Call):
            args = [self.expr(a, dst_axes) for a in e.args]
            return np.asarray(ELEMENTWISE[e.fn].numpy(*args), dtype=np.float32)
        raise PlanError(f"kernel {self.k.name}: unknown expression {e!r}")

    def skip_mask(self, pred: masks.Pred, op: Map) -> bool:
        """A masking Map on a tile the predicate shows entirely is left out (the renderer leaves it
        out too); with ``audit`` it is checked to be a no-op there."""
        test = masks.tile_test(pred, self.box(), masks.IntArith())
        if test.all_true is None or test.all_true > 0:
            return False
        if self.audit:
            before = self.buf[op.dst].copy()
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                self.write(op.dst, self.expr(op.expr, self.info[op.dst].axes))
            if not np.array_equal(before, self.buf[op.dst], equal_nan=True):
                raise PlanError(f"kernel {self.k.name}: mask {op.dst!r} was proven all-visible on a tile "
                                "but changes it")
        return True

    def run(self, ops: list, tensors: dict[str, np.ndarray], dtypes: dict[str, str],
            taxes: dict[str, list[str]]) -> None:
        for op in ops:
            if isinstance(op, Load):  # a tile past the end of an axis reads zeros there
                part = np.asarray(tensors[op.src][self.region(taxes[op.src])], dtype=np.float32)
                shape = self.buf[op.dst].shape
                if part.ndim == len(shape) and part.shape != shape:
                    full = np.zeros(shape, dtype=np.float32)
                    full[tuple(slice(0, n) for n in part.shape)] = part
                    part = full
                self.write(op.dst, part)
            elif isinstance(op, Store):  # ... and writes nothing there
                dtype = "float32" if self.exact else dtypes[op.dst]
                region = self.region(taxes[op.dst])
                have = np.shape(tensors[op.dst][region])
                value = round_to(self.buf[op.src], dtype)
                if value.ndim == len(have) and value.shape != have:
                    value = value[tuple(slice(0, n) for n in have)]
                tensors[op.dst][region] = value
            elif isinstance(op, Fill):
                v = {"-inf": -np.inf, "inf": np.inf}.get(op.value, op.value) if isinstance(op.value, str) else op.value
                self.buf[op.dst] = np.full(self.buf[op.dst].shape, v, dtype=np.float32)
            elif isinstance(op, Gemm):
                a, b = self.buf[op.a], self.buf[op.b]
                if self.info[op.a].axes[0] == op.contract:
                    a = a.T
                if self.info[op.b].axes[1] == op.contract:
                    b = b.T
                prod = np.matmul(a.astype(np.float32), b.astype(np.float32))
                self.write(op.c, prod if op.clear else self.buf[op.c] + prod)
            elif isinstance(op, Map):
                pred = masks.mask_predicate(op)
                if pred is not None and self.skip_mask(pred, op):
                    continue
                with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                    self.write(op.dst, self.expr(op.expr, self.info[op.dst].axes))
            elif isinstance(op, Reduce):
                red = REDUCTIONS[op.fn]
                r = red.numpy(self.buf[op.src], self.info[op.src].axes.index(op.axis))
                if op.accumulate:
                    r = ELEMENTWISE[red.combine].numpy(self.buf[op.dst], r)
                self.write(op.dst, r)
            else:  # pragma: no cover - the schema admits no other op
                raise PlanError(f"kernel {self.k.name}: unknown op {op!r}")


def loop_steps(blk: "_Block", n_iter: int) -> range:
    """The loop steps a block runs: all of them, or those its ``visible`` predicate may show."""
    lp = blk.k.loop
    if lp is None or lp.visible is None:
        return range(n_iter)
    box = {a: r for a, r in blk.box().items() if a != lp.axis}
    return masks.visible_steps(masks.predicate(lp.visible), lp.axis, blk.blocks[lp.axis], n_iter, box)


def _audit_skipped(blk: "_Block", step: int, tensors: dict, dtypes: dict, taxes: dict) -> None:
    """Run a step the loop bounds leave out and check that no loop state changes (the
    masked_tile_skip proof, checked numerically)."""
    saved = {n: v.copy() for n, v in blk.buf.items()}
    blk.step = step
    blk.run(blk.k.body, tensors, dtypes, taxes)
    for b in blk.k.buffers:
        if b.state and not np.array_equal(saved[b.name], blk.buf[b.name], equal_nan=True):
            raise PlanError(f"kernel {blk.k.name}: skipped loop step {step} would change state {b.name!r}")
    blk.buf = saved


def run_kernel(k: Kernel, cfg: dict[str, int], sizes: dict[str, int], tensors: dict[str, np.ndarray],
               dtypes: dict[str, str], taxes: dict[str, list[str]], exact: bool = False,
               audit: bool = False) -> None:
    geo = kernel_geometry(k, cfg, sizes)
    blocks = geo.blocks
    grid_axes = [g.axis for g in k.grid]
    extents = [geo.tiles[a] for a in grid_axes]
    n_iter = geo.loop_steps()
    for coords in itertools.product(*(range(e) for e in extents)):
        blk = _Block(k, blocks, dict(zip(grid_axes, coords)), sizes, exact, audit)
        blk.run(k.prologue, tensors, dtypes, taxes)
        steps = loop_steps(blk, n_iter)
        for step in range(n_iter):
            if step in steps:
                blk.step = step
                blk.run(k.body, tensors, dtypes, taxes)
            elif audit:
                _audit_skipped(blk, step, tensors, dtypes, taxes)
        if k.loop is None:
            blk.run(k.body, tensors, dtypes, taxes)
        blk.run(k.epilogue, tensors, dtypes, taxes)


def execute(plan: Plan, inputs: dict[str, np.ndarray], config: dict | None = None,
            exact: bool = False, audit: bool = False) -> dict[str, np.ndarray]:
    """Run every kernel of the plan on the CPU; returns outputs (float64) by name. Inputs and outputs
    are in the source graph's layout (a plan's merged axes are reshaped at the boundary).

    Inputs are rounded to the plan's dtype first, as the GPU would see them;
    outputs and intermediates start as NaN (poisoned) so an unwritten tile shows.
    With ``exact`` every buffer is float32 (checks the plan's algebra alone,
    against a float32-level tolerance). With ``audit`` the tiles the plan skips (loop steps outside
    the mask's bounds, masks left out on fully visible tiles) are run anyway and checked to change
    nothing.
    """
    sizes = axis_sizes(plan)
    view = view_of(plan)
    tensors: dict[str, np.ndarray] = {}
    dtypes = {t.name: t.dtype for t in plan.tensors}
    taxes = {t.name: list(t.axes) for t in plan.tensors}
    for t in plan.tensors:
        if t.role == "input":
            if t.name not in inputs:
                raise PlanError(f"missing input tensor {t.name!r}")
            x = np.asarray(inputs[t.name], dtype=np.float32)
            if view.reshapes(t.axes) and list(x.shape) != list(t.shape):  # given in the source graph's layout
                x = to_plan_layout(x, view.source_axes(t.axes), t.axes, view)
            if list(x.shape) != list(t.shape):
                raise PlanError(f"input {t.name!r} has shape {list(x.shape)}, plan expects {t.shape}")
            tensors[t.name] = x if exact else round_to(x, t.dtype)
        else:
            tensors[t.name] = np.full(t.shape, np.nan, dtype=np.float32)
    values = resolve_config(plan, config, in_space=False)
    for k in plan.kernels:
        run_kernel(k, values[k.name], sizes, tensors, dtypes, taxes, exact, audit)
    return {t.name: to_source_layout(tensors[t.name], t.axes, view.source_axes(t.axes), view).astype(np.float64)
            for t in plan.tensors if t.role == "output"}


# --- scaling a plan down to CPU-sized shapes ------------------------------------

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


def _graph_constants(plan: Plan, out: dict[str, float]) -> None:
    """``compared_constants`` of the plan's source graph (iota axes and constants under a comparison)."""
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
        for a in axes:
            out[a] = max(out.get(a, 0.0), max(consts))


def compared_constants(plan: Plan) -> dict[str, float]:
    """For each axis whose index a comparison reads (a mask: a window, a band, a causal offset), the
    largest constant in any comparison that reads it, in the plan or its source graph: scaled below
    that, the mask never bites, and a plan with its window dropped or changed would pass the CPU check
    (issue 46)."""
    out: dict[str, float] = {}
    _graph_constants(plan, out)
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
        for a in axes:
            out[a] = max(out.get(a, 0.0), max(consts))
    return out


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
    merges = []
    for m in reversed(plan.axis_merges):  # a later merge may merge an earlier one's axis
        n = new_sizes[m.axis]
        outer = min((d for d in range(2, n + 1) if n % d == 0), default=1)
        new_sizes.update({m.parts[0]: outer, m.parts[1]: n // outer})
        merges.insert(0, m.model_copy(update={"sizes": [outer, n // outer]}))
    splits = []
    for sp in plan.axis_splits:  # the chunk and in-chunk axes got sizes of their own; the split axis is both
        new_sizes[sp.axis] = new_sizes[sp.parts[0]] * new_sizes[sp.parts[1]]
        splits.append(sp.model_copy(update={"sizes": [new_sizes[sp.parts[0]], new_sizes[sp.parts[1]]]}))
    tensors = [t.model_copy(update={"shape": [new_sizes[a] for a in t.axes]}) for t in plan.tensors]
    graph = dict(plan.graph)
    if "axes" in graph:
        graph["axes"] = {a: new_sizes[a] for a in graph["axes"]}
    prov = plan.provenance.model_copy(update={"plan_hash": ""})
    return plan.model_copy(update={"kernels": kernels, "tensors": tensors, "graph": graph, "provenance": prov,
                                   "axis_merges": merges, "axis_splits": splits})
