"""CPU plan executor: runs a plan's kernels tile by tile in numpy.

It follows the plan's loop structure exactly (grid blocks, the streamed
loop, on-chip state and its updates) and emulates the storage precision of
every buffer (float16/bfloat16 rounding on write, float32 accumulation), so
the mathematics of a plan is checked on the CPU against the float64
reference. ``run.shrink`` chooses the shapes it runs at.
"""

from __future__ import annotations

import itertools

import numpy as np

from pyrunner.errors import PlanError
from pyrunner.ir.ops import ELEMENTWISE, REDUCTIONS
from pyrunner.ir.reference import align
from pyrunner.plan import masks
from pyrunner.plan.analysis import kernel_geometry, resolve_config
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
