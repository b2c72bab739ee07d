"""Random valid graphs over named axes with tile-friendly sizes, as graph JSON documents.

``random_graph_doc(choose)`` composes the op vocabulary into a graph; every decision goes
through ``choose(options)``, so the same code is a Hypothesis strategy (``graph_docs()``, which
shrinks towards the first option of every choice: the simplest graph) and a seeded generator
for the GPU sweep (``seeded_graph_doc(seed)``, with ``random.Random(seed).choice``).

Two families, from how real operators are built:
- row-wise chains over rows ``m`` and feature axes: elementwise ops, inputs broadcast along
  rows (biases, weights) or full-shape (residuals), row reductions combined back, norms
  (softmax / rmsnorm / layernorm), and contractions with a weight into a fresh feature axis;
- attention over heads: scores Q K^T (optionally RMS-normalised Q and K, multi-query K/V),
  score ops (a scale, a soft cap c*tanh(s/c), an additive bias), softmax or sigmoid, then @ V.

Ops that can overflow on unbounded values (exp, log, reciprocals) only appear inside softmax
and the norms. No path holds two contractions in sequence outside attention (issue 9 item 1:
the planner does not plan chained contractions yet). Graphs may have two outputs.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

SIZES = (64, 128, 256)
UNARY = ("relu", "gelu", "silu", "sigmoid", "tanh", "square", "abs", "neg")
BINARY = ("add", "mul", "sub", "max", "min")
REDUCE = ("sum", "max", "mean")
NORMS = ("rmsnorm", "softmax", "layernorm")

Choose = Callable[[Sequence[Any]], Any]


class GraphDoc:
    """A graph document under construction: named nodes, inputs, axes (shared with ``wild_graphs``)."""

    def __init__(self, name: str) -> None:
        self.doc: dict[str, Any] = {"name": name, "axes": {}, "inputs": {}, "nodes": [], "outputs": []}
        self.n = 0

    def axis(self, name: str, size: int) -> str:
        self.doc["axes"][name] = size
        return name

    def input(self, prefix: str, axes: list[str]) -> str:
        name = f"{prefix}{len(self.doc['inputs'])}"
        self.doc["inputs"][name] = list(axes)
        return name

    def node(self, op: str, args: list, **extra: Any) -> str:
        self.n += 1
        name = f"t{self.n}"
        self.doc["nodes"].append({"name": name, "op": op, "args": args, **extra})
        return name


def _row_chain(choose: Choose, d: GraphDoc) -> None:
    m = d.axis("m", choose(SIZES))
    f0 = d.axis("f0", choose(SIZES))
    x = d.input("X", [m, f0])
    # (name, feature axis, whether a contraction is upstream)
    tensors: list[tuple[str, str, bool]] = [(x, f0, False)]
    rows: list[str] = []  # per-row (1-D over m) results
    features = 1
    for _ in range(choose((1, 2, 3, 4, 5))):
        t, f, contracted = choose(tensors)
        action = choose(("unary", "matmul", "broadcast_input", "norm", "reduce_combine", "pair", "full_input"))
        if action == "matmul" and not contracted:
            g = d.axis(f"f{features}", choose(SIZES))
            features += 1
            w = d.input("W", [f, g])
            tensors.append((d.node("matmul", [t, w], contract=f), g, True))
        elif action == "broadcast_input":
            v = d.input("b", [f])
            args = [t, v] if choose((True, False)) else [v, t]
            tensors.append((d.node(choose(BINARY), args), f, contracted))
        elif action == "full_input":
            r = d.input("R", [m, f])
            tensors.append((d.node(choose(("add", "mul", "sub")), [t, r]), f, contracted))
        elif action == "norm":
            op = choose(NORMS)
            tensors.append((d.node(op, [t], axis=f), f, contracted))
        elif action == "reduce_combine":
            r = d.node(choose(REDUCE), [t], axis=f)
            rows.append(r)
            tensors.append((d.node(choose(("sub", "mul", "add")), [t, r]), f, contracted))
        elif action == "pair":
            same = [u for u in tensors if u[1] == f and u[0] != t]
            if same:
                u, _, c2 = choose(same)
                tensors.append((d.node(choose(BINARY), [t, u]), f, contracted or c2))
            else:
                tensors.append((d.node(choose(UNARY), [t]), f, contracted))
        else:
            tensors.append((d.node(choose(UNARY), [t]), f, contracted))
    nodes = [t for t, _, _ in tensors if t != x]
    if not nodes:
        nodes.append(d.node(choose(UNARY), [x]))
    outs = [nodes[-1]]
    extra = [n for n in nodes[:-1] + rows if n not in outs]
    if extra and choose((False, True)):
        outs.append(choose(extra))
    d.doc["outputs"] = outs


def _attention(choose: Choose, d: GraphDoc, qk_norm: bool = True) -> None:
    h = d.axis("h", choose((1, 2, 4)))
    tq = d.axis("t_q", choose(SIZES))
    tkv = d.axis("t_kv", choose(SIZES))
    hd = d.axis("d", choose((64, 128)))
    shared_kv = choose((False, True))  # multi-query: one K/V for every head
    q = d.input("Q", [h, tq, hd])
    k = d.input("K", [tkv, hd] if shared_kv else [h, tkv, hd])
    v = d.input("V", [tkv, hd] if shared_kv else [h, tkv, hd])
    if qk_norm and choose((False, True)):
        q = d.node("rmsnorm", [q], axis=hd)
        k = d.node("rmsnorm", [k], axis=hd)
    s = d.node("matmul", [q, k], contract=hd)
    for _ in range(choose((0, 1, 2))):
        op = choose(("scale", "softcap", "bias", "shift"))
        if op == "scale":
            s = d.node("mul", [s, choose((0.125, 0.08838834764831845))])
        elif op == "softcap":
            c = choose((30.0, 50.0))
            s = d.node("mul", [d.node("tanh", [d.node("div", [s, c])]), c])
        elif op == "bias":
            s = d.node("add", [s, d.input("B", [tq, tkv])])
        else:
            s = d.node("add", [s, -1.5])
    p = d.node("softmax", [s], axis=tkv) if choose((True, False)) else d.node("sigmoid", [s])
    o = d.node("matmul", [p, v], contract=tkv)
    if choose((False, True)):
        o = d.node(choose(UNARY), [o])
    d.doc["outputs"] = [o]


def random_graph_doc(choose: Choose, name: str = "RandomGraph", qk_norm: bool = True) -> dict:
    """A valid graph JSON document built by the decisions of ``choose``.

    ``qk_norm=False`` leaves out RMS-normalised Q and K: planning them takes 10-50 s today
    (the search is exponential in reductions), too slow for many CI examples.
    """
    d = GraphDoc(name)
    if choose(("rows", "attention")) == "rows":
        _row_chain(choose, d)
    else:
        _attention(choose, d, qk_norm)
    return d.doc


def seeded_graph_doc(seed: int) -> dict:
    """The random graph of ``seed`` (stable across runs and machines)."""
    return random_graph_doc(random.Random(seed).choice, name=f"Random{seed}")


def graph_docs(qk_norm: bool = True):
    """Hypothesis strategy of random graph documents."""
    from hypothesis import strategies as st

    @st.composite
    def docs(draw) -> dict:
        return random_graph_doc(lambda opts: draw(st.sampled_from(list(opts))), qk_norm=qk_norm)

    return docs()
