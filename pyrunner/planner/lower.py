"""Lower one fused sub-graph to a tile-level kernel, for a chosen streamed axis.

The kernel computes ``root`` from global tensors (``boundary``); ``root`` may be several
terms (sibling kernels merged into one multi-output kernel: their cones are lowered together,
so shared loads and common subterms appear once, and each root gets its own store). Terms are
sorted into phases relative to the streamed axis ``s``:

* pre   - no ``s`` axis and no dependence on a reduction over ``s``: prologue;
* tile  - carries ``s``: recomputed for every tile of ``s`` in the loop body;
* acc   - reductions and contractions over ``s``: state buffers updated per tile
          (``reduction_tiling``);
* post  - depends on an accumulator: epilogue, after the loop.

A tile term may depend on a running ``max`` accumulator only through an
exponential factor ``E(c*(x - m))``; every sum that consumes it is then kept
relative to the running max and rescaled when it grows
(``online_softmax_rescale``). Any other dependence of the loop on a finished
reduction makes the candidate infeasible: it would need a second pass.

Everything here walks the kernel's terms in one operands-first list (no
recursion), so 1000-op chains and shared sub-graphs lower in linear time.
Emission is per op kind (``_EMIT``), each a small method of ``_Builder``.

Why one module: phases, the online-rescale factor analysis and the tile builder
are one algorithm over one kernel's terms; each function is small (C901 < 12).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pyrunner.ir.axes import axes_of
from pyrunner.ir.graph import Term, index_only
from pyrunner.ir.ops import REDUCTIONS, UNARY
from pyrunner.plan import masks
from pyrunner.plan.analysis import MMA_K_ALIGN, block_param, constant_value, expr_refs, op_buffers, substitute_refs
from pyrunner.plan.schema import (
    AxisSize,
    Buffer,
    Call,
    Const,
    Expr,
    Fill,
    Gemm,
    GridAxis,
    Index,
    Load,
    Map,
    Reduce,
    Ref,
    Store,
)
from pyrunner.planner.tiles import stream_steps
from pyrunner.rules.loop_body import (
    Infeasible,
    Roots,
    as_roots,
    cone,
    kernel_computes,
)
from pyrunner.rules.loop_body import is_acc as _is_acc
from pyrunner.rules.loop_body import is_leaf as _is_leaf
from pyrunner.rules.loop_body import online_sources as _online_sources
from pyrunner.rules.loop_body import phases as _phases
from pyrunner.rules.masking import skippable_predicates
from pyrunner.target.device import rows_async
from pyrunner.target.layout import fragment_groups, padded_row, whole_row_divisible

TRANSCENDENTAL = tuple(name for name, op in UNARY.items() if op.sfu)

SHARED_ACCUMULATOR = True
"""A sum of contractions over the streamed axis accumulates in one register tile (``shared_accumulator``):
``dX = dG @ W_gate^T + dU @ W_up^T`` is one GEMM over the two K ranges, as cuBLAS runs it on the
concatenated operands, with one fragment and no epilogue add, and such a sum is a cut candidate
(``search._sums_of_contractions``): written once, not as two products the next kernel adds. On since run 165
(H100): RMSNormMLP's forward + backward 46.1 -> 43.6 us per step, SwiGLU's 93.4 -> 93.3; in kernel profiles taken
apart from that timing, RMSNormMLP's backward GEMM pair 12.9 -> 11.3 us and the norm's backward, reading one tensor,
4.4 -> 3.7; SwiGLU's d_X kernel 32.2 us either way (cuBLAS's 27.3 is not about the accumulators). A switch
(``benchmarks/switches.py``)."""

SHORT_DTYPE = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}

MAX_FULL_EXTENT = 256
"""Largest axis a kernel may hold whole in one tile (an in-tile contraction)."""

MAX_FULL_REDUCE = 8192
"""Largest axis a kernel may reduce whole in one tile when it also stores along that axis (a row
held on chip, read once, normalised in place)."""

LONG_ROW_THREADS = (128, 256, 512)
"""Block sizes a kernel holding long rows whole may take (its rows spread over more threads than a
tile of short ones: a 4096-wide row at 8 rows and 256 threads is 128 registers a fragment)."""

NARROW_ROW_THREADS = 64
"""The block size added for a row held whole whose length only 64 threads x 8 elements divide (1536,
2560, 3584: ``target.layout.reduced_tile_problem``); two warps a block are a measured size, not a
guess (run 67: layernorm over 1024 at 2 rows x 64 threads 8.7 us, 9.4 at 128)."""

WHOLE_ROW_THREADS = (NARROW_ROW_THREADS, *LONG_ROW_THREADS)
"""Every block size a kernel holding a long row whole may take."""


def long_row_threads(full: dict[str, int]) -> list[int]:
    """Thread counts for a kernel holding the rows ``full`` (axis -> extent) whole: ``LONG_ROW_THREADS``,
    and ``NARROW_ROW_THREADS`` where a row's length needs it."""
    narrow = any(not whole_row_divisible(n, LONG_ROW_THREADS) for n in full.values() if n > MAX_FULL_EXTENT)
    return list(WHOLE_ROW_THREADS if narrow else LONG_ROW_THREADS)

MAX_INLINE_DEPTH = 8
"""Deepest elementwise expression kept inline in one map; deeper chains go through a
fragment, so plans of long chains stay shallow (serialisation and renderers recurse)."""

ELEMENTWISE_OPS = ("unary", "binary", "ternary")


def const_expr(v: float) -> Const:
    """A plan constant; infinities are spelled as strings (JSON has none)."""
    return Const(value=("-inf" if v < 0 else "inf") if math.isinf(v) else v)


def static(t: Term) -> bool:
    """t depends only on indices and constants (a mask predicate, say): computed where it is used."""
    return index_only(t) and t.op != "const" and t.op != "axis_size"


def static_expr(t: Term) -> Expr:
    """The plan expression of a term built from indices and constants only."""
    if t.op == "const":
        return const_expr(t.value)
    if t.op == "axis_size":
        return AxisSize(axis=t.axis)
    if t.op == "iota":
        return Index(axis=t.axis)
    return Call(fn=t.fn, args=[static_expr(a) for a in t.args])


@dataclass
class GemmInfo:
    m_axis: str
    n_axis: str
    k_axis: str
    streamed: bool
    flops: float
    a_in_registers: bool = False


@dataclass
class LoadInfo:
    tensor: str
    axes: tuple[str, ...]
    in_loop: bool
    asynchronous: bool = True
    """Its rows are 16-byte aligned, so cp.async or TMA can fetch it (``target.device.rows_async``)."""


@dataclass
class Lowered:
    """A kernel's structure before tile sizes are chosen."""

    root: Term                # the first root (its axes name the kernel's structure)
    stream: str | None
    grid: list[GridAxis]
    tiled: list[str]          # grid axes whose block is a tuning parameter
    full: dict[str, int]      # grid axes held whole (literal block = size)
    buffers: list[Buffer]
    prologue: list
    body: list
    epilogue: list
    reads: list[str]
    writes: list[str]
    gemms: list[GemmInfo] = field(default_factory=list)
    loads: list[LoadInfo] = field(default_factory=list)
    ew_by_axes: tuple[tuple[tuple[str, ...], float, float], ...] = ()
    """Elementwise and reduction work of the whole kernel by the axes of the value computed: (axes,
    element operations, of which transcendental). A block computes its tile of each value once per
    block of every grid axis the value lacks (the scores' softmax once per block of d when d is
    split), which the cost model multiplies in."""
    rules: list[str] = field(default_factory=list)
    terms: frozenset[Term] = frozenset()
    visible: Expr | None = None  # loop steps whose tile has this all false are skipped (masked_tile_skip)
    roots: tuple[Term, ...] = ()  # every term the kernel stores, in ``writes`` order
    steps: list[int] = field(default_factory=list)
    """Blocks the streamed loop may step by (``planner.tiles.stream_steps``): the tuning space offers
    exactly these, and the body masks its accumulators where one of them leaves a partial tile."""


def stream_candidates(root: Roots, terms: list[Term], boundary: dict[Term, str] | None = None) -> list[str | None]:
    """Axes reduced inside the kernel (not by a tensor it reads) and absent from its
    outputs, plus no loop."""
    root_axes = {a for r in as_roots(root) for a in axes_of(r)}
    computed = terms if boundary is None else kernel_computes(root, terms, boundary)
    axes: list[str] = []
    for t in computed:
        if t.op in ("reduce", "matmul") and t.axis not in root_axes and t.axis not in axes:
            axes.append(t.axis)
    return [None, *axes]


# --- online softmax: how loop sums depend on a running max ------------------------

Factor = tuple[str, float, "Expr | None"] | None | bool
"""False: independent of m; (E, c, c as an expression or None): t = f * E(-c*m) with f free of m;
None: any other dependence."""


def term_constant(t: Term, sizes: dict[str, int]) -> float | None:
    """The value of a term built from constants and axis sizes only (``rsqrt(|d|)``), else None."""
    if t.op not in ("const", "axis_size") and not static(t):
        return None
    return constant_value(static_expr(t), sizes)


def _exp_scale(t: Term, m: Term, dep: dict[Term, bool],
               sizes: dict[str, int]) -> tuple[str, float, Expr | None] | None:
    """If t == E(c * (x - m)) with x free of m and c a product of constants, return (E, c, c's
    expression): None for plain numbers; the factors themselves where they read axis sizes
    (``rsqrt(|d|)``), so the plan stays right at other sizes (``scale_down``)."""
    if t.op != "unary" or t.fn not in ("exp", "exp2"):
        return None
    arg, coef = t.args[0], 1.0
    factors: list[Term] = []
    while arg.op == "binary" and arg.fn == "mul":
        a, b = arg.args
        if (v := term_constant(b, sizes)) is not None:
            arg, coef = a, coef * v
            factors.append(b)
        elif (v := term_constant(a, sizes)) is not None:
            arg, coef = b, coef * v
            factors.append(a)
        else:
            break
    if arg.op == "binary" and arg.fn == "sub" and arg.args[1] == m and not dep.get(arg.args[0], False):
        return t.fn, coef, _coef_expr(factors)
    return None


def _coef_expr(factors: list[Term]) -> Expr | None:
    """The product of constant factors as a plan expression, or None when they are all numbers."""
    if all(f.op == "const" for f in factors):
        return None
    expr: Expr = static_expr(factors[0])
    for f in factors[1:]:
        expr = Call(fn="mul", args=[expr, static_expr(f)])
    return expr


def _product_factor(fn: str, fa: Factor, fb: Factor) -> Factor:
    if fn == "div":
        return fa if fb is False else None
    if fa is False:
        return fb
    if fb is False:
        return fa
    if fa and fb and fa[0] == fb[0]:
        ea = fa[2] if fa[2] is not None else const_expr(fa[1])
        eb = fb[2] if fb[2] is not None else const_expr(fb[1])
        both = None if fa[2] is None and fb[2] is None else Call(fn="add", args=[ea, eb])
        return (fa[0], fa[1] + fb[1], both)
    return None


def _factor_of(t: Term, m: Term, dep: dict[Term, bool], fac: dict[Term, Factor], sizes: dict[str, int]) -> Factor:
    if t == m:
        return None
    if not dep[t]:
        return False
    if (sc := _exp_scale(t, m, dep, sizes)) is not None:
        return sc
    if t.op == "binary" and t.fn in ("mul", "div"):
        return _product_factor(t.fn, fac[t.args[0]], fac[t.args[1]])
    if t.op == "matmul" or (t.op == "reduce" and t.fn == "sum"):
        deps = [fac[a] for a in t.args if fac[a] is not False]
        return deps[0] if len(deps) == 1 else None
    return None


def online_factors(computed: list[Term], m: Term, sizes: dict[str, int] | None = None) -> dict[Term, Factor]:
    """The factor of every computed term (operands first) with respect to running max m.
    Terms read from global memory are finished values: independent of the running max."""
    dep: dict[Term, bool] = {}
    fac: dict[Term, Factor] = {}
    cset = set(computed)
    for t in computed:
        for a in t.args:
            if a not in cset and a not in dep:
                dep[a], fac[a] = False, False
        dep[t] = t == m or any(dep[a] for a in t.args)
        fac[t] = _factor_of(t, m, dep, fac, sizes or {})
    return fac


def _online_sums(computed: list[Term], s: str | None, sources: list[Term],
                 sizes: dict[str, int]) -> dict[Term, tuple[Term, str, float, Expr | None]]:
    """Loop sums kept relative to a running max: acc -> (max, E, c)."""
    online: dict[Term, tuple[Term, str, float, Expr | None]] = {}
    accs = [t for t in computed if _is_acc(t, s)]
    for m in sources:
        fac = online_factors(computed, m, sizes)
        for acc in accs:
            if acc is m:
                continue
            if acc.op == "reduce" and acc.fn == "max" and fac[acc] is not False:
                raise Infeasible("a running max depends on a running max")
            f = fac[acc]
            if f is None:
                raise Infeasible("a loop sum depends on the running max other than by an exponential factor")
            if f is False:
                continue
            if acc in online:
                raise Infeasible("a loop sum depends on two running maxima")
            if acc.op == "reduce" and acc.fn != "sum":
                raise Infeasible("only sums can be rescaled online")
            online[acc] = (m, f[0], f[1], f[2])
    return online


# --- tile geometry --------------------------------------------------------------------

def _held_whole(computed: list[Term], s: str | None, sizes: dict[str, int],
                stored: frozenset[str] = frozenset()) -> dict[str, int]:
    """Axes reduced or contracted inside one tile, at their (padded) extents. A long row is held
    whole only where the kernel also stores along it, as its innermost (contiguous) axis (a norm's
    output beside its statistic): then the row is read once instead of once per pass (run 63:
    add + RMSNorm with both outputs 54.6 -> 42.7 us, capped log-softmax 12.6 -> 6.4). A kernel that
    stores only the reduction streams the row as before, and so does a reduction over a strided
    axis (run 63: batch-norm over 8192 rows held whole, 23.9 us against 14.4 streamed)."""
    full: dict[str, int] = {}
    for t in computed:
        if t.op in ("reduce", "matmul") and t.axis != s:
            limit = MAX_FULL_REDUCE if t.op == "reduce" and t.axis in stored else MAX_FULL_EXTENT
            if sizes[t.axis] > limit:
                raise Infeasible(f"axis {t.axis} ({sizes[t.axis]}) too large to hold whole in a tile")
            n = sizes[t.axis]
            if n == 1 and t.op == "reduce":
                # a block of 1 is an indexed axis in the plan format, which cannot be reduced over: a
                # reduction over an axis of extent 1 (a mean over one row) takes a tile of 2, masked
                n = 2
            if t.op == "reduce" and not whole_row_divisible(n, WHOLE_ROW_THREADS):
                # TileLang finds no fragment layout (d = 96), or no butterfly over the row's threads:
                # the tile is padded to a power of two and every reduced value masked past the end
                n = padded_row(n)
                if n > limit:
                    raise Infeasible(f"axis {t.axis} ({sizes[t.axis]}) padded to {n} is too large to hold whole")
            if t.op == "matmul" and n % MMA_K_ALIGN:  # a tensor-core K step is 16 elements
                n = _padded_contraction(computed, t.axis, n)
            full[t.axis] = max(n, full.get(t.axis, 0))
    return full


def _padded_contraction(computed: list[Term], a: str, n: int) -> int:
    """The tile of a held-whole contraction over `a` rounded up to whole MMA steps (a LoRA rank 8
    becomes 16, a head dim of 72 80). Sound only where every reduction over `a` in the kernel is such
    a contraction of two tiles loaded from memory: loads fill the positions past the extent with
    zeros, which add nothing to the products, while a value computed in the kernel would hold f(0)
    there. Other uses of `a` are free axes (attention's V and O columns): their padded positions
    are never reduced over and never stored (stores stop at the extent)."""
    own = set(computed)
    for u in computed:
        if u.op in ("reduce", "matmul") and u.axis == a:
            if u.op != "matmul" or any(x in own for x in u.args):
                raise Infeasible(f"a contraction over axis {a} held whole needs a multiple of {MMA_K_ALIGN} "
                                 f"elements, not {n}, unless both operands are loaded tiles: it is streamed instead")
    return -(-n // MMA_K_ALIGN) * MMA_K_ALIGN


def _choose_tiled(root: Roots, computed: list[Term], s: str | None,
                  sizes: dict[str, int]) -> tuple[set[str], dict[str, int]]:
    """Pick which axes are tiled (2-D tensor-core tiles) and which are held whole."""
    full = _held_whole(computed, s, sizes, frozenset(axes_of(r)[-1] for r in as_roots(root) if axes_of(r)))
    tiled: set[str] = {s} if s is not None else set()
    matmuls = [t for t in computed if t.op == "matmul"]
    for t in matmuls:
        for op, other in ((t.args[0], t.args[1]), (t.args[1], t.args[0])):
            # a batch axis (both operands carry it) is indexed, never a tile axis: a decode step's
            # 4 query rows must be the rows, not its 8 KV heads
            cands = [a for a in axes_of(op) if a != t.axis and a not in axes_of(other)]
            if cands and not any(a in tiled or a in full for a in cands):
                tiled.add(max(cands, key=lambda a: (sizes[a], cands.index(a))))
    if not matmuls:
        out_axes = list(dict.fromkeys(a for r in as_roots(root) for a in axes_of(r)))
        tiled.update([a for a in out_axes if a not in full][-2:])
    for t in matmuls:
        for op in t.args:
            free = [a for a in axes_of(op) if a != t.axis]
            if len([a for a in free if a in tiled or a in full]) != 1:
                raise Infeasible("a tile GEMM operand needs exactly one tiled free axis")
    return tiled, full


def _kernel_axes(terms: list[Term], root: Roots, boundary: dict[Term, str]) -> list[str]:
    """Axes the kernel iterates over: the result axes of everything it touches, plus the
    axes it reduces itself. A tensor read from global memory brings only its own axes,
    never the axis its producer reduced (that loop ran in the producer's kernel)."""
    out: list[str] = []
    for t in terms:
        own = (t.axis,) if t.op in ("reduce", "matmul") and not _is_leaf(t, root, boundary) else ()
        for a in axes_of(t) + own:
            if a not in out:
                out.append(a)
    return out


def _grid(all_axes: list[str], root: Roots, s: str | None, tiled: set[str], full: dict[str, int],
          sizes: dict[str, int]) -> list[GridAxis]:
    """One grid axis per kernel axis but the loop's. An axis split across blocks must be an axis
    of every tensor the kernel stores: otherwise blocks would race on that store."""
    grid: list[GridAxis] = []
    roots = as_roots(root)
    root_axes = [a for a in axes_of(roots[0]) if all(a in axes_of(r) for r in roots[1:])]
    for a in all_axes:
        if a == s:
            continue
        if a in full:
            g = GridAxis(axis=a, block=full[a])
        elif a in tiled:
            g = GridAxis(axis=a, block=block_param(a))
        else:
            g = GridAxis(axis=a, block=1)
        # held whole (one block, padded or not) or of extent 1 (a scalar output's unit axis): one block
        if a not in root_axes and a not in full and g.block != sizes[a] and sizes[a] > 1:
            raise Infeasible(f"axis {a} is split across blocks but not in every output")
        grid.append(g)
    return grid


# --- emission -------------------------------------------------------------------------

class _Builder:
    """Accumulates buffers and ops while walking the cone in order."""

    def __init__(self, root: Roots, computed: list[Term], boundary: dict[Term, str], tensor_dtype: dict[str, str],
                 sizes: dict[str, int], dtype: str, s: str | None, labels: dict[Term, str], out_tensor: str | list[str],
                 indexed: set[str], reserved: frozenset[str] | None = None) -> None:
        self.roots, self.computed, self.boundary = as_roots(root), computed, boundary
        self.tensor_dtype, self.sizes, self.dtype, self.s = tensor_dtype, sizes, dtype, s
        self.labels = labels
        self.indexed = indexed
        self.buffers: dict[str, Buffer] = {}
        # buffer names never shadow tensors
        outs = [out_tensor] if isinstance(out_tensor, str) else list(out_tensor)
        self.reserved = (reserved if reserved is not None else frozenset(boundary.values())) | set(outs)
        self.buf_of: dict[Term, str] = {}
        self.expr_inline: dict[Term, tuple[Expr, int]] = {}
        self.cast_of: dict[tuple[str, str], str] = {}
        self.ops: dict[str, list] = {"prologue": [], "body": [], "epilogue": []}
        self.gemms: list[GemmInfo] = []
        self.loads: list[LoadInfo] = []
        self.rules: list[str] = []
        self.ew_by_axes: dict[tuple[str, ...], list[float]] = {}
        self.scale_bufs: dict[tuple[Term, str, float], str] = {}
        self.m_prev: dict[Term, str] = {}
        self.mean_fix: list[tuple[str, str]] = []
        self.online: dict[Term, tuple[Term, str, float, Expr | None]] = {}
        self.online_src: set[Term] = set()
        self.users: dict[Term, list[Term]] = {}
        self.where: dict[Term, str] = {}
        self.next_suffix: dict[str, int] = {}
        self.body_ref: dict[Term, str] = {}  # running maxima as the loop body reads them (guarded)
        self.at = "prologue"
        self.guard_max = False  # the cone has an infinite constant (a mask): guard running maxima
        self.tail = False  # the streamed axis ends in a partial tile
        self.padded: dict[str, int] = {}  # axes held whole in a tile larger than the axis
        self.loaded: set[str] = set()
        self.tail_masked: dict[tuple[str, float, str], str] = {}
        self.sum_member: dict[Term, Term] = {}  # a summed contraction -> the first of its sum (_sum_groups)
        self.acc_of: dict[Term, str] = {}  # a contraction or sum of them -> the accumulator they share

    def is_root(self, t: Term) -> bool:
        """t is stored by the kernel: it needs a buffer of its own, never an inline expression."""
        return any(t is r for r in self.roots)

    # --- naming ------------------------------------------------------------
    def fresh(self, base: str) -> str:
        base = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in base) or "t"
        if base in self.reserved:
            base = f"{base}_tile"
        name, i = base, self.next_suffix.get(base, 1)
        while name in self.buffers:
            i += 1
            name = f"{base}_{i}"
        self.next_suffix[base] = i
        return name

    def tile_axes(self, axes: tuple[str, ...]) -> list[str]:
        return [a for a in axes if a not in self.indexed]

    def add_buffer(self, base: str, axes: list[str], scope: str, dtype: str, state: bool = False) -> str:
        name = self.fresh(base)
        self.buffers[name] = Buffer(name=name, axes=axes, scope=scope, dtype=dtype, state=state)
        return name

    def fragment_for(self, t: Term, fallback: str, state: bool = False) -> str:
        return self.add_buffer(self.labels.get(t, fallback), self.fragment_axes(t), "fragment", "float32",
                               state=state)

    def fragment_axes(self, t: Term) -> list[str]:
        """The tile axes of t's fragment, in the order of the loaded tiles it reads where they agree.

        An elementwise map walks its destination's axes with the last one across neighbouring
        threads. When that is not the last axis of a shared tile the map reads (h[d] * E[v, d] in the
        canonical order (d, v)), each warp reads one column of the tile: one shared-memory bank,
        32-way serialised. Taking the loaded tile's order makes those reads contiguous; the order is
        kept where the loaded operands disagree (x[i, j] + y[j, i]: one of them is read across).

        Two-axis tiles only, as measured on the Hopper GPU (run 84): a GEMV's map went from 51 to 33 us,
        but the same reorder of a four-axis fragment (b, h, t, d) of a batched decode made TileLang
        build a kernel 8x slower at its default tile (3.0 -> 23.4 ms; 2x faster at 1x1 heads), so
        higher ranks keep the canonical order until that is understood. A stored term keeps its
        tensor's order: the store copies the tile as it is (``v[f] * X[m, f]`` is stored ``[f, m]``).
        """
        axes = self.tile_axes(axes_of(t))
        if t.op not in ELEMENTWISE_OPS or len(axes) != 2 or self.is_root(t):
            return axes
        orders = {tuple(self.buffers[self.buf_of[a]].axes) for a in t.args
                  if a in self.buf_of and self.buf_of[a] in self.loaded}
        orders = {o for o in orders if set(o) == set(axes)}
        return list(orders.pop()) if len(orders) == 1 else axes

    def elems(self, t: Term) -> float:
        n = 1.0
        for a in axes_of(t):
            n *= self.sizes[a]
        return n

    def count(self, t: Term, ops: float = 1.0, trans: float = 0.0) -> None:
        """Elementwise work on ``t``'s value: ``ops`` (of which ``trans`` transcendental) per element."""
        n = self.elems(t)
        acc = self.ew_by_axes.setdefault(tuple(sorted(axes_of(t))), [0.0, 0.0])
        acc[0] += ops * n
        acc[1] += trans * n

    # --- values ------------------------------------------------------------
    def expr(self, t: Term) -> tuple[Expr, int]:
        """t's value as an expression, with its nesting depth."""
        if t.op in ("const", "axis_size", "iota"):
            return static_expr(t), 0
        if t in self.body_ref and self.at == "body":
            return Ref(buf=self.body_ref[t]), 0
        if t in self.buf_of:
            return Ref(buf=self.buf_of[t]), 0
        if t in self.expr_inline:
            return self.expr_inline[t]
        raise Infeasible(f"internal: no value for {t.op} term")

    def materialize(self, t: Term, at: str) -> str:
        if t in self.buf_of:
            return self.buf_of[t]
        if t.op in ("const", "axis_size"):
            raise Infeasible("a scalar constant cannot be a tile operand")
        name = self.fragment_for(t, "t")
        self.ops[at].append(Map(dst=name, expr=self.expr(t)[0]))
        self.buf_of[t] = name
        return name

    def operand(self, t: Term, at: str, role: str, contract: str) -> str:
        """A GEMM operand in the compute dtype: shared (B, or an A tile stored contraction-major) or any
        scope (A).

        An A operand in registers must hold its rows across threads and its contraction along them:
        TileLang has no register layout for a transposed A (``acc[k, m]`` as A fails layout inference,
        "Layout infer conflict between acc and acc_bf16"), so such a tile goes through shared memory,
        which the GEMM reads either way round.
        """
        buf = self.materialize(t, at)
        info = self.buffers[buf]
        transposed_a = role == "a" and bool(info.axes) and info.axes[0] == contract
        shared_only = role == "b" or transposed_a
        if info.dtype == self.dtype and (not shared_only or info.scope == "shared"):
            return buf
        key = (buf, "b" if shared_only else "a")
        if key not in self.cast_of:
            scope = "shared" if shared_only else "fragment"
            cast = self.add_buffer(f"{buf}_{SHORT_DTYPE[self.dtype]}", list(info.axes), scope, self.dtype)
            self.ops[at].append(Map(dst=cast, expr=Ref(buf=buf)))
            self.cast_of[key] = cast
        return self.cast_of[key]

    def gemm_layout(self, a_buf: str, b_buf: str, k: str) -> tuple[str, str]:
        a_axes, b_axes = self.buffers[a_buf].axes, self.buffers[b_buf].axes
        fa = [x for x in a_axes if x != k]
        fb = [x for x in b_axes if x != k]
        if len(fa) != 1 or len(fb) != 1 or len(a_axes) != 2 or len(b_axes) != 2:
            raise Infeasible("tile GEMM operands must be 2-D tiles")
        return fa[0], fb[0]

    def scale_buffer(self, m: Term, kind: str, coef: float, coef_expr: Expr | None = None) -> str:
        key = (m, kind, coef)
        if key not in self.scale_bufs:
            name = self.add_buffer("rescale", list(self.buffers[self.buf_of[m]].axes), "fragment", "float32")
            diff: Expr = Call(fn="sub", args=[Ref(buf=self.m_prev[m]), Ref(buf=self.body_ref.get(m, self.buf_of[m]))])
            if coef_expr is not None:
                diff = Call(fn="mul", args=[diff, coef_expr])
            elif coef != 1.0:
                diff = Call(fn="mul", args=[diff, Const(value=coef)])
            self.ops["body"].append(Map(dst=name, expr=Call(fn=kind, args=[diff])))
            self.scale_bufs[key] = name
            self.count(m, 0.0, 1.0)
        return self.scale_bufs[key]

    def tail_mask(self, buf: str, identity: float) -> str:
        """On a partial last tile, mask a value entering a loop accumulator with its identity, and
        return the buffer to accumulate from."""
        if not self.tail:
            return buf
        assert self.s is not None
        return self.pad_mask(buf, identity, self.s, "body")

    def pad_mask(self, buf: str, identity: float, axis: str, at: str) -> str:
        """Mask ``buf`` past the end of ``axis`` with a reduction's ``identity`` (a partial last
        tile of the loop, or a row held whole in a padded tile). Zeros loaded from memory already
        are a sum's identity; a tile loaded from memory is masked into a fragment of its own (its
        shared copy may feed a GEMM too), any other value in place."""
        if buf in self.loaded and identity == 0.0:
            return buf
        key = (buf, identity, axis)  # a value reduced over two padded axes is masked along each
        if key not in self.tail_masked:
            pred = Call(fn="lt", args=[Index(axis=axis), AxisSize(axis=axis)])
            dst = (self.add_buffer(f"{buf}_masked", list(self.buffers[buf].axes), "fragment", "float32")
                   if buf in self.loaded else buf)
            masked = Call(fn="where", args=[pred, Ref(buf=buf), const_expr(identity)])
            self.ops[at].append(Map(dst=dst, expr=masked))
            self.tail_masked[key] = dst
        return self.tail_masked[key]

    # --- one method per op kind ------------------------------------------------
    def emit_elementwise(self, t: Term) -> None:
        at = self.where[t]
        shared = self._shared_sum(t)
        if shared is not None:  # both terms went into one accumulator: it holds the sum already
            self.buf_of[t] = self.acc_of[t] = shared
            return
        if static(t) and not self.is_root(t):
            self.expr_inline[t] = (static_expr(t), 0)
            return
        if t.op == "ternary" and t.fn == "where" and static(t.args[0]):
            self.emit_mask(t, at)
            return
        trans = 1.0 if t.op == "unary" and t.fn in TRANSCENDENTAL else 0.0
        # exp: range reduction, then exp2 (the cheaper primitive): 4 more operations
        ops = 5.0 if t.op == "unary" and t.fn == "exp" else 1.0
        if self._folded_factor(t):
            ops = 0.0
        self.count(t, ops, trans)
        parts = [self.expr(a) for a in t.args]
        e = Call(fn=t.fn, args=[p[0] for p in parts])
        depth = 1 + max(p[1] for p in parts)
        us = self.users.get(t, [])
        inline = (not self.is_root(t) and len(us) == 1 and us[0].op in ELEMENTWISE_OPS
                  and self.where[us[0]] == at and depth < MAX_INLINE_DEPTH)
        if inline:
            self.expr_inline[t] = (e, depth)
        else:
            name = self.fragment_for(t, "t")
            self.ops[at].append(Map(dst=name, expr=e))
            self.buf_of[t] = name

    def _shared_sum(self, t: Term) -> str | None:
        """The accumulator holding ``t`` where ``t`` adds two contractions (or such sums) that share it."""
        if t.op != "binary" or t.fn != "add":
            return None
        accs = {self.acc_of.get(a) for a in t.args}
        return accs.pop() if len(accs) == 1 and None not in accs else None

    def _folded_factor(self, t: Term) -> bool:
        """A constant factor on an inlined elementwise value, ``(S - m) * rsqrt(|d|) * log2(e)``: the
        renderer multiplies the constants out and emits one FMA per element for the whole chain."""
        if t.op != "binary" or t.fn != "mul":
            return False
        a, b = t.args
        for x, c in ((a, b), (b, a)):
            if static(c) and x in self.expr_inline and x.op in ("unary", "binary", "ternary"):
                return True
        return False

    def emit_mask(self, t: Term, at: str) -> None:
        """where(pred, x, y) with an index predicate: the values, then the predicate applied in
        place (left out on tiles it shows whole)."""
        self.count(t, 2.0)
        name = self.fragment_for(t, "t")
        self.ops[at].append(Map(dst=name, expr=self.expr(t.args[1])[0]))
        self.ops[at].append(Map(dst=name, expr=Call(fn="where", args=[self.expr(t.args[0])[0], Ref(buf=name),
                                                                      self.expr(t.args[2])[0]])))
        self.buf_of[t] = name

    def emit_index(self, t: Term) -> None:
        """An iota that is a kernel's own output (a naive plan): its index values as a map."""
        self.count(t)
        name = self.fragment_for(t, "t")
        self.ops[self.where[t]].append(Map(dst=name, expr=static_expr(t)))
        self.buf_of[t] = name

    def emit_reduce(self, t: Term) -> None:
        if _is_acc(t, self.s):
            self.emit_accumulated_reduce(t)
            return
        at = self.where[t]
        self.count(t.args[0])
        src = self.materialize(t.args[0], at)
        if t.axis in self.padded:
            src = self.pad_mask(src, REDUCTIONS[t.fn].identity, t.axis, at)
        name = self.fragment_for(t, f"{t.fn}_{t.axis}")
        self.ops[at].append(Reduce(fn=REDUCTIONS[t.fn].tile, src=src, dst=name, axis=t.axis, accumulate=False))
        if t.fn == "mean":
            self.ops[at].append(Map(dst=name, expr=Call(fn="div", args=[Ref(buf=name), AxisSize(axis=t.axis)])))
        self.buf_of[t] = name

    def emit_accumulated_reduce(self, t: Term) -> None:
        """A reduction over the streamed axis: a state buffer updated once per tile."""
        self.count(t.args[0])
        kind = REDUCTIONS[t.fn].tile
        src = self.tail_mask(self.materialize(t.args[0], "body"), -math.inf if kind == "max" else 0.0)
        name = self.fragment_for(t, f"{t.fn}_{t.axis}", state=True)
        self.ops["prologue"].append(Fill(dst=name, value="-inf" if kind == "max" else 0.0))
        self.buf_of[t] = name
        self.rules.append("reduction_tiling")
        if t in self.online_src:
            prev = self.add_buffer(f"{name}_prev", list(self.buffers[name].axes), "fragment", "float32")
            self.ops["body"].append(Map(dst=prev, expr=Ref(buf=name)))
            self.m_prev[t] = prev
        if t in self.online:
            m, kind_e, coef, coef_expr = self.online[t]
            sc = self.scale_buffer(m, kind_e, coef, coef_expr)
            part = self.add_buffer(f"{name}_tile", list(self.buffers[name].axes), "fragment", "float32")
            self.ops["body"].append(Reduce(fn="sum", src=src, dst=part, axis=t.axis, accumulate=False))
            self.ops["body"].append(Map(dst=name, expr=Call(fn="add", args=[
                Call(fn="mul", args=[Ref(buf=name), Ref(buf=sc)]), Ref(buf=part)])))
            self.rules.append("online_softmax_rescale")
        else:
            self.ops["body"].append(Reduce(fn=kind, src=src, dst=name, axis=t.axis, accumulate=True))
            if t in self.online_src and self.guard_max:
                # a running max stays -inf while every score so far is masked; the body reads it
                # as 0 so exp(-inf - m) is 0, not NaN (the state keeps -inf, as the reference would)
                safe = self.add_buffer(f"{name}_safe", list(self.buffers[name].axes), "fragment", "float32")
                self.ops["body"].append(Map(dst=safe, expr=Call(fn="where", args=[
                    Call(fn="lt", args=[const_expr(-math.inf), Ref(buf=name)]), Ref(buf=name), const_expr(0.0)])))
                self.body_ref[t] = safe
        if t.fn == "mean":
            self.mean_fix.append((name, t.axis))

    def emit_matmul(self, t: Term) -> None:
        streamed = t.axis == self.s
        at = "body" if streamed else self.where[t]
        if streamed and self.tail:  # mask the operands before any cast to the compute dtype
            for x in t.args:
                self.tail_mask(self.materialize(x, "body"), 0.0)
        a_buf = self.operand(t.args[0], at, "a", t.axis)
        b_buf = self.operand(t.args[1], at, "b", t.axis)
        fa, fb = self.gemm_layout(a_buf, b_buf, t.axis)
        self.gemms.append(GemmInfo(fa, fb, t.axis, streamed, flops=2.0 * self.elems(t) * self.sizes[t.axis],
                                   a_in_registers=self.buffers[a_buf].scope == "fragment"))
        first = self.sum_member.get(t)
        joined = self.acc_of.get(first) if first is not None and first != t else None
        if streamed and joined is not None and self.buffers[joined].axes == [fa, fb]:
            self.acc_of[t] = joined  # shared_accumulator: this contraction adds into the first one's tile
            self.ops["body"].append(Gemm(a=a_buf, b=b_buf, c=joined, contract=t.axis, clear=False))
            return
        name = self.add_buffer(self.labels.get(t, "acc"), [fa, fb], "fragment", "float32", state=streamed)
        self.buf_of[t] = name
        if streamed and first == t:
            self.acc_of[t] = name
        if streamed:
            self.ops["prologue"].append(Fill(dst=name, value=0.0))
            if t in self.online:
                m, kind_e, coef, coef_expr = self.online[t]
                sc = self.scale_buffer(m, kind_e, coef, coef_expr)
                self.ops["body"].append(Map(dst=name, expr=Call(fn="mul", args=[Ref(buf=name), Ref(buf=sc)])))
            self.ops["body"].append(Gemm(a=a_buf, b=b_buf, c=name, contract=t.axis, clear=False))
        else:
            self.ops[at].append(Gemm(a=a_buf, b=b_buf, c=name, contract=t.axis, clear=True))
        if self.tile_axes(axes_of(t)) != [fa, fb]:
            raise Infeasible("GEMM result axes do not match the tile layout")

    def emit_loads(self, leaves: list[Term]) -> None:
        for leaf in leaves:
            tensor = self.boundary[leaf]
            axes = axes_of(leaf)
            in_loop = self.s is not None and self.s in axes
            buf = self.add_buffer(f"{tensor}_s", self.tile_axes(axes), "shared", self.tensor_dtype[tensor])
            self.buf_of[leaf] = buf
            self.ops["body" if in_loop else "prologue"].append(Load(src=tensor, dst=buf))
            inner = self.sizes[axes[-1]] if axes else 1
            self.loads.append(LoadInfo(tensor, axes, in_loop, rows_async(inner, self.tensor_dtype[tensor])))

    def fused_loop_rules(self) -> None:
        """Cite the schedule rules that the loop structure relies on."""
        if self.s is None:
            return
        streamed = [g for g in self.gemms if g.streamed]
        if len(streamed) >= 2:
            gemm_ops = [op for op in self.ops["body"] if isinstance(op, Gemm)]
            if len(gemm_ops) > len({op.a for op in gemm_ops}) or len(gemm_ops) > len({op.b for op in gemm_ops}):
                self.rules.append("shared_operand_fusion")
        if streamed and any(t.op == "reduce" and _is_acc(t, self.s) for t in self.computed):
            self.rules.append("reduction_in_contraction_loop")
        accs = [op.c for op in self.ops["body"] if isinstance(op, Gemm) and op.contract == self.s]
        if len(set(accs)) < len(accs):
            self.rules.append("shared_accumulator")


_EMIT = {
    "unary": _Builder.emit_elementwise,
    "binary": _Builder.emit_elementwise,
    "ternary": _Builder.emit_elementwise,
    "iota": _Builder.emit_index,
    "reduce": _Builder.emit_reduce,
    "matmul": _Builder.emit_matmul,
}


def _sum_groups(computed: list[Term], s: str | None, online: dict, roots: tuple[Term, ...],
                users: dict[Term, list[Term]]) -> dict[Term, Term]:
    """Contractions over ``s`` summed by ``add`` terms (``a + b``, ``(a + b) + c``), each read by that sum
    alone: contraction -> the first of its sum, whose accumulator the others join (``shared_accumulator``).

    An online-rescaled contraction keeps its own tile (its rescale would scale the others), and so does
    one that is stored or read twice (its value alone is needed)."""
    if s is None or not SHARED_ACCUMULATOR:
        return {}

    def alone(t: Term) -> bool:
        return len(users.get(t, [])) == 1 and not any(t is r for r in roots)

    order = {t: i for i, t in enumerate(computed)}  # the first emitted makes the tile the others join
    groups: dict[Term, list[Term]] = {}  # a summable term -> the contractions it sums
    first: dict[Term, Term] = {}
    for t in computed:
        if t.op == "matmul" and t.axis == s and t not in online and alone(t):
            groups[t] = [t]
        elif (t.op == "binary" and t.fn == "add" and t.args[0] != t.args[1]
              and all(a in groups for a in t.args) and axes_of(t.args[0]) == axes_of(t.args[1])):
            merged = sorted(groups.pop(t.args[0]) + groups.pop(t.args[1]), key=order.__getitem__)
            if alone(t):
                groups[t] = merged
            first.update((m, merged[0]) for m in merged)
    return first


def _users(computed: list[Term]) -> dict[Term, list[Term]]:
    users: dict[Term, list[Term]] = {}
    for t in computed:
        for a in t.args:
            users.setdefault(a, []).append(t)
    return users


def _unique(xs: list[str]) -> list[str]:
    return list(dict.fromkeys(xs))


def lower(root: Roots, boundary: dict[Term, str], tensor_dtype: dict[str, str], sizes: dict[str, int],
          dtype: str, s: str | None, labels: dict[Term, str], out_tensor: str | list[str],
          reserved: frozenset[str] | None = None, terms: list[Term] | None = None) -> Lowered:
    """Lower the cone of ``root`` with streamed axis ``s`` (None: no loop). ``reserved``: the
    names of all global tensors (default: the boundary's), which no buffer name may shadow;
    ``terms``: ``cone(root, boundary)`` where the caller has it (one per streamed axis tried).

    Several roots (a tuple, with one output tensor each in ``out_tensor``): one kernel computing
    all of them over one grid and one loop, with a store per root (a multi-output kernel)."""
    roots = as_roots(root)
    outs = [out_tensor] if isinstance(out_tensor, str) else list(out_tensor)
    if len(outs) != len(roots) or len(set(outs)) != len(outs):
        raise ValueError(f"lower: {len(roots)} root(s) need as many distinct output tensors, got {outs}")
    if terms is None:
        terms = cone(root, boundary)
    computed = kernel_computes(root, terms, boundary)
    leaves = [t for t in terms if _is_leaf(t, root, boundary) and t in boundary]
    phase = _phases(computed, s)
    sources = _online_sources(computed, phase)
    online = _online_sums(computed, s, sources, sizes)
    tiled, full = _choose_tiled(root, computed, s, sizes)
    all_axes = _kernel_axes(terms, root, boundary)
    indexed = {a for a in all_axes if a not in tiled and a not in full and a != s}
    grid = _grid(all_axes, root, s, tiled, full, sizes)

    b = _Builder(root, computed, boundary, tensor_dtype, sizes, dtype, s, labels, out_tensor, indexed, reserved)
    b.online, b.online_src, b.users = online, set(sources), _users(computed)
    b.sum_member = _sum_groups(computed, s, online, as_roots(root), b.users)
    where = {"pre": "prologue", "tile": "body", "acc": "body", "post": "epilogue"}
    b.where = {t: where[phase[t]] for t in computed}
    b.emit_loads(leaves)
    b.guard_max = any(t.op == "const" and math.isinf(t.value) for t in terms)
    visible = _visible(b, computed, phase, sources, s)
    # a streamed axis that some allowed step does not divide ends in a partial tile: loads read zeros
    # past the end, and every value entering a loop accumulator is masked there with its identity
    synchronous = any(ld.in_loop and not ld.asynchronous for ld in b.loads)
    steps = stream_steps(sizes[s], tensor_cores=any(t.op == "matmul" for t in computed),
                         synchronous=synchronous) if s is not None else []
    b.tail = any(sizes[s] % step for step in steps)
    b.loaded = {b.buf_of[leaf] for leaf in leaves}
    b.padded = {a: n for a, n in full.items() if n != sizes[a]}
    for t in computed:
        emit = _EMIT.get(t.op)
        if emit is None:
            raise Infeasible(f"cannot lower op {t.op}")
        b.at = b.where[t]
        emit(b, t)
    if b.mean_fix:
        b.ops["epilogue"][:0] = [Map(dst=n, expr=Call(fn="div", args=[Ref(buf=n), AxisSize(axis=k)]))
                                 for n, k in b.mean_fix]
    b.at = "epilogue" if s is not None else "prologue"
    for r, out in zip(roots, outs, strict=True):
        b.ops["epilogue"].append(Store(src=b.materialize(r, b.at), dst=out))
    b.fused_loop_rules()
    reuse_in_place(b.buffers, b.ops)
    b.ops["body"] = route_reduced_tile(b.buffers, b.ops["body"], b.loaded)
    return Lowered(
        root=roots[0], stream=s, grid=grid, tiled=sorted(a for a in tiled if a != s), full=full,
        buffers=list(b.buffers.values()), prologue=b.ops["prologue"], body=b.ops["body"],
        epilogue=b.ops["epilogue"], reads=_unique([boundary[leaf] for leaf in leaves]), writes=outs,
        gemms=b.gemms, loads=b.loads, rules=_unique(b.rules),
        ew_by_axes=tuple((ax, v[0], v[1]) for ax, v in sorted(b.ew_by_axes.items())),
        terms=frozenset(computed), visible=visible, roots=roots, steps=steps,
    )


def _visible(b: _Builder, computed: list[Term], phase: dict[Term, str], sources: list[Term],
             s: str | None) -> Expr | None:
    """The index predicate whose all-false tiles the loop skips (masked_tile_skip), if any."""
    if s is None:
        return None
    preds = skippable_predicates([t for t in computed if phase[t] == "tile"],
                                 [t for t in computed if _is_acc(t, s)], set(sources), s)
    exprs = [static_expr(c) for c in preds if masks.is_index_predicate(static_expr(c))]
    if not exprs:
        return None
    visible = exprs[0]
    for e in exprs[1:]:
        visible = Call(fn="min", args=[visible, e])
    b.rules.append("masked_tile_skip")
    return visible


# --- in-place reuse of dead fragments ------------------------------------------------------

def _rename(op, old: str, new: str):
    if isinstance(op, Map):
        return Map(dst=new if op.dst == old else op.dst, expr=substitute_refs(op.expr, {old: Ref(buf=new)}))
    fields = {Gemm: ("a", "b", "c"), Reduce: ("src", "dst"), Load: ("dst",), Store: ("src",), Fill: ("dst",)}
    data = op.model_dump()
    for k in fields[type(op)]:
        if data[k] == old:
            data[k] = new
    return type(op)(**data)


def _reusable(cand: Buffer, d: Buffer, sec: str) -> bool:
    # loop state is only needed across iterations: after the loop it is an ordinary value
    return not (cand.state and sec != "epilogue") and cand.scope == "fragment" and cand.dtype == d.dtype \
        and cand.axes == d.axes


def _gemm_a_groups(buffers: dict[str, Buffer], body: list) -> set[str]:
    """Fragments that share a register layout with a GEMM's fragment A operand (fixed by the wgmma)."""
    group = fragment_groups(buffers.values(), body)
    roots = {group[op.a] for op in body if isinstance(op, Gemm) and op.a in group}
    return {n for n, g in group.items() if g in roots}


def route_reduced_tile(buffers: dict[str, Buffer], body: list, loaded: set[str]) -> list:
    """Read a loaded tile that the loop both reduces and maps into a GEMM operand through that Map's
    fragment: ``F = X`` first, then the reduction and the Map read F.

    Reduced straight from shared memory, the row statistic gets a layout of its own, while the
    Map's result is laid out for the wgmma; the online-softmax update then combines statistics of
    both origins and TileLang finds no layout ("no available layout found": short-query GQA, whose
    scores come from the previous kernel, once the scale stopped being a Map of its own). With the
    copy every statistic follows the wgmma layout. The copy is exact (float32 holds the tile).
    """
    a_group = _gemm_a_groups(buffers, body)
    for x in sorted(loaded):
        if x not in buffers or buffers[x].scope != "shared":
            continue
        reduced = any(isinstance(op, Reduce) and op.src == x for op in body)
        first = next((i for i, op in enumerate(body) if isinstance(op, Map) and x in expr_refs(op.expr)), None)
        if not reduced or first is None:
            continue
        f = body[first].dst
        fb = buffers[f]
        if fb.scope != "fragment" or fb.state or fb.dtype != "float32" or f not in a_group \
                or set(fb.axes) != set(buffers[x].axes):
            continue
        if any(f in op_buffers(op) for op in body[:first]):
            continue  # F is live before the Map: no room for the copy
        last_load = max(i for i, op in enumerate(body) if isinstance(op, Load))
        if last_load > first:
            continue
        out = list(body[:last_load + 1]) + [Map(dst=f, expr=Ref(buf=x))]
        for i in range(last_load + 1, len(body)):
            op = body[i]
            if i <= first and isinstance(op, Reduce) and op.src == x:
                op = Reduce(fn=op.fn, src=f, dst=op.dst, axis=op.axis, accumulate=op.accumulate)
            elif i <= first and isinstance(op, Map) and x in expr_refs(op.expr):
                op = Map(dst=op.dst, expr=substitute_refs(op.expr, {x: Ref(buf=f)}))
            out.append(op)
        body = out
    return body


def reuse_in_place(buffers: dict[str, Buffer], ops: dict[str, list]) -> None:
    """Write an elementwise result over an operand tile that dies at that op.

    Register pressure decides tile sizes on tensor-core kernels; reusing the
    score tile for its exponential is what keeps a 128x128 attention tile in
    registers. Linear in the number of ops: each buffer's uses are indexed once.
    """
    seq = [(sec, i) for sec in ("prologue", "body", "epilogue") for i in range(len(ops[sec]))]
    uses_at: dict[str, list[int]] = {}
    for pos, (sec, i) in enumerate(seq):
        for name in op_buffers(ops[sec][i]):
            uses_at.setdefault(name, []).append(pos)
    for pos, (sec, i) in enumerate(seq):
        op = ops[sec][i]
        if not isinstance(op, Map):
            continue
        d = buffers[op.dst]
        refs = expr_refs(op.expr)
        if d.state or d.scope != "fragment" or op.dst in refs:
            continue
        for cand in refs:
            # non-state buffers are written before they are read in each iteration,
            # so only later ops can still need the operand
            if not _reusable(buffers[cand], d, sec) or uses_at[cand][-1] > pos:
                continue
            old = op.dst
            for p in uses_at[old]:
                s2, j = seq[p]
                ops[s2][j] = _rename(ops[s2][j], old, cand)
            uses_at[cand] = sorted(set(uses_at[cand]) | set(uses_at.pop(old)))
            del buffers[old]
            break
