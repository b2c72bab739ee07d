"""What a kernel plan means: the one home for facts every stage derives from a plan.

Which buffers each tile op reads and writes, which buffers an expression refers to, the names
of tuning parameters, parameter values under a config, and a kernel's geometry (block and tile
count per axis, threads, pipeline stages, the role of every axis). The validator, the renderer,
the fit check, the CPU executor, the cost model and ``--explain`` all read a plan through these
functions, so each fact is written once.

Everything here assumes a plan that passed ``plan.validate`` (names resolve; a block that does not
divide its axis leaves a partial last tile: loads are padded with zeros, stores masked); the only
errors raised are about a user's config (unknown kernel or parameter, a value
outside its space), which validation of the plan alone cannot rule out.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from pyrunner.errors import PlanError
from pyrunner.ir.ops import ELEMENTWISE
from pyrunner.plan.schema import (
    AxisSize,
    Block,
    Call,
    Const,
    Expr,
    Fill,
    Gemm,
    Kernel,
    Load,
    Map,
    Op,
    Plan,
    Reduce,
    Ref,
    Store,
    axis_sizes,
)

SECTIONS = ("prologue", "body", "epilogue")
STAGES_PARAM = "stages"
THREADS_PARAM = "threads"
MMA_K_ALIGN = 16
"""A GEMM's contracted tile is whole tensor-core K steps (16 for 16-bit inputs): TileLang has no
m16n8k8 bf16 MMA and no shared layout for an odd row (d = 65). A contraction held whole at another
extent is padded to a multiple of this (a held-whole grid block larger than its axis)."""


# --- names ------------------------------------------------------------------------

def block_param(axis: str) -> str:
    """The tuning parameter holding the block (tile extent) of ``axis``: the one place it is named."""
    return f"block_{axis}"


# --- ops and expressions ------------------------------------------------------------

def walk(expr: object) -> Iterator[object]:
    """Every node of an expression tree, pre-order (iterative: plans may nest deeply)."""
    stack = [expr]
    while stack:
        e = stack.pop()
        yield e
        if isinstance(e, Call):
            stack.extend(reversed(e.args))


def constant_value(e: object, sizes: Mapping[str, int]) -> float | None:
    """The value of an expression built from constants and axis sizes only (``rsqrt(|d|) * log2 e``),
    in float64, or None when it reads a buffer or an index, or is not finite. The planner folds such
    factors into one coefficient and the renderer into one literal."""
    if isinstance(e, Const):
        return e.number()
    if isinstance(e, AxisSize):
        return float(sizes[e.axis]) if e.axis in sizes else None
    if not isinstance(e, Call) or e.fn not in ELEMENTWISE or e.fn in ("lt", "le", "where"):
        return None
    args = [constant_value(a, sizes) for a in e.args]
    if any(a is None for a in args):
        return None
    with np.errstate(all="ignore"):
        v = float(ELEMENTWISE[e.fn].numpy(*(np.float64(a) for a in args)))
    return v if math.isfinite(v) else None


def expr_refs(expr: object) -> list[str]:
    """Buffers an expression reads, in order of appearance (with repeats): ``walk``'s order, without
    a generator (the planner asks this of every op of every kernel it lowers, several times)."""
    out: list[str] = []
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Call):
            stack.extend(reversed(e.args))
        elif isinstance(e, Ref):
            out.append(e.buf)
    return out


def substitute_refs(expr: Expr, to: Mapping[str, Expr]) -> Expr:
    """``expr`` with every reference to a buffer of ``to`` replaced by its expression (a rename
    where that is a ``Ref``). Recursive: the planner nests expressions at most
    ``planner.lower.MAX_INLINE_DEPTH`` deep, and a plan file at most ``MAX_JSON_DEPTH``."""
    if isinstance(expr, Ref):
        return to.get(expr.buf, expr)
    if isinstance(expr, Call):
        return Call(fn=expr.fn, args=[substitute_refs(a, to) for a in expr.args])
    return expr


def op_reads_writes(op: Op) -> tuple[list[str], list[str]]:
    """Buffers a tile op reads and writes (its reads happen before its writes)."""
    if isinstance(op, Load):
        return [], [op.dst]
    if isinstance(op, Store):
        return [op.src], []
    if isinstance(op, Fill):
        return [], [op.dst]
    if isinstance(op, Gemm):
        return [op.a, op.b] + ([] if op.clear else [op.c]), [op.c]
    if isinstance(op, Map):
        return expr_refs(op.expr), [op.dst]
    if isinstance(op, Reduce):
        return [op.src] + ([op.dst] if op.accumulate else []), [op.dst]
    raise TypeError(f"not a tile op: {op!r}")  # pragma: no cover - the schema admits no other op


def thread_reads_staged(body: list[Op]) -> bool:
    """Whether a loop body reads a tile it loads with thread code (anything but a GEMM operand).

    TileLang cannot warp-specialise such a loop safely (``backend.tilelang.emit.NO_WARP_SPECIALISATION``),
    so the renderer turns it off and the cost model prices the loop without the producer/consumer split.
    """
    staged = {op.dst for op in body if isinstance(op, Load)}
    return any(r in staged for op in body if not isinstance(op, Gemm) for r in op_reads_writes(op)[0])


def op_buffers(op: Op) -> set[str]:
    """Every buffer a tile op mentions (read or written)."""
    reads, writes = op_reads_writes(op)
    if isinstance(op, Gemm):
        reads = reads + [op.c]
    return set(reads) | set(writes)


def numbered_ops(kernel: Kernel) -> list[tuple[str, int, Op]]:
    """(section, index in section, op) for every op of the kernel, in program order."""
    return [(s, i, op) for s in SECTIONS for i, op in enumerate(getattr(kernel, s))]


def kernel_ops(kernel: Kernel) -> list[Op]:
    """The kernel's ops in program order (prologue, body, epilogue)."""
    return [*kernel.prologue, *kernel.body, *kernel.epilogue]


def kernel_args(plan: Plan, kernel: Kernel) -> list[str]:
    """Global tensors a kernel takes, in the plan's tensor order."""
    used = set(kernel.reads) | set(kernel.writes)
    return [t.name for t in plan.tensors if t.name in used]


# --- parameter values ------------------------------------------------------------------

def safe_repr(x: object, limit: int = 60) -> str:
    """A short repr of a user's value that cannot fail: no 5,000-digit integer conversion (a
    ValueError), no recursion into 100,000-deep nesting, at most ``limit`` characters."""
    import reprlib

    if isinstance(x, int) and not isinstance(x, bool) and x.bit_length() > 64:
        return f"an integer of {x.bit_length()} bits"
    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother = 3, limit, limit
    try:
        s = r.repr(x)
    except (ValueError, RecursionError):
        s = f"a {type(x).__name__}"
    return s if len(s) <= limit else s[: limit - 3] + "..."


def resolve(block: Block, values: Mapping[str, int]) -> int:
    """A block, stage count or thread count under parameter values (literal or parameter name)."""
    return block if isinstance(block, int) else values[block]


def resolve_config(plan: Plan, config: Mapping[str, Mapping[str, int]] | None = None,
                   in_space: bool = True) -> dict[str, dict[str, int]]:
    """Each kernel's parameter values: its defaults overlaid by ``config`` (kernel -> param -> value).

    Raises PlanError for an unknown kernel or parameter or (with ``in_space``) a value outside the
    parameter's space. The CPU executor passes ``in_space=False`` to try tiles a plan does not
    offer (any block that divides its axis computes the same values).
    """
    by_name = {k.name: k for k in plan.kernels}
    merged = {k.name: dict(k.defaults) for k in plan.kernels}
    if config is not None and not isinstance(config, Mapping):
        raise PlanError(f"config must map kernel names to {{parameter: value}}, got {safe_repr(config)}")
    for kname, params in (config or {}).items():
        if kname not in by_name:
            raise PlanError(f"config names unknown kernel {safe_repr(kname)}; kernels are {list(by_name)}")
        if not isinstance(params, Mapping):
            raise PlanError(f"config for kernel {kname!r} must map parameter names to values")
        space = by_name[kname].params
        for p, v in params.items():
            if p not in space:
                raise PlanError(f"config for kernel {kname!r} names unknown parameter {safe_repr(p)}; "
                                f"parameters are {sorted(space)}")
            if not isinstance(v, int) or isinstance(v, bool) or (in_space and v not in space[p]):
                raise PlanError(f"config for kernel {kname!r}: {p}={safe_repr(v)} is not in its space {space[p]}")
            merged[kname][p] = v
    return merged


# --- geometry ------------------------------------------------------------------------

AxisKind = Literal["grid", "indexed", "loop"]


@dataclass(frozen=True)
class AxisRole:
    """How a kernel iterates one axis: a tiled grid axis, an indexed grid axis (block 1), or the loop axis."""

    axis: str
    kind: AxisKind
    block: int | str
    size: int


def block_box(coord: Mapping[str, int], blocks: Mapping[str, int],
              sizes: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """Least and greatest index of the tile at ``coord`` along each of its axes, and every axis
    extent under its ``plan.masks.size_symbol``: the box a mask's tile test and step range take."""
    from pyrunner.plan.masks import size_symbol

    box = {a: (c * blocks[a], c * blocks[a] + blocks[a] - 1) for a, c in coord.items()}
    box.update({size_symbol(a): (n, n) for a, n in sizes.items()})
    return box


def kernel_axes(kernel: Kernel, sizes: Mapping[str, int]) -> dict[str, AxisRole]:
    """The role of each grid and loop axis of a kernel (grid axes first, in grid order)."""
    roles: dict[str, AxisRole] = {}
    for g in kernel.grid:
        roles[g.axis] = AxisRole(g.axis, "indexed" if g.block == 1 else "grid", g.block, sizes[g.axis])
    if kernel.loop is not None:
        lp = kernel.loop
        roles[lp.axis] = AxisRole(lp.axis, "loop", lp.block, sizes[lp.axis])
    return roles


@dataclass(frozen=True)
class KernelGeometry:
    """A kernel's shape under one set of parameter values."""

    roles: dict[str, AxisRole]
    blocks: dict[str, int]
    """Block (tile extent) of every grid and loop axis."""
    tiles: dict[str, int]
    """Number of tiles of every grid and loop axis (blocks along a grid axis, loop steps along the loop axis)."""
    threads: int
    stages: int
    """Software-pipeline depth of the loop (1 without a loop)."""

    @property
    def indexed(self) -> set[str]:
        return {a for a, r in self.roles.items() if r.kind == "indexed"}

    @property
    def held(self) -> set[str]:
        """Axes that buffers may carry: tiled grid axes and the loop axis."""
        return {a for a, r in self.roles.items() if r.kind != "indexed"}

    @property
    def grid_blocks(self) -> int:
        """Thread blocks launched: the product of the grid axes' tile counts."""
        n = 1
        for a, r in self.roles.items():
            if r.kind != "loop":
                n *= self.tiles[a]
        return n

    def loop_steps(self) -> int:
        loop = [a for a, r in self.roles.items() if r.kind == "loop"]
        return self.tiles[loop[0]] if loop else 0


def kernel_geometry(kernel: Kernel, values: Mapping[str, int], sizes: Mapping[str, int],
                    roles: dict[str, AxisRole] | None = None) -> KernelGeometry:
    """Geometry of ``kernel`` under parameter ``values`` over axis extents ``sizes`` (``roles``:
    ``kernel_axes`` computed once by a caller that checks many configs; never mutated)."""
    roles = kernel_axes(kernel, sizes) if roles is None else roles
    blocks = {a: resolve(r.block, values) for a, r in roles.items()}
    tiles = {a: -(-sizes[a] // b) for a, b in blocks.items()}  # a last, partial tile where b does not divide
    stages = resolve(kernel.loop.stages, values) if kernel.loop is not None else 1
    return KernelGeometry(roles, blocks, tiles, resolve(kernel.threads, values), stages)


def plan_geometry(plan: Plan, config: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, KernelGeometry]:
    """Every kernel's geometry under ``config`` (kernel -> param -> value; defaults elsewhere)."""
    values = resolve_config(plan, config)
    sizes = axis_sizes(plan)
    return {k.name: kernel_geometry(k, values[k.name], sizes) for k in plan.kernels}


def default_value(kernel: Kernel, block: Block) -> int:
    """A block, stage or thread count at the kernel's default parameters."""
    return resolve(block, kernel.defaults)
