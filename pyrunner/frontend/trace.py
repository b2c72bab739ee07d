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
the user's source line.
"""

from __future__ import annotations

import copy
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyrunner.frontend.errors import FrontendError
from pyrunner.ir import graph as ir
from pyrunner.ir import ops
from pyrunner.ir.graph import Graph, Term, check

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
    """Union-find over axis variables, each with its extent."""

    parent: dict[str, str] = field(default_factory=dict)
    size: dict[str, int] = field(default_factory=dict)
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

    def unify(self, a: str, b: str) -> str:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            if self.size[ra] != self.size[rb]:
                raise AxisConflict(f"extents {self.size[ra]} and {self.size[rb]} meet")
            self.parent[rb] = ra
        return ra


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
    axes: Axes = field(default_factory=Axes)
    values: dict[Any, Value] = field(default_factory=dict)
    uses: list[InputUse] = field(default_factory=list)
    nodes: list[Any] = field(default_factory=list)
    inner: list[Dims] = field(default_factory=list)
    """Dims of intermediate values that no node names (a softmax's scores, say): checked like the rest."""

    def snapshot(self) -> RegionTrace:
        return RegionTrace(self.meta, copy.deepcopy(self.axes), dict(self.values), list(self.uses), list(self.nodes),
                           list(self.inner))

    # operands
    def tensor(self, arg: Any, node: Any) -> Value | float:
        """The region value of an operand: a term of the region, a fresh input use, or a constant."""
        fx_node = _fx_node_type()
        if isinstance(arg, fx_node):
            if arg in self.values:
                return self.values[arg]
            ex = self.meta(arg)
            if not _is_tensor(ex):
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
        value = translate(self, node)
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
            roots = [self.axes.find(d) for d in dims if d]
            if len(set(roots)) != len(roots):
                raise AxisConflict("a value would hold one axis twice")

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
        return self.made(Value(ir.binary(fn, va.term, vb.term), self.broadcast(va.dims, vb.dims)))

    def made(self, v: Value) -> Value:
        """Record a new value's dims and refuse it at once if it holds one axis twice."""
        self.inner.append(v.dims)
        roots = [self.axes.find(d) for d in v.dims if d]
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


def _fx_node_type():
    import torch.fx

    return torch.fx.Node


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


# --- the op table ------------------------------------------------------------------------

def _torch_names() -> tuple[dict[str, str], dict[str, str]]:
    """PyTorch function/method/operator name -> IR op, read from the op table's PyTorch forms."""
    unary: dict[str, str] = {}
    for op in ops.UNARY.values():
        m = re.fullmatch(r"(?:torch|F)\.(\w+)\(\{0\}\)", op.torch)
        if m:
            unary[m.group(1)] = op.name
    binary: dict[str, str] = {}
    infix = {"+": ("add",), "-": ("sub",), "*": ("mul",), "/": ("truediv", "div")}
    for op in ops.BINARY.values():
        m = re.fullmatch(r"\{0\} (\S) \{1\}", op.torch) or re.fullmatch(r"torch\.(\w+)\(\{0\}, \{1\}\)", op.torch)
        if not m:
            continue
        for name in infix.get(m.group(1), (m.group(1),)):
            for form in (name, f"i{name}", f"r{name}"):  # x += y, 1 - x
                binary[form] = op.name
    return unary, binary


UNARY, BINARY = _torch_names()
REDUCE = {m.group(1): r.name for r in ops.REDUCTIONS.values()
          if (m := re.fullmatch(r"\{0\}\.(\w+)\(dim=\{1\}\)", r.torch))}
"""Tensor method name -> IR reduction (``amax`` -> ``max``), from the op table's PyTorch forms."""
REVERSED = {"rsub", "rtruediv", "rdiv"}
IDENTITY = {"contiguous", "clone", "detach", "to", "float", "half", "bfloat16", "type", "type_as", "identity"}
POW = {2.0: "square", 0.5: "sqrt", -0.5: "rsqrt", -1.0: "recip"}
MODULES = {
    "Linear": "linear", "RMSNorm": "rms_norm", "LayerNorm": "layer_norm", "SiLU": "silu", "ReLU": "relu",
    "Sigmoid": "sigmoid", "Tanh": "tanh", "GELU": "gelu", "Softmax": "softmax", "Identity": "identity",
    "Dropout": "dropout",
}


def target_name(node: Any) -> str:
    """The op-table key of a node: function or method name (``linear``, ``softmax``, ``add``...)."""
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_module":
        return "module"
    return getattr(node.target, "__name__", str(node.target))


class _Args:
    """Positional-or-keyword access to a node's (already resolved) arguments."""

    def __init__(self, args: tuple, kwargs: dict) -> None:
        self.args, self.kwargs = args, kwargs

    def get(self, i: int, name: str, default: Any = None) -> Any:
        if i < len(self.args):
            return self.args[i]
        return self.kwargs.get(name, default)


def _resolve(rt: RegionTrace, x: Any) -> Any:
    """Replace FX nodes that are Python values (shape arithmetic) by their values, recursively."""
    fx_node = _fx_node_type()
    if isinstance(x, fx_node):
        if x in rt.values:
            return x
        ex = rt.meta(x)
        return x if _is_tensor(ex) else ex
    if isinstance(x, (list, tuple)):
        return type(x)(_resolve(rt, y) for y in x)
    if isinstance(x, dict):
        return {k: _resolve(rt, v) for k, v in x.items()}
    return x


def _ints(x: Any) -> list[int]:
    if isinstance(x, int):
        return [x]
    return [int(v) for v in x]


def translate(rt: RegionTrace, node: Any) -> Value:
    """The region value of one FX node (which must produce a tensor)."""
    if node.op == "call_module":
        return _translate_module(rt, node)
    if node.op not in ("call_function", "call_method"):
        raise unmappable(node, f"FX op kind {node.op!r} is not a computation")
    a = _Args(_resolve(rt, node.args), _resolve(rt, node.kwargs))
    name = target_name(node)
    return _dispatch(rt, node, name, a)


def _translate_module(rt: RegionTrace, node: Any) -> Value:
    mod = node.graph.owning_module.get_submodule(node.target)
    kind = MODULES.get(type(mod).__name__)
    if kind is None:
        raise unmappable(node, f"module type {type(mod).__name__} is not in the op table (trace into it instead)")
    raise unmappable(node, f"module {type(mod).__name__} was kept as a leaf; trace with pyrunner.frontend's "
                           f"tracer, which traces into it")


def _tv(rt: RegionTrace, node: Any, x: Any) -> Value:
    v = rt.tensor(x, node)
    if not isinstance(v, Value):
        raise unmappable(node, "expected a tensor operand")
    return v


def _dispatch(rt: RegionTrace, node: Any, name: str, a: _Args) -> Value:  # noqa: C901 - one table
    x0 = a.get(0, "input", a.get(0, "self"))
    if name in UNARY:
        return rt.unary(UNARY[name], _tv(rt, node, x0))
    if name in BINARY:
        lhs, rhs = rt.tensor(x0, node), rt.tensor(a.get(1, "other"), node)
        alpha = a.kwargs.get("alpha", 1)
        if alpha != 1:
            raise unmappable(node, f"alpha={alpha} is not supported")
        if name in REVERSED:
            lhs, rhs = rhs, lhs
        return rt.binary(BINARY[name], lhs, rhs)
    if name in IDENTITY:
        return _tv(rt, node, x0)
    if name == "gelu":
        approx = a.get(1, "approximate", "none")
        if approx != "tanh":
            raise unmappable(node, "the op table's gelu is the tanh approximation; call "
                                   "F.gelu(x, approximate='tanh')")
        return rt.unary("gelu", _tv(rt, node, x0))
    if name == "dropout":
        p, training = a.get(1, "p", 0.5), a.get(2, "training", True)
        if p and training:
            raise unmappable(node, "dropout in training mode is random; call model.eval()")
        return _tv(rt, node, x0)
    if name == "pow":
        base, e = rt.tensor(x0, node), a.get(1, "exponent")
        if not isinstance(base, Value) or not isinstance(e, (int, float)) or float(e) not in POW and e != 1:
            raise unmappable(node, f"only x ** {sorted(POW)} (and 1) with a number exponent map to the op table")
        return base if e == 1 else rt.unary(POW[float(e)], base)
    if name in ("clamp", "clamp_min", "clamp_max"):
        x = _tv(rt, node, x0)
        lo = a.get(1, "min") if name != "clamp_max" else None
        hi = a.get(2, "max") if name == "clamp" else (a.get(1, "max") if name == "clamp_max" else None)
        if lo is not None:
            x = rt.binary("max", x, rt.tensor(lo, node))
        if hi is not None:
            x = rt.binary("min", x, rt.tensor(hi, node))
        return x
    if name in REDUCE:
        return _reduction(rt, node, name, a)
    if name in ("matmul", "mm", "bmm"):
        return _matmul(rt, _tv(rt, node, x0), _tv(rt, node, a.get(1, "other", a.get(1, "mat2"))))
    if name == "linear":
        x, w, b = _tv(rt, node, x0), _tv(rt, node, a.get(1, "weight")), a.get(2, "bias")
        if len(w.dims) != 2:
            raise unmappable(node, "linear needs a 2-D weight")
        y = rt.contract(x, w, x.dims[-1], w.dims[-1], x.dims[:-1] + (w.dims[0],))
        return y if b is None else rt.binary("add", y, rt.tensor(b, node))
    if name == "einsum":
        return _einsum(rt, node, a)
    if name == "softmax":
        x = _tv(rt, node, x0)
        dim = a.get(1, "dim")
        if dim is None:
            raise unmappable(node, "softmax needs dim=")
        return _softmax(rt, node, x, int(dim))
    if name == "rms_norm":
        return _norm(rt, node, a, layer=False)
    if name == "layer_norm":
        return _norm(rt, node, a, layer=True)
    if name == "scaled_dot_product_attention":
        return _sdpa(rt, node, a)
    if name in ("transpose", "swapaxes"):
        x = _tv(rt, node, x0)
        i, j = (int(a.get(1, "dim0")) % len(x.dims), int(a.get(2, "dim1")) % len(x.dims))
        dims = list(x.dims)
        dims[i], dims[j] = dims[j], dims[i]
        return Value(x.term, tuple(dims))
    if name == "t":
        x = _tv(rt, node, x0)
        return Value(x.term, tuple(reversed(x.dims)))
    if name == "permute":
        x = _tv(rt, node, x0)
        order = a.args[1] if len(a.args) == 2 and isinstance(a.args[1], (list, tuple)) else \
            (a.args[1:] or a.kwargs.get("dims"))
        return Value(x.term, tuple(x.dims[int(i) % len(x.dims)] for i in order))
    if name == "getattr" and a.args[1] in ("T", "mT"):
        x = _tv(rt, node, x0)
        dims = tuple(reversed(x.dims)) if a.args[1] == "T" else x.dims[:-2] + (x.dims[-1], x.dims[-2])
        return Value(x.term, dims)
    if name in ("view", "reshape", "flatten", "unsqueeze", "squeeze", "expand", "expand_as", "view_as",
                "reshape_as", "unflatten"):
        return _reshape(rt, node, _tv(rt, node, x0), tuple(rt.meta(node).shape))
    raise unmappable(node, "no such op in the graph IR's op table")


def _reduction(rt: RegionTrace, node: Any, name: str, a: _Args) -> Value:
    x = _tv(rt, node, a.get(0, "input"))
    dim = a.get(1, "dim")
    keep = bool(a.get(2, "keepdim", False))
    fn = REDUCE[name]
    dims = list(range(len(x.dims))) if dim is None or dim == [] or dim == () else [d % len(x.dims) for d in _ints(dim)]
    if not keep and len(dims) == len(x.dims):
        raise unmappable(node, "a reduction to a scalar has no axis left; the graph IR's outputs need one")
    for d in sorted(dims, reverse=True):
        x = rt.reduce(fn, x, d, keep)
    return x


def _matmul(rt: RegionTrace, a: Value, b: Value) -> Value:
    if len(a.dims) == 1 and len(b.dims) == 1:
        raise AxisConflict("dot product to a scalar")
    if len(a.dims) == 1:
        return rt.contract(a, b, a.dims[0], b.dims[-2], b.dims[:-2] + (b.dims[-1],))
    if len(b.dims) == 1:
        return rt.contract(a, b, a.dims[-1], b.dims[0], a.dims[:-1])
    batch = rt.broadcast(a.dims[:-2], b.dims[:-2])
    return rt.contract(a, b, a.dims[-1], b.dims[-2], batch + (a.dims[-2], b.dims[-1]))


def _softmax(rt: RegionTrace, node: Any, x: Value, dim: int) -> Value:
    d = x.dims[dim % len(x.dims)]
    if d is None:
        raise unmappable(node, "softmax over a size-1 dimension")
    e = rt.unary("exp", x)
    s = Value(ir.reduce("sum", e.term, d), ())
    return Value(ir.binary("div", e.term, s.term), x.dims)


def _norm(rt: RegionTrace, node: Any, a: _Args, layer: bool) -> Value:
    import torch

    x = _tv(rt, node, a.get(0, "input"))
    shape = a.get(1, "normalized_shape")
    if len(_ints(shape)) != 1:
        raise unmappable(node, "normalisation over more than one dimension")
    d = x.dims[-1]
    if d is None:
        raise unmappable(node, "normalisation over a size-1 dimension")
    weight = a.get(2, "weight")
    bias = a.get(3, "bias") if layer else None
    eps = a.get(4 if layer else 3, "eps", 1e-5 if layer else None)
    if eps is None:
        eps = torch.finfo(rt.meta(a.get(0, "input")).dtype).eps
    if layer:
        mean = ir.reduce("mean", x.term, d)
        centered = ir.binary("sub", x.term, mean)
        var = ir.reduce("mean", ir.unary("square", centered), d)
        y = Value(ir.binary("mul", centered, ir.unary("rsqrt", ir.binary("add", var, ir.const(eps)))), x.dims)
    else:
        ms = ir.reduce("mean", ir.unary("square", x.term), d)
        y = Value(ir.binary("mul", x.term, ir.unary("rsqrt", ir.binary("add", ms, ir.const(eps)))), x.dims)
    if weight is not None:
        y = rt.binary("mul", y, rt.tensor(weight, node))
    if bias is not None:
        y = rt.binary("add", y, rt.tensor(bias, node))
    return y


def _sdpa(rt: RegionTrace, node: Any, a: _Args) -> Value:
    q, k, v = (_tv(rt, node, a.get(i, n)) for i, n in enumerate(("query", "key", "value")))
    if a.get(3, "attn_mask") is not None or a.get(5, "is_causal", False):
        raise unmappable(node, "masks are not in the graph IR yet (causal attention is not expressible)")
    if a.get(4, "dropout_p", 0.0):
        raise unmappable(node, "attention dropout is random")
    if a.kwargs.get("enable_gqa"):
        raise unmappable(node, "enable_gqa: write grouped heads as their own axis instead")
    scale = a.get(6, "scale")
    e = rt.extent(q.dims[-1])
    scale = 1.0 / math.sqrt(e) if scale is None else float(scale)
    batch = rt.broadcast(q.dims[:-2], k.dims[:-2])
    s = rt.contract(q, k, q.dims[-1], k.dims[-1], batch + (q.dims[-2], k.dims[-2]))
    s = rt.binary("mul", s, scale)
    p = _softmax(rt, node, s, -1)
    batch = rt.broadcast(p.dims[:-2], v.dims[:-2])
    return rt.contract(p, v, p.dims[-1], v.dims[-2], batch + (p.dims[-2], v.dims[-1]))


def _einsum(rt: RegionTrace, node: Any, a: _Args) -> Value:
    eq = a.args[0]
    ops = a.args[1:]
    if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
        ops = tuple(ops[0])
    if not isinstance(eq, str) or "..." in eq or "->" not in eq:
        raise unmappable(node, "einsum needs an explicit '->' output and no '...'")
    lhs, out = eq.replace(" ", "").split("->")
    specs = lhs.split(",")
    if len(specs) != len(ops) or len(ops) not in (1, 2):
        raise unmappable(node, "einsum with one or two operands only")
    vals = [_tv(rt, node, o) for o in ops]
    letter: dict[str, str | None] = {}
    for spec, v in zip(specs, vals, strict=True):
        if len(set(spec)) != len(spec) or len(spec) != len(v.dims):
            raise unmappable(node, f"einsum operand {spec!r}: repeated letters (diagonals) or wrong rank")
        for ch, d in zip(spec, v.dims, strict=True):
            prev = letter.get(ch)
            if prev is None or d is None:
                letter[ch] = d if prev is None else prev
            else:
                letter[ch] = rt.axes.unify(prev, d)
    if set(out) - set(letter) or len(set(out)) != len(out):
        raise unmappable(node, f"einsum output {out!r} names a letter no operand has, or repeats one")
    # letters only one operand has and the output drops: summed out first
    for i, spec in enumerate(specs):
        others = set(out) | (set(specs[1 - i]) if len(specs) == 2 else set())
        for ch in spec:
            if ch not in others:
                v = vals[i]
                vals[i] = rt.reduce("sum", v, v.dims.index(_dim_of(rt, v, letter[ch])), False) \
                    if letter[ch] is not None else Value(v.term, tuple(x for x in v.dims))
    out_dims = tuple(letter[ch] for ch in out)
    if len(vals) == 1:
        return rt.made(Value(vals[0].term, out_dims))
    shared = [ch for ch in specs[0] if ch in specs[1] and ch not in out and letter[ch] is not None]
    rt.made(Value(vals[0].term, tuple(letter[ch] for ch in specs[0])))
    rt.made(Value(vals[1].term, tuple(letter[ch] for ch in specs[1])))
    if not shared:
        return rt.made(Value(ir.binary("mul", vals[0].term, vals[1].term), out_dims))
    shared.sort(key=lambda ch: -rt.extent(letter[ch]))  # the tile GEMM takes the longest; the rest are sums
    c = letter[shared[0]]
    term = ir.matmul(vals[0].term, vals[1].term, c)
    rt.made(Value(term, out_dims + tuple(letter[ch] for ch in shared[1:])))
    for ch in shared[1:]:
        term = ir.reduce("sum", term, letter[ch])
    return rt.made(Value(term, out_dims))


def _dim_of(rt: RegionTrace, v: Value, var: str | None) -> str | None:
    root = rt.axes.find(var) if var else None
    for d in v.dims:
        if d is not None and rt.axes.find(d) == root:
            return d
    return None  # pragma: no cover


def _reshape(rt: RegionTrace, node: Any, x: Value, shape: tuple[int, ...]) -> Value:
    """A view/reshape/squeeze/unsqueeze/expand that only adds or drops size-1 dimensions."""
    have = [d for d in x.dims if d is not None]
    want = [n for n in shape if n != 1]
    if [rt.extent(d) for d in have] != want:
        raise unmappable(node, f"reshapes {tuple(rt.extent(d) for d in x.dims)} to {shape}: only views that "
                               f"add or drop size-1 dimensions rename axes; write split axes as inputs of their "
                               f"own shape (einsum over a [d, heads, head_dim] weight, say)")
    it = iter(have)
    return Value(x.term, tuple(None if n == 1 else next(it) for n in shape))


# --- finishing a region -------------------------------------------------------------------

LETTERS = "ijklmnpqrsuvwxyzabcdefgho"


@dataclass
class RegionGraph:
    """A translated region: its IR graph and how torch tensors enter and leave it."""

    graph: Graph
    nodes: list[Any]
    inputs: list[tuple[str, Any, tuple[int, ...]]]
    """IR input name, the FX node that feeds it, the shape it is viewed as (size-1 dims dropped)."""
    outputs: list[tuple[str, Any, list[int], tuple[int, ...]]]
    """IR output name, the FX node it replaces, the permutation from IR order, the node's shape."""
    label: str = ""
    """For messages; the graph itself is named ``region`` with inputs ``in<k>`` and outputs ``out<k>``,
    so equal regions (the layers of a model, or two traces of one function) give one plan and one
    cached binary."""


def ident(name: str) -> str:
    s = re.sub(r"\W", "_", str(name)).strip("_") or "t"
    return ("t_" + s) if s[0].isdigit() else s


def finish(rt: RegionTrace, outputs: list[Any], name: str,
           axis_names: dict[str, tuple[str, ...]] | None = None) -> RegionGraph:
    """Name the axes, merge input uses that ended up alike, and build the checked IR graph."""
    _merge_uses(rt)
    names = _name_axes(rt, axis_names or {})
    final: dict[str, str] = {v: names[rt.axes.find(v)] for v in rt.axes.parent}
    # input uses: one IR input per (node, final axes)
    use_name: dict[int, str] = {}
    by_key: dict[tuple, str] = {}
    taken: set[str] = set()
    inputs: list[tuple[str, Any, tuple[int, ...]]] = []
    for i, u in enumerate(rt.uses):
        axes = tuple(final[d] for d in u.dims if d)
        key = (u.node, axes)
        if key not in by_key:
            nm = f"in{len(by_key)}"
            taken.add(nm)
            by_key[key] = nm
            inputs.append((nm, u.node, tuple(rt.extent(d) for d in u.dims if d)))
        use_name[i] = by_key[key]
    use_axes = {f"__use{i}": (use_name[i], tuple(final[d] for d in u.dims if d)) for i, u in enumerate(rt.uses)}
    memo: dict[Term, Term] = {}

    def rename(t: Term) -> Term:
        if t in memo:
            return memo[t]
        if t.op == "input":
            nm, axes = use_axes[t.name]
            out = ir.inp(nm, axes)
        else:
            out = Term(t.op, tuple(rename(x) for x in t.args), t.fn, final.get(t.axis, t.axis), t.name,
                       t.axes, t.value)
        memo[t] = out
        return out

    outs = []
    out_specs = []
    for node in outputs:
        v = rt.values[node]
        term = rename(v.term)
        nm = f"out{len(outs)}"
        have = ir.result_axes(term)
        want = tuple(final[d] for d in v.dims if d)
        if sorted(have) != sorted(want) or not have:
            raise unmappable(node, f"internal: output axes {have} but the value has {want}")
        outs.append((nm, term))
        out_specs.append((nm, node, [have.index(a) for a in want], tuple(rt.meta(node).shape)))
    sizes = {names[r]: rt.axes.size[r] for r in {rt.axes.find(v) for v in rt.axes.parent}}
    labels = {t: nm for nm, t in outs}
    g = Graph("region", sizes, tuple(outs), labels)
    check(g)
    return RegionGraph(g, list(rt.nodes), inputs, out_specs, name)


def _merge_uses(rt: RegionTrace) -> None:
    """Give later uses of one input the axes of an earlier use wherever no value then holds an axis twice."""
    first: dict[Any, list[InputUse]] = {}
    for u in rt.uses:
        for prev in first.setdefault(u.node, []):
            saved = copy.deepcopy(rt.axes)
            try:
                for a, b in zip(prev.dims, u.dims, strict=True):
                    if a is not None and b is not None:
                        rt.axes.unify(a, b)
                rt.check_distinct()
                break
            except AxisConflict:
                rt.axes = saved
        first[u.node].append(u)


def _name_axes(rt: RegionTrace, axis_names: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """Class root -> axis name: the user's names for an input's dims first, then i, j, k, ..."""
    names: dict[str, str] = {}
    used: set[str] = set()
    for u in rt.uses:
        given = axis_names.get(u.node.name) or axis_names.get(ident(u.node.name))
        if not given:
            continue
        if len(given) != len(u.dims):
            raise FrontendError(f"axes for {u.node.name!r}: {len(given)} names for {len(u.dims)} dimensions")
        for d, n in zip(u.dims, given, strict=True):
            if d is None:
                continue
            r = rt.axes.find(d)
            if r not in names and n not in used:
                if not str(n).isidentifier():
                    raise FrontendError(f"axes for {u.node.name!r}: {n!r} is not an identifier")
                names[r] = str(n)
                used.add(str(n))
    letters = iter([c for c in LETTERS if c not in used] + [f"a{i}" for i in range(1000)])
    order = [d for u in rt.uses for d in u.dims if d] + [d for v in rt.values.values() for d in v.dims if d]
    for d in order:
        r = rt.axes.find(d)
        if r not in names:
            names[r] = next(letters)
    return names


FOLDABLE: dict[str, Callable] = {"getitem": operator.getitem, "getattr": getattr}
