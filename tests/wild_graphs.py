"""Seeded "wild" graphs: operators shaped like the ones users write, not like the ones we planned for.

``graph_strategies`` keeps every axis a multiple of 64 and every contraction a row chain, so its
graphs (``RandomN`` in the GPU sweep) stay stable across releases. This generator (``WildN``)
draws what those leave out, each from how real operators are written:
- odd and tiny axis sizes (1, 3, 17, 48, 80, 100, 200, 1000), batch axes, inputs stored row- or
  feature-major, weights stored either way round (``[f, g]`` or ``[g, f]``) or one per batch;
- reductions over any axis: columns (over the rows), batches, or the feature axis;
- chained contractions (an MLP's two GEMMs, a low-rank pair), outer products and GEMVs;
- masks from ``iota`` / ``lt`` / ``where``, safe ``exp`` / ``exp2`` / ``log`` / ``sqrt`` / ``div`` /
  ``recip`` / ``rsqrt`` forms (``exp(-|x|)``, ``log(1 + x^2)``, ``x / (1 + |x|)``), clamps with ``max`` / ``min``;
- attention with odd lengths and head sizes, a causal or padding mask, keys stored ``[d, t]``,
  grouped heads, the log-sum-exp as a second output, an output projection summed over heads.

Values stay bounded (no unguarded exp, no division by something near zero), so a wrong kernel, not
a numerically hopeless reference, is what a failure means.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from graph_strategies import GraphDoc

Choose = Callable[[Sequence[Any]], Any]

ODD = (1, 3, 17, 48, 64, 80, 100, 128, 200, 256)
ROWS = (1, 8, 48, 100, 128, 200, 256, 1000)
UNARY = ("relu", "gelu", "silu", "sigmoid", "tanh", "square", "abs", "neg", "softplus")
BINARY = ("add", "mul", "sub", "max", "min")


class _Tensor:
    """A node with its axes (in the order the graph's shape rules give, which we do not need)."""

    def __init__(self, name: str, axes: frozenset[str]) -> None:
        self.name, self.axes = name, axes


def _safe_unary(choose: Choose, d: GraphDoc, t: _Tensor) -> _Tensor:
    """A bounded function of an unbounded value."""
    form = choose(("plain", "exp_neg_abs", "log1p_sq", "soft_sign", "sqrt_abs", "clamp", "recip_1p_sq",
                   "rsqrt_1p_sq", "exp2_neg_abs"))
    x = t.name
    one_plus_square = ("recip_1p_sq", "rsqrt_1p_sq")
    if form == "exp_neg_abs":
        out = d.node("exp", [d.node("neg", [d.node("abs", [x])])])
    elif form == "log1p_sq":
        out = d.node("log", [d.node("add", [d.node("square", [x]), 1.0])])
    elif form == "soft_sign":
        out = d.node("div", [x, d.node("add", [d.node("abs", [x]), 1.0])])
    elif form == "sqrt_abs":
        out = d.node("sqrt", [d.node("add", [d.node("abs", [x]), 0.5])])
    elif form in one_plus_square:
        out = d.node("recip" if form == "recip_1p_sq" else "rsqrt", [d.node("add", [d.node("square", [x]), 1.0])])
    elif form == "exp2_neg_abs":
        out = d.node("exp2", [d.node("neg", [d.node("abs", [x])])])
    elif form == "clamp":
        out = d.node("min", [d.node("max", [x, -1.0]), 1.0])
    else:
        out = d.node(choose(UNARY), [x])
    return _Tensor(out, t.axes)


def _mask(choose: Choose, d: GraphDoc, t: _Tensor, a: str, b: str, fill: float | str) -> _Tensor:
    """``t`` where ``iota a <= iota b`` (or ``<``), else ``fill``: a triangular or band mask."""
    ia, ib = d.node("iota", [], axis=a), d.node("iota", [], axis=b)
    cond = d.node(choose(("le", "lt")), [ia, ib])
    return _Tensor(d.node("where", [cond, t.name, fill]), t.axes | {a, b})


def _row_program(choose: Choose, d: GraphDoc) -> None:
    """Elementwise, reductions over any axis, masks and chained contractions on a batched row tensor."""
    batched = choose((False, True))
    b = d.axis("b", choose((2, 3, 4))) if batched else None
    m = d.axis("m", choose(ROWS))
    f0 = d.axis("f0", choose(ODD[2:]))
    x_axes = choose(([m, f0], [f0, m]))  # rows first, or stored feature-major
    x_axes = [b, *x_axes] if b else x_axes
    x = _Tensor(d.input("X", x_axes), frozenset(x_axes))
    tensors = [x]
    features = [f0]
    for _ in range(choose((2, 3, 4, 5, 6))):
        t = choose([tensors[-1]] * 3 + tensors)  # mostly extend the newest value: fewer dead nodes
        feat = [a for a in features if a in t.axes]
        action = choose(("matmul", "matmul", "unary", "safe", "bias", "residual", "reduce", "norm",
                         "mask", "pair", "outer"))
        if action == "matmul" and feat:
            f = feat[0]
            g = d.axis(f"f{len(features)}", choose(ODD[1:]))
            features.append(g)
            w_axes = choose(([f, g], [g, f]))  # weights stored either way round
            if b and b in t.axes and choose((False, False, True)):
                w_axes = [b, *w_axes]  # one weight per batch: a batched GEMM
            w = d.input("W", w_axes)
            args = [t.name, w] if choose((True, False)) else [w, t.name]
            tensors.append(_Tensor(d.node("matmul", args, contract=f), (t.axes - {f}) | {g}))
        elif action == "safe":
            tensors.append(_safe_unary(choose, d, t))
        elif action == "bias" and feat:
            v = d.input("v", [choose(feat)])
            tensors.append(_Tensor(d.node(choose(BINARY), choose(([t.name, v], [v, t.name]))), t.axes))
        elif action == "residual":
            r = d.input("R", sorted(t.axes, key=list(d.doc["axes"]).index))
            tensors.append(_Tensor(d.node(choose(("add", "mul", "sub")), [t.name, r]), t.axes))
        elif action == "reduce" and len(t.axes) > 1:
            axis = choose(sorted(t.axes))
            r = d.node(choose(("sum", "max", "mean")), [t.name], axis=axis)
            if choose((True, False)):
                tensors.append(_Tensor(d.node(choose(("sub", "mul", "add")), [t.name, r]), t.axes))
            else:
                tensors.append(_Tensor(r, t.axes - {axis}))
        elif action == "norm" and feat:
            axis = choose(feat + [m]) if m in t.axes else choose(feat)
            if d.doc["axes"][axis] >= 8:
                op = choose(("softmax", "rmsnorm", "layernorm"))
                tensors.append(_Tensor(d.node(op, [t.name], axis=axis), t.axes))
        elif action == "mask" and feat and m in t.axes:
            f = choose(feat)
            tensors.append(_mask(choose, d, t, f, m, 0.0))
        elif action == "pair":
            same = [u for u in tensors if u.axes == t.axes and u is not t]
            if same:
                u = choose(same)
                tensors.append(_Tensor(d.node(choose(BINARY), [t.name, u.name]), t.axes))
        elif action == "outer" and len(t.axes) == 1:
            g = d.axis(f"f{len(features)}", choose(ODD[2:]))
            features.append(g)
            v = d.input("u", [g])
            tensors.append(_Tensor(d.node("mul", [t.name, v]), t.axes | {g}))
        else:
            tensors.append(_Tensor(d.node(choose(UNARY), [t.name]), t.axes))
    nodes = [t for t in tensors if t is not x]
    if not nodes:
        nodes.append(_Tensor(d.node(choose(UNARY), [x.name]), x.axes))
    read = {a for n in d.doc["nodes"] for a in n.get("args", []) if isinstance(a, str)}
    unread = [t for t in nodes[:-1] if t.name not in read]  # values nothing else uses: outputs too
    outs = [nodes[-1].name]
    if unread and choose((False, True, True)):
        outs.append(choose(unread).name)
    d.doc["outputs"] = outs


def _attention(choose: Choose, d: GraphDoc) -> None:
    """Attention with odd sizes, optional batch and query-group axes, masks, layouts and outputs."""
    batch = [d.axis("b", choose((2, 3)))] if choose((False, True)) else []
    h = d.axis("h", choose((1, 2, 3, 4)))
    grouped = choose((False, True))
    g = [d.axis("g", choose((2, 4)))] if grouped else []
    tq = d.axis("t_q", choose((1, 17, 64, 100, 128, 256, 300)))
    tkv = d.axis("t_kv", choose((17, 64, 100, 128, 256, 300, 1000)))
    hd = d.axis("d", choose((32, 48, 64, 80, 96, 128)))
    q = d.input("Q", batch + [h] + g + [tq, hd])
    k_axes = choose(([tkv, hd], [hd, tkv]))  # keys stored [t, d] or transposed [d, t]
    k = d.input("K", batch + [h] + k_axes)
    v = d.input("V", batch + [h, tkv, hd])
    s = d.node("matmul", [q, k], contract=hd)
    if choose((True, False)):
        s = d.node("mul", [s, round(1.0 / d.doc["axes"][hd] ** 0.5, 6)])
    extra = choose(("none", "bias_row", "softcap", "alibi"))
    if extra == "bias_row":
        s = d.node("add", [s, d.input("B", [tkv])])
    elif extra == "softcap":
        s = d.node("mul", [d.node("tanh", [d.node("div", [s, 30.0])]), 30.0])
    elif extra == "alibi":
        dist = d.node("sub", [d.node("iota", [], axis=tq), d.node("iota", [], axis=tkv)])
        s = d.node("sub", [s, d.node("mul", [d.node("abs", [dist]), 0.01])])
    mask = choose(("none", "causal", "padding"))
    if mask == "causal" and d.doc["axes"][tq] <= d.doc["axes"][tkv]:
        cond = d.node("le", [d.node("iota", [], axis=tkv), d.node("iota", [], axis=tq)])
        s = d.node("where", [cond, s, "-inf"])
    elif mask == "padding":
        keep = d.node("lt", [d.node("iota", [], axis=tkv), max(1, d.doc["axes"][tkv] - 7)])
        s = d.node("where", [keep, s, "-inf"])
    outputs: list[str]
    if choose(("softmax", "softmax", "explicit")) == "softmax":
        p = d.node("softmax", [s], axis=tkv)
        o = d.node("matmul", [p, v], contract=tkv)
        outputs = [o]
    else:  # unnormalised weighted sum, divided at the end, with the log-sum-exp as a second output
        mx = d.node("max", [s], axis=tkv)
        e = d.node("exp", [d.node("sub", [s, mx])])
        den = d.node("sum", [e], axis=tkv)
        o = d.node("div", [d.node("matmul", [e, v], contract=tkv), den])
        outputs = [o]
        if choose((True, False)):
            outputs.append(d.node("add", [mx, d.node("log", [den])]))
    finish = choose(("none", "unary", "project"))
    if finish == "unary":
        outputs[0] = d.node(choose(UNARY), [outputs[0]])
    elif finish == "project":  # the output projection: every head's d columns into e, summed over heads
        e = d.axis("e", choose((64, 96, 100, 128)))
        wo = d.input("Wo", [h, hd, e])
        outputs[0] = d.node("sum", [d.node("matmul", [outputs[0], wo], contract=hd)], axis=h)
    d.doc["outputs"] = outputs


def wild_graph_doc(choose: Choose, name: str = "WildGraph") -> dict:
    """A valid graph JSON document built by the decisions of ``choose``."""
    d = GraphDoc(name)
    if choose(("rows", "rows", "attention")) == "rows":
        _row_program(choose, d)
    else:
        _attention(choose, d)
    return d.doc


def seeded_wild_doc(seed: int) -> dict:
    """The wild graph of ``seed`` (stable across runs and machines)."""
    return wild_graph_doc(random.Random(seed).choice, name=f"Wild{seed}")
