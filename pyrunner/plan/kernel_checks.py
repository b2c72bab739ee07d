"""The rules of one kernel of a plan: its iteration space, buffers, ops, and listed reads/writes.

``plan.validate`` runs these for each kernel (for the defaults, and again for a user's config,
since tile shapes follow the parameter values). Each op kind has its own checker in
``_OP_CHECKS``; what they share about the kernel (blocks per axis, buffers, the tensors loaded
and stored so far) lives in one ``KernelScope``. Every failure is one ``PlanError`` naming the
kernel and op (``kernels[0] 'attn' body[2] (map): ...``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyrunner.errors import PlanError
from pyrunner.plan import masks
from pyrunner.plan.analysis import expr_refs, numbered_ops, op_reads_writes, resolve, walk
from pyrunner.plan.schema import (
    EXPR_FUNCTIONS,
    AxisSize,
    Block,
    Buffer,
    Call,
    Const,
    Fill,
    Gemm,
    GlobalTensor,
    Index,
    Kernel,
    Load,
    Map,
    Plan,
    Reduce,
    Store,
)


def check_kernel_static(ki: int, k: Kernel) -> None:
    """Name-level rules that do not depend on parameter values."""
    kw = f"kernels[{ki}] {k.name!r}"
    blocks: list[tuple[str, Block]] = [(f"grid[{i}].block", g.block) for i, g in enumerate(k.grid)]
    if k.loop is not None:
        blocks += [("loop.block", k.loop.block), ("loop.stages", k.loop.stages)]
    blocks.append(("threads", k.threads))
    for name, b in blocks:
        if isinstance(b, str) and b not in k.params:
            raise PlanError(f"{kw}: {name} names parameter {b!r}, which is not in params "
                            f"({sorted(k.params) or 'none'})")


def _masks_tail(k: Kernel, axis: str) -> bool:
    """Whether a partial last tile of ``axis`` is safe: the loop body masks values past the end (a
    predicate comparing the index along it with its extent, as the planner emits before each
    accumulator), or only tiles loaded from memory (zeros past the end) feed sums and products."""
    if any(isinstance(op, Map) and any(isinstance(e, AxisSize) and e.axis == axis for e in walk(op.expr))
           and any(isinstance(e, Index) and e.axis == axis for e in walk(op.expr)) for op in k.body):
        return True
    # without masks, only zeros loaded past the end may reach the accumulators (sums and products)
    loaded = {op.dst for op in k.body if isinstance(op, Load)}
    return all(op.src in loaded and op.fn == "sum" for op in k.body if isinstance(op, Reduce) and op.axis == axis) \
        and all(op.a in loaded and op.b in loaded for op in k.body if isinstance(op, Gemm) and op.contract == axis)


@dataclass
class KernelScope:
    """What the checks of one kernel share: its geometry under the values checked, and what the ops
    seen so far declared, loaded, stored and wrote."""

    kw: str
    """The kernel's name in messages: ``kernels[0] 'attn'``."""
    setting: str
    """Which parameter values are checked, for messages whose truth depends on them."""
    kernel: Kernel
    sizes: Mapping[str, int]
    tensors: Mapping[str, GlobalTensor]
    dtype: str
    block: dict[str, int]
    """Block of every grid axis and of the loop axis."""
    grid_axes: list[str]
    loop_axis: str
    """The loop axis, or '' without a loop."""
    indexed: set[str] = field(init=False)
    held: set[str] = field(init=False)
    tiles: dict[str, int] = field(init=False)
    """Tile count of every grid axis."""
    bufs: dict[str, Buffer] = field(default_factory=dict)
    loaded: list[str] = field(default_factory=list)
    stored: list[str] = field(default_factory=list)
    written: set[str] = field(default_factory=set)
    written_in_body: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        grid = self.grid_axes
        self.indexed = {a for a in grid if self.block[a] == 1}
        self.held = {a for a in grid if self.block[a] != 1} | ({self.loop_axis} if self.loop_axis else set())
        self.tiles = {a: -(-self.sizes[a] // self.block[a]) for a in grid}


def check_kernel(plan: Plan, ki: int, k: Kernel, values: Mapping[str, int], sizes: Mapping[str, int],
                 tensors: Mapping[str, GlobalTensor], config: bool = False) -> None:
    """Every value-dependent rule of kernel ``ki`` under parameter ``values`` (``config``: they are a
    user's config, not the defaults, which the messages say)."""
    kw = f"kernels[{ki}] {k.name!r}"
    setting = "with the given config" if config else "with the default parameters"
    block, grid_axes = _grid_blocks(kw, k, values, sizes)
    loop_axis = _loop_block(kw, setting, k, values, sizes, block)
    s = KernelScope(kw, setting, k, sizes, tensors, plan.dtype, block, grid_axes, loop_axis)
    _check_visible(s)
    _check_buffers(s)
    _check_ops(s)
    _check_state_init(s)
    _check_listed(s)


# --- iteration space ------------------------------------------------------------------

def _grid_blocks(kw: str, k: Kernel, values: Mapping[str, int],
                 sizes: Mapping[str, int]) -> tuple[dict[str, int], list[str]]:
    block: dict[str, int] = {}
    grid_axes: list[str] = []
    for i, g in enumerate(k.grid):
        if g.axis not in sizes:
            raise PlanError(f"{kw}: grid[{i}] names unknown axis {g.axis!r}; graph axes are {sorted(sizes)}")
        if g.axis in block:
            raise PlanError(f"{kw}: grid[{i}] repeats grid axis {g.axis!r}")
        block[g.axis] = resolve(g.block, values)
        grid_axes.append(g.axis)
    return block, grid_axes


def _loop_block(kw: str, setting: str, k: Kernel, values: Mapping[str, int], sizes: Mapping[str, int],
                block: dict[str, int]) -> str:
    """The loop axis ('' without a loop), its block added to ``block``."""
    if k.loop is None:
        return ""
    loop_axis = k.loop.axis
    if loop_axis not in sizes:
        raise PlanError(f"{kw}: loop names unknown axis {loop_axis!r}; graph axes are {sorted(sizes)}")
    if loop_axis in block:
        raise PlanError(f"{kw}: axis {loop_axis!r} is both a grid axis and the loop axis")
    b = resolve(k.loop.block, values)
    if sizes[loop_axis] % b and not _masks_tail(k, loop_axis):
        raise PlanError(f"{kw}: loop block {b} of axis {loop_axis!r} does not divide its size "
                        f"{sizes[loop_axis]} ({setting}), and the loop body masks nothing past the end: "
                        "the partial last tile would feed padding into the loop's accumulators")
    block[loop_axis] = b
    return loop_axis


def _check_visible(s: KernelScope) -> None:
    loop = s.kernel.loop
    if loop is None or loop.visible is None:
        return
    for c in (e for e in walk(loop.visible) if isinstance(e, Call)):
        if len(c.args) != EXPR_FUNCTIONS[c.fn]:  # before the predicate is read: it unpacks arguments
            raise PlanError(f"{s.kw}: loop.visible calls {c.fn!r} with {len(c.args)} argument(s); "
                            f"it takes {EXPR_FUNCTIONS[c.fn]}")
    if not masks.is_index_predicate(loop.visible):
        raise PlanError(f"{s.kw}: loop.visible must be an index predicate (comparisons of affine forms in "
                        "index values, combined by min/max/mul), so loop bounds can be derived from it")
    for e in walk(loop.visible):
        if isinstance(e, Index) and e.axis not in s.block:
            raise PlanError(f"{s.kw}: loop.visible uses the index of axis {e.axis!r}, which is not an axis "
                            f"the kernel iterates ({sorted(s.block)})")


def _check_buffers(s: KernelScope) -> None:
    for i, buf in enumerate(s.kernel.buffers):
        bw = f"{s.kw}: buffers[{i}] {buf.name!r}"
        if buf.name in s.bufs:
            raise PlanError(f"{bw}: a buffer named {buf.name!r} is already declared")
        if buf.name in s.tensors:  # one namespace in the rendered kernel: the tensor argument would be shadowed
            raise PlanError(f"{bw}: a buffer may not have the name of the global tensor {buf.name!r}")
        if len(set(buf.axes)) != len(buf.axes):
            raise PlanError(f"{bw}: repeats an axis: {buf.axes}")
        for a in buf.axes:
            if a not in s.held:
                why = "an indexed grid axis (block 1)" if a in s.indexed else "not an axis of this kernel"
                raise PlanError(f"{bw}: axis {a!r} is {why}; a buffer axis must be a grid axis with "
                                f"block != 1 or the loop axis ({sorted(s.held) or 'none here'}) ({s.setting})")
        s.bufs[buf.name] = buf


# --- ops --------------------------------------------------------------------------------

def _check_ops(s: KernelScope) -> None:
    """Each op in program order: its buffers exist and hold values when read, then its kind's rules."""
    body_writes = {w for op in s.kernel.body for w in op_reads_writes(op)[1]}
    for section, oi, op in numbered_ops(s.kernel):
        ow = f"{s.kw} {section}[{oi}] ({getattr(op, 'op', '?')})"
        reads, writes = op_reads_writes(op)
        _check_op_buffers(s, ow, section, reads, writes, body_writes)
        check = _OP_CHECKS.get(type(op))
        if check is not None:
            check(s, section, ow, op)
        s.written.update(writes)
        if section == "body":
            s.written_in_body.update(writes)


def _check_op_buffers(s: KernelScope, ow: str, section: str, reads: list[str], writes: list[str],
                      body_writes: set[str]) -> None:
    for name in reads + writes:
        if name not in s.bufs:
            known = ", ".join(s.bufs) or "none"
            raise PlanError(f"{ow}: unknown buffer {name!r}; this kernel's buffers: {known}")
    for name in reads:
        if name not in s.written:
            raise PlanError(f"{ow}: reads buffer {name!r} before anything writes it")
        if section == "body" and name in body_writes and name not in s.written_in_body \
                and not s.bufs[name].state and s.kernel.loop is not None:
            raise PlanError(f"{ow}: buffer {name!r} carries its value across loop iterations "
                            f"(read here before the body writes it); declare it with state=true")


def _tile_axes(s: KernelScope, t: GlobalTensor, where: str) -> list[str]:
    """The axes of a tile of ``t`` in this kernel: its axes without indexed grid axes."""
    for a in t.axes:
        if a not in s.block:
            raise PlanError(f"{where}: tensor {t.name!r} has axis {a!r}, which is neither a grid axis nor "
                            f"the loop axis of this kernel")
    return [a for a in t.axes if a not in s.indexed]


def _check_transfer(s: KernelScope, section: str, ow: str, op: Load | Store) -> GlobalTensor:
    """Rules shared by loads and stores: the tensor exists and its tile matches the buffer."""
    gname = op.src if isinstance(op, Load) else op.dst
    bname = op.dst if isinstance(op, Load) else op.src
    if gname not in s.tensors:
        raise PlanError(f"{ow}: unknown global tensor {gname!r}; tensors: {', '.join(s.tensors)}")
    t = s.tensors[gname]
    want = _tile_axes(s, t, ow)
    if s.bufs[bname].axes != want:
        side = "dst" if isinstance(op, Load) else "src"
        raise PlanError(f"{ow}: {side} buffer {bname!r} has axes {s.bufs[bname].axes}, but the tile of "
                        f"{gname!r} has axes {want} (its axes without indexed grid axes, same order) "
                        f"({s.setting})")
    if s.loop_axis and s.loop_axis in t.axes and section != "body":
        raise PlanError(f"{ow}: tensor {gname!r} has the loop axis {s.loop_axis!r}, so it can only be "
                        f"accessed in the loop body, not in the {section}")
    return t


def _check_load(s: KernelScope, section: str, ow: str, op: Load) -> None:
    _check_transfer(s, section, ow, op)
    s.loaded.append(op.src)


def _check_store(s: KernelScope, section: str, ow: str, op: Store) -> None:
    t = _check_transfer(s, section, ow, op)
    gname = op.dst
    if t.role == "input":
        raise PlanError(f"{ow}: stores into {gname!r}, which is a graph input")
    racing = [a for a in s.grid_axes if s.tiles[a] > 1 and a not in t.axes]
    if racing:
        raise PlanError(f"{ow}: blocks race on {gname!r}: grid axis {racing[0]!r} has "
                        f"{s.tiles[racing[0]]} tiles but is not an axis of the tensor ({s.setting})")
    if gname in s.stored:
        raise PlanError(f"{ow}: stores {gname!r} a second time; a global tensor has one writer "
                        f"(one store in one kernel)")
    s.stored.append(gname)


def _check_gemm(s: KernelScope, section: str, ow: str, op: Gemm) -> None:
    a, b, c = s.bufs[op.a], s.bufs[op.b], s.bufs[op.c]
    free: list[str] = []
    for role, buf in (("a", a), ("b", b)):
        if len(buf.axes) != 2 or op.contract not in buf.axes:
            raise PlanError(f"{ow}: operand {role} {buf.name!r} must be 2-D holding the contracted axis "
                            f"{op.contract!r} and one free axis; it has axes {buf.axes}")
        free.append(next(x for x in buf.axes if x != op.contract))
        if buf.dtype != s.dtype:
            raise PlanError(f"{ow}: operand {role} {buf.name!r} has dtype {buf.dtype}; gemm operands have the "
                            f"compute dtype {s.dtype}")
    if b.scope != "shared":
        raise PlanError(f"{ow}: operand b {b.name!r} must be in shared memory, it is {b.scope}")
    if c.axes != free:
        raise PlanError(f"{ow}: accumulator c {c.name!r} has axes {c.axes}; it must be [free axis of a, free "
                        f"axis of b] = {free}")
    if c.dtype != "float32" or c.scope != "fragment":
        raise PlanError(f"{ow}: accumulator c {c.name!r} must be a float32 fragment, it is a {c.dtype} {c.scope}")


def _check_map(s: KernelScope, section: str, ow: str, op: Map) -> None:
    dst = s.bufs[op.dst]
    for r in expr_refs(op.expr):
        extra = [a for a in s.bufs[r].axes if a not in dst.axes]
        if extra:
            raise PlanError(f"{ow}: operand {r!r} has axes {s.bufs[r].axes}, which are not a "
                            f"subset of dst {op.dst!r}'s axes {dst.axes} (axis {extra[0]!r})")
    for e in walk(op.expr):
        _check_expr_node(s, ow, op, dst, e)
    for c in (e for e in walk(op.expr) if isinstance(e, Call)):
        if len(c.args) != EXPR_FUNCTIONS[c.fn]:  # the schema admits only known names
            raise PlanError(f"{ow}: function {c.fn!r} takes {EXPR_FUNCTIONS[c.fn]} argument(s), "
                            f"got {len(c.args)}")


def _check_expr_node(s: KernelScope, ow: str, op: Map, dst: Buffer, e: object) -> None:
    if isinstance(e, Const) and math.isnan(e.number()):
        raise PlanError(f"{ow}: a constant is NaN")
    if isinstance(e, AxisSize) and e.axis not in s.sizes:
        raise PlanError(f"{ow}: size of unknown axis {e.axis!r}; graph axes are {sorted(s.sizes)}")
    if isinstance(e, Index) and e.axis not in dst.axes and e.axis not in s.indexed:
        raise PlanError(f"{ow}: index along axis {e.axis!r}, which is neither an axis of dst "
                        f"{op.dst!r} {dst.axes} nor an indexed grid axis of the kernel")


def _check_fill(s: KernelScope, section: str, ow: str, op: Fill) -> None:
    if isinstance(op.value, float) and math.isnan(op.value):
        raise PlanError(f"{ow}: fill value is NaN; use a number, -inf or inf")


def _check_reduce(s: KernelScope, section: str, ow: str, op: Reduce) -> None:
    src, dst = s.bufs[op.src], s.bufs[op.dst]
    if op.axis not in src.axes:
        raise PlanError(f"{ow}: reduces over axis {op.axis!r}, but src {op.src!r} has axes {src.axes}")
    want = [a for a in src.axes if a != op.axis]
    if dst.axes != want:
        raise PlanError(f"{ow}: dst {op.dst!r} has axes {dst.axes}; reducing {op.src!r} over "
                        f"{op.axis!r} gives axes {want}")


_OP_CHECKS: dict[type, Callable[[KernelScope, str, str, Any], None]] = {
    Load: _check_load,
    Store: _check_store,
    Gemm: _check_gemm,
    Map: _check_map,
    Fill: _check_fill,
    Reduce: _check_reduce,
}
"""The rules of each op kind, given the scope, the op's section, its name in messages, and the op."""


# --- the kernel as a whole --------------------------------------------------------------

def _check_state_init(s: KernelScope) -> None:
    k = s.kernel
    if k.loop is None:
        return
    init = {w for op in k.prologue for w in op_reads_writes(op)[1]}
    for buf in k.buffers:
        if buf.state and buf.name not in init:
            raise PlanError(f"{s.kw}: state buffer {buf.name!r} is not initialised in the prologue "
                            f"(add a fill)")


def _check_listed(s: KernelScope) -> None:
    """The kernel's reads/writes lists name exactly the tensors it loads/stores."""
    k = s.kernel
    for name_of, listed, done in (("reads", k.reads, s.loaded), ("writes", k.writes, s.stored)):
        verb = "loads" if name_of == "reads" else "stores"
        for name in listed:
            if name not in s.tensors:
                raise PlanError(f"{s.kw}: {name_of} lists unknown tensor {name!r}")
            if name not in done:
                raise PlanError(f"{s.kw}: {name_of} lists {name!r}, but the kernel never {verb} it")
        for name in done:
            if name not in listed:
                raise PlanError(f"{s.kw}: {verb} {name!r}, but {name_of} does not list it")
