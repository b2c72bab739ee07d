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
gemms, reductions, fills, map writes) and the buffers it allocates, which ``structure_problems``
compares with the plan op by op. It does not model TileLang's own lowering (layouts, warp
partition, pipelining): that still needs the GPU sweep.
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pyrunner.backend.tilelang.render import render
from pyrunner.errors import PlanError
from pyrunner.plan.analysis import resolve_config
from pyrunner.plan.schema import Fill, Gemm, Load, Map, Plan, Reduce, Store
from pyrunner.run.executor import round_to


class EmulationError(PlanError):
    """The rendered source does something the emulator (or TileLang) would reject."""


# --- tiles ----------------------------------------------------------------------

class Tile:
    """A global tensor or an on-chip buffer: float32 storage rounded to ``dtype`` on every write."""

    def __init__(self, name: str, data: np.ndarray, dtype: str, scope: str, trace: Trace) -> None:
        self.name, self.data, self.dtype, self.scope, self.trace = name, data, dtype, scope, trace

    def __getitem__(self, idx: Any) -> Any:
        idx = idx if isinstance(idx, tuple) else (idx,)
        if any(isinstance(i, slice) for i in idx):
            return Region(self, idx)
        if idx == () and self.data.ndim == 0:
            return self.data[()]
        return self.data[idx]

    def __setitem__(self, idx: Any, value: Any) -> None:
        idx = idx if isinstance(idx, tuple) else (idx,)
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


def _name(x: Any) -> str:
    return x.tile.name if isinstance(x, Region) else x.name


# --- the trace --------------------------------------------------------------------

@dataclass
class Trace:
    """Events of the first block of the kernel being run, and its buffer allocations."""

    events: list[tuple] = field(default_factory=list)
    allocs: list[tuple[str, tuple, str, str]] = field(default_factory=list)
    on: bool = True

    def add(self, *event: Any) -> None:
        if self.on:
            self.events.append(event)

    def write(self, tile: Tile, how: str) -> None:
        if self.on and tile.scope != "global":
            self.events.append((how, tile.name))


# --- the numpy stand-in for tilelang.language ----------------------------------------

_NP_DTYPES = {"float16": np.float32, "bfloat16": np.float32, "float32": np.float32}


class _Policy:
    FullRow, FullCol, Square = "FullRow", "FullCol", "Square"


class FakeT:
    """The subset of ``tilelang.language`` the renderer emits, on numpy."""

    GemmWarpPolicy = _Policy

    def __init__(self, trace: Trace) -> None:
        self.trace = trace

    # declarations
    def prim_func(self, f=None, **_: Any):
        return f if f is not None else (lambda g: g)

    def Tensor(self, shape, dtype):  # noqa: N802 - TileLang's name
        return (shape, dtype)

    def Kernel(self, *extents, threads=None, **_: Any):  # noqa: N802
        """Every block in turn (rewritten from ``with``); the trace keeps the first block only."""
        for i, coords in enumerate(itertools.product(*(range(int(e)) for e in extents))):
            self.trace.on = i == 0
            yield coords[0] if len(coords) == 1 else coords
        self.trace.on = True

    def Pipelined(self, n, num_stages=None, **_: Any):  # noqa: N802
        return range(int(n))

    def serial(self, n):
        return range(int(n))

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

    # data movement and compute
    def copy(self, src, dst, **_: Any) -> None:
        s = _vals(src)
        d_shape = _vals(dst).shape
        if s.shape != d_shape:
            raise EmulationError(f"T.copy from {_name(src)!r} {s.shape} to {_name(dst)!r} {d_shape}: shapes differ")
        region = src.bounds() if isinstance(src, Region) else dst.bounds() if isinstance(dst, Region) else None
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

    def visit_Assign(self, node: ast.Assign):  # noqa: N802
        v = node.value
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and isinstance(v, ast.Call) \
                and isinstance(v.func, ast.Attribute) and v.func.attr in ("alloc_shared", "alloc_fragment"):
            v.keywords.append(ast.keyword(arg="_name", value=ast.Constant(node.targets[0].id)))
        return node


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
            source: str | None = None) -> Emulation:
    """Run the rendered kernels of ``plan`` (or ``source``, a rendering of it) on numpy; inputs by
    graph input name, in the plan's axis order."""
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
    source = render(plan) if source is None else source
    for k_name, _build, args in load_emulated(source, Trace())["KERNELS"]:
        trace = traces[k_name] = Trace()
        ns = load_emulated(source, trace)
        build = next(b for n, b, _ in ns["KERNELS"] if n == k_name)
        func = build(**cfg[k_name])
        for a in args:
            tensors[a].trace = trace
        func(*(tensors[a] for a in args))
    return Emulation({t.name: tensors[t.name].data.astype(np.float64) for t in plan.tensors if t.role == "output"},
                     traces)


def execute_rendered(plan: Plan, inputs: dict[str, np.ndarray], config: dict | None = None) -> dict[str, np.ndarray]:
    """``executor.execute``'s signature, for ``verify.verify_executor``: the rendered source's outputs."""
    return emulate(plan, inputs, config).outputs


# --- op-by-op agreement with the plan ----------------------------------------------------

def _expected_events(plan: Plan, k, cfg: dict[str, int]) -> list[tuple]:
    steps = 1
    if k.loop is not None:
        size = next(n for t in plan.tensors for a, n in zip(t.axes, t.shape, strict=True) if a == k.loop.axis)
        block = cfg[k.loop.block] if isinstance(k.loop.block, str) else k.loop.block
        steps = size // block
    scalars = {t.name for t in plan.tensors if not t.axes}
    out: list[tuple] = []
    for ops, times in ((k.prologue, 1), (k.body, steps), (k.epilogue, 1)):
        for _ in range(times):
            for op in ops:
                if isinstance(op, Load):  # a scalar tensor is copied by an element assignment
                    out.append(("copy", op.src, op.dst) if op.src not in scalars else ("map", op.dst))
                elif isinstance(op, Store):
                    if op.dst not in scalars:
                        out.append(("copy", op.src, op.dst))
                elif isinstance(op, Fill):
                    out.append(("fill", op.dst))
                elif isinstance(op, Gemm):
                    out.append(("gemm", op.a, op.b, op.c))
                elif isinstance(op, Reduce):
                    out.append(("reduce", op.fn, op.src, op.dst))
                elif isinstance(op, Map):
                    out.append(("map", op.dst))
    return out


def structure_problems(plan: Plan, em: Emulation, config: dict | None = None) -> list[str]:
    """Where the rendered source's first block disagrees with the plan: buffers (shape, dtype, scope),
    the sequence of ops (loads, stores, fills, gemms, reductions, map writes; the renderer's layout
    bridge copies aside), the global region each copy touches and the dim each reduction takes."""
    cfg = resolve_config(plan, config)
    problems: list[str] = []
    sizes = {a: n for t in plan.tensors for a, n in zip(t.axes, t.shape, strict=True)}
    for k in plan.kernels:
        tr = em.traces[k.name]
        kc = cfg[k.name]
        blocks = {g.axis: (kc[g.block] if isinstance(g.block, str) else g.block) for g in k.grid}
        if k.loop is not None:
            blocks[k.loop.axis] = kc[k.loop.block] if isinstance(k.loop.block, str) else k.loop.block
        ident: dict[str, str] = {}
        for b, (name, shape, dtype, scope) in zip(k.buffers, tr.allocs, strict=False):
            want = tuple(blocks[a] for a in b.axes) or (1,)
            ident[name] = b.name
            if (shape, dtype, scope) != (want, b.dtype, b.scope):
                problems.append(f"{k.name}: buffer {b.name!r} rendered as {scope} {dtype} {shape}, "
                                f"plan says {b.scope} {b.dtype} {want}")
        if len(tr.allocs) < len(k.buffers):
            problems.append(f"{k.name}: {len(tr.allocs)} buffers allocated, the plan has {len(k.buffers)}")
        bridges = {name for name, *_ in tr.allocs[len(k.buffers):]}
        got: list[tuple] = []
        seen: dict[str, int] = {}
        for ev in tr.events:
            if ev[0] == "copy" and (ev[2] in bridges or ev[1] in bridges):
                continue
            ev = tuple(ident.get(x, x) if isinstance(x, str) else x for x in ev)
            if ev[0] == "reduce":
                src = next(b for b in k.buffers if b.name == ev[2])
                op = next(o for o in k.prologue + k.body + k.epilogue if isinstance(o, Reduce) and o.src == ev[2]
                          and o.dst == ev[3])
                if src.axes.index(op.axis) != ev[4]:
                    problems.append(f"{k.name}: reduction of {ev[2]!r} over dim {ev[4]}, plan reduces axis "
                                    f"{op.axis!r} = dim {src.axes.index(op.axis)}")
                ev = ev[:4]
            if ev[0] == "copy":
                problems += _region_problems(plan, k, ev, blocks, sizes, seen)
                ev = ev[:3]
            got.append(ev)
        want = _expected_events(plan, k, kc)
        if got != want:
            i = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            problems.append(f"{k.name}: op {i} of the first block is {got[i] if i < len(got) else 'missing'}, "
                            f"the plan says {want[i] if i < len(want) else 'nothing more'}")
    return problems


def _region_problems(plan: Plan, k, ev: tuple, blocks: dict[str, int], sizes: dict[str, int],
                     seen: dict[str, int]) -> list[str]:
    """The first block (every grid coordinate 0) touches tile 0 of each tiled grid axis, the whole
    extent of a held axis, element 0 of an indexed one, and step ``i`` of the loop axis on the
    ``i``-th copy of that tensor in the loop."""
    tensors = {t.name: t for t in plan.tensors}
    g = ev[1] if ev[1] in tensors else ev[2]
    region = ev[3]
    t = tensors.get(g)
    if t is None or region is None or not t.axes:
        return []
    if len(region) != len(t.axes):
        return [f"{k.name}: copy of {g!r} indexes {len(region)} dims, the tensor has {len(t.axes)}"]
    loop = k.loop.axis if k.loop is not None else None
    per_step = sum(1 for op in k.body if isinstance(op, (Load, Store)) and g in (op.src, op.dst))
    step = 0
    if loop in t.axes and per_step:
        step = seen.get(g, 0) // per_step
        seen[g] = seen.get(g, 0) + 1
    out = []
    for a, r in zip(t.axes, region, strict=True):
        b = blocks.get(a, sizes[a])
        want: tuple[int, int] | int = 0 if b == 1 and a != loop else ((step * b, (step + 1) * b) if a == loop
                                                                      else (0, b))
        if r != want and not (isinstance(want, int) and r == (0, 1)):
            out.append(f"{k.name}: copy of {g!r} along axis {a!r} touches {r} in the first block, expected {want}")
    return out

