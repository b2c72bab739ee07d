"""Run the rendered TileLang source itself on the CPU, with numpy, and trace it op by op.

The CPU executor runs the *plan*; a renderer bug (a wrong region, a swapped transpose flag, a
reduction over the wrong dim, an op in the wrong section) is invisible to it until a GPU run.
This module closes that gap without a GPU: it parses the rendered module with ``ast``, rewrites
``with T.Kernel(...) as coords:`` into a loop over every block and drops the ``tilelang``
imports, then executes it against a numpy stand-in for ``tilelang.language``:

- tiles are numpy arrays that round to their dtype on every write (fp16 / bf16 / fp32); fresh
  tiles and non-input globals start as NaN, so a read of anything unwritten shows;
- ``T.Parallel`` yields open index grids once (the map runs vectorised), ``T.Pipelined`` is a
  plain loop, ``T.copy`` copies regions (shapes must match exactly), ``T.gemm`` honours
  transpose flags and ``clear_accum``, ``T.reduce_*`` their ``dim`` and ``clear``.

It also records a trace of the first block of every kernel (copies with their global region,
gemms, reductions, fills, map writes) and the buffers it allocates, which ``structure.py``
compares with the plan op by op. It does not model TileLang's own lowering (layouts, warp
partition, pipelining): that still needs the GPU sweep.

An explicitly warp-specialised kernel (``render_ws``) runs its producer branch as a generator
that loads as far ahead as its empty mbarriers let it, and ``T.wgmma_gemm`` computes at the
``T.wait_wgmma`` that covers it, from its operands as they are then: a slot freed too early is
overwritten under a GEMM in flight, a slot never freed deadlocks, and either fails the check.

Why one module: the numpy stand-in for ``T``, the source rewrite that makes the producer a
generator, and the driver that runs every block share the trace and the barrier state.
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pyrunner.backend.tilelang.render import render
from pyrunner.errors import PlanError
from pyrunner.plan.analysis import resolve_config
from pyrunner.plan.schema import Plan
from pyrunner.plan.views import to_source_layout, view_of
from pyrunner.target.rounding import round_to

if TYPE_CHECKING:
    from pyrunner.backend.tilelang.compile_target import CompileTarget


class EmulationError(PlanError):
    """The rendered source does something the emulator (or TileLang) would reject."""


# --- tiles ----------------------------------------------------------------------

class Tile:
    """A global tensor or an on-chip buffer: float32 storage rounded to ``dtype`` on every write."""

    def __init__(self, name: str, data: np.ndarray, dtype: str, scope: str, trace: Trace) -> None:
        self.name, self.data, self.dtype, self.scope, self.trace = name, data, dtype, scope, trace
        self.written = False  # a global tensor some kernel has stored to

    def __getitem__(self, idx: Any) -> Any:
        idx = idx if isinstance(idx, tuple) else (idx,)
        if any(isinstance(i, slice) for i in idx):
            return Region(self, idx)
        if self.scope == "global":
            self.trace.touch(self, write=False)
        if idx == () and self.data.ndim == 0:
            return self.data[()]
        return self.data[idx]

    def __setitem__(self, idx: Any, value: Any) -> None:
        idx = idx if isinstance(idx, tuple) else (idx,)
        if self.scope == "global":
            self.trace.touch(self, write=True)
        self.trace.write(self, "map")
        self.data[idx] = round_to(np.asarray(value, dtype=np.float32), self.dtype)

    def values(self) -> np.ndarray:
        return self.data

    def assign(self, value: np.ndarray) -> None:
        self.data[...] = round_to(value, self.dtype)


@dataclass
class Region:
    """A slice of a tile, as T.copy takes it."""

    tile: Tile
    idx: tuple

    def values(self) -> np.ndarray:
        return self.tile.data[self.idx]

    def assign(self, value: np.ndarray) -> None:
        self.tile.data[self.idx] = round_to(value, self.tile.dtype)

    def bounds(self) -> list[tuple[int, int] | int]:
        return [(s.start, s.stop) if isinstance(s, slice) else int(s) for s in self.idx]


def _vals(x: Any) -> np.ndarray:
    return x.values() if isinstance(x, (Tile, Region)) else np.asarray(x, dtype=np.float32)


def _global_region(x: Any) -> bool:
    return isinstance(x, Region) and x.tile.scope == "global"


def _name(x: Any) -> str:
    return x.tile.name if isinstance(x, Region) else x.name


# --- the trace --------------------------------------------------------------------

@dataclass
class Trace:
    """Events of the first block of the kernel being run, and its buffer allocations."""

    events: list[tuple] = field(default_factory=list)
    allocs: list[tuple[str, tuple, str, str]] = field(default_factory=list)
    on: bool = True
    earlier: frozenset[str] = frozenset()  # tensors the kernels ahead write (dependent launch)
    role: str = "consumer"  # the thread role running now: "producer" inside the producer warpgroup
    synced: set[str] = field(default_factory=set)  # roles of the running block past T.pdl_sync()
    waits: bool = False  # the kernel called T.pdl_sync(): it is launched dependently
    early: str | None = None  # the first global access of a block before its role's T.pdl_sync()

    def add(self, *event: Any) -> None:
        if self.on:
            self.events.append(event)

    def touch(self, tile: Tile, write: bool) -> None:
        """A global access: before its role's wait only a read of a tensor no kernel ahead writes is safe."""
        tile.written |= write
        if self.early is None and self.role not in self.synced and (write or tile.name in self.earlier):
            what = f"writes to {tile.name!r}" if write else f"reads {tile.name!r}, which a kernel ahead writes,"
            self.early = f"a {self.role} thread {what} before T.pdl_sync()"

    def write(self, tile: Tile, how: str) -> None:
        if self.on and tile.scope != "global":
            self.events.append((how, tile.name))


# --- the numpy stand-in for tilelang.language ----------------------------------------

class _BarrierRef:
    """One mbarrier of an array: the emulator runs one representative of each role, so one arrive
    from a role completes a phase."""

    def __init__(self, owner: _Barriers, slot: int) -> None:
        self.owner, self.slot = owner, slot

    def arrive(self) -> None:
        self.owner.phases[self.slot] += 1

    def phase_parity(self) -> int:
        return self.owner.phases[self.slot] % 2

    def __str__(self) -> str:
        return f"{self.owner.name}[{self.slot}]"


class _Barriers:
    def __init__(self, name: str, n: int) -> None:
        self.name, self.phases = name, [0] * n

    def __getitem__(self, slot: Any) -> _BarrierRef:
        return _BarrierRef(self, int(slot))


_NP_DTYPES = {"float16": np.float32, "bfloat16": np.float32, "float32": np.float32}


class _Policy:
    FullRow, FullCol, Square = "FullRow", "FullCol", "Square"


class FakeT:
    """The subset of ``tilelang.language`` the renderer emits, on numpy."""

    GemmWarpPolicy = _Policy

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self._producer = None  # the producer warpgroup's generator, while a warp-specialised block runs
        self._running = False  # inside the producer (its own arrives do not re-enter it)
        self._pending: list[tuple] = []  # issued wgmma, not yet waited on

    # declarations
    def prim_func(self, f=None, **_: Any):
        return f if f is not None else (lambda g: g)

    def Tensor(self, shape, dtype):  # noqa: N802 - TileLang's name
        return (shape, dtype)

    def Kernel(self, *extents, threads=None, **_: Any):  # noqa: N802
        """Every block in turn (rewritten from ``with``); the trace keeps the first block only."""
        for i, coords in enumerate(itertools.product(*(range(int(e)) for e in extents))):
            self.trace.on = i == 0
            self.trace.synced = set()
            yield coords[0] if len(coords) == 1 else coords
        self.trace.on = True

    def Pipelined(self, *bounds, num_stages=None, **_: Any):  # noqa: N802
        """``T.Pipelined(n)`` or ``T.Pipelined(lo, hi)`` (a loop whose masked tiles are skipped)."""
        return range(*(int(b) for b in bounds))

    @staticmethod
    def ceildiv(a, b) -> int:
        """Blocks of ``b`` that cover ``a`` (a grid extent of a partial last tile)."""
        return -(-int(a) // int(b))

    def serial(self, lo, hi=None):
        return range(int(lo)) if hi is None else range(int(lo), int(hi))

    def Parallel(self, *extents):  # noqa: N802
        grids = np.meshgrid(*(np.arange(int(e)) for e in extents), indexing="ij", sparse=True)
        yield grids[0] if len(grids) == 1 else tuple(grids)

    def alloc_shared(self, shape, dtype, _name: str = "?"):
        return self._alloc(shape, dtype, "shared", _name)

    def alloc_fragment(self, shape, dtype, _name: str = "?"):
        return self._alloc(shape, dtype, "fragment", _name)

    def _alloc(self, shape, dtype, scope, name):
        shape = tuple(int(s) for s in shape)
        if self.trace.on:
            self.trace.allocs.append((name, shape, dtype, scope))
        return Tile(name, np.full(shape, np.nan, dtype=np.float32), dtype, scope, self.trace)

    def use_swizzle(self, *_, **__) -> None:
        return None

    # explicit warp specialisation (render_ws): the producer runs as a generator the consumers pull
    def alloc_barrier(self, counts, _name: str = "?"):
        return _Barriers(_name, len(counts) if isinstance(counts, list) else 1)

    def get_thread_binding(self):
        return 0  # the rewritten source takes the producer branch as a generator, never by this value

    def start_producer(self, gen) -> None:
        self._producer = gen
        self.trace.add("async")
        self._pump()

    def finish_producer(self) -> None:
        """The block ends: every wgmma waited on, and the producer ran to its end (it never blocks for good)."""
        if self._pending:
            raise EmulationError(f"{len(self._pending)} wgmma still in flight when the block ends")
        self._pump()
        if self._producer is not None:
            raise EmulationError("deadlock: the producer still waits for a free slot when the block ends")

    def _pump(self) -> None:
        """Run the producer as far as it can go: as fast as a real one could, so a slot released too
        early is overwritten before a wgmma still in flight reads it."""
        if self._producer is None or self._running:
            return
        self._running, self.trace.role = True, "producer"
        try:
            next(self._producer)
        except StopIteration:
            self._producer = None
        finally:
            self._running, self.trace.role = False, "consumer"

    def must_wait(self, ref, parity) -> bool:
        """The producer's side of an mbarrier wait (rewritten into ``while T.must_wait(...): yield``)."""
        return ref.phase_parity() == int(parity)

    def barrier_arrive(self, ref) -> None:
        ref.arrive()
        self._pump()

    def barrier_wait(self, ref, parity) -> None:
        """A consumer's mbarrier parity wait: passes once the phase of that parity has completed."""
        if ref.phase_parity() == int(parity):
            self._pump()
        if ref.phase_parity() == int(parity):
            raise EmulationError(f"deadlock: the consumers wait on {ref}, which the producer never arrives on")

    def tma_copy(self, src, dst, barrier=None, **_: Any) -> None:
        self.copy(src, dst)

    def wgmma_gemm(self, a, b, c, **kw: Any) -> None:
        """Issue: traced now, computed at the wait that covers it, from the operands as they are then."""
        self.trace.add("gemm", _name(a), _name(b), c.name)
        self._pending.append((a, b, c, kw))

    def wait_wgmma(self, n) -> None:
        while len(self._pending) > int(n):
            a, b, c, kw = self._pending.pop(0)
            on, self.trace.on = self.trace.on, False
            try:
                self.gemm(a, b, c, **kw)
            finally:
                self.trace.on = on

    def set_max_nreg(self, *_: Any) -> None:
        return None

    def sync_threads(self, *_: Any) -> None:
        return None

    def named_barrier_arrive(self, *_: Any) -> None:
        return None

    def fence_proxy_async(self) -> None:
        return None

    # programmatic dependent launch: the kernel is checked for global accesses before its wait
    def pdl_trigger(self) -> None:
        return None

    def pdl_sync(self) -> None:
        self.trace.waits = True
        self.trace.synced.add(self.trace.role)

    # data movement and compute
    def copy(self, src, dst, **_: Any) -> None:
        s = _vals(src)
        d_shape = _vals(dst).shape
        if s.shape != d_shape and _global_region(src) and all(a <= b for a, b in zip(s.shape, d_shape, strict=True)):
            # a region past the tensor's end (a padded contraction tile): TileLang's bounds-checked
            # copy reads zeros there
            s = np.pad(s, [(0, b - a) for a, b in zip(s.shape, d_shape, strict=True)])
        if s.shape != d_shape and _global_region(dst) and all(a >= b for a, b in zip(s.shape, d_shape, strict=True)):
            # a padded tile stored into a region past the tensor's end (a row held whole in a
            # power-of-two tile): the bounds-checked copy drops the positions past the end
            s = s[tuple(slice(0, b) for b in d_shape)]
        if s.shape != d_shape:
            raise EmulationError(f"T.copy from {_name(src)!r} {s.shape} to {_name(dst)!r} {d_shape}: shapes differ")
        region = src.bounds() if isinstance(src, Region) else dst.bounds() if isinstance(dst, Region) else None
        for x, write in ((src, False), (dst, True)):
            tile = x.tile if isinstance(x, Region) else x
            if isinstance(tile, Tile) and tile.scope == "global":
                self.trace.touch(tile, write)
        self.trace.add("copy", _name(src), _name(dst), region)
        dst.assign(s)

    def clear(self, buf) -> None:
        self.trace.add("fill", buf.name)
        buf.assign(np.zeros_like(buf.data))

    def fill(self, buf, value) -> None:
        self.trace.add("fill", buf.name)
        buf.assign(np.full_like(buf.data, float(value)))

    def gemm(self, a, b, c, transpose_A=False, transpose_B=False, policy=None, clear_accum=False,  # noqa: N803
             **_: Any) -> None:
        x, y = _vals(a).astype(np.float64), _vals(b).astype(np.float64)
        x = x.T if transpose_A else x
        y = y.T if transpose_B else y
        if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[0] or c.data.shape != (x.shape[0], y.shape[1]):
            raise EmulationError(f"T.gemm {_name(a)!r} {x.shape} @ {_name(b)!r} {y.shape} into {c.name!r} "
                                 f"{c.data.shape}: shapes do not match")
        self.trace.add("gemm", _name(a), _name(b), c.name)
        acc = x @ y
        c.assign(acc if clear_accum else c.data.astype(np.float64) + acc)

    def _reduce(self, fn, src, dst, dim, clear) -> None:
        v = _vals(src)
        r = {"sum": np.sum, "max": np.max, "min": np.min}[fn](v, axis=dim)
        want = dst.data.shape
        if r.shape != want and not (r.shape == () and want == (1,)):
            raise EmulationError(f"T.reduce_{fn} of {_name(src)!r} {v.shape} over dim {dim} into {dst.name!r} "
                                 f"{want}: shapes do not match")
        self.trace.add("reduce", fn, _name(src), dst.name, dim)
        r = np.reshape(r, want)
        if not clear:
            r = {"sum": np.add, "max": np.maximum, "min": np.minimum}[fn](dst.data, r)
        dst.assign(r)

    def reduce_sum(self, src, dst, dim=-1, clear=True, **_: Any) -> None:
        self._reduce("sum", src, dst, dim, clear)

    def reduce_max(self, src, dst, dim=-1, clear=True, **_: Any) -> None:
        self._reduce("max", src, dst, dim, clear)

    def reduce_min(self, src, dst, dim=-1, clear=True, **_: Any) -> None:
        self._reduce("min", src, dst, dim, clear)

    # scalar math
    def float32(self, x):
        return np.float32(x)

    def cast(self, x, dtype):
        return round_to(np.asarray(x, dtype=np.float32), dtype)

    def infinity(self, dtype):
        return np.float32(np.inf)

    def exp(self, x):
        return np.exp(x)

    def exp2(self, x):
        return np.exp2(x)

    def log(self, x):
        return np.log(x)

    def log1p(self, x):
        return np.log1p(x)

    def sqrt(self, x):
        return np.sqrt(x)

    def rsqrt(self, x):
        return np.float32(1.0) / np.sqrt(x)

    def tanh(self, x):
        return np.tanh(x)

    def abs(self, x):
        return np.abs(x)

    def max(self, a, b):
        return np.maximum(a, b)

    def min(self, a, b):
        return np.minimum(a, b)

    # mask predicates
    def if_then_else(self, c, x, y):
        return np.where(c, x, y)

    def And(self, *xs):  # noqa: N802
        return np.logical_and.reduce(np.broadcast_arrays(*xs))

    def Or(self, *xs):  # noqa: N802
        return np.logical_or.reduce(np.broadcast_arrays(*xs))

    def __getattr__(self, name: str):
        raise EmulationError(f"the rendered source calls T.{name}, which the CPU emulator does not model")


# --- source rewriting ------------------------------------------------------------------

class _Rewrite(ast.NodeTransformer):
    """``with T.Kernel(...) as v:`` -> ``for v in T.Kernel(...):``; allocations learn their names;
    ``import tilelang...`` dropped."""

    def visit_Import(self, node: ast.Import):  # noqa: N802
        return None if all(a.name.split(".")[0] == "tilelang" for a in node.names) else node

    def visit_ImportFrom(self, node: ast.ImportFrom):  # noqa: N802
        return None if (node.module or "").split(".")[0] == "tilelang" else node

    def visit_With(self, node: ast.With):  # noqa: N802
        self.generic_visit(node)
        item = node.items[0]
        call = item.context_expr
        if len(node.items) == 1 and isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                and call.func.attr == "Kernel":
            target = item.optional_vars or ast.Name(id="_block", ctx=ast.Store())
            return ast.copy_location(ast.For(target=target, iter=call, body=node.body, orelse=[]), node)
        return node

    def __init__(self) -> None:
        self.thread_vars: set[str] = set()

    def visit_Assign(self, node: ast.Assign):  # noqa: N802
        v = node.value
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and isinstance(v, ast.Call) \
                and isinstance(v.func, ast.Attribute) \
                and v.func.attr in ("alloc_shared", "alloc_fragment", "alloc_barrier"):
            v.keywords.append(ast.keyword(arg="_name", value=ast.Constant(node.targets[0].id)))
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and isinstance(v, ast.Call) \
                and isinstance(v.func, ast.Attribute) and v.func.attr == "get_thread_binding":
            self.thread_vars.add(node.targets[0].id)
        return node

    def visit_If(self, node: ast.If):  # noqa: N802
        """``if tx >= consumers: <producer> else: <consumers>`` -> the producer as a generator that
        yields after each arrive, started before the consumers run and finished after them."""
        self.generic_visit(node)
        t = node.test
        if not (isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id in self.thread_vars
                and len(t.ops) == 1 and isinstance(t.ops[0], ast.GtE)):
            return node
        gen = ast.FunctionDef(name="_producer_warpgroup", args=ast.arguments(
            posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=_yield_while_blocked(node.body) + [ast.If(test=ast.Constant(False), body=[ast.Expr(ast.Yield())],
                                                           orelse=[])],
            decorator_list=[], returns=None)
        if "type_params" in ast.FunctionDef._fields:
            gen.type_params = []

        def call(fn: str, *args: ast.expr) -> ast.Expr:
            return ast.Expr(ast.Call(func=ast.Attribute(value=ast.Name(id="T", ctx=ast.Load()), attr=fn,
                                                        ctx=ast.Load()), args=list(args), keywords=[]))

        start = call("start_producer", ast.Call(func=ast.Name(id="_producer_warpgroup", ctx=ast.Load()),
                                                args=[], keywords=[]))
        return [gen, start, *node.orelse, call("finish_producer")]


def _yield_while_blocked(stmts: list[ast.stmt]) -> list[ast.stmt]:
    """The producer's statements with each ``T.barrier_wait(b, p)`` as ``while T.must_wait(b, p): yield``."""
    out: list[ast.stmt] = []
    for st in stmts:
        if isinstance(st, (ast.For, ast.If, ast.While)):
            st.body = _yield_while_blocked(st.body)
            st.orelse = _yield_while_blocked(st.orelse)
        call = st.value if isinstance(st, ast.Expr) else None
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "barrier_wait":
            call.func.attr = "must_wait"
            st = ast.copy_location(ast.While(test=call, body=[ast.Expr(ast.Yield())], orelse=[]), st)
        out.append(st)
    return out


def load_emulated(source: str, trace: Trace) -> dict:
    """Execute a rendered module's text in a namespace whose ``T`` is the numpy stand-in."""
    tree = _Rewrite().visit(ast.parse(source))
    ast.fix_missing_locations(tree)
    ns: dict[str, Any] = {"T": FakeT(trace), "__name__": "superopt_emulated"}
    exec(compile(tree, "<rendered TileLang>", "exec"), ns)  # noqa: S102 - our own rendered source
    return ns


# --- running a plan --------------------------------------------------------------------

@dataclass
class Emulation:
    outputs: dict[str, np.ndarray]
    traces: dict[str, Trace]


def emulate(plan: Plan, inputs: dict[str, np.ndarray], config: dict | None = None,
            source: str | None = None, target: CompileTarget | None = None) -> Emulation:
    """Run the rendered kernels of ``plan`` (or ``source``, a rendering of it) on numpy; inputs by
    graph input name, in the plan's axis order (merged axes may come unmerged: they are reshaped).
    ``target``: the compile target the plan is rendered for when no ``source`` is given."""
    cfg = resolve_config(plan, config)
    traces: dict[str, Trace] = {}
    tensors: dict[str, Tile] = {}
    scratch = Trace(on=False)
    for t in plan.tensors:
        if t.role == "input":
            data = round_to(np.asarray(inputs[t.name], dtype=np.float32), t.dtype).copy()
        else:
            data = np.full(t.shape, np.nan, dtype=np.float32)
        tensors[t.name] = Tile(t.name, data.reshape(t.shape), t.dtype, "global", scratch)
    source = render(plan, target) if source is None else source
    written: set[str] = set()
    for k_name, _build, args in load_emulated(source, Trace())["KERNELS"]:
        trace = traces[k_name] = Trace(earlier=frozenset(written))
        ns = load_emulated(source, trace)
        build = next(b for n, b, _ in ns["KERNELS"] if n == k_name)
        func = build(**cfg[k_name])
        for a in args:
            tensors[a].trace = trace
        func(*(tensors[a] for a in args))
        if trace.waits and trace.early:  # launched dependently: it may run beside the kernels ahead
            raise EmulationError(f"kernel {k_name!r}: {trace.early}")
        written |= {a for a in args if tensors[a].written}
    view = view_of(plan)  # outputs in source axis names, as executor.execute gives them
    return Emulation({t.name: to_source_layout(tensors[t.name].data, t.axes, view.source_axes(t.axes),
                                               view).astype(np.float64)
                      for t in plan.tensors if t.role == "output"}, traces)


def execute_rendered(plan: Plan, inputs: dict[str, np.ndarray], config: dict | None = None) -> dict[str, np.ndarray]:
    """``executor.execute``'s signature, for ``verify.verify_executor``: the rendered source's outputs."""
    return emulate(plan, inputs, config).outputs


def rendered_executor(target: CompileTarget):
    """``execute_rendered`` for the source rendered for ``target``."""

    def run(plan: Plan, inputs: dict[str, np.ndarray], config: dict | None = None) -> dict[str, np.ndarray]:
        return emulate(plan, inputs, config, target=target).outputs

    return run
