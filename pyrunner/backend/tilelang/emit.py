"""The per-kernel emitters of the TileLang renderer: identifiers, the source writer, the rendering
context and one emitter per plan op (loads, stores, fills, maps, reductions, GEMMs), with the layout
and policy decisions they need.

``render`` assembles modules from these (a ``T.Pipelined`` prim_func per kernel) and ``render_ws``
writes the explicitly warp-specialised form of a two-GEMM chain with them; both sit above this
module, so neither imports the other's internals.

Why one module: the emitters share one rendering context (names, block coordinates, helpers,
bridges) and call each other (a map's expression, a mask's predicate, a GEMM's policy); split
apart they would pass that context through every signature.
"""

from __future__ import annotations

import keyword
import math
import re
from dataclasses import dataclass
from typing import Mapping

from pyrunner.errors import PlanError
from pyrunner.ir.ops import ELEMENTWISE
from pyrunner.plan import masks
from pyrunner.plan.analysis import (
    AxisRole,
    constant_value,
    kernel_args,
    kernel_ops,
    op_reads_writes,
    thread_reads_staged,
)
from pyrunner.plan.dependent_launch import DependentLaunch
from pyrunner.plan.schedule import longest_first_axes
from pyrunner.plan.schema import (
    AxisSize,
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
    Ref,
    Store,
)
from pyrunner.target.device import DTYPE_BYTES
from pyrunner.target.layout import launch_axes, layout_groups, synchronous_loop_loads

NO_WARP_SPECIALISATION = {"tl.disable_warp_specialized": True}
"""Pass config of a kernel whose loop reads a pipelined tile with thread code: TileLang 0.1.15 releases
a warp-specialised stage with an ``mbarrier.arrive`` asm that has no memory clobber, so nvcc may move
those shared-memory reads after the release, and the producer's next copy overwrites the stage under
them (sweep run 4: right on the CPU, wrong on the Hopper GPU; run 6 diagnosis: every such kernel is right
without warp specialisation). The non-specialised pipeline syncs all threads between stages."""
FOLD_EXP_SHIFT = False
"""Whether ``exp2((a - b) * c)`` renders as one FMA per element, ``a * c - b * c``, as FlashAttention does.
Off: the FMA keeps ``a * c`` unrounded and subtracts a rounded ``b * c``, so at a row's maximum (a == b) the
exponent is that rounding, not 0: past ``|b * c|`` of 2^31 it exceeds 128 and exp2 overflows to inf (runs 132-133:
a temperature ``exp(16)`` gave NaN in a softmax whose float64 value is one-hot and well-conditioned), and past
2^16 it already moves the maximum's weight by more than bfloat16's rounding. ``(a - b) * c`` is exactly 0 at the
maximum for one more instruction per element. A benchmark flips it (``benchmarks/switches.py``) to time both."""
MERGE_ATOM_BYTES = 128  # TileLang's widest shared-memory swizzle atom: each half of a merged B tile spans whole atoms


# --- names -------------------------------------------------------------------

def _ident(raw: str) -> str:
    s = re.sub(r"\W", "_", raw)
    if not s or s[0].isdigit():
        s = "v_" + s
    if keyword.iskeyword(s) or keyword.issoftkeyword(s):
        s += "_"
    return s


class _Names:
    """Deterministic unique Python identifiers for plan names."""

    def __init__(self, taken: set[str]) -> None:
        self.taken = set(taken)

    def fresh(self, raw: str) -> str:
        base = _ident(raw)
        name, i = base, 1
        while name in self.taken:
            i += 1
            name = f"{base}_{i}"
        self.taken.add(name)
        return name


# --- source writer -----------------------------------------------------------

class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0

    def line(self, text: str = "") -> None:
        self.lines.append(("    " * self.depth + text) if text else "")

    def indent(self) -> None:
        self.depth += 1

    def dedent(self) -> None:
        self.depth -= 1

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


# --- kernel rendering --------------------------------------------------------

@dataclass
class _Ctx:
    """Everything needed to render one kernel's ops."""

    plan: Plan
    kernel: Kernel
    roles: dict[str, AxisRole]
    buffers: dict[str, Buffer]
    tensors: dict[str, GlobalTensor]
    names: dict[str, str]  # buffer / global tensor name -> identifier
    size_const: dict[str, str]  # axis -> module constant
    block_expr: dict[str, str]  # axis -> block expression (literal or parameter)
    coord: dict[str, str | None]  # grid axis -> coordinate expression (None: single tile, coordinate 0)
    loop_var: str
    local: _Names
    helpers: set[str]
    par_vars: dict[str, str]
    bridges: dict[tuple[str, int], list[str]]  # (section, op index) -> fragments a Map reads through shared
    bridge_names: dict[str, str]  # fragment -> its shared bridge buffer
    reroute: dict[str, str]  # while rendering one Map: buffer -> identifier to read instead
    policy_vars: dict[str, str]  # GEMM accumulator -> build-time variable holding its warp policy
    halves: dict[str, tuple[str, int]] = None  # merged GEMMs: B buffer / first accumulator -> (wide buffer, half)
    merged_second: dict[int, GemmMerge] = None  # id of a merged GEMM issued by its partner -> the merge
    merged_first: dict[int, GemmMerge] = None  # id of the GEMM that issues a merge -> the merge
    staging: dict[tuple[str, str], str] = None  # (fragment, global tensor) of an epilogue store -> shared tile
    hoisted: set[str] = None  # loop-invariant fragments whose bridge copy is issued once, before the loop
    sizes: dict[str, int] = None  # axis -> extent (constant expressions fold to literals at these)
    slots: dict[str, str] = None  # ring buffer -> slot index its element reads take first (render_ws)
    launch: DependentLaunch = None  # the kernel's part in the plan's programmatic dependent launch chain
    staged: dict[str, str] = None  # loop-loaded buffer -> register tile holding the next step's load
    tma_pipelines: bool = True  # the target pipelines loads by TMA under warp specialisation (else cp.async only)

    def par_var(self, axis: str) -> str:
        """The T.Parallel loop variable of an axis; one name per kernel, reused by every map."""
        if axis not in self.par_vars:
            self.par_vars[axis] = self.local.fresh(f"{axis}_i")
        return self.par_vars[axis]


def _paren(expr: str) -> str:
    return f"({expr})" if " " in expr else expr


def _tuple(items) -> str:
    items = list(items)
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def _scalar_copy(w: _Writer, ctx: _Ctx, tensor: GlobalTensor, buf: Buffer, load: bool) -> None:
    """Copy between a 0-d global tensor and a one-element buffer (TileLang's T.copy needs a region)."""
    g, b = ctx.names[tensor.name], ctx.names[buf.name]
    if load:
        w.line("for _ in T.Parallel(1):")
        w.line(f"    {b}[0] = {g}[()]")
    else:
        w.line(f"{g}[()] = {b}[0]")


def _extent(ctx: _Ctx, buf: Buffer) -> list[str]:
    return [ctx.block_expr[a] for a in buf.axes] if buf.axes else ["1"]


def _alloc_extent(ctx: _Ctx, buf: Buffer) -> list[str]:
    """The allocated extent: a merged B tile or accumulator is twice as wide along its free axis."""
    ext = _extent(ctx, buf)
    if ctx.halves and ctx.halves.get(buf.name, ("", -1))[0] == buf.name:  # the wide buffer of a merge
        ax = _wide_axis(ctx, buf.name)
        ext[ax] = f"2 * {_paren(ext[ax])}"
    return ext


def _wide_axis(ctx: _Ctx, name: str) -> int:
    """Position of the free (non-contracted) axis along which a merged B or accumulator is doubled."""
    for m in ctx.merged_first.values():
        if name == m.first.c:
            return 1
        if name == m.first.b:
            return next(i for i, a in enumerate(ctx.buffers[name].axes) if a != m.first.contract)
    raise AssertionError(name)  # pragma: no cover


def _half(ctx: _Ctx, name: str) -> str:
    """The region of the wide buffer that stands for buffer ``name`` of a merged GEMM pair."""
    wide, half = ctx.halves[name]
    buf = ctx.buffers[name]
    ax = _wide_axis(ctx, wide)
    parts = []
    for i, a in enumerate(buf.axes):
        b = ctx.block_expr[a]
        parts.append((f"{b}:2 * {_paren(b)}" if half else f"0:{b}") if i == ax else f"0:{b}")
    return f"{ctx.names[wide]}[{', '.join(parts)}]"


def _region(ctx: _Ctx, tensor: GlobalTensor) -> str:
    """Index expression of the tile of ``tensor`` a block touches (validation matched it to the buffer's axes)."""
    parts: list[str] = []
    held = False
    for a in tensor.axes:
        r = ctx.roles[a]
        b = ctx.block_expr[a]
        if r.kind == "indexed":
            parts.append(ctx.coord[a] or "0")
            continue
        held = True
        c = ctx.loop_var if r.kind == "loop" else ctx.coord[a]
        parts.append(f"{c} * {b}:({c} + 1) * {b}" if c else f"0:{b}")
    if not held:  # a single element: give the region extent 1 to match the [1] buffer
        last = parts[-1]
        parts[-1] = f"{last}:{last} + 1"
    return f"{ctx.names[tensor.name]}[{', '.join(parts)}]"


def _fill_value(v: float | str, dtype: str) -> str:
    if isinstance(v, float) and math.isnan(v):
        raise PlanError("a fill value is NaN")
    if v == "-inf" or (isinstance(v, float) and v == -math.inf):
        return f'-T.infinity("{dtype}")'
    if v == "inf" or (isinstance(v, float) and v == math.inf):
        return f'T.infinity("{dtype}")'
    return repr(float(v))


def _const(v: float) -> str:
    if math.isnan(v):  # validation does not look at constant values
        raise PlanError("a Map constant is NaN")
    if math.isinf(v):
        return ("-" if v < 0 else "") + 'T.infinity("float32")'
    return f"T.float32({float(v)!r})"


def _expr(ctx: _Ctx, e, idx: dict[str, str]) -> str:
    if isinstance(e, Ref):
        b = ctx.buffers[e.buf]
        ix = ", ".join(idx[a] for a in b.axes) if b.axes else "0"
        if ctx.slots and b.name in ctx.slots and b.name not in ctx.reroute:
            ix = f"{ctx.slots[b.name]}, {ix}"
        load = f"{ctx.reroute.get(b.name, ctx.names[b.name])}[{ix}]"
        return load if b.dtype == "float32" else f'T.cast({load}, "float32")'
    if isinstance(e, Const):
        return _const(e.number())
    if isinstance(e, Index):
        return f'T.cast({_index(ctx, e.axis, idx)}, "float32")'
    if isinstance(e, AxisSize):
        return f"T.float32({ctx.size_const[e.axis]})"
    assert isinstance(e, Call)
    value = _constant_value(ctx, e)
    if value is not None:  # e.g. rsqrt(|d|): one literal, not a special-function call per element
        return _const(value)
    folded = _folded_exp_arg(ctx, e)
    if folded is not None:  # exp2((a - b) * c): one product of constants, the shift exact (FOLD_EXP_SHIFT)
        a, b, c = (_expr(ctx, x, idx) for x in folded)
        arg = f"({a} * {c}) - ({b} * {c})" if FOLD_EXP_SHIFT else f"({a} - {b}) * {c}"
        return ELEMENTWISE[e.fn].emit_tilelang([arg])
    if e.fn in ("lt", "le"):
        return f"T.if_then_else({_pred(ctx, e, idx)}, T.float32(1.0), T.float32(0.0))"
    if e.fn == "where":
        x, y = (_expr(ctx, a, idx) for a in e.args[1:])
        return f"T.if_then_else({_pred(ctx, e.args[0], idx)}, {x}, {y})"
    args = [_expr(ctx, a, idx) for a in e.args]
    if e.fn == "div" and _is_broadcast(ctx, e.args[1], idx):  # one reciprocal per row, a multiply per element
        return ELEMENTWISE["mul"].emit_tilelang([args[0], f"(T.float32(1.0) / {args[1]})"])
    op = ELEMENTWISE[e.fn]
    if op.helper:
        ctx.helpers.add(e.fn)
    return op.emit_tilelang(args)


def _constant_value(ctx: _Ctx, e) -> float | None:
    """``analysis.constant_value`` at the plan's sizes: a call on constants and axis sizes becomes one
    literal. Fast math would not fold it: nvcc kept ``rsqrtf(128.0f)`` as a MUFU op per element."""
    return constant_value(e, ctx.sizes)


def _folded_exp_arg(ctx: _Ctx, e: Call):
    """(a, b, c) when ``e`` is exp/exp2 of ``(a - b)`` times constant factors whose product is c
    (``((S - m) * rsqrt(|d|)) * log2(e)``), else None: the constants multiplied once (``FOLD_EXP_SHIFT``)."""
    if e.fn not in ("exp", "exp2") or len(e.args) != 1:
        return None
    factors, stack = [], [e.args[0]]
    while stack:
        t = stack.pop()
        if isinstance(t, Call) and t.fn == "mul" and len(t.args) == 2 and _constant_value(ctx, t) is None:
            stack.extend(t.args)
        else:
            factors.append(t)
    c, rest = 1.0, []
    for f in factors:
        v = _constant_value(ctx, f)
        if v is None:
            rest.append(f)
        else:
            c *= v
    if len(rest) != 1 or len(factors) < 2 or not isinstance(rest[0], Call) or rest[0].fn != "sub" \
            or len(rest[0].args) != 2:
        return None
    return rest[0].args[0], rest[0].args[1], Const(value=c)


def _is_broadcast(ctx: _Ctx, e, idx: dict[str, str]) -> bool:
    """Whether ``e`` reads one buffer with fewer axes than the destination (a per-row value, say)."""
    return isinstance(e, Ref) and e.buf in ctx.buffers and len(ctx.buffers[e.buf].axes) < len(idx)
def _index(ctx: _Ctx, axis: str, idx: dict[str, str]) -> str:
    """Integer global index along ``axis`` of the element a Map writes (validation checked that the
    axis is one of the destination's, or an indexed grid axis)."""
    r = ctx.roles[axis]
    if r.kind == "indexed" or axis not in idx:
        return ctx.coord.get(axis) or "0"
    c = ctx.loop_var if r.kind == "loop" else ctx.coord[axis]
    return f"{c} * {ctx.block_expr[axis]} + {idx[axis]}" if c else idx[axis]


_INT_OPS = {"add": "+", "sub": "-", "mul": "*"}


def _int_expr(ctx: _Ctx, e, idx: dict[str, str]) -> str | None:
    """An affine index expression as integer source (exact, no float rounding), or None."""
    if masks.affine(e) is None:
        return None
    if isinstance(e, Index):
        return f"({_index(ctx, e.axis, idx)})"
    if isinstance(e, Const):
        return str(int(e.number()))
    if isinstance(e, AxisSize):
        return ctx.size_const[e.axis]
    if e.fn == "neg":
        return f"(-{_int_expr(ctx, e.args[0], idx)})"
    a, b = (_int_expr(ctx, x, idx) for x in e.args)
    return f"({a} {_INT_OPS[e.fn]} {b})"


def _pred(ctx: _Ctx, e, idx: dict[str, str]) -> str:
    """A mask predicate as a boolean expression: integer comparisons where the sides are affine in
    indices, ``T.And``/``T.Or`` for min/max of predicates, else ``value != 0``."""
    if isinstance(e, Call) and e.fn in ("lt", "le"):
        op = "<" if e.fn == "lt" else "<="
        sides = [_int_expr(ctx, a, idx) for a in e.args]
        if None in sides:
            sides = [_expr(ctx, a, idx) for a in e.args]
        return f"({sides[0]} {op} {sides[1]})"
    if isinstance(e, Call) and e.fn in ("min", "max", "mul") and all(
            isinstance(a, Call) and a.fn in ("lt", "le", "min", "max", "mul") for a in e.args):
        join = "T.Or" if e.fn == "max" else "T.And"
        return f"{join}({', '.join(_pred(ctx, a, idx) for a in e.args)})"
    return f"({_expr(ctx, e, idx)} != T.float32(0.0))"


def _tile_box(ctx: _Ctx, section: str) -> dict[str, tuple[str, str]]:
    """Least and greatest global index, as source, of the current tile along each kernel axis."""
    ar = masks.SrcArith()
    box: dict[str, tuple[str, str]] = {}
    for a, r in ctx.roles.items():
        if r.kind == "indexed":
            c = ctx.coord.get(a) or "0"
            box[a] = (c, c)
            continue
        if r.kind == "loop" and section != "body":
            continue
        c = ctx.loop_var if r.kind == "loop" else ctx.coord.get(a)
        b = ctx.block_expr[a]
        lo = ar.mul(c, b) if c else "0"
        box[a] = (lo, ar.add(lo, ar.add(b, "-1")))
    for a, const in ctx.size_const.items():
        box[masks.size_symbol(a)] = (const, const)
    return box


def _partial_tile(ctx: _Ctx, pred: masks.Pred, section: str) -> str | None:
    """Source of the condition 'the mask may hide something on this tile', or None (always apply)."""
    test = masks.tile_test(pred, _tile_box(ctx, section), masks.SrcArith())
    return None if test.all_true is None else f"{test.all_true} > 0"


def has_tail(kernel: Kernel, axis: str, block: int | str, size: int) -> bool:
    """Whether some allowed block of ``axis`` leaves a partial last tile (then tiles are counted with
    a ceiling division; loads past the end read zeros and stores past it are dropped)."""
    values = kernel.params.get(block, []) if isinstance(block, str) else [block]
    return any(size % v for v in values)


def _tiles(ctx: _Ctx, axis: str) -> str:
    r = ctx.roles[axis]
    if has_tail(ctx.kernel, axis, r.block, r.size):
        return f"T.ceildiv({ctx.size_const[axis]}, {ctx.block_expr[axis]})"
    return f"{ctx.size_const[axis]} // {ctx.block_expr[axis]}"


def _bind_loop_bounds(w: _Writer, ctx: _Ctx, lo_name: str, hi_name: str) -> None:
    """Bind ``lo_name``, ``hi_name`` to the steps ``[lo, hi)`` a block runs (what ``visible`` may show)."""
    lp = ctx.kernel.loop
    assert lp is not None and lp.visible is not None
    steps = _tiles(ctx, lp.axis)
    box = {a: v for a, v in _tile_box(ctx, "prologue").items() if a != lp.axis}
    lo, hi = masks.step_range(masks.predicate(lp.visible), lp.axis, ctx.block_expr[lp.axis], steps, box,
                              masks.SrcArith())
    w.line("# masked_tile_skip: steps outside [lo, hi) have the mask false everywhere (fully masked tiles)")
    w.line(f"{lo_name} = {lo}")
    w.line(f"{hi_name} = {hi}")


def _gemm_policy_full_row(kernel: Kernel, buffers: dict[str, Buffer], op: Gemm) -> bool:
    """FullRow is required: whole rows of c in one warp for a row reduction, or a layout shared with a fragment A.

    A GEMM whose accumulator is row-reduced, or whose A operand is a fragment, or whose accumulator
    shares a layout group with some GEMM's fragment A operand (``P = f(S)`` feeding ``P @ V``
    without a reduction in between, as in sigmoid attention) must use FullRow, or TileLang's layout
    inference cannot reconcile the fragments.
    """
    if buffers[op.a].scope == "fragment":
        return True
    ops = kernel_ops(kernel)
    if any(isinstance(o, Reduce) and o.src == op.c for o in ops):
        return True
    group = layout_groups(kernel)
    frag_a = {group[o.a] for o in ops if isinstance(o, Gemm) and o.a in group}
    return op.c in group and group[op.c] in frag_a


def gemm_policy_names(kernel: Kernel, buffers: dict[str, Buffer]) -> dict[str, str]:
    """Accumulator -> the policy its GEMMs use: "FullRow" (required) or "mma" (chosen from the MMA shape)."""
    out: dict[str, str] = {}
    for o in kernel_ops(kernel):  # an accumulator two GEMMs share takes FullRow if either needs it
        if isinstance(o, Gemm) and out.get(o.c) != "FullRow":
            out[o.c] = "FullRow" if _gemm_policy_full_row(kernel, buffers, o) else "mma"
    return out


@dataclass(frozen=True)
class GemmMerge:
    """Two loop GEMMs with the same A operand and contracted axis, issued as one twice-as-wide GEMM.

    ``second``'s B tile is loaded into the upper half (along its free axis) of ``first``'s B
    buffer, its accumulator is the upper half of ``first``'s, and it is copied out into its own
    fragment when the loop ends. SwiGLU's gate and up projections: one m64n256 wgmma, not two m64n128.
    """

    first: Gemm
    second: Gemm


NO_ASYNC_COPY = {"tl.enable_async_copy": False}
"""Pass config of a loop that loads rows which are not 16-byte aligned: TileLang 0.1.15 may still
lower such a copy to cp.async and then fails on a 2-byte transfer (a 512 x 50257 bf16 tile of 4 x 2048;
8 x 512 happened to fall back to plain loads). The loads are synchronous either way; this makes them so
for every tile shape."""


def kernel_pass_configs(kernel: Kernel, tensors: Mapping[str, GlobalTensor]) -> dict[str, bool]:
    """TileLang pass configs this kernel needs beside ``PASS_CONFIGS`` (see ``NO_WARP_SPECIALISATION``).

    Also off for a loop that loads a tensor whose rows are not 16-byte aligned (n = 50257 in bf16):
    TMA cannot load it, and TileLang's warp specialisation then doubles the threads with a copying
    producer group, halving the registers per thread below what the kernel's wgmma needs; nor can
    cp.async (``NO_ASYNC_COPY``).
    """
    if kernel.loop is None:
        return {}
    if synchronous_loop_loads(kernel, tensors):
        return {**NO_WARP_SPECIALISATION, **NO_ASYNC_COPY}
    return dict(NO_WARP_SPECIALISATION) if thread_reads_staged(kernel.body) else {}


def _read_by_threads(kernel: Kernel, name: str) -> bool:
    """Whether a pipelined kernel reads a buffer with thread code (anything but a GEMM operand)."""
    if kernel.loop is None:
        return False
    ops = kernel.prologue + kernel.body + kernel.epilogue
    return any(name in op_reads_writes(op)[0] for op in ops if not isinstance(op, Gemm))


def _mentions(op, name: str) -> bool:
    r, w = op_reads_writes(op)
    return name in r or name in w


def loop_invariant_bridges(kernel: Kernel, bridges: dict[tuple[str, int], list[str]]) -> list[str]:
    """Fragments the loop body reads through a layout bridge but never writes, in buffer order.

    Their bridge copy belongs before the loop: TileLang warp-specialises a pipelined loop, and a
    fragment computed before it is laid out over all the block's threads (producers included),
    while the loop body runs on the consumer threads only. A copy inside the loop writes just the
    consumers' rows of the bridge and the rest is read uninitialised (GPU sweep 1,
    attention_qk_norm: the query's rmsnorm factor scaling the scores).
    """
    written = {w for op in kernel.body for w in op_reads_writes(op)[1]}
    used = {r for (section, _), rs in bridges.items() if section == "body" for r in rs}
    return [b.name for b in kernel.buffers if b.name in used and b.name not in written]


def _merge_legal(cols: str, b_dtype: str, inner: str | None = None) -> str:
    """Python condition, on the tile parameters, under which a merged pair can lower.

    The wide B tile is filled by two copies, one into each half. TileLang lays a shared tile out in
    128-byte swizzle atoms; a half narrower than (or not a multiple of) one atom is a gapped box in
    that layout, which TileLang rejects ("plain SMEM layout is not a bijection"). And the merged
    wgmma needs N = 2 * cols <= 256. A B stored output-axis-major (an nn.Linear weight, [n, d])
    is merged by rows instead; each half is then whole only while a row, the ``inner`` contracted
    extent, fits in one atom (block_d = 128 in bf16 spans two and was rejected the same way).
    """
    atom = MERGE_ATOM_BYTES // DTYPE_BYTES[b_dtype]
    if inner is not None:
        return f"2 * {_paren(cols)} <= 256 and {_paren(inner)} <= {atom}"
    return f"2 * {_paren(cols)} <= 256 and {_paren(cols)} % {atom} == 0"


def gemm_merges(kernel: Kernel) -> list[GemmMerge]:
    """Pairs of loop-body GEMMs that can share one wide MMA (see ``GemmMerge``), in body order.

    Both read the same A over the same contracted axis; their B operands are shared tiles of equal
    axes, each filled by one Load in the loop and read by nothing else; their accumulators are
    float32 fragments of equal axes, touched in the loop only by these GEMMs, in the prologue only
    by equal Fills, and the first is neither reduced nor a GEMM operand afterwards (it is a
    half-view of a wider fragment). Nor does an epilogue map read the first into another fragment:
    the forwards that also save both halves (SwiGLU's ``Y = silu(G) * U`` beside ``G`` and ``U``,
    RMSNormMLP's) did, and their ``Y`` failed the float64 check on the GPU (run 157: normalised error
    1.0 and 1.1) while their ``G``, ``U`` and every merged kernel that maps in place (the forward plans)
    or stores the half (the backward ones) pass. In the lowered CUDA TileLang lays such a fragment out
    at the merged width (128 registers a thread for a 128 x 128 tile) and stores twice the tile from
    it; unmerged, both forwards pass on the GPU (runs 158-159, small and real shapes).
    """
    if kernel.loop is None:
        return []
    bufs = {b.name: b for b in kernel.buffers}
    gemms = [op for op in kernel.body if isinstance(op, Gemm)]
    forced = {c for c, p in gemm_policy_names(kernel, bufs).items() if p == "FullRow"}
    out: list[GemmMerge] = []
    used: set[int] = set()

    def clean(g: Gemm) -> bool:
        b, c = bufs.get(g.b), bufs.get(g.c)
        if b is None or c is None or b.scope != "shared" or c.scope != "fragment" or c.dtype != "float32":
            return False
        if g.c in forced or b.state:
            return False
        body_b = [op for op in kernel.body if _mentions(op, g.b)]
        if len(body_b) != 2 or not any(isinstance(op, Load) and op.dst == g.b for op in body_b):
            return False
        if any(_mentions(op, g.b) for op in kernel.prologue + kernel.epilogue):
            return False
        return all(op is g for op in kernel.body if _mentions(op, g.c))

    for i, g1 in enumerate(gemms):
        if i in used or not clean(g1):
            continue
        for j in range(i + 1, len(gemms)):
            g2 = gemms[j]
            if j in used or (g2.a, g2.contract, g2.clear) != (g1.a, g1.contract, g1.clear) or g2.c == g1.c \
                    or g2.b == g1.b or not clean(g2):
                continue
            b1, b2, c1, c2 = bufs[g1.b], bufs[g2.b], bufs[g1.c], bufs[g2.c]
            if b1.axes != b2.axes or b1.dtype != b2.dtype or c1.axes != c2.axes:
                continue
            fills1 = [op for op in kernel.prologue if _mentions(op, g1.c)]
            fills2 = [op for op in kernel.prologue if _mentions(op, g2.c)]
            if not all(isinstance(op, Fill) for op in fills1 + fills2) \
                    or [f.value for f in fills1] != [f.value for f in fills2]:
                continue
            if any(isinstance(op, (Reduce, Gemm)) and _mentions(op, g1.c) for op in kernel.epilogue):
                continue
            if any(isinstance(op, Map) and op.dst != g1.c and g1.c in op_reads_writes(op)[0]
                   for op in kernel.epilogue):
                continue  # a fragment computed from the merged half: see the docstring
            out.append(GemmMerge(g1, g2))
            used |= {i, j}
            break
    return out


def _render_op(w: _Writer, ctx: _Ctx, op, section: str, i: int) -> None:
    n = ctx.names
    if isinstance(op, Load):
        dst = ctx.buffers[op.dst]
        src = ctx.tensors[op.src]
        if not src.axes:
            _scalar_copy(w, ctx, src, dst, True)
            return
        target = _half(ctx, dst.name) if ctx.halves and dst.name in ctx.halves else n[dst.name]
        if section == "prologue" and _read_by_threads(ctx.kernel, dst.name):
            # TileLang 0.1.15's warp specialisation waits for a prologue TMA load only before the first
            # GEMM that reads it, so thread reads before that race the copy: load these synchronously.
            w.line(f"T.copy({_region(ctx, src)}, {target}, annotations={{\"disable_tma\": True}})")
            return
        w.line(f"T.copy({_region(ctx, src)}, {target})")
    elif isinstance(op, Store):
        src = ctx.buffers[op.src]
        dst = ctx.tensors[op.dst]
        if not dst.axes:
            _scalar_copy(w, ctx, dst, src, False)
            return
        source = _half(ctx, src.name) if ctx.halves and src.name in ctx.halves else n[src.name]
        stage = (ctx.staging or {}).get((src.name, dst.name)) if section == "epilogue" else None
        if stage is not None:  # registers -> shared -> global (a TMA store, or coalesced unaligned rows)
            w.line(f"T.copy({source}, {stage})")
            source = stage
        w.line(f"T.copy({source}, {_region(ctx, dst)})")
    elif isinstance(op, Fill):
        dst = ctx.buffers[op.dst]
        if ctx.merged_second and any(m.second.c == op.dst for m in ctx.merged_second.values()):
            w.line(f"# {op.dst!r} is the upper half of a merged accumulator, filled with it")
            return
        if op.value in (0, 0.0) and not isinstance(op.value, str):
            w.line(f"T.clear({n[dst.name]})")
        else:
            w.line(f"T.fill({n[dst.name]}, {_fill_value(op.value, dst.dtype)})")
    elif isinstance(op, Gemm):
        if ctx.merged_second and id(op) in ctx.merged_second:
            w.line(f"# the GEMM into {op.c!r} is the upper half of the one above")
            return
        _render_gemm(w, ctx, op)
    elif isinstance(op, Map):
        dst = ctx.buffers[op.dst]
        idx = {a: ctx.par_var(a) for a in dst.axes}
        pred = masks.mask_predicate(op)
        partial = _partial_tile(ctx, pred, section) if pred is not None else None
        if partial is not None:
            w.line(f"if {partial}:  # the mask, only on tiles it does not show whole")
            w.indent()
        ctx.reroute = {}
        for r in ctx.bridges.get((section, i), []):
            if not (section == "body" and ctx.hoisted and r in ctx.hoisted):
                w.line(f"T.copy({n[r]}, {ctx.bridge_names[r]})  # layout bridge: {r!r} and {dst.name!r} disagree")
            ctx.reroute[r] = ctx.bridge_names[r]
        rhs = _expr(ctx, op.expr, idx)
        ctx.reroute = {}
        if dst.dtype != "float32":
            rhs = f'T.cast({rhs}, "{dst.dtype}")'
        if dst.axes:
            w.line(f"for {', '.join(idx.values())} in T.Parallel({', '.join(_extent(ctx, dst))}):")
            w.indent()
            w.line(f"{n[dst.name]}[{', '.join(idx.values())}] = {rhs}")
        else:
            w.line("for _ in T.Parallel(1):")
            w.indent()
            w.line(f"{n[dst.name]}[0] = {rhs}")
        w.dedent()
        if partial is not None:
            w.dedent()
    elif isinstance(op, Reduce):
        src = ctx.buffers[op.src]
        dst = ctx.buffers[op.dst]
        # TileLang's clear=False combines the reduction into dst's value (dst + r, max(dst, r)).
        w.line(f"T.reduce_{op.fn}({n[src.name]}, {n[dst.name]}, dim={src.axes.index(op.axis)}, "
               f"clear={not op.accumulate})")
    else:  # pragma: no cover - the schema admits no other op
        raise TypeError(f"not a tile op: {op!r}")


def _render_gemm(w: _Writer, ctx: _Ctx, op: Gemm, fn: str = "T.gemm", full_row: bool = False) -> None:
    """One GEMM; ``fn`` T.wgmma_gemm issues it without waiting, ``full_row`` forces 64-row slabs per warpgroup."""
    a, b = ctx.buffers[op.a], ctx.buffers[op.b]
    kwargs = []
    if a.axes[0] == op.contract:
        kwargs.append("transpose_A=True")
    if b.axes[1] == op.contract:
        kwargs.append("transpose_B=True")
    if ctx.merged_first and id(op) in ctx.merged_first:
        kwargs.append(f"policy={ctx.policy_vars[op.c + ' wide']}")
    elif full_row or op.c not in ctx.policy_vars:  # FullRow where ``gemm_policy_names`` chose it for the accumulator
        kwargs.append("policy=T.GemmWarpPolicy.FullRow")
    else:
        kwargs.append(f"policy={ctx.policy_vars[op.c]}")
    if op.clear:
        kwargs.append("clear_accum=True")
    n = ctx.names
    w.line(f"{fn}({', '.join([n[op.a], n[op.b], n[op.c], *kwargs])})")


def _launch_count(ctx: _Ctx, axis: str) -> str:
    """How many blocks a launched grid axis takes: its tiles, or its extent when indexed."""
    return _tiles(ctx, axis) if ctx.roles[axis].kind != "indexed" else ctx.size_const[axis]


def _coord_name(ctx: _Ctx, axis: str) -> str:
    """A fresh name for a block's coordinate along a launched grid axis."""
    return ctx.local.fresh(f"{axis}_idx" if ctx.roles[axis].kind == "indexed" else f"{axis}_blk")


def _grid_launch(ctx: _Ctx, w: _Writer, params_line: str) -> None:
    """Emit ``with T.Kernel(...)`` and bind each grid axis's coordinate (folding > 3 launch dims)."""
    dims = launch_axes(ctx.kernel, ctx.roles)
    for g in ctx.kernel.grid:
        ctx.coord[g.axis] = None
    if not dims:
        w.line(f"with T.Kernel(1, {params_line}) as _block:")
        w.indent()
        return
    counts = {a: _launch_count(ctx, a) for d in dims for a in d}
    coord_names = {a: _coord_name(ctx, a) for d in dims for a in d}
    reverse = longest_first_axes(ctx.kernel, ctx.sizes)
    longest = [d[0] for d in dims if len(d) == 1 and d[0] in reverse]
    launch_names = {a: ctx.local.fresh(f"{a}_launch") for a in longest}
    launch, names, folds = [], [], []
    for d, dim in zip(dims, "xyz", strict=False):
        if len(d) == 1:
            launch.append(counts[d[0]])
            names.append(launch_names.get(d[0], coord_names[d[0]]))
            continue
        fold_var = ctx.local.fresh("_".join(d) + "_fold")
        w.line(f"# grid axes {d} share blockIdx.{dim} through div/mod")
        launch.append(" * ".join(_paren(counts[a]) for a in d))
        names.append(fold_var)
        folds.append((d, fold_var))
    target = names[0] if len(names) == 1 else f"({', '.join(names)})"
    w.line(f"with T.Kernel({', '.join(launch)}, {params_line}) as {target}:")
    w.indent()
    for folded, fold_var in folds:
        for j, a in enumerate(folded):  # fold = ((a0 * n1) + a1) * n2 + a2 ...
            inner = " * ".join(_paren(counts[b]) for b in folded[j + 1:])
            expr = f"{fold_var} // {_paren(inner)}" if inner else fold_var
            if j > 0:
                expr = f"{_paren(expr)} % {_paren(counts[a])}"
            w.line(f"{coord_names[a]} = {expr}")
    for a in longest:
        w.line(f"{coord_names[a]} = {_paren(counts[a])} - 1 - {launch_names[a]}  # longest first: later {a!r} "
               "blocks run more steps of the masked loop")
    for a in coord_names:
        ctx.coord[a] = coord_names[a]


SWIZZLE_PANEL = 10
"""Rows of blocks in one panel of the block order that keeps GEMM operand panels in L2 (TileLang's
``use_swizzle(panel_size=10)``, whose order the persistent launch reproduces: odd panels walk the
columns back, so the tiles in flight across a panel boundary share their column operands)."""


def launch_counts(ctx: _Ctx) -> list[tuple[str, str]]:
    """(grid axis, tile count expression) of every launched grid axis, fastest first: blockIdx.x's axes,
    then .y's, then .z's, the folded axes of each innermost first."""
    dims = launch_axes(ctx.kernel, ctx.roles)
    order = [a for d in dims for a in reversed(d)]
    return [(a, _launch_count(ctx, a)) for a in order]


def _persistent_launch(ctx: _Ctx, w: _Writer, params_line: str) -> str:
    """``with T.Kernel(SM_COUNT, ...)`` of a persistent kernel; returns the block index's name. Each role
    binds the grid coordinates of its current tile with ``bind_tile_coords``."""
    block = ctx.local.fresh("block")
    for g in ctx.kernel.grid:
        ctx.coord[g.axis] = None
    for a, _ in launch_counts(ctx):
        ctx.coord[a] = _coord_name(ctx, a)
    w.line(f"with T.Kernel(SM_COUNT, {params_line}) as {block}:")
    w.indent()
    return block


def bind_tile_coords(ctx: _Ctx, w: _Writer, tile: str, panel: bool) -> None:
    """Bind the grid coordinates of tile number ``tile`` (the launch order: the first launched axis
    fastest). ``panel``: two launched axes walked in panels of ``SWIZZLE_PANEL`` rows of the second,
    as ``T.use_swizzle`` orders blocks (``rasterization2DRow``), so the tiles in flight share operand
    panels in L2."""
    counts = launch_counts(ctx)
    if panel and len(counts) == 2:
        (ax, nx), (ay, ny) = counts
        span = f"{SWIZZLE_PANEL} * {_paren(nx)}"
        panel_v, rows = ctx.local.fresh("panel"), ctx.local.fresh("panel_rows")
        w.line(f"{panel_v} = {tile} // ({span})  # panels of {SWIZZLE_PANEL} rows of {ay!r} blocks")
        w.line(f"{rows} = T.min({SWIZZLE_PANEL}, {_paren(ny)} - {panel_v} * {SWIZZLE_PANEL})")
        col = ctx.local.fresh("panel_col")
        w.line(f"{col} = {tile} % ({span}) // {rows}")
        w.line(f"{ctx.coord[ax]} = {col} + {panel_v} % 2 * ({_paren(nx)} - 1 - 2 * {col})  # odd panels walk back")
        w.line(f"{ctx.coord[ay]} = {panel_v} * {SWIZZLE_PANEL} + {tile} % ({span}) % {rows}")
        return
    stride = ""
    for j, (a, n) in enumerate(counts):
        expr = f"{tile} // ({stride})" if stride else tile
        if j < len(counts) - 1:
            expr = f"{_paren(expr)} % {_paren(n)}" if stride else f"{tile} % {_paren(n)}"
        w.line(f"{ctx.coord[a]} = {expr}")
        stride = f"{stride} * {_paren(n)}" if stride else _paren(n)


def _stages(kernel: Kernel) -> str:
    """The loop's pipeline depth as source text: a literal or its tile parameter."""
    assert kernel.loop is not None
    return str(kernel.loop.stages)


def _launch_chain_top(w: _Writer, ctx: _Ctx, sync: bool) -> None:
    """The trigger that lets the next kernel of the plan be scheduled now, and (``sync``) the wait for the
    kernels ahead, both at the top of the block (``plan.dependent_launch`` says why this is safe)."""
    if ctx.launch.trigger:
        w.line("T.pdl_trigger()  # dependent launch: the next kernel may be scheduled now; it waits for this one")
    if sync and ctx.launch.waits:
        pdl_sync(w, "the kernels ahead finished, their writes visible")


def pdl_sync(w: _Writer, why: str) -> None:
    """``griddepcontrol.wait`` of a dependently launched kernel."""
    w.line(f"T.pdl_sync()  # dependent launch: {why}")


def _signature_and_launch(w: _Writer, ctx: _Ctx, func_name: str, threads: str, persistent: bool = False) -> str | None:
    """``@T.prim_func``, its global tensor arguments and ``with T.Kernel(...)`` (indents into the block);
    ``persistent``: one block per SM (``_persistent_launch``), whose index it returns."""
    tensors = {t.name: t for t in ctx.plan.tensors}
    w.line("@T.prim_func")
    w.line(f"def {func_name}(")
    for t in kernel_args(ctx.plan, ctx.kernel):
        shape = _tuple(ctx.size_const[a] for a in tensors[t].axes)
        w.line(f'    {ctx.names[t]}: T.Tensor({shape}, "{tensors[t].dtype}"),')
    w.line("):")
    w.indent()
    if persistent:
        return _persistent_launch(ctx, w, f"threads={threads}")
    _grid_launch(ctx, w, f"threads={threads}")
    return None


def _declare_buffers(w: _Writer, ctx: _Ctx, rings: frozenset[str] = frozenset()) -> None:
    """Every buffer of the kernel, then the renderer's own: layout bridges and TMA-store epilogue
    tiles. ``rings``: loaded buffers allocated once per pipeline slot (the explicit producer form)."""
    for b in ctx.kernel.buffers:
        if b.name in ctx.halves and ctx.halves[b.name][0] != b.name:
            continue  # the upper half of a merged B tile
        if b.name in rings:
            stages = _stages(ctx.kernel)
            w.line(f'{ctx.names[b.name]} = T.alloc_shared({_tuple([stages, *_extent(ctx, b)])}, "{b.dtype}")'
                   f"  # ring of {stages} slots, filled by the producer warpgroup")
            continue
        alloc = "T.alloc_shared" if b.scope == "shared" else "T.alloc_fragment"
        note = "  # state: carried across loop steps" if b.state else ""
        if b.name in ctx.halves:
            note = "  # merged: two GEMMs' tiles side by side"
        w.line(f'{ctx.names[b.name]} = {alloc}({_tuple(_alloc_extent(ctx, b))}, "{b.dtype}"){note}')
    for b, bridge in ctx.bridge_names.items():
        buf = ctx.buffers[b]
        w.line(f'{bridge} = T.alloc_shared({_tuple(_extent(ctx, buf))}, "{buf.dtype}")'
               f"  # shared copy of {b!r} for maps that need another fragment layout")
    dtypes = {t.name: t.dtype for t in ctx.plan.tensors}
    held = {ctx.names[b.name] for b in ctx.kernel.buffers}
    for (src, dst), stage in ctx.staging.items():
        if stage in held:  # a dead shared tile of the kernel's own (render.unaligned_store_staging)
            continue
        w.line(f'{stage} = T.alloc_shared({_tuple(_extent(ctx, ctx.buffers[src]))}, "{dtypes[dst]}")'
               f"  # epilogue tile of {dst!r} for one TMA store")
