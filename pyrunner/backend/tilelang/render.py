"""Render a kernel plan as one readable TileLang Python module.

The renderer is generic: it maps the plan's tile ops one-to-one onto TileLang
primitives and knows nothing about the workload. The module it returns looks
like TileLang's own examples: a ``build_<kernel>(<tile params>=<default>)``
per kernel returning a ``@T.prim_func``, ``CONFIG_SPACE``/``DEFAULT_CONFIG``,
and ``launch(tensors, config)`` that runs the kernels in order on
preallocated global tensors. Shapes are baked in as module constants.

Tile parameters stay symbolic in the source (keyword arguments), so the
structure of the code must not depend on their values: a grid axis whose
block is a parameter always gets a launch dimension, even if some config
gives it a single tile. Config-dependent checks (divisibility, racing stores)
live in ``resolve_config``/``resolve_kernel``.

One thing is added that the plan does not say: where a Map combines
fragments whose register layouts TileLang cannot reconcile, the renderer
routes the odd one through a small shared buffer (``layout_bridges``).
"""

from __future__ import annotations

import keyword
import math
import re
from dataclasses import dataclass

from pyrunner.errors import PlanError
from pyrunner.plan.schema import (
    EXPR_FUNCTIONS,
    AxisSize,
    Buffer,
    Call,
    Const,
    Fill,
    Gemm,
    GlobalTensor,
    Kernel,
    Load,
    Map,
    Plan,
    Reduce,
    Ref,
    Store,
    axis_sizes,
    plan_hash,
)

TARGET = {"kind": "cuda", "arch": "sm_90a"}
MAX_GRID_YZ = 65535
"""CUDA's limit on gridDim.y and gridDim.z (gridDim.x allows 2**31 - 1)."""

# Module-level helpers the generated code may call from Map expressions: each
# takes and returns float32 PrimExprs. Only the ones a plan uses are emitted.
_HELPERS = {
    "square": ('"""x * x."""', "return x * x"),
    "recip": ('"""1 / x."""', "return T.float32(1.0) / x"),
    "sigmoid": ('"""1 / (1 + exp(-x))."""', "return T.float32(1.0) / (T.float32(1.0) + T.exp(-x))"),
    "silu": ('"""x * sigmoid(x)."""', "return x / (T.float32(1.0) + T.exp(-x))"),
    "relu": ('"""max(x, 0)."""', "return T.max(x, T.float32(0.0))"),
    "gelu": (
        '"""Tanh-approximated gelu: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""',
        f"return T.float32(0.5) * x * (T.float32(1.0) + T.tanh(T.float32({math.sqrt(2.0 / math.pi)!r})"
        " * (x + T.float32(0.044715) * x * x * x)))",
    ),
}
_DIRECT = {"exp": "T.exp", "exp2": "T.exp2", "log": "T.log", "sqrt": "T.sqrt", "rsqrt": "T.rsqrt",
           "tanh": "T.tanh", "abs": "T.abs", "max": "T.max", "min": "T.min"}
_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_RESERVED_MODULE = {
    "T", "tilelang", "PLAN_HASH", "WORKLOAD", "DTYPE", "ACCUM_DTYPE", "TARGET", "TENSORS", "CONFIG_SPACE",
    "DEFAULT_CONFIG", "KERNELS", "merge_config", "build_kernels", "compile_kernels", "launch", "_COMPILED",
    "tensors", "config", "kernels", "target", "name", "build", "args", "cfg", "key",
    *_HELPERS,
}


# --- plan analysis -----------------------------------------------------------



@dataclass(frozen=True)
class AxisRole:
    """How a kernel iterates one axis: a tiled grid axis, an indexed grid axis, or the loop axis."""

    axis: str
    kind: str  # "grid" | "indexed" | "loop"
    block: int | str
    size: int


def kernel_axes(plan: Plan, kernel: Kernel) -> dict[str, AxisRole]:
    """The roles of the kernel's grid and loop axes, checked against the plan's tensors."""
    sizes = axis_sizes(plan)
    roles: dict[str, AxisRole] = {}
    entries = [(g.axis, g.block, "grid") for g in kernel.grid]
    if kernel.loop is not None:
        entries.append((kernel.loop.axis, kernel.loop.block, "loop"))
    for axis, block, kind in entries:
        if axis in roles:
            raise PlanError(f"kernel {kernel.name!r}: axis {axis!r} appears twice among grid and loop axes")
        if axis not in sizes:
            raise PlanError(f"kernel {kernel.name!r}: axis {axis!r} is not an axis of any global tensor")
        _check_block(kernel, axis, block)
        if kind == "grid" and block == 1:
            kind = "indexed"
        roles[axis] = AxisRole(axis, kind, block, sizes[axis])
    return roles


def _check_block(kernel: Kernel, axis: str, block: int | str) -> None:
    if isinstance(block, str) and block not in kernel.params:
        raise PlanError(f"kernel {kernel.name!r}: block of axis {axis!r} names unknown parameter {block!r}; "
                        f"parameters are {sorted(kernel.params)}")


def resolve_config(plan: Plan, config: dict | None = None) -> dict[str, dict[str, int]]:
    """Each kernel's parameter values: its defaults overlaid by ``config`` (kernel -> param -> value)."""
    by_name = {k.name: k for k in plan.kernels}
    merged = {k.name: dict(k.defaults) for k in plan.kernels}
    for kname, params in (config or {}).items():
        if kname not in by_name:
            raise PlanError(f"config names unknown kernel {kname!r}; kernels are {list(by_name)}")
        if not isinstance(params, dict):
            raise PlanError(f"config for kernel {kname!r} must map parameter names to values")
        space = by_name[kname].params
        for p, v in params.items():
            if p not in space:
                raise PlanError(f"config for kernel {kname!r} names unknown parameter {p!r}; "
                                f"parameters are {sorted(space)}")
            if not isinstance(v, int) or isinstance(v, bool) or v not in space[p]:
                raise PlanError(f"config for kernel {kname!r}: {p}={v!r} is not in its space {space[p]}")
            merged[kname][p] = v
    for k in plan.kernels:
        resolve_kernel(plan, k, merged[k.name])
    return merged


@dataclass(frozen=True)
class KernelShape:
    """A kernel's geometry under one config: block and tile count per axis, threads, stages."""

    blocks: dict[str, int]
    tiles: dict[str, int]
    threads: int
    stages: int


def _value(kernel: Kernel, v: int | str, cfg: dict[str, int]) -> int:
    if isinstance(v, int):
        return v
    if v not in cfg:
        raise PlanError(f"kernel {kernel.name!r}: parameter {v!r} has no value")
    return cfg[v]


def resolve_kernel(plan: Plan, kernel: Kernel, cfg: dict[str, int]) -> KernelShape:
    """Geometry of ``kernel`` under parameter values ``cfg``; rejects blocks that do not tile their axis."""
    roles = kernel_axes(plan, kernel)
    blocks = {a: _value(kernel, r.block, cfg) for a, r in roles.items()}
    for a, b in blocks.items():
        if roles[a].size % b:
            raise PlanError(f"kernel {kernel.name!r}: block {b} of axis {a!r} does not divide its extent "
                            f"{roles[a].size}")
    tiles = {a: roles[a].size // b for a, b in blocks.items()}
    stages = _value(kernel, kernel.loop.stages, cfg) if kernel.loop is not None else 1
    threads = _value(kernel, kernel.threads, cfg)
    for op in kernel.prologue + kernel.body + kernel.epilogue:
        if isinstance(op, Store):
            dst = _tensor(plan, kernel, op.dst)
            racing = [g.axis for g in kernel.grid if tiles[g.axis] > 1 and g.axis not in dst.axes]
            if racing:
                raise PlanError(f"kernel {kernel.name!r}: store to {op.dst!r} races between the blocks of grid "
                                f"axis {racing[0]!r} ({tiles[racing[0]]} tiles), which {op.dst!r} does not have")
    return KernelShape(blocks, tiles, threads, stages)


def _tensor(plan: Plan, kernel: Kernel, name: str) -> GlobalTensor:
    for t in plan.tensors:
        if t.name == name:
            return t
    raise PlanError(f"kernel {kernel.name!r}: unknown global tensor {name!r}")


def kernel_args(plan: Plan, kernel: Kernel) -> list[str]:
    """Global tensors a kernel's prim_func takes, in the plan's tensor order."""
    used = set(kernel.reads) | set(kernel.writes)
    for n in used:
        _tensor(plan, kernel, n)
    return [t.name for t in plan.tensors if t.name in used]


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

    def par_var(self, axis: str) -> str:
        """The T.Parallel loop variable of an axis; one name per kernel, reused by every map."""
        if axis not in self.par_vars:
            self.par_vars[axis] = self.local.fresh(f"{axis}_i")
        return self.par_vars[axis]

    def where(self, section: str, i: int) -> str:
        return f"kernel {self.kernel.name!r}, {section} op {i}"


def _paren(expr: str) -> str:
    return f"({expr})" if " " in expr else expr


def _tuple(items) -> str:
    items = list(items)
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def _scalar_copy(w: _Writer, ctx: _Ctx, tensor: GlobalTensor, buf: Buffer, load: bool, where: str) -> None:
    """Copy between a 0-d global tensor and a one-element buffer (TileLang's T.copy needs a region)."""
    if buf.axes:
        raise PlanError(f"{where}: tensor {tensor.name!r} is a scalar, but buffer {buf.name!r} has axes {buf.axes}")
    g, b = ctx.names[tensor.name], ctx.names[buf.name]
    if load:
        w.line("for _ in T.Parallel(1):")
        w.line(f"    {b}[0] = {g}[()]")
    else:
        w.line(f"{g}[()] = {b}[0]")


def _extent(ctx: _Ctx, buf: Buffer) -> list[str]:
    return [ctx.block_expr[a] for a in buf.axes] if buf.axes else ["1"]


def _check_buffers(kernel: Kernel, roles: dict[str, AxisRole], plan: Plan) -> dict[str, Buffer]:
    bufs: dict[str, Buffer] = {}
    tensor_names = {t.name for t in plan.tensors}
    for b in kernel.buffers:
        if b.name in bufs:
            raise PlanError(f"kernel {kernel.name!r}: buffer {b.name!r} is declared twice")
        if b.name in tensor_names:
            raise PlanError(f"kernel {kernel.name!r}: buffer {b.name!r} has the name of a global tensor")
        if len(set(b.axes)) != len(b.axes):
            raise PlanError(f"kernel {kernel.name!r}: buffer {b.name!r} repeats an axis: {b.axes}")
        for a in b.axes:
            r = roles.get(a)
            if r is None or r.kind == "indexed":
                raise PlanError(f"kernel {kernel.name!r}: buffer {b.name!r} has axis {a!r}, which is neither a "
                                "tiled grid axis (block != 1) nor the loop axis of the kernel")
        bufs[b.name] = b
    return bufs


def _buf(ctx: _Ctx, name: str, where: str) -> Buffer:
    b = ctx.buffers.get(name)
    if b is None:
        raise PlanError(f"{where}: unknown buffer {name!r}; buffers are {sorted(ctx.buffers)}")
    return b


def _region(ctx: _Ctx, tensor: GlobalTensor, buf: Buffer, section: str, where: str) -> str:
    """Index expression of the tile of ``tensor`` a block touches (the inverse of the buffer's axes)."""
    parts: list[str] = []
    held: list[str] = []
    for a in tensor.axes:
        r = ctx.roles.get(a)
        if r is None:
            raise PlanError(f"{where}: axis {a!r} of tensor {tensor.name!r} is neither a grid axis nor the loop "
                            "axis of the kernel (give it a grid axis with block equal to its extent)")
        b = ctx.block_expr[a]
        if r.kind == "indexed":
            parts.append(ctx.coord[a] or "0")
            continue
        held.append(a)
        if r.kind == "loop":
            if section != "body":
                raise PlanError(f"{where}: tensor {tensor.name!r} has the loop axis {a!r}, but the op is in the "
                                f"{section}, outside the loop")
            c = ctx.loop_var
        else:
            c = ctx.coord[a]
        parts.append(f"{c} * {b}:({c} + 1) * {b}" if c else f"0:{b}")
    if held != list(buf.axes):
        raise PlanError(f"{where}: buffer {buf.name!r} has axes {buf.axes}, but the tile of {tensor.name!r} "
                        f"{tensor.axes} has axes {held} (indexed axes removed, same order)")
    if not held:  # a single element: give the region extent 1 to match the [1] buffer
        last = parts[-1]
        parts[-1] = f"{last}:{last} + 1"
    return f"{ctx.names[tensor.name]}[{', '.join(parts)}]"


def _fill_value(v: float | str, dtype: str) -> str:
    if v == "-inf" or (isinstance(v, float) and v == -math.inf):
        return f'-T.infinity("{dtype}")'
    if v == "inf" or (isinstance(v, float) and v == math.inf):
        return f'T.infinity("{dtype}")'
    return repr(float(v))


def _const(v: float) -> str:
    if math.isnan(v):
        raise PlanError("a Map constant is NaN")
    if math.isinf(v):
        return ("-" if v < 0 else "") + 'T.infinity("float32")'
    return f"T.float32({float(v)!r})"


def _expr(ctx: _Ctx, e, dst: Buffer, idx: dict[str, str], where: str) -> str:
    if isinstance(e, Ref):
        b = _buf(ctx, e.buf, where)
        extra = [a for a in b.axes if a not in dst.axes]
        if extra:
            raise PlanError(f"{where}: map into {dst.name!r} (axes {dst.axes}) reads {b.name!r} with axes "
                            f"{b.axes}; its axes {extra} are not axes of the destination")
        ix = ", ".join(idx[a] for a in b.axes) if b.axes else "0"
        load = f"{ctx.reroute.get(b.name, ctx.names[b.name])}[{ix}]"
        return load if b.dtype == "float32" else f'T.cast({load}, "float32")'
    if isinstance(e, Const):
        return _const(e.value)
    if isinstance(e, AxisSize):
        if e.axis not in ctx.size_const:
            raise PlanError(f"{where}: expression uses the size of axis {e.axis!r}, which no tensor of the plan has")
        return f"T.float32({ctx.size_const[e.axis]})"
    if isinstance(e, Call):
        arity = EXPR_FUNCTIONS.get(e.fn)
        if arity is None:
            raise PlanError(f"{where}: unknown function {e.fn!r}; known: {sorted(EXPR_FUNCTIONS)}")
        if len(e.args) != arity:
            raise PlanError(f"{where}: {e.fn} takes {arity} argument(s), got {len(e.args)}")
        args = [_expr(ctx, a, dst, idx, where) for a in e.args]
        if e.fn in _INFIX:
            return f"({args[0]} {_INFIX[e.fn]} {args[1]})"
        if e.fn == "neg":
            return f"(-{args[0]})"
        if e.fn in _DIRECT:
            return f"{_DIRECT[e.fn]}({', '.join(args)})"
        ctx.helpers.add(e.fn)
        return f"{e.fn}({args[0]})"
    raise PlanError(f"{where}: unknown expression {e!r}")  # pragma: no cover - pydantic rejects it first


def expr_refs(e) -> list[str]:
    """Buffers a Map expression reads, in order of appearance."""
    if isinstance(e, Ref):
        return [e.buf]
    if isinstance(e, Call):
        return [r for a in e.args for r in expr_refs(a)]
    return []


def _numbered_ops(kernel: Kernel) -> list[tuple[str, int, object]]:
    ops = [("prologue", i, op) for i, op in enumerate(kernel.prologue)]
    ops += [("body", i, op) for i, op in enumerate(kernel.body)]
    return ops + [("epilogue", i, op) for i, op in enumerate(kernel.epilogue)]


def layout_groups(kernel: Kernel) -> dict[str, str]:
    """Fragment -> representative of its layout group: same-axes fragments one Map touches share a layout."""
    bufs = {b.name: b for b in kernel.buffers}
    parent = {b.name: b.name for b in kernel.buffers if b.scope == "fragment"}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for _, _, op in _numbered_ops(kernel):
        if isinstance(op, Map) and op.dst in parent:
            for r in expr_refs(op.expr):
                if r in parent and set(bufs[r].axes) == set(bufs[op.dst].axes):
                    parent[find(r)] = find(op.dst)
    return {b: find(b) for b in parent}


def layout_bridges(kernel: Kernel) -> dict[tuple[str, int], list[str]]:
    """Fragments that a Map must read through shared memory, keyed by (section, op index).

    TileLang gives each fragment one register layout. A Gemm fixes the layout of its accumulator
    (and of a fragment A operand); a Map ties together the layouts of the fragments with the same
    axes that it writes and reads; a Reduce's result follows its source; a group of fragments with
    neither (computed from shared tiles only) gets a free layout of its own. A Map that broadcasts
    a lower-rank fragment whose layout has another origin than its destination's -- a row
    statistic reduced from a freely laid out tile, scaling a GEMM accumulator, say -- cannot be laid
    out, so the renderer copies that fragment to a shared buffer and the Map reads the copy.
    """
    bufs = {b.name: b for b in kernel.buffers}
    frag = {b.name for b in kernel.buffers if b.scope == "fragment"}
    ops = _numbered_ops(kernel)
    group = layout_groups(kernel)

    def find(x: str) -> str:
        return group[x]

    origin: dict[str, str] = {}
    for _, _, op in ops:
        if isinstance(op, Gemm):
            for x in (op.c, op.a):
                if x in frag:
                    origin[find(x)] = "gemm"
    for _, _, op in ops:  # reduced groups written only from memory (shared or global) pick their own layout
        if isinstance(op, (Map, Load)) and op.dst in frag and find(op.dst) not in origin:
            if isinstance(op, Load) or (not any(r in frag for r in expr_refs(op.expr)) and bufs[op.dst].axes):
                members = [b for b in frag if find(b) == find(op.dst)]
                if any(isinstance(o, Reduce) and o.src in members for _, _, o in ops):
                    origin[find(op.dst)] = f"free:{find(op.dst)}"
    changed = True
    while changed:  # reduce results follow their source (to a fixpoint: results can be reduced again)
        changed = False
        for _, _, op in ops:
            if isinstance(op, Reduce) and op.dst in frag and find(op.dst) not in origin:
                src = origin.get(find(op.src)) if op.src in frag else f"free:{op.src}"
                if src:
                    origin[find(op.dst)] = src
                    changed = True
    out: dict[tuple[str, int], list[str]] = {}
    for section, i, op in ops:
        if not isinstance(op, Map) or op.dst not in frag:
            continue
        od = origin.get(find(op.dst))
        need = []
        for r in expr_refs(op.expr):
            if r in frag and r not in need and find(r) != find(op.dst) and od and origin.get(find(r)) not in (None, od):
                need.append(r)
        if need:
            out[(section, i)] = need
    return out


def _gemm_policy_full_row(kernel: Kernel, buffers: dict[str, Buffer], op: Gemm) -> bool:
    """FullRow keeps whole rows of c in one warp: cheap row reductions and a fragment A operand."""
    if buffers[op.a].scope == "fragment":
        return True
    return any(isinstance(o, Reduce) and o.src == op.c for o in kernel.prologue + kernel.body + kernel.epilogue)


def _render_op(w: _Writer, ctx: _Ctx, op, section: str, i: int) -> None:
    where = ctx.where(section, i)
    n = ctx.names
    if isinstance(op, Load):
        if op.src not in ctx.kernel.reads:
            raise PlanError(f"{where}: loads {op.src!r}, which is not in the kernel's reads {ctx.kernel.reads}")
        dst = _buf(ctx, op.dst, where)
        src = _tensor(ctx.plan, ctx.kernel, op.src)
        if not src.axes:
            _scalar_copy(w, ctx, src, dst, True, where)
            return
        w.line(f"T.copy({_region(ctx, src, dst, section, where)}, {n[dst.name]})")
    elif isinstance(op, Store):
        if op.dst not in ctx.kernel.writes:
            raise PlanError(f"{where}: stores {op.dst!r}, which is not in the kernel's writes {ctx.kernel.writes}")
        src = _buf(ctx, op.src, where)
        dst = _tensor(ctx.plan, ctx.kernel, op.dst)
        if not dst.axes:
            _scalar_copy(w, ctx, dst, src, False, where)
            return
        w.line(f"T.copy({n[src.name]}, {_region(ctx, dst, src, section, where)})")
    elif isinstance(op, Fill):
        dst = _buf(ctx, op.dst, where)
        if op.value in (0, 0.0) and not isinstance(op.value, str):
            w.line(f"T.clear({n[dst.name]})")
        else:
            w.line(f"T.fill({n[dst.name]}, {_fill_value(op.value, dst.dtype)})")
    elif isinstance(op, Gemm):
        _render_gemm(w, ctx, op, where)
    elif isinstance(op, Map):
        dst = _buf(ctx, op.dst, where)
        idx = {a: ctx.par_var(a) for a in dst.axes}
        ctx.reroute = {}
        for r in ctx.bridges.get((section, i), []):
            w.line(f"T.copy({n[r]}, {ctx.bridge_names[r]})  # layout bridge: {r!r} and {dst.name!r} disagree")
            ctx.reroute[r] = ctx.bridge_names[r]
        rhs = _expr(ctx, op.expr, dst, idx, where)
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
    elif isinstance(op, Reduce):
        src = _buf(ctx, op.src, where)
        dst = _buf(ctx, op.dst, where)
        if op.axis not in src.axes:
            raise PlanError(f"{where}: reduces over {op.axis!r}, which buffer {src.name!r} {src.axes} lacks")
        want = [a for a in src.axes if a != op.axis]
        if list(dst.axes) != want:
            raise PlanError(f"{where}: reduce of {src.name!r} {src.axes} over {op.axis!r} must write a buffer "
                            f"with axes {want}, but {dst.name!r} has {dst.axes}")
        # TileLang's clear=False combines the reduction into dst's value (dst + r, max(dst, r)).
        w.line(f"T.reduce_{op.fn}({n[src.name]}, {n[dst.name]}, dim={src.axes.index(op.axis)}, "
               f"clear={not op.accumulate})")
    else:  # pragma: no cover - pydantic rejects unknown ops
        raise PlanError(f"{where}: unknown op {op!r}")


def _render_gemm(w: _Writer, ctx: _Ctx, op: Gemm, where: str) -> None:
    a, b, c = (_buf(ctx, x, where) for x in (op.a, op.b, op.c))
    for buf, role in ((a, "a"), (b, "b"), (c, "c")):
        if len(buf.axes) != 2:
            raise PlanError(f"{where}: gemm operand {role}={buf.name!r} must be 2-D, has axes {buf.axes}")
    for buf, role in ((a, "a"), (b, "b")):
        if op.contract not in buf.axes:
            raise PlanError(f"{where}: gemm operand {role}={buf.name!r} {buf.axes} lacks contracted axis "
                            f"{op.contract!r}")
        if buf.dtype == "float32":
            raise PlanError(f"{where}: gemm operand {role}={buf.name!r} is float32; operands must have the "
                            "compute dtype (float16/bfloat16)")
    if b.scope != "shared":
        raise PlanError(f"{where}: gemm operand b={b.name!r} must be a shared buffer, it is {b.scope}")
    if c.scope != "fragment" or c.dtype != "float32":
        raise PlanError(f"{where}: gemm accumulator c={c.name!r} must be a float32 fragment")
    free_a = next(x for x in a.axes if x != op.contract)
    free_b = next(x for x in b.axes if x != op.contract)
    if list(c.axes) != [free_a, free_b]:
        raise PlanError(f"{where}: gemm accumulator {c.name!r} has axes {c.axes}, expected "
                        f"[{free_a!r}, {free_b!r}] (free axis of a, free axis of b)")
    kwargs = []
    if a.axes[0] == op.contract:
        kwargs.append("transpose_A=True")
    if b.axes[1] == op.contract:
        kwargs.append("transpose_B=True")
    if _gemm_policy_full_row(ctx.kernel, ctx.buffers, op):
        kwargs.append("policy=T.GemmWarpPolicy.FullRow")
    if op.clear:
        kwargs.append("clear_accum=True")
    n = ctx.names
    w.line(f"T.gemm({', '.join([n[a.name], n[b.name], n[c.name], *kwargs])})")


def launch_axes(kernel: Kernel, roles: dict[str, AxisRole]) -> list[list[str]]:
    """Grid axes behind blockIdx.x, .y, .z (each list outermost first; more than one axis: folded).

    An axis gets a launch dimension when it has more than one tile or its block is a parameter
    (the source must not depend on parameter values). The last grid axis varies fastest.
    """
    live = [g.axis for g in kernel.grid
            if isinstance(roles[g.axis].block, str) or roles[g.axis].size // roles[g.axis].block > 1]
    dims = [[a] for a in reversed(live)]
    if len(dims) > 3:
        dims = dims[:2] + [live[: len(live) - 2]]
    return dims


def _grid_launch(ctx: _Ctx, w: _Writer, params_line: str) -> None:
    """Emit ``with T.Kernel(...)`` and bind each grid axis's coordinate (folding > 3 launch dims)."""
    dims = launch_axes(ctx.kernel, ctx.roles)
    for g in ctx.kernel.grid:
        ctx.coord[g.axis] = None
    if not dims:
        w.line(f"with T.Kernel(1, {params_line}) as _block:")
        w.indent()
        return
    counts = {a: f"{ctx.size_const[a]} // {ctx.block_expr[a]}" if ctx.roles[a].kind != "indexed"
              else ctx.size_const[a] for d in dims for a in d}
    coord_names = {a: ctx.local.fresh(f"{a}_idx" if ctx.roles[a].kind == "indexed" else f"{a}_blk")
                   for d in dims for a in d}
    folded = dims[2] if len(dims) == 3 and len(dims[2]) > 1 else []
    launch, names = [], []
    for d in dims:
        if len(d) == 1:
            launch.append(counts[d[0]])
            names.append(coord_names[d[0]])
    if folded:
        fold_var = ctx.local.fresh("_".join(folded) + "_fold")
        w.line(f"# grid axes {folded} share blockIdx.z through div/mod")
        launch.append(" * ".join(_paren(counts[a]) for a in folded))
        names.append(fold_var)
    target = names[0] if len(names) == 1 else f"({', '.join(names)})"
    w.line(f"with T.Kernel({', '.join(launch)}, {params_line}) as {target}:")
    w.indent()
    for j, a in enumerate(folded):  # fold = ((a0 * n1) + a1) * n2 + a2 ...
        inner = " * ".join(_paren(counts[b]) for b in folded[j + 1:])
        expr = f"{fold_var} // {_paren(inner)}" if inner else fold_var
        if j > 0:
            expr = f"{_paren(expr)} % {_paren(counts[a])}"
        w.line(f"{coord_names[a]} = {expr}")
    for a in coord_names:
        ctx.coord[a] = coord_names[a]


def _render_kernel(w: _Writer, plan: Plan, kernel: Kernel, module_names: set[str], size_const: dict[str, str],
                   tensor_ident: dict[str, str], helpers: set[str], build_name: str, func_name: str) -> None:
    roles = kernel_axes(plan, kernel)
    buffers = _check_buffers(kernel, roles, plan)
    local = _Names(module_names)
    names = {t: tensor_ident[t] for t in tensor_ident}
    for b in kernel.buffers:
        names[b.name] = local.fresh(b.name)
    block_expr = {a: (r.block if isinstance(r.block, str) else str(r.block)) for a, r in roles.items()}
    loop_var = local.fresh(f"{kernel.loop.axis}_step") if kernel.loop else ""
    bridges = layout_bridges(kernel)
    bridged = sorted({b for bs in bridges.values() for b in bs}, key=[x.name for x in kernel.buffers].index)
    bridge_names = {b: local.fresh(f"{b}_bridge") for b in bridged}
    ctx = _Ctx(plan, kernel, roles, buffers, names, size_const, block_expr, {}, loop_var, local, helpers, {},
               bridges, bridge_names, {})

    defaults = ", ".join(f"{p}={kernel.defaults[p]}" for p in kernel.params)
    w.line(f"def {build_name}({defaults}):")
    w.indent()
    w.line(f'"""Kernel {kernel.name!r}: {_describe(kernel)}."""')
    args = kernel_args(plan, kernel)
    w.line()
    w.line("@T.prim_func")
    tensors = {t.name: t for t in plan.tensors}
    w.line(f"def {func_name}(")
    for t in args:
        w.line(f'    {names[t]}: T.Tensor({_tuple(size_const[a] for a in tensors[t].axes)}, "{tensors[t].dtype}"),')
    w.line("):")
    w.indent()
    threads = kernel.threads if isinstance(kernel.threads, str) else str(kernel.threads)
    _grid_launch(ctx, w, f"threads={threads}")
    for b in kernel.buffers:
        alloc = "T.alloc_shared" if b.scope == "shared" else "T.alloc_fragment"
        note = "  # state: carried across loop steps" if b.state else ""
        w.line(f'{names[b.name]} = {alloc}({_tuple(_extent(ctx, b))}, "{b.dtype}"){note}')
    for b in bridged:
        buf = buffers[b]
        w.line(f'{bridge_names[b]} = T.alloc_shared({_tuple(_extent(ctx, buf))}, "{buf.dtype}")'
               f"  # shared copy of {b!r} for maps that need another fragment layout")
    if kernel.loop is not None and any(isinstance(op, Gemm) for op in kernel.body) \
            and len(launch_axes(kernel, roles)) == 2:
        w.line("T.use_swizzle(panel_size=10)  # block order that keeps GEMM operand panels in L2")
    sections = [("prologue", kernel.prologue), ("body", kernel.body), ("epilogue", kernel.epilogue)]
    if kernel.loop is None:
        for section, ops in sections:
            if ops:
                w.line(f"# {section}")
            for i, op in enumerate(ops):
                _render_op(w, ctx, op, section, i)
    else:
        lp = kernel.loop
        stages = lp.stages if isinstance(lp.stages, str) else str(lp.stages)
        if kernel.prologue:
            w.line("# prologue")
        for i, op in enumerate(kernel.prologue):
            _render_op(w, ctx, op, "prologue", i)
        w.line(f"# streamed loop over {lp.axis!r}, {block_expr[lp.axis]} at a time")
        w.line(f"for {loop_var} in T.Pipelined({size_const[lp.axis]} // {block_expr[lp.axis]}, "
               f"num_stages={stages}):")
        w.indent()
        for i, op in enumerate(kernel.body):
            _render_op(w, ctx, op, "body", i)
        if not kernel.body:
            w.line("pass")
        w.dedent()
        if kernel.epilogue:
            w.line("# epilogue")
        for i, op in enumerate(kernel.epilogue):
            _render_op(w, ctx, op, "epilogue", i)
    w.dedent()
    w.dedent()
    w.line()
    w.line(f"return {func_name}")
    w.dedent()


def _describe(kernel: Kernel) -> str:
    grid = ", ".join(f"{g.axis}/{g.block}" for g in kernel.grid) or "none"
    text = f"grid [{grid}]"
    if kernel.loop:
        text += f", loop {kernel.loop.axis}/{kernel.loop.block} (stages {kernel.loop.stages})"
    if kernel.fused_rules:
        text += f"; fused by {', '.join(kernel.fused_rules)}"
    return text


# --- the module --------------------------------------------------------------

def render(plan: Plan) -> str:
    """Source of one Python module running every kernel of ``plan`` with TileLang."""
    if not plan.kernels:
        raise PlanError("plan has no kernels")
    names_k = [k.name for k in plan.kernels]
    if len(set(names_k)) != len(names_k):
        raise PlanError(f"plan repeats a kernel name: {names_k}")
    tnames = [t.name for t in plan.tensors]
    if len(set(tnames)) != len(tnames):
        raise PlanError(f"plan repeats a global tensor name: {tnames}")
    sizes = axis_sizes(plan)
    phash = plan.provenance.plan_hash or plan_hash(plan)

    params = sorted({p for k in plan.kernels for p in k.params})
    for k in plan.kernels:
        for p in k.params:
            if not p.isidentifier() or keyword.iskeyword(p) or p in _RESERVED_MODULE:
                raise PlanError(f"kernel {k.name!r}: parameter name {p!r} cannot be a Python keyword argument of "
                                f"the build function (not an identifier, or one of {sorted(_RESERVED_MODULE)})")
    module = _Names(_RESERVED_MODULE | set(params))
    size_const = {a: module.fresh(f"SIZE_{a}".upper()) for a in sorted(sizes)}
    build_names = {k.name: module.fresh(f"build_{k.name}") for k in plan.kernels}
    # global tensors become prim_func arguments; they must not shadow module names
    tensor_ident = {t.name: module.fresh(t.name) for t in plan.tensors}
    func_names = {k.name: module.fresh(k.name) for k in plan.kernels}
    module_names = set(module.taken)

    body = _Writer()
    helpers: set[str] = set()
    for k in plan.kernels:
        body.line()
        body.line()
        body.line(f"# --- kernel {k.name!r} (plan {phash}) " + "-" * max(0, 60 - len(k.name)))
        _render_kernel(body, plan, k, module_names, size_const, tensor_ident, helpers,
                       build_names[k.name], func_names[k.name])

    w = _Writer()
    w.line(f'"""TileLang kernels for plan {phash} (workload {plan.workload!r}, {plan.dtype}).')
    w.line()
    w.line("Rendered by pyrunner.backend.tilelang.render from the plan's kernel IR; do not edit by hand.")
    w.line("Kernels, in launch order:")
    for k in plan.kernels:
        w.line(f"  {k.name}: {_describe(k)}")
    w.line()
    w.line("Reference check: this module only computes. pyrunner's runner allocates every global tensor,")
    w.line("poisons the outputs, calls launch(), and compares the outputs with the float64 reference")
    w.line("(pyrunner.reference.evaluate) on fresh random inputs.")
    w.line('"""')
    w.line()
    w.line("import tilelang")
    w.line("import tilelang.language as T")
    w.line()
    w.line(f"PLAN_HASH = {phash!r}")
    w.line(f"WORKLOAD = {plan.workload!r}")
    w.line(f"DTYPE = {plan.dtype!r}")
    w.line(f"ACCUM_DTYPE = {plan.accum_dtype!r}")
    w.line(f"TARGET = {TARGET!r}")
    w.line()
    w.line("# axis extents")
    for a in sorted(sizes):
        w.line(f"{size_const[a]} = {sizes[a]}")
    w.line()
    w.line("# global tensors: name -> (shape, dtype, role); the caller allocates all of them")
    w.line("TENSORS = {")
    for t in plan.tensors:
        w.line(f"    {t.name!r}: ({_tuple(size_const[a] for a in t.axes)}, {t.dtype!r}, {t.role!r}),")
    w.line("}")
    w.line()
    w.line("# tuning space: kernel -> parameter -> allowed values")
    w.line("CONFIG_SPACE = {")
    for k in plan.kernels:
        w.line(f"    {k.name!r}: {{{', '.join(f'{p!r}: {v!r}' for p, v in k.params.items())}}},")
    w.line("}")
    w.line("DEFAULT_CONFIG = {")
    for k in plan.kernels:
        w.line(f"    {k.name!r}: {{{', '.join(f'{p!r}: {k.defaults[p]!r}' for p in k.params)}}},")
    w.line("}")
    for h in sorted(helpers):
        doc, ret = _HELPERS[h]
        w.line()
        w.line()
        w.line(f"def {h}(x):")
        w.indent()
        w.line(doc)
        w.line(ret)
        w.dedent()
    w.lines.extend(body.lines)
    _render_runtime(w, plan, build_names)
    return w.text()


def _render_runtime(w: _Writer, plan: Plan, build_names: dict[str, str]) -> None:
    w.line()
    w.line()
    w.line("# launch order: (kernel, build function, global tensors it takes)")
    w.line("KERNELS = [")
    for k in plan.kernels:
        w.line(f"    ({k.name!r}, {build_names[k.name]}, {tuple(kernel_args(plan, k))!r}),")
    w.line("]")
    w.line()
    w.line()
    w.line("def merge_config(config=None):")
    w.indent()
    w.line('"""DEFAULT_CONFIG overlaid by a partial config (kernel -> parameter -> value)."""')
    w.line("cfg = {name: dict(values) for name, values in DEFAULT_CONFIG.items()}")
    w.line("for name, values in (config or {}).items():")
    w.indent()
    w.line("unknown = set(values) - set(cfg[name])")
    w.line("if unknown:")
    w.indent()
    w.line('raise KeyError(f"kernel {name!r} has no parameter(s) {sorted(unknown)}")')
    w.dedent()
    w.line("cfg[name].update(values)")
    w.dedent()
    w.line("return cfg")
    w.dedent()
    w.line()
    w.line()
    w.line("def build_kernels(config=None):")
    w.indent()
    w.line('"""The prim_func of every kernel under config."""')
    w.line("cfg = merge_config(config)")
    w.line("return {name: build(**cfg[name]) for name, build, _ in KERNELS}")
    w.dedent()
    w.line()
    w.line()
    w.line("def compile_kernels(config=None, target=TARGET):")
    w.indent()
    w.line('"""JIT-compile every kernel for the GPU (needs CUDA)."""')
    w.line("return {name: tilelang.compile(func, target=target) for name, func in build_kernels(config).items()}")
    w.dedent()
    w.line()
    w.line()
    w.line("_COMPILED = {}")
    w.line()
    w.line()
    w.line("def launch(tensors, config=None, *, kernels=None):")
    w.indent()
    w.line('"""Run the kernels in order on preallocated tensors (name -> torch.Tensor on the GPU)."""')
    w.line("if kernels is None:")
    w.indent()
    w.line("key = repr(sorted((name, sorted(values.items())) for name, values in merge_config(config).items()))")
    w.line("if key not in _COMPILED:")
    w.indent()
    w.line("_COMPILED[key] = compile_kernels(config)")
    w.dedent()
    w.line("kernels = _COMPILED[key]")
    w.dedent()
    w.line("for name, _, args in KERNELS:")
    w.indent()
    w.line("kernels[name](*(tensors[a] for a in args))")
    w.dedent()
    w.dedent()
