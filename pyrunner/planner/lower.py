"""Lower one fused sub-graph to a tile-level kernel, for a chosen streamed axis.

The kernel computes ``root`` from global tensors (``boundary``). Terms are
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

Why one module: phases, the online-rescale factor analysis and the tile builder are one algorithm;
``lower()`` is still to be split into per-op functions (issue 7, owned by the planner work).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pyrunner.ir.graph import Term, result_axes, subterms
from pyrunner.ir.ops import REDUCTIONS, UNARY
from pyrunner.plan import masks
from pyrunner.plan.analysis import block_param, expr_refs, op_buffers
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
from pyrunner.planner.masking import skippable_predicates

TRANSCENDENTAL = tuple(name for name, op in UNARY.items() if op.sfu)

SHORT_DTYPE = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}

MAX_FULL_EXTENT = 256
"""Largest axis a kernel may hold whole in one tile (an in-tile contraction)."""


class Infeasible(Exception):
    """This sub-graph cannot be one kernel with this loop structure."""


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


@dataclass
class Lowered:
    """A kernel's structure before tile sizes are chosen."""

    root: Term
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
    ew_elems: float = 0.0     # elementwise/reduction element operations, whole kernel
    trans_elems: float = 0.0  # of which transcendental (SFU) evaluations
    rules: list[str] = field(default_factory=list)
    terms: frozenset[Term] = frozenset()
    visible: Expr | None = None  # loop steps whose tile has this all false are skipped (masked_tile_skip)


LEAVES = ("input", "const", "axis_size", "iota")
ELEMENTWISE = ("unary", "binary", "ternary")


def const_expr(v: float) -> Const:
    """A plan constant; infinities are spelled as strings (JSON has none)."""
    return Const(value=("-inf" if v < 0 else "inf") if math.isinf(v) else v)


def static(t: Term) -> bool:
    """t depends only on indices and constants (a mask predicate, say): computed where it is used."""
    return all(x.op in ("iota", "const", "axis_size") or x.op in ELEMENTWISE for x in subterms([t])) \
        and t.op != "const" and t.op != "axis_size"


def static_expr(t: Term) -> Expr:
    """The plan expression of a term built from indices and constants only."""
    if t.op == "const":
        return const_expr(t.value)
    if t.op == "axis_size":
        return AxisSize(axis=t.axis)
    if t.op == "iota":
        return Index(axis=t.axis)
    return Call(fn=t.fn, args=[static_expr(a) for a in t.args])


def cone(root: Term, boundary: dict[Term, str]) -> list[Term]:
    """Terms the kernel touches (operands first): what it computes plus the leaves it
    reads (materialized tensors, constants), whose operands it does not visit."""
    out: list[Term] = []
    seen: set[Term] = set()
    stack: list[tuple[Term, bool]] = [(root, False)]
    while stack:
        t, done = stack.pop()
        if done:
            out.append(t)
            continue
        if t in seen:
            continue
        seen.add(t)
        stack.append((t, True))
        if t is not root and (t in boundary or t.op in LEAVES):
            continue
        for a in reversed(t.args):
            stack.append((a, False))
    return out


def stream_candidates(root: Term, terms: list[Term]) -> list[str | None]:
    """Axes reduced inside the kernel and absent from its output, plus no loop."""
    root_axes = set(result_axes(root))
    axes: list[str] = []
    for t in terms:
        if t.op in ("reduce", "matmul") and t.axis not in root_axes and t.axis not in axes:
            axes.append(t.axis)
    return [None, *axes]


def _is_acc(t: Term, s: str | None) -> bool:
    return s is not None and t.op in ("reduce", "matmul") and t.axis == s


def _exp_scale(t: Term, m: Term) -> tuple[str, float] | None:
    """If t == E(c * (x - m)) with x free of m, return (E, c)."""
    if t.op != "unary" or t.fn not in ("exp", "exp2"):
        return None
    arg, coef = t.args[0], 1.0
    if arg.op == "binary" and arg.fn == "mul":
        a, b = arg.args
        if b.op == "const":
            arg, coef = a, b.value
        elif a.op == "const":
            arg, coef = b, a.value
    if arg.op == "binary" and arg.fn == "sub" and arg.args[1] == m and m not in subterms([arg.args[0]]):
        return t.fn, coef
    return None


Factor = tuple[str, float] | None | bool


def online_factor(t: Term, m: Term, memo: dict[Term, Factor]) -> Factor:
    """How t depends on running max m: False if not at all, (E, c) if t = f * E(-c*m),
    None if the dependence is not a rescalable exponential factor."""
    if t in memo:
        return memo[t]
    if t == m:
        res: Factor = None
    elif m not in subterms([t]):
        res = False
    elif (sc := _exp_scale(t, m)) is not None:
        res = sc
    elif t.op == "binary" and t.fn in ("mul", "div"):
        fa = online_factor(t.args[0], m, memo)
        fb = online_factor(t.args[1], m, memo)
        if t.fn == "div":
            res = fa if fb is False else None
        elif fa is False:
            res = fb
        elif fb is False:
            res = fa
        elif fa and fb and fa[0] == fb[0]:
            res = (fa[0], fa[1] + fb[1])
        else:
            res = None
    elif t.op == "matmul" or (t.op == "reduce" and t.fn == "sum"):
        fs = [online_factor(a, m, memo) for a in t.args]
        deps = [f for f in fs if f is not False]
        res = deps[0] if len(deps) == 1 else None
    else:
        res = None
    memo[t] = res
    return res


class _Builder:
    """Accumulates buffers and ops while walking the cone in order."""

    def __init__(self, root: Term, terms: list[Term], boundary: dict[Term, str], tensor_dtype: dict[str, str],
                 sizes: dict[str, int], dtype: str, s: str | None, labels: dict[Term, str], out_tensor: str) -> None:
        self.root, self.terms, self.boundary = root, terms, boundary
        self.tensor_dtype, self.sizes, self.dtype, self.s = tensor_dtype, sizes, dtype, s
        self.labels = labels
        self.buffers: dict[str, Buffer] = {}
        self.reserved = set(boundary.values()) | {out_tensor}  # buffer names never shadow tensors
        self.buf_of: dict[Term, str] = {}
        self.expr_inline: dict[Term, Expr] = {}
        self.cast_of: dict[tuple[str, str], str] = {}
        self.ops = {"prologue": [], "body": [], "epilogue": []}
        self.indexed: set[str] = set()
        self.gemms: list[GemmInfo] = []
        self.loads: list[LoadInfo] = []
        self.rules: list[str] = []
        self.ew_elems = 0.0
        self.trans_elems = 0.0
        self.scale_bufs: dict[tuple[Term, str, float], str] = {}
        self.m_prev: dict[Term, str] = {}
        self.body_ref: dict[Term, str] = {}  # running maxima as the loop body reads them (guarded)
        self.at = "prologue"

    # --- naming ------------------------------------------------------------
    def fresh(self, base: str) -> str:
        base = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in base) or "t"
        if base in self.reserved:
            base = f"{base}_tile"
        name, i = base, 1
        while name in self.buffers:
            i += 1
            name = f"{base}_{i}"
        return name

    def tile_axes(self, axes: tuple[str, ...]) -> list[str]:
        return [a for a in axes if a not in self.indexed]

    def add_buffer(self, base: str, axes: list[str], scope: str, dtype: str, state: bool = False) -> str:
        name = self.fresh(base)
        self.buffers[name] = Buffer(name=name, axes=axes, scope=scope, dtype=dtype, state=state)
        return name


def _choose_tiled(root: Term, terms: list[Term], leaves: list[Term], s: str | None,
                  sizes: dict[str, int]) -> tuple[set[str], dict[str, int]]:
    """Pick which axes are tiled (2-D tensor-core tiles) and which are held whole."""
    full: dict[str, int] = {}
    for t in terms:
        if t.op in ("reduce", "matmul") and t.axis != s:
            if sizes[t.axis] > MAX_FULL_EXTENT:
                raise Infeasible(f"axis {t.axis} ({sizes[t.axis]}) too large to hold whole in a tile")
            full[t.axis] = sizes[t.axis]
    tiled: set[str] = set()
    if s is not None:
        tiled.add(s)

    def pick(cands: list[str]) -> None:
        if not cands or any(a in tiled or a in full for a in cands):
            return
        best = max(cands, key=lambda a: (sizes[a], cands.index(a)))
        tiled.add(best)

    for t in terms:
        if t.op == "matmul":
            for op in t.args:
                pick([a for a in result_axes(op) if a != t.axis])
    if not any(t.op == "matmul" for t in terms):
        ra = [a for a in result_axes(root) if a not in full]
        for a in ra[-2:]:
            tiled.add(a)
    for t in terms:
        if t.op == "matmul":
            for op in t.args:
                free = [a for a in result_axes(op) if a != t.axis]
                if len([a for a in free if a in tiled or a in full]) != 1:
                    raise Infeasible("a tile GEMM operand needs exactly one tiled free axis")
    return tiled, full


def lower(root: Term, boundary: dict[Term, str], tensor_dtype: dict[str, str], sizes: dict[str, int],
          dtype: str, s: str | None, labels: dict[Term, str], out_tensor: str) -> Lowered:
    """Lower the cone of ``root`` with streamed axis ``s`` (None: no loop)."""
    terms = cone(root, boundary)
    computed = [t for t in terms if not (t is not root and (t in boundary or t.op in LEAVES))]
    leaves = [t for t in terms if t is not root and t in boundary]
    cset = set(computed)

    # --- phases -------------------------------------------------------------
    phase: dict[Term, str] = {}
    acc_terms = [t for t in computed if _is_acc(t, s)]
    for t in computed:
        if _is_acc(t, s):
            phase[t] = "acc"
        elif s is not None and s in result_axes(t):
            phase[t] = "tile"
        elif any(phase.get(a) in ("acc", "post") for a in t.args if a in cset):
            phase[t] = "post"
        else:
            phase[t] = "pre"
    online_src: set[Term] = set()
    for t in computed:
        if phase[t] == "tile":
            for a in t.args:
                if a in cset and phase[a] in ("acc", "post"):
                    if phase[a] == "acc" and a.op == "reduce" and a.fn == "max":
                        online_src.add(a)
                    else:
                        raise Infeasible("the loop body would need a finished reduction (two passes)")
        if phase[t] == "pre" and any(a in cset and phase[a] == "tile" for a in t.args):
            raise Infeasible("internal: pre term after tile term")
    online: dict[Term, tuple[Term, str, float]] = {}
    for acc in acc_terms:
        for m in online_src:
            if acc is m:
                continue
            f = online_factor(acc, m, {})
            if f is None:
                raise Infeasible("a loop sum depends on the running max other than by an exponential factor")
            if f is False:
                continue
            if acc in online:
                raise Infeasible("a loop sum depends on two running maxima")
            if acc.op == "reduce" and acc.fn != "sum":
                raise Infeasible("only sums can be rescaled online")
            online[acc] = (m, f[0], f[1])
        if acc.op == "reduce" and acc.fn == "max" and any(m in subterms([acc.args[0]]) for m in online_src):
            raise Infeasible("a running max depends on a running max")

    tiled, full = _choose_tiled(root, computed, leaves, s, sizes)
    all_axes: list[str] = []
    for t in terms:
        for a in result_axes(t) + ((t.axis,) if t.op in ("reduce", "matmul") else ()):
            if a not in all_axes:
                all_axes.append(a)
    b = _Builder(root, computed, boundary, tensor_dtype, sizes, dtype, s, labels, out_tensor)
    b.indexed = {a for a in all_axes if a not in tiled and a not in full and a != s}
    grid: list[GridAxis] = []
    root_axes = result_axes(root)
    for a in all_axes:
        if a == s:
            continue
        if a in b.indexed:
            grid.append(GridAxis(axis=a, block=1))
        elif a in full:
            grid.append(GridAxis(axis=a, block=full[a]))
        else:
            grid.append(GridAxis(axis=a, block=block_param(a)))
    for g_ax in grid:
        if g_ax.axis not in root_axes and g_ax.block != sizes[g_ax.axis]:
            raise Infeasible(f"axis {g_ax.axis} is split across blocks but not in the output")

    # --- loads ----------------------------------------------------------------
    for leaf in leaves:
        tensor = boundary[leaf]
        axes = result_axes(leaf)
        in_loop = s is not None and s in axes
        buf = b.add_buffer(f"{tensor}_s", b.tile_axes(axes), "shared", tensor_dtype[tensor])
        b.buf_of[leaf] = buf
        b.ops["body" if in_loop else "prologue"].append(Load(src=tensor, dst=buf))
        b.loads.append(LoadInfo(tensor, axes, in_loop))

    where = {"pre": "prologue", "tile": "body", "acc": "body", "post": "epilogue"}
    users: dict[Term, list[Term]] = {t: [] for t in terms}
    for t in computed:
        for a in t.args:
            users.setdefault(a, []).append(t)

    def expr(t: Term) -> Expr:
        if t.op in ("const", "axis_size", "iota"):
            return static_expr(t)
        if t in b.body_ref and b.at == "body":
            return Ref(buf=b.body_ref[t])
        if t in b.buf_of:
            return Ref(buf=b.buf_of[t])
        if t in b.expr_inline:
            return b.expr_inline[t]
        raise Infeasible(f"internal: no value for {t!r}")

    def materialize(t: Term, at: str) -> str:
        if t in b.buf_of:
            return b.buf_of[t]
        if t.op in ("const", "axis_size"):
            raise Infeasible("a scalar constant cannot be a tile operand")
        name = b.add_buffer(labels.get(t, "t"), b.tile_axes(result_axes(t)), "fragment", "float32")
        b.ops[at].append(Map(dst=name, expr=expr(t)))
        b.buf_of[t] = name
        return name

    def operand(t: Term, at: str, role: str) -> str:
        """A GEMM operand in the compute dtype: shared (B) or any scope (A)."""
        buf = materialize(t, at)
        info = b.buffers[buf]
        if info.dtype == dtype and (role == "a" or info.scope == "shared"):
            return buf
        key = (buf, role)
        if key not in b.cast_of:
            scope = "fragment" if role == "a" else "shared"
            cast = b.add_buffer(f"{buf}_{SHORT_DTYPE[dtype]}", list(info.axes), scope, dtype)
            b.ops[at].append(Map(dst=cast, expr=Ref(buf=buf)))
            b.cast_of[key] = cast
        return b.cast_of[key]

    def gemm_layout(a_buf: str, b_buf: str, k: str) -> tuple[str, str]:
        fa = [x for x in b.buffers[a_buf].axes if x != k]
        fb = [x for x in b.buffers[b_buf].axes if x != k]
        if len(fa) != 1 or len(fb) != 1 or len(b.buffers[a_buf].axes) != 2 or len(b.buffers[b_buf].axes) != 2:
            raise Infeasible("tile GEMM operands must be 2-D tiles")
        return fa[0], fb[0]

    def scale_buffer(m: Term, kind: str, coef: float) -> str:
        key = (m, kind, coef)
        if key not in b.scale_bufs:
            name = b.add_buffer("rescale", list(b.buffers[b.buf_of[m]].axes), "fragment", "float32")
            diff = Call(fn="sub", args=[Ref(buf=b.m_prev[m]), Ref(buf=b.body_ref.get(m, b.buf_of[m]))])
            if coef != 1.0:
                diff = Call(fn="mul", args=[diff, Const(value=coef)])
            b.ops["body"].append(Map(dst=name, expr=Call(fn=kind, args=[diff])))
            b.scale_bufs[key] = name
            b.trans_elems += elems(m)
        return b.scale_bufs[key]

    def elems(t: Term) -> float:
        n = 1.0
        for a in result_axes(t):
            n *= sizes[a]
        return n

    # masks: a running max may stay -inf while every score so far is masked; the loop body then reads
    # it as 0 so exp(-inf - m) is 0, not NaN (the state itself keeps -inf, as the reference would)
    guard_max = any(t.op == "const" and math.isinf(t.value) for t in terms)
    visible = None
    if s is not None:
        preds = skippable_predicates([t for t in computed if phase[t] == "tile"], acc_terms, online_src, s)
        exprs = [static_expr(c) for c in preds if masks.is_index_predicate(static_expr(c))]
        if exprs:
            visible = exprs[0]
            for e in exprs[1:]:
                visible = Call(fn="min", args=[visible, e])
            b.rules.append("masked_tile_skip")

    # a streamed axis that no power-of-two block divides ends in a partial tile: loads read zeros past
    # the end, and every value entering a loop accumulator is masked there with the accumulator's
    # identity (left out on whole tiles, like any mask); zeros loaded from memory already are one
    tail = s is not None and sizes[s] % 16 != 0
    loaded = {b.buf_of[leaf] for leaf in leaves}
    tail_masked: set[tuple[str, float]] = set()

    def tail_mask(buf: str, identity: float) -> None:
        if not tail or (buf, identity) in tail_masked or (buf in loaded and identity == 0.0):
            return
        if buf in loaded:
            raise Infeasible("a max over a tile loaded from memory with a partial last tile")
        pred = Call(fn="lt", args=[Index(axis=s), AxisSize(axis=s)])
        b.ops["body"].append(Map(dst=buf, expr=Call(fn="where", args=[pred, Ref(buf=buf), const_expr(identity)])))
        tail_masked.add((buf, identity))


    mean_fix: list[tuple[str, str]] = []
    for t in computed:
        at = where[phase[t]]
        b.at = at
        if t.op in ELEMENTWISE and static(t) and t is not root:
            b.expr_inline[t] = static_expr(t)
        elif t.op == "ternary" and t.fn == "where" and static(t.args[0]):
            # a mask: the values, then the predicate applied in place (left out on tiles it shows whole)
            b.ew_elems += 2 * elems(t)
            name = b.add_buffer(labels.get(t, "t"), b.tile_axes(result_axes(t)), "fragment", "float32")
            b.ops[at].append(Map(dst=name, expr=expr(t.args[1])))
            b.ops[at].append(Map(dst=name, expr=Call(fn="where", args=[expr(t.args[0]), Ref(buf=name),
                                                                         expr(t.args[2])])))
            b.buf_of[t] = name
        elif t.op in ELEMENTWISE:
            b.ew_elems += elems(t)
            if t.op == "unary" and t.fn in TRANSCENDENTAL:
                b.trans_elems += elems(t)
            if t.op == "unary" and t.fn == "exp":  # range reduction, then exp2: exp2 is the cheaper primitive
                b.ew_elems += 4 * elems(t)
            e = Call(fn=t.fn, args=[expr(a) for a in t.args])
            us = users.get(t, [])
            inline = (t is not root and len(us) == 1 and us[0].op in ELEMENTWISE
                      and where[phase[us[0]]] == at)
            if inline:
                b.expr_inline[t] = e
            else:
                name = b.add_buffer(labels.get(t, "t"), b.tile_axes(result_axes(t)), "fragment", "float32")
                b.ops[at].append(Map(dst=name, expr=e))
                b.buf_of[t] = name
        elif t.op == "reduce" and not _is_acc(t, s):
            b.ew_elems += elems(t.args[0])
            src = materialize(t.args[0], at)
            name = b.add_buffer(labels.get(t, f"{t.fn}_{t.axis}"), b.tile_axes(result_axes(t)), "fragment", "float32")
            b.ops[at].append(Reduce(fn=REDUCTIONS[t.fn].tile, src=src, dst=name, axis=t.axis,
                                    accumulate=False))
            if t.fn == "mean":
                b.ops[at].append(Map(dst=name, expr=Call(fn="div", args=[Ref(buf=name), AxisSize(axis=t.axis)])))
            b.buf_of[t] = name
        elif t.op == "reduce":  # accumulator over the streamed axis
            b.ew_elems += elems(t.args[0])
            src = materialize(t.args[0], "body")
            kind = REDUCTIONS[t.fn].tile
            tail_mask(src, -math.inf if kind == "max" else 0.0)
            name = b.add_buffer(labels.get(t, f"{t.fn}_{t.axis}"), b.tile_axes(result_axes(t)), "fragment",
                                "float32", state=True)
            b.ops["prologue"].append(Fill(dst=name, value="-inf" if kind == "max" else 0.0))
            b.buf_of[t] = name
            b.rules.append("reduction_tiling")
            if t in online_src:
                prev = b.add_buffer(f"{name}_prev", list(b.buffers[name].axes), "fragment", "float32")
                b.ops["body"].append(Map(dst=prev, expr=Ref(buf=name)))
                b.m_prev[t] = prev
            if t in online:
                m, kind_e, coef = online[t]
                sc = scale_buffer(m, kind_e, coef)
                part = b.add_buffer(f"{name}_tile", list(b.buffers[name].axes), "fragment", "float32")
                b.ops["body"].append(Reduce(fn="sum", src=src, dst=part, axis=t.axis, accumulate=False))
                b.ops["body"].append(Map(dst=name, expr=Call(fn="add", args=[
                    Call(fn="mul", args=[Ref(buf=name), Ref(buf=sc)]), Ref(buf=part)])))
                b.rules.append("online_softmax_rescale")
            else:
                b.ops["body"].append(Reduce(fn=kind, src=src, dst=name, axis=t.axis, accumulate=True))
                if t in online_src and guard_max:
                    safe = b.add_buffer(f"{name}_safe", list(b.buffers[name].axes), "fragment", "float32")
                    b.ops["body"].append(Map(dst=safe, expr=Call(fn="where", args=[
                        Call(fn="lt", args=[const_expr(-math.inf), Ref(buf=name)]), Ref(buf=name),
                        const_expr(0.0)])))
                    b.body_ref[t] = safe
            if t.fn == "mean":
                mean_fix.append((name, t.axis))
        elif t.op == "matmul":
            if t.axis == s and tail:  # mask the operands before any cast to the compute dtype
                for x in t.args:
                    tail_mask(materialize(x, "body"), 0.0)
            a_buf = operand(t.args[0], at if t.axis != s else "body", "a")
            b_buf = operand(t.args[1], at if t.axis != s else "body", "b")
            fa, fb = gemm_layout(a_buf, b_buf, t.axis)
            streamed = t.axis == s
            b.gemms.append(GemmInfo(fa, fb, t.axis, streamed, flops=2.0 * elems(t) * sizes[t.axis],
                                    a_in_registers=b.buffers[a_buf].scope == "fragment"))
            name = b.add_buffer(labels.get(t, "acc"), [fa, fb], "fragment", "float32", state=streamed)
            b.buf_of[t] = name
            if streamed:
                b.ops["prologue"].append(Fill(dst=name, value=0.0))
                if t in online:
                    m, kind_e, coef = online[t]
                    sc = scale_buffer(m, kind_e, coef)
                    b.ops["body"].append(Map(dst=name, expr=Call(fn="mul", args=[Ref(buf=name), Ref(buf=sc)])))
                b.ops["body"].append(Gemm(a=a_buf, b=b_buf, c=name, contract=t.axis, clear=False))
            else:
                b.ops[at].append(Gemm(a=a_buf, b=b_buf, c=name, contract=t.axis, clear=True))
            if b.tile_axes(result_axes(t)) != [fa, fb]:
                raise Infeasible("GEMM result axes do not match the tile layout")
        else:
            raise Infeasible(f"cannot lower op {t.op}")

    if mean_fix:
        b.ops["epilogue"][:0] = [Map(dst=n, expr=Call(fn="div", args=[Ref(buf=n), AxisSize(axis=k)]))
                                 for n, k in mean_fix]
    b.at = "epilogue" if s is not None else "prologue"
    out_buf = materialize(root, b.at)
    b.ops["epilogue"].append(Store(src=out_buf, dst=out_tensor))

    if s is not None and len([g for g in b.gemms if g.streamed]) >= 2:
        gemm_ops = [op for op in b.ops["body"] if isinstance(op, Gemm)]
        if len(gemm_ops) > len({op.a for op in gemm_ops}) or len(gemm_ops) > len({op.b for op in gemm_ops}):
            b.rules.append("shared_operand_fusion")
    if s is not None and any(g.streamed for g in b.gemms) and any(
            t.op == "reduce" and _is_acc(t, s) for t in computed):
        b.rules.append("reduction_in_contraction_loop")

    reuse_in_place(b.buffers, b.ops)
    reads = []
    for leaf in leaves:
        if boundary[leaf] not in reads:
            reads.append(boundary[leaf])
    seen_rules: list[str] = []
    for r in b.rules:
        if r not in seen_rules:
            seen_rules.append(r)
    return Lowered(
        root=root, stream=s, grid=grid, tiled=sorted(a for a in tiled if a != s), full=full,
        buffers=list(b.buffers.values()), prologue=b.ops["prologue"], body=b.ops["body"],
        epilogue=b.ops["epilogue"], reads=reads, writes=[out_tensor], gemms=b.gemms, loads=b.loads,
        ew_elems=b.ew_elems, trans_elems=b.trans_elems, rules=seen_rules, terms=frozenset(computed),
        visible=visible,
    )


def _rename(op, old: str, new: str):
    def ren_expr(e: Expr) -> Expr:
        if isinstance(e, Ref):
            return Ref(buf=new) if e.buf == old else e
        if isinstance(e, Call):
            return Call(fn=e.fn, args=[ren_expr(a) for a in e.args])
        return e

    if isinstance(op, Map):
        return Map(dst=new if op.dst == old else op.dst, expr=ren_expr(op.expr))
    fields = {Gemm: ("a", "b", "c"), Reduce: ("src", "dst"), Load: ("dst",), Store: ("src",), Fill: ("dst",)}
    data = op.model_dump()
    for k in fields[type(op)]:
        if data[k] == old:
            data[k] = new
    return type(op)(**data)


def reuse_in_place(buffers: dict[str, Buffer], ops: dict[str, list]) -> None:
    """Write an elementwise result over an operand tile that dies at that op.

    Register pressure decides tile sizes on tensor-core kernels; reusing the
    score tile for its exponential is what keeps a 128x128 attention tile in
    registers.
    """
    seq = [(sec, i) for sec in ("prologue", "body", "epilogue") for i in range(len(ops[sec]))]
    for pos, (sec, i) in enumerate(seq):
        op = ops[sec][i]
        if not isinstance(op, Map):
            continue
        d = buffers[op.dst]
        if d.state or d.scope != "fragment" or op.dst in expr_refs(op.expr):
            continue
        for cand in expr_refs(op.expr):
            c = buffers[cand]
            # loop state is only needed across iterations: after the loop it is an ordinary value
            if (c.state and sec != "epilogue") or c.scope != "fragment" or c.dtype != d.dtype or c.axes != d.axes:
                continue
            # non-state buffers are written before they are read in each iteration,
            # so only later ops can still need the operand
            later = [ops[s2][j] for s2, j in seq[pos + 1:]]
            if any(cand in op_buffers(o) for o in later):
                continue
            old = op.dst
            for s2, j in seq[pos:]:
                ops[s2][j] = _rename(ops[s2][j], old, cand)
            del buffers[old]
            break
