"""The op table of the frontend: what each PyTorch op means in the graph IR.

Elementwise ops and reductions are read from the IR's own op table
(``ir.ops``: their PyTorch forms); contractions, normalisations, attention and
views are translated here. Everything else raises ``Unmappable``.

Why one module: it is one table, an entry per PyTorch op with its translation;
split by op family, the lookup and the shared axis helpers would be spread out.
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
COMPARE = {"lt": ("lt", False), "le": ("le", False), "gt": ("lt", True), "ge": ("le", True)}
"""Comparisons (a boolean mask, 0/1 in the IR): IR op and whether the operands swap (a > b is b < a)."""
MASKED_SCORE = -(2.0 ** 100)
"""What a boolean ``attn_mask`` puts at a masked score: below any real score (its exponential is 0, as -inf's is)
but finite, so a query row whose every key is masked (left padding in a batch) has a finite softmax and its
forward and derived backward stay finite (with -inf the row is 0/0); ``_sdpa`` then gives that row 0, as
PyTorch's SDPA does. A power of two: exact in float64, float32 and bfloat16, so the log-sum-exp a backward
saves in float32 is the score's own value (-1e30 rounded in float32 made ``exp(score - lse)`` overflow)."""

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
        return ex if _plain(ex) else x
    if isinstance(x, (list, tuple)):
        return type(x)(_resolve(rt, y) for y in x)
    if isinstance(x, dict):
        return {k: _resolve(rt, v) for k, v in x.items()}
    return x


def _plain(x: Any) -> bool:
    """A Python value with no tensor in it (shape arithmetic, a dtype), which folds to a literal; the parts
    of ``split``/``chunk`` are a computation and stay a node."""
    if isinstance(x, (list, tuple)):
        return all(_plain(v) for v in x)
    return not is_tensor(x)


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
        if not isinstance(base, Value) or not isinstance(e, (int, float)) or \
                float(e) not in POW and float(e) not in (1.0, 3.0, 4.0):
            raise unmappable(node, f"only x ** {sorted({*POW, 1.0, 3.0, 4.0})} with a number exponent map to "
                                   f"the op table")
        if float(e) == 3.0:
            return rt.binary("mul", base, rt.unary("square", base))
        if float(e) == 4.0:
            return rt.unary("square", rt.unary("square", base))
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
    if name in ("view", "reshape", "flatten", "unsqueeze", "squeeze", "view_as", "reshape_as", "unflatten"):
        return _reshape(rt, node, _tv(rt, node, x0), tuple(rt.meta(node).shape))
    if name in ("expand", "expand_as", "broadcast_to"):
        return _expand(rt, node, _tv(rt, node, x0), tuple(rt.meta(node).shape))
    if name == "getitem":
        return _getitem(rt, node, a)
    if name == "cat" or name == "concat" or name == "concatenate":
        return _cat(rt, node, a)
    if name in ("invert", "logical_not", "bitwise_not") and str(rt.meta(node).dtype) == "torch.bool":
        return rt.binary("sub", 1.0, _tv(rt, node, x0))  # masks are 0/1 values in the IR
    if name in ("logical_and", "and_", "iand", "logical_or", "or_", "ior") and \
            str(rt.meta(node).dtype) == "torch.bool":
        fn = "min" if "and" in name else "max"
        return rt.binary(fn, rt.tensor(x0, node), rt.tensor(a.get(1, "other"), node))
    if name in COMPARE:
        fn, swap = COMPARE[name]
        lhs, rhs = rt.tensor(x0, node), rt.tensor(a.get(1, "other"), node)
        return rt.binary(fn, rhs, lhs) if swap else rt.binary(fn, lhs, rhs)
    if name == "where":
        c, x, y = (rt.lift(rt.tensor(a.get(i, k), node)) for i, k in enumerate(("condition", "input", "other")))
        dims = rt.broadcast(rt.broadcast(c.dims, x.dims), y.dims)
        return rt.made(Value(ir.where(c.term, x.term, y.term), dims))
    if name == "masked_fill":
        x, m = _tv(rt, node, x0), rt.lift(rt.tensor(a.get(1, "mask"), node))
        fill = rt.lift(rt.tensor(a.get(2, "value"), node))
        return rt.made(Value(ir.where(m.term, fill.term, x.term), rt.broadcast(rt.broadcast(x.dims, m.dims),
                                                                              fill.dims)))
    if name in ("addmm", "baddbmm"):
        if a.kwargs.get("beta", 1) != 1 or a.kwargs.get("alpha", 1) != 1:
            raise unmappable(node, "addmm with beta/alpha other than 1")
        y = _matmul(rt, _tv(rt, node, a.get(1, "mat1", a.get(1, "batch1"))),
                    _tv(rt, node, a.get(2, "mat2", a.get(2, "batch2"))))
        return rt.binary("add", y, rt.tensor(x0, node))
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
    """softmax(mask(q k^T * scale)) v. ``is_causal`` is the IR's index predicate (key <= query, top-left
    aligned as PyTorch's); a boolean ``attn_mask`` selects scores (-inf elsewhere), a float one is added;
    ``enable_gqa`` reads each K/V head for its group of query heads (a broadcast axis, never a copy)."""
    q, k, v = (_tv(rt, node, a.get(i, n)) for i, n in enumerate(("query", "key", "value")))
    mask = a.get(3, "attn_mask")
    if a.get(4, "dropout_p", 0.0):
        raise unmappable(node, "attention dropout is random")
    causal = bool(a.get(5, "is_causal", False))
    if a.get(7, "enable_gqa", False) and len(q.dims) >= 3 and rt.extent(q.dims[-3]) != rt.extent(k.dims[-3]):
        k, v = _shared_heads(rt, node, q, k), _shared_heads(rt, node, q, v)
    scale = a.get(6, "scale")
    e = rt.extent(q.dims[-1])
    scale = 1.0 / math.sqrt(e) if scale is None else float(scale)
    batch = rt.broadcast(q.dims[:-2], k.dims[:-2])
    s = rt.contract(q, k, q.dims[-1], k.dims[-1], batch + (q.dims[-2], k.dims[-2]))
    s = rt.binary("mul", s, scale)
    if causal:
        tq, tk = s.dims[-2], s.dims[-1]
        if tq is None or tk is None:
            if rt.extent(tk) > 1:  # one query row sees only key 0
                raise unmappable(node, "is_causal with one query row and several keys")
        else:
            keep = ir.binary("le", ir.iota(tk), ir.iota(tq))
            s = rt.made(Value(ir.where(keep, s.term, ir.const(-math.inf)), s.dims))
    kept = None
    if mask is not None:
        m = rt.lift(rt.tensor(mask, node))
        dims = rt.broadcast(s.dims, m.dims)
        if str(rt.meta(mask).dtype) == "torch.bool":
            s = rt.made(Value(ir.where(m.term, s.term, ir.const(MASKED_SCORE)), dims))
            # 1 where the row keeps a key: a row keeping none is 0 (PyTorch's SDPA), not a mean of V
            kept = rt.reduce("max", m, -1, False) if m.dims and m.dims[-1] is not None else m
        else:
            s = rt.made(Value(ir.binary("add", s.term, m.term), dims))
    p = _softmax(rt, node, s, -1)
    batch = rt.broadcast(p.dims[:-2], v.dims[:-2])
    out = rt.contract(p, v, p.dims[-1], v.dims[-2], batch + (p.dims[-2], v.dims[-1]))
    if kept is None:
        return out
    return rt.made(Value(ir.where(kept.term, out.term, ir.const(0.0)), out.dims))


def _shared_heads(rt: RegionTrace, node: Any, q: Value, kv: Value) -> Value:
    """K or V seen with the query heads' axis: that axis is (kv heads, group), and K/V lack the group."""
    hq, hk = q.dims[-3], kv.dims[-3]
    nq, nk = rt.extent(hq), rt.extent(hk)
    if hq is None or hk is None or nq % nk:
        raise unmappable(node, f"enable_gqa with {nq} query heads and {nk} key/value heads")
    group = rt.axes.fresh(nq // nk)
    return Value(kv.term, kv.dims[:-3] + (rt.axes.compose([hk, group]),) + kv.dims[-2:])


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
    """A view/reshape: the value's axes (row-major) regrouped into ``shape``. An axis the new shape cuts
    is split into parts (heads, head_dim); dims the new shape joins become one variable standing for
    them (batch x tokens); size-1 dims come and go. No data moves: the IR sees the same leaves."""
    src = rt.leaf_axes(x.dims)
    out: list[str | None] = []
    i = 0
    for n in shape:
        if n == 1:
            out.append(None)
            continue
        group: list[str] = []
        prod = 1
        while prod < n:
            if i >= len(src):
                raise unmappable(node, f"reshape to {shape} does not follow the value's axes")
            leaf = rt.axes.find(src[i])
            e = rt.axes.size[leaf]
            if n % (prod * e) == 0:
                group.append(leaf)
                prod *= e
                i += 1
            elif e % (n // prod) == 0 and n % prod == 0:
                first, rest = rt.axes.refine(leaf, (n // prod, e // (n // prod)))
                src[i:i + 1] = [first, rest]
            else:
                raise unmappable(node, f"reshape {tuple(rt.extent(d) for d in x.dims)} to {shape} mixes axes "
                                       f"whose extents do not nest")
        out.append(rt.axes.compose(group))
    if i != len(src):
        raise unmappable(node, f"reshape to {shape} does not follow the value's axes")
    return Value(x.term, tuple(out))


def _expand(rt: RegionTrace, node: Any, x: Value, shape: tuple[int, ...]) -> Value:
    """Broadcasting size-1 dims to ``shape``: new axes the term does not carry (a shared operand, as
    ``repeat_kv``'s K/V heads: read once per group, never copied)."""
    dims = (None,) * (len(shape) - len(x.dims)) + x.dims
    out: list[str | None] = []
    for d, n in zip(dims, shape, strict=True):
        if d is not None:
            out.append(d)
        else:
            out.append(None if n == 1 else rt.axes.fresh(n))
    return rt.made(Value(x.term, tuple(out)))


def _index_parts(x: Value, idx: Any) -> list[Any]:
    """``x[idx]``'s index as one entry per dim of x (``slice``, ``int``) with ``None`` entries for new dims."""
    idx = list(idx) if isinstance(idx, tuple) else [idx]
    used = sum(1 for i in idx if i is not None and i is not Ellipsis)
    if Ellipsis in idx:
        at = idx.index(Ellipsis)
        idx[at:at + 1] = [slice(None)] * (len(x.dims) - used)
    return idx + [slice(None)] * (len(x.dims) - sum(1 for i in idx if i is not None))


def _getitem(rt: RegionTrace, node: Any, a: _Args) -> Value:
    """``x[..., i:j, None]`` and the parts of ``split``/``chunk``: full slices keep a dim, ``None`` adds one,
    an aligned part (``i`` a multiple of ``j - i``, dividing the extent) selects one chunk of the dim split
    into (chunks, part). Selection is an index predicate summed over the chunk axis."""
    src, idx = a.args[0], a.args[1]
    fx_node = fx_node_type()
    if isinstance(src, fx_node) and src not in rt.values and not is_tensor(rt.meta(src)):
        return _split_part(rt, node, src, int(idx))
    x = _tv(rt, node, src)
    if isinstance(idx, fx_node) or any(isinstance(i, fx_node) or is_tensor(i) for i in
                                       (idx if isinstance(idx, tuple) else (idx,))):
        raise unmappable(node, "indexing by a tensor (a gather) has no graph-IR meaning")
    dims: list[str | None] = []
    term = x.term
    it = iter(x.dims)
    for part in _index_parts(x, idx):
        if part is None:
            dims.append(None)
            continue
        d = next(it)
        n = rt.extent(d)
        if isinstance(part, int):
            if n != 1:
                raise unmappable(node, "indexing one position of an axis: slice it or keep the axis")
            continue
        if not isinstance(part, slice) or part.step not in (None, 1):
            raise unmappable(node, f"index {part!r}: only slices with step 1, None and ... map")
        lo, hi, _ = part.indices(n)
        if (lo, hi) == (0, n):
            dims.append(d)
            continue
        v = _select_chunk(rt, node, Value(term, x.dims), d, lo, hi)
        term = v.term
        dims.append(v.dims[0])
    return rt.made(Value(term, tuple(dims)))


def _select_chunk(rt: RegionTrace, node: Any, x: Value, d: str | None, lo: int, hi: int) -> Value:
    """Elements lo..hi-1 of axis d: d split into (chunks, part) and the chunk lo // part selected."""
    n, part = rt.extent(d), hi - lo
    if d is None or part <= 0 or lo % part or n % part:
        raise unmappable(node, f"slice {lo}:{hi} of an axis of {n}: only aligned equal parts map "
                               f"(x[..., :n/2], split, chunk)")
    outer, inner = _split_axis(rt, d, n // part, part)
    keep = ir.binary("mul", ir.binary("le", ir.iota(outer), ir.const(float(lo // part))),
                     ir.binary("le", ir.const(float(lo // part)), ir.iota(outer)))
    term = ir.reduce("sum", ir.where(keep, x.term, ir.const(0.0)), outer)  # where: a masked -inf stays out
    return Value(term, (inner,))


def _split_axis(rt: RegionTrace, d: str, chunks: int, part: int) -> tuple[str, str]:
    """Axis d as (chunks, part), refining it (or its leaves) as needed."""
    comp = rt.axes.compose([rt.axes.fresh(chunks), rt.axes.fresh(part)])
    rt.axes.unify(comp, d)
    a, b = rt.axes.parts[comp]
    return a, b


def _split_part(rt: RegionTrace, node: Any, tup: Any, i: int) -> Value:
    """Part ``i`` of ``x.split(size, dim)`` / ``x.chunk(n, dim)`` (equal parts only)."""
    from pyrunner.frontend.trace import unmappable as um

    name = target_name(tup)
    if name not in ("split", "chunk", "tensor_split"):
        raise um(node, f"part of {name}, which is not a split")
    args = _resolve(rt, tup.args)
    kw = _resolve(rt, tup.kwargs)
    x = _tv(rt, node, args[0])
    dim = args[2] if len(args) > 2 else kw.get("dim", 0)
    d = x.dims[int(dim) % len(x.dims)]
    n = rt.extent(d)
    parts = rt.meta(tup)
    sizes = [int(p.shape[int(dim) % len(x.dims)]) for p in parts]
    if len(set(sizes)) != 1:
        raise um(node, f"{name} into unequal parts {sizes}")
    if len(sizes) == 1:
        return x
    lo = i * sizes[0]
    v = _select_chunk(rt, node, x, d, lo, lo + sizes[0])
    pos = int(dim) % len(x.dims)
    if sizes[0] * len(sizes) != n:
        raise um(node, f"{name} parts {sizes} do not cover the axis of {n}")
    return rt.made(Value(v.term, x.dims[:pos] + v.dims + x.dims[pos + 1:]))


def _cat(rt: RegionTrace, node: Any, a: _Args) -> Value:
    """``torch.cat`` of equal parts along a dim: the dim becomes (parts, part), each part placed by an index
    predicate (rotary embeddings' ``rotate_half`` is ``cat((-x2, x1))``)."""
    xs = [_tv(rt, node, t) for t in a.get(0, "tensors")]
    dim = int(a.get(1, "dim", 0))
    nd = len(xs[0].dims)
    pos = dim % nd
    if any(len(x.dims) != nd for x in xs):
        raise unmappable(node, "cat of tensors of different ranks")
    ds = [x.dims[pos] for x in xs]
    if any(d is None for d in ds) or len({rt.extent(d) for d in ds}) != 1:
        raise unmappable(node, "cat of parts of different sizes along the dim")
    others = xs[0].dims[:pos] + xs[0].dims[pos + 1:]
    for x in xs[1:]:
        others = rt.broadcast(others, x.dims[:pos] + x.dims[pos + 1:])
    part = ds[0]
    for d in ds[1:]:
        part = rt.axes.unify(part, d)
    outer = rt.axes.fresh(len(xs))
    term = None
    for j, x in enumerate(xs):
        keep = ir.binary("mul", ir.binary("le", ir.iota(outer), ir.const(float(j))),
                         ir.binary("le", ir.const(float(j)), ir.iota(outer)))
        piece = ir.where(keep, x.term, ir.const(0.0))
        term = piece if term is None else ir.binary("add", term, piece)
    whole = rt.axes.compose([outer, part])
    return rt.made(Value(term, others[:pos] + (whole,) + others[pos:]))
