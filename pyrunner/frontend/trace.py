"""Translate PyTorch FX nodes into graph-IR terms over named axes.

PyTorch broadcasts by position, the graph IR by axis name. Every dimension of
a value gets an axis *variable*; an op that pairs two dimensions (broadcasting,
a contraction, a batch dimension) unifies their variables; size-1 dimensions
carry no axis (``None``). Names are given at the end, per equivalence class.
A value that would hold one axis twice (``x @ x.T``, or scores of
self-attention whose queries and keys come from the same tokens) raises
``AxisConflict``: the partitioner then starts a new region where the operands
are fresh inputs with axes of their own.

Each use of a region input gets fresh variables (positional semantics puts
back every constraint that matters), so one tensor may enter a graph under
two axis names (``X`` and ``X_1``) where the computation needs that.

Anything without a faithful IR meaning raises ``Unmappable`` naming the op and
the user's source line. The op table itself is ``torchops``; naming axes and
building the checked graph of a region is ``region``.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyrunner.frontend.errors import FrontendError
from pyrunner.ir import graph as ir
from pyrunner.ir.graph import Term
from pyrunner.ir.ops import BINARY

Dims = tuple[str | None, ...]


class Unmappable(FrontendError):
    """An FX node the graph IR cannot express; the message names the op and the source line."""


class AxisConflict(Exception):
    """A value would carry one axis twice: the region must be cut before this node."""


@dataclass(frozen=True)
class Value:
    """A tensor in a region: its term and one axis variable (or None for size 1) per dimension."""

    term: Term
    dims: Dims


# --- where a node came from ------------------------------------------------------

def op_name(node: Any) -> str:
    """``torch.matmul``, ``Tensor.softmax``, ``nn.Linear`` ... for messages."""
    t = node.target
    if node.op == "call_method":
        return f"Tensor.{t}"
    if node.op == "call_module":
        return f"module {t!r}"
    mod = getattr(t, "__module__", None) or ""
    name = getattr(t, "__name__", str(t))
    if mod in ("_operator", "operator"):
        return f"operator.{name}"
    if mod.startswith("torch"):
        return f"{mod.replace('torch._C._nn', 'torch.nn.functional').replace('torch._C._VariableFunctions', 'torch')}" \
               f".{name}"
    return f"{mod}.{name}" if mod else name


def where(node: Any) -> str:
    """The user's source line of a node (``file.py:12 `y = f(x)```), or the FX node name."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', trace)
    if frames:
        path, line, fn, code = frames[-1]
        return f"{path.rsplit('/', 1)[-1]}:{line} in {fn}: `{code.strip()}`"
    return f"FX node {node.name!r}"


def unmappable(node: Any, why: str) -> Unmappable:
    return Unmappable(f"cannot map {op_name(node)} ({where(node)}) to the graph IR: {why}")


# --- axis variables -----------------------------------------------------------------

@dataclass
class Axes:
    """Union-find over axis variables, each with its extent.

    A class may be *refined* into parts (``parts``): a view that splits ``[t, heads * head_dim]`` into
    ``[t, heads, head_dim]`` gives the hidden axis the parts (heads, head_dim), row-major; a view that
    merges axes gives the merged dimension a new variable whose parts are those axes. Unifying two
    classes aligns their parts (splitting a part where the other side is finer), so the graph IR,
    which names only unrefined axes (the *leaves*), sees one consistent set of axes per region.
    """

    parent: dict[str, str] = field(default_factory=dict)
    size: dict[str, int] = field(default_factory=dict)
    parts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    count: int = 0

    def fresh(self, n: int) -> str:
        v = f"_v{self.count}"
        self.count += 1
        self.parent[v] = v
        self.size[v] = n
        return v

    def find(self, v: str) -> str:
        while self.parent[v] != v:
            self.parent[v] = self.parent[self.parent[v]]
            v = self.parent[v]
        return v

    def leaves(self, v: str) -> list[str]:
        """The unrefined classes ``v`` stands for, outermost first."""
        r = self.find(v)
        if r in self.parts:
            return [leaf for p in self.parts[r] for leaf in self.leaves(p)]
        return [r]

    def refine(self, v: str, extents: tuple[int, ...]) -> tuple[str, ...]:
        """Split the unrefined class of ``v`` into parts of these extents (row-major)."""
        r = self.find(v)
        if r in self.parts or math.prod(extents) != self.size[r] or any(n < 2 for n in extents):
            raise AxisConflict(f"cannot split an axis of {self.size[r]} into {extents}")
        ch = tuple(self.fresh(n) for n in extents)
        self.parts[r] = ch
        return ch

    def compose(self, vs: list[str]) -> str:
        """A new variable standing for the axes ``vs`` merged (row-major)."""
        if len(vs) == 1:
            return vs[0]
        v = self.fresh(math.prod(self.size[self.find(x)] for x in vs))
        self.parts[v] = tuple(vs)
        return v

    def unify(self, a: str, b: str) -> str:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return ra
        if self.size[ra] != self.size[rb]:
            raise AxisConflict(f"extents {self.size[ra]} and {self.size[rb]} meet")
        if ra in self.parts or rb in self.parts:
            self._align(self.leaves(ra), self.leaves(rb))
            ra, rb = self.find(ra), self.find(rb)
            if ra == rb:
                return ra
            if rb in self.parts and ra not in self.parts:
                ra, rb = rb, ra
        self.parent[rb] = ra
        return ra

    def _align(self, la: list[str], lb: list[str]) -> None:
        """Unify two sequences of leaves of equal total extent, splitting leaves to a common refinement."""
        la, lb = list(la), list(lb)
        while la and lb:
            x, y = self.find(la[0]), self.find(lb[0])
            if x == y:
                la.pop(0)
                lb.pop(0)
                continue
            sx, sy = self.size[x], self.size[y]
            if sx == sy:
                self.parent[y] = x
                la.pop(0)
                lb.pop(0)
            elif sx > sy and sx % sy == 0:
                la[0:1] = list(self.refine(x, (sy, sx // sy)))
            elif sy > sx and sy % sx == 0:
                lb[0:1] = list(self.refine(y, (sx, sy // sx)))
            else:
                raise AxisConflict(f"axes of {sx} and {sy} do not nest")
        if la or lb:
            raise AxisConflict("axes of different total extent")


# --- one region's translation ---------------------------------------------------------

@dataclass
class InputUse:
    """One use of a tensor from outside the region: the IR input it becomes."""

    node: Any
    dims: Dims


@dataclass
class RegionTrace:
    """Terms of the nodes of one region, built node by node (``add``), rolled back on conflict."""

    meta: Callable[[Any], Any]
    """node -> its example value (a tensor, or a Python value for shape arithmetic)."""
    translate: Callable[[RegionTrace, Any], Value]
    """The op table (``torchops.translate``): one FX node -> its value in this region."""
    axes: Axes = field(default_factory=Axes)
    values: dict[Any, Value] = field(default_factory=dict)
    uses: list[InputUse] = field(default_factory=list)
    nodes: list[Any] = field(default_factory=list)
    inner: list[Dims] = field(default_factory=list)
    """Dims of intermediate values that no node names (a softmax's scores, say): checked like the rest."""

    def snapshot(self) -> RegionTrace:
        return RegionTrace(self.meta, self.translate, copy.deepcopy(self.axes), dict(self.values), list(self.uses),
                           list(self.nodes), list(self.inner))

    # operands
    def tensor(self, arg: Any, node: Any) -> Value | float:
        """The region value of an operand: a term of the region, a fresh input use, or a constant."""
        fx_node = fx_node_type()
        if isinstance(arg, fx_node):
            if arg in self.values:
                return self.values[arg]
            ex = self.meta(arg)
            if not is_tensor(ex):
                return self.tensor(ex, node)
            if ex.dim() == 0:
                raise unmappable(node, f"operand {arg.name!r} is a 0-dim tensor; the graph IR needs named axes")
            dims = tuple(None if n == 1 else self.axes.fresh(int(n)) for n in ex.shape)
            use = InputUse(arg, dims)
            self.uses.append(use)
            if all(d is None for d in dims):
                raise unmappable(node, f"operand {arg.name!r} has only size-1 dimensions")
            return Value(ir.inp(f"__use{len(self.uses) - 1}", [d for d in dims if d]), dims)
        if isinstance(arg, bool) or not isinstance(arg, (int, float)):
            raise unmappable(node, f"operand {arg!r} is neither a tensor nor a number")
        return float(arg)

    def add(self, node: Any) -> None:
        """Translate ``node`` into the region (AxisConflict / Unmappable leave the region unusable)."""
        value = self.translate(self, node)
        self.values[node] = value
        self.nodes.append(node)
        ex = self.meta(node)
        if tuple(ex.shape) != tuple(self.extent(d) for d in value.dims):
            raise unmappable(node, f"internal: traced shape {tuple(ex.shape)} but the translation gives "
                                   f"{tuple(self.extent(d) for d in value.dims)}")
        self.check_distinct()

    def extent(self, d: str | None) -> int:
        return 1 if d is None else self.axes.size[self.axes.find(d)]

    def check_distinct(self) -> None:
        dims_lists = [v.dims for v in self.values.values()] + [u.dims for u in self.uses] + self.inner
        for dims in dims_lists:
            roots = self.leaf_axes(dims)
            if len(set(roots)) != len(roots):
                raise AxisConflict("a value would hold one axis twice")

    def leaf_axes(self, dims: Dims) -> list[str]:
        """The unrefined axes of a value's dims, in order (size-1 dims have none)."""
        return [leaf for d in dims if d for leaf in self.axes.leaves(d)]

    # value helpers
    def lift(self, x: Value | float) -> Value:
        return x if isinstance(x, Value) else Value(ir.const(x), ())

    def broadcast(self, a: Dims, b: Dims) -> Dims:
        n = max(len(a), len(b))
        a = (None,) * (n - len(a)) + a
        b = (None,) * (n - len(b)) + b
        out = []
        for x, y in zip(a, b, strict=True):
            if x is None or y is None:
                out.append(x if y is None else y)
            else:
                out.append(self.axes.unify(x, y))
        return tuple(out)

    def binary(self, fn: str, a: Value | float, b: Value | float) -> Value:
        if not isinstance(a, Value) and not isinstance(b, Value):
            raise AxisConflict("binary op of two numbers")  # pragma: no cover - folded before
        va, vb = self.lift(a), self.lift(b)
        dims = self.broadcast(va.dims, vb.dims)  # unifies the operands' axes first
        if (isinstance(a, Value) and isinstance(b, Value) and BINARY[fn].commutative
                and set(self.leaf_axes(va.dims)) < set(self.leaf_axes(vb.dims))):
            # the result's axes follow the first operand's: weight[j] * x[i, j] is stored [i, j], as x is,
            # not [j, i] (a transposed region output PyTorch then copies back); only a broadcast operand moves
            va, vb = vb, va
        return self.made(Value(ir.binary(fn, va.term, vb.term), dims))

    def made(self, v: Value) -> Value:
        """Record a new value's dims and refuse it at once if it holds one axis twice."""
        self.inner.append(v.dims)
        roots = self.leaf_axes(v.dims)
        if len(set(roots)) != len(roots):
            raise AxisConflict("a value would hold one axis twice")
        return v

    def unary(self, fn: str, x: Value) -> Value:
        return Value(ir.unary(fn, x.term), x.dims)

    def reduce(self, fn: str, x: Value, dim: int, keepdim: bool) -> Value:
        i = dim % len(x.dims)
        d = x.dims[i]
        dims = x.dims[:i] + ((None,) if keepdim else ()) + x.dims[i + 1:]
        if d is None:
            return Value(x.term, dims)
        return Value(ir.reduce(fn, x.term, d), dims)

    def contract(self, a: Value, b: Value, da: str | None, db: str | None, out: Dims) -> Value:
        """Sum over the paired dims ``da`` of a and ``db`` of b; ``out`` the result's dims."""
        if da is None and db is None:
            return self.made(Value(ir.binary("mul", a.term, b.term), out))
        if da is None or db is None:
            raise AxisConflict("contraction of a size-1 dimension with a larger one")
        c = self.axes.unify(da, db)
        return self.made(Value(ir.matmul(a.term, b.term, c), out))


def fx_node_type():
    import torch.fx

    return torch.fx.Node


def is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)
