"""The op table of the frontend: what each PyTorch op means in the graph IR.

Elementwise ops and reductions are read from the IR's own op table
(``ir.ops``: their PyTorch forms); contractions, normalisations, attention and
views are translated here. Everything else raises ``Unmappable``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from pyrunner.frontend.trace import (
    AxisConflict,
    RegionTrace,
    Value,
    fx_node_type,
    is_tensor,
    unmappable,
)
from pyrunner.ir import graph as ir
from pyrunner.ir import ops


def new_trace(meta: Callable[[Any], Any]) -> RegionTrace:
    """An empty region that translates nodes with this op table."""
    return RegionTrace(meta, translate)


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
    fx_node = fx_node_type()
    if isinstance(x, fx_node):
        if x in rt.values:
            return x
        ex = rt.meta(x)
        return x if is_tensor(ex) else ex
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
    for kw in ("rounding_mode", "out"):
        if a.kwargs.get(kw) is not None:
            raise unmappable(node, f"{kw}= has no graph-IR meaning")
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

