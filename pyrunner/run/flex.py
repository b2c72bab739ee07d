"""FlexAttention baseline: softmax attention whose scores pass through an elementwise function first.

``torch.nn.attention.flex_attention`` (compiled) takes that function as a ``score_mod``; this
module finds such attention in a graph structurally (one q.k product, an elementwise function of
it, constants and bias inputs over (batch, query, key), a softmax over the key axis, a product
with V) and generates the call. Plain or scaled attention is SDPA's (``baselines.vendor_fn``);
sigmoid attention has no softmax and is not expressible here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from pyrunner.ir.graph import Graph, Term, result_axes, softmax_source, subterms
from pyrunner.ir.ops import ELEMENTWISE
from pyrunner.run.baselines import (
    TorchFn,
    _constant_value,
    _is_constant,
    _is_index_only,
    _load,
    match_attention,
)
from pyrunner.run.torch_code import lit, permute, reshape


@dataclass(frozen=True)
class FlexMatch:
    """``softmax_kv(f(q @_d k, bias...)) @_kv v`` with f elementwise: FlexAttention's score_mod."""

    term: Term
    scores: Term
    x: Term
    q: Term
    k: Term
    v: Term
    d: str
    kv: str


def match_flex(t: Term, sizes: Mapping[str, int]) -> FlexMatch | None:
    """Attention whose pre-softmax scores are an elementwise function of one q.k product (not a plain scale)."""
    if t.op != "matmul":
        return None
    plain = match_attention(t, sizes)
    if plain is not None and plain.mask is None:
        return None
    p, v = t.args
    sm = softmax_source(p)
    if sm is None or sm[1] != t.axis:
        return None
    x, kv = sm
    prods = [s for s in subterms([x]) if s.op == "matmul"]
    if len(prods) != 1:
        return None
    s = prods[0]
    if any(u.op == "reduce" for u in subterms([x])):
        return None
    q, k = s.args
    if q.op != "input" or k.op != "input" or v.op != "input":
        return None
    m = match_attention_shape(q, k, v, s.axis, kv)
    return FlexMatch(t, s, x, q, k, v, s.axis, kv) if m else None


def match_attention_shape(q: Term, k: Term, v: Term, d: str, kv: str) -> bool:
    qa, ka, va = result_axes(q), result_axes(k), result_axes(v)
    batch = [x for x in qa if x in ka and x != d]
    if [x for x in ka if x not in batch and x != d] != [kv] or kv in qa or kv not in va:
        return False
    v_free = [x for x in va if x not in batch and x != kv]
    q_free = [x for x in qa if x not in batch and x != d]
    return len(q_free) == 1 and len(v_free) == 1 and all(x in va for x in batch)


def _flex_source(graph: Graph) -> str | None:
    """Source of a FlexAttention (compiled) baseline for a graph that is one such attention, else None."""
    if len(graph.outputs) != 1:
        return None
    out_name, t = graph.outputs[0]
    sizes = graph.sizes
    m = match_flex(t, sizes)
    if m is None:
        return None
    qa, ka, va = result_axes(m.q), result_axes(m.k), result_axes(m.v)
    batch = tuple(x for x in qa if x in ka and x != m.d)
    (q_free,) = [x for x in qa if x not in batch and x != m.d]
    (v_free,) = [x for x in va if x not in batch and x != m.kv]
    nb = math.prod(sizes[x] for x in batch)
    biases: dict[str, str] = {}
    prep: list[str] = []

    def code(u: Term) -> str | None:
        if u == m.scores:
            return "score"
        if u.op == "iota":
            return {q_free: "q_idx", m.kv: "kv_idx"}.get(u.axis)
        if u.op != "input" and _is_constant(u):
            return lit(_constant_value(u, sizes))
        if u.op == "input":
            ax = result_axes(u)
            full, plain = batch + (q_free, m.kv), (q_free, m.kv)
            if set(ax) == set(full):
                idx, want = "[h, q_idx, kv_idx]", full
                shape = [nb, sizes[q_free], sizes[m.kv]]
            elif set(ax) == set(plain):
                idx, want, shape = "[q_idx, kv_idx]", plain, [sizes[q_free], sizes[m.kv]]
            else:
                return None
            if u.name not in biases:
                biases[u.name] = f"bias{len(biases)}"
                prep.append(f"    {biases[u.name]} = "
                            f"{reshape(permute(f'inputs[{u.name!r}]', ax, want), shape)}.contiguous()")
            return f"{biases[u.name]}{idx}"
        if u.op in ("unary", "binary", "ternary") and u.fn in ELEMENTWISE:
            args = [code(x) for x in u.args]
            return None if None in args else "(" + ELEMENTWISE[u.fn].torch.format(*args) + ")"
        return None

    x, mask = m.x, None
    if x.op == "ternary" and x.fn == "where" and _is_constant(x.args[2]) \
            and _constant_value(x.args[2], sizes) == -math.inf and _is_index_only(x.args[0]):
        mask, x = code(x.args[0]), x.args[1]  # a mask over (query, key) indices: FlexAttention's mask_mod
        if mask is None:
            return None
    body = code(x)
    if body is None:
        return None
    q4 = reshape(permute("inputs[%r]" % m.q.name, qa, batch + (q_free, m.d)), [1, nb, sizes[q_free], sizes[m.d]])
    k4 = reshape(permute("inputs[%r]" % m.k.name, ka, batch + (m.kv, m.d)), [1, nb, sizes[m.kv], sizes[m.d]])
    v4 = reshape(permute("inputs[%r]" % m.v.name, va, batch + (m.kv, v_free)), [1, nb, sizes[m.kv], sizes[v_free]])
    have = batch + (q_free, v_free)
    o = permute(reshape("o", [sizes[x] for x in have]), have, result_axes(t))
    masked = [] if mask is None else [
        "",
        "def mask_mod(b, h, q_idx, kv_idx):",
        f"    return {mask} != 0",
        "",
        "_BLOCK_MASKS = {}",
        "",
        "def _block_mask(device):",
        '    """Built once per device: which (query, key) blocks are fully masked (skipped) or partial."""',
        "    if device not in _BLOCK_MASKS:",
        f"        _BLOCK_MASKS[device] = create_block_mask(mask_mod, None, None, {sizes[q_free]}, {sizes[m.kv]},",
        "                                                 device=device)",
        "    return _BLOCK_MASKS[device]",
    ]
    call = "score_mod=score_mod, scale=1.0" + ("" if mask is None else f", block_mask=_block_mask({q4}.device)")
    lines = [
        "from torch.nn.attention.flex_attention import create_block_mask, flex_attention",
        "_flex = torch.compile(flex_attention)",
        *masked,
        "",
        "def baseline(**inputs):",
        f'    """{graph.name} through FlexAttention (generated by pyrunner.run.baselines)."""',
        *prep,
        "",
        "    def score_mod(score, b, h, q_idx, kv_idx):",
        f"        return {body}",
        "",
        f"    o = _flex({q4}, {k4}, {v4}, {call})",
        f"    return {{{out_name!r}: {o}}}",
    ]
    return "\n".join(lines) + "\n"


def flex_applies(graph: Graph) -> bool:
    """Whether ``graph`` has a FlexAttention baseline (``flex_fn`` would give one), without compiling it:
    the runner keeps time back for that compile only where it will happen."""
    return _flex_source(graph) is not None


def flex_fn(graph: Graph) -> TorchFn | None:
    """FlexAttention (torch.compile'd) for a graph that is one softmax attention with a score modification.

    None for plain (scaled) attention, which SDPA covers, and for what FlexAttention cannot
    express: sigmoid attention (no softmax), scores that are not an elementwise function of one
    q.k product, biases over other axes than (batch, query, key).
    """
    src = _flex_source(graph)
    return None if src is None else _load(src)
