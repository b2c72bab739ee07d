"""Workload catalog: each workload is data built with the graph DSL.

Default sizes are DESIGN section 4's; every size is a parameter
(``Graph.with_sizes``). Nothing outside this file knows these names.
"""

from __future__ import annotations

from typing import Callable

from pyrunner.errors import GraphError
from pyrunner.ir.graph import Graph, GraphBuilder, show


def attention(h: int = 16, t_q: int = 4096, t_kv: int = 4096, d: int = 128) -> Graph:
    """softmax_{t_kv}(Q K^T) V per head; no scale, no mask."""
    g = GraphBuilder("Attention")
    q = g.input("Q", h=h, t_q=t_q, d=d)
    k = g.input("K", h=h, t_kv=t_kv, d=d)
    v = g.input("V", h=h, t_kv=t_kv, d=d)
    s = g.matmul(q, k, contract="d", name="S")
    p = g.softmax(s, axis="t_kv", name="P")
    g.output("O", g.matmul(p, v, contract="t_kv"))
    return g.build()


def swiglu(m: int = 1024, n: int = 2048, d: int = 2048) -> Graph:
    """silu(X W_gate) * (X W_up)."""
    g = GraphBuilder("SwiGLU")
    x = g.input("X", m=m, d=d)
    wg = g.input("W_gate", d=d, n=n)
    wu = g.input("W_up", d=d, n=n)
    gate = g.unary("silu", g.matmul(x, wg, contract="d", name="G"))
    g.output("Y", g.mul(gate, g.matmul(x, wu, contract="d", name="U")))
    return g.build()


def matmul(m: int = 1024, d: int = 4096, n: int = 4096) -> Graph:
    """X W."""
    g = GraphBuilder("Matmul")
    x = g.input("X", m=m, d=d)
    w = g.input("W", d=d, n=n)
    g.output("Y", g.matmul(x, w, contract="d"))
    return g.build()


def rmsnorm(m: int = 1024, d: int = 4096, n: int = 4096) -> Graph:
    """(X * S) W with S = 1/sqrt(mean_d(X^2) + 1e-6); no learned weight."""
    g = GraphBuilder("RMSNorm")
    x = g.input("X", m=m, d=d)
    w = g.input("W", d=d, n=n)
    g.output("Y", g.matmul(g.rmsnorm(x, axis="d", eps=1e-6, name="N"), w, contract="d"))
    return g.build()


def rmsnorm_mlp(m: int = 1024, d: int = 1024, n: int = 1024) -> Graph:
    """(N W_up) * (N W_gate) with N = rmsnorm(X); no silu."""
    g = GraphBuilder("RMSNormMLP")
    x = g.input("X", m=m, d=d)
    wu = g.input("W_up", d=d, n=n)
    wg = g.input("W_gate", d=d, n=n)
    nx = g.rmsnorm(x, axis="d", eps=1e-6, name="N")
    g.output("Y", g.mul(g.matmul(nx, wu, contract="d"), g.matmul(nx, wg, contract="d")))
    return g.build()


def scaled_attention(h: int = 16, t_q: int = 4096, t_kv: int = 4096, d: int = 128) -> Graph:
    """softmax(Q K^T / sqrt(d)) V: the scale must travel through the rewrites."""
    g = GraphBuilder("ScaledAttention")
    q = g.input("Q", h=h, t_q=t_q, d=d)
    k = g.input("K", h=h, t_kv=t_kv, d=d)
    v = g.input("V", h=h, t_kv=t_kv, d=d)
    s = g.mul(g.matmul(q, k, contract="d"), g.unary("rsqrt", g.size("d")), name="S")
    g.output("O", g.matmul(g.softmax(s, axis="t_kv", name="P"), v, contract="t_kv"))
    return g.build()


def _scaled_scores(g: GraphBuilder, h: int, t_q: int, t_kv: int, d: int):
    q = g.input("Q", h=h, t_q=t_q, d=d)
    k = g.input("K", h=h, t_kv=t_kv, d=d)
    v = g.input("V", h=h, t_kv=t_kv, d=d)
    return g.mul(g.matmul(q, k, contract="d"), g.unary("rsqrt", g.size("d")), name="S"), v


def causal_attention(h: int = 16, t_q: int = 4096, t_kv: int = 4096, d: int = 128) -> Graph:
    """softmax(mask(Q K^T / sqrt(d))) V with key t_kv visible to query t_q iff t_kv <= t_q (top-left
    aligned, as PyTorch's is_causal)."""
    g = GraphBuilder("CausalAttention")
    s, v = _scaled_scores(g, h, t_q, t_kv, d)
    keep = g.le(g.iota("t_kv"), g.iota("t_q"), name="causal")
    p = g.softmax(g.masked(s, keep, name="S_masked"), axis="t_kv", name="P")
    g.output("O", g.matmul(p, v, contract="t_kv"))
    return g.build()


def sliding_window_attention(h: int = 16, t_q: int = 4096, t_kv: int = 4096, d: int = 128,
                             window: int = 1024) -> Graph:
    """Causal attention limited to the last ``window`` keys: visible iff t_q - window < t_kv <= t_q."""
    g = GraphBuilder("SlidingWindowAttention")
    s, v = _scaled_scores(g, h, t_q, t_kv, d)
    kv, tq = g.iota("t_kv"), g.iota("t_q")
    keep = g.binary("min", g.le(kv, tq), g.lt(g.sub(tq, float(window)), kv), name="window")
    p = g.softmax(g.masked(s, keep, name="S_masked"), axis="t_kv", name="P")
    g.output("O", g.matmul(p, v, contract="t_kv"))
    return g.build()


def gqa(kv_h: int = 4, group: int = 4, t_q: int = 4096, t_kv: int = 4096, d: int = 128) -> Graph:
    """Grouped-query attention: `group` query heads share each K/V head."""
    g = GraphBuilder("GroupedQueryAttention")
    q = g.input("Q", kv_h=kv_h, group=group, t_q=t_q, d=d)
    k = g.input("K", kv_h=kv_h, t_kv=t_kv, d=d)
    v = g.input("V", kv_h=kv_h, t_kv=t_kv, d=d)
    s = g.mul(g.matmul(q, k, contract="d"), g.unary("rsqrt", g.size("d")), name="S")
    g.output("O", g.matmul(g.softmax(s, axis="t_kv", name="P"), v, contract="t_kv"))
    return g.build()


def geglu(m: int = 1024, n: int = 2048, d: int = 2048) -> Graph:
    """gelu(X W_gate) * (X W_up), tanh-approximated gelu."""
    g = GraphBuilder("GeGLU")
    x = g.input("X", m=m, d=d)
    wg = g.input("W_gate", d=d, n=n)
    wu = g.input("W_up", d=d, n=n)
    gate = g.unary("gelu", g.matmul(x, wg, contract="d", name="G"))
    g.output("Y", g.mul(gate, g.matmul(x, wu, contract="d", name="U")))
    return g.build()


def layernorm_matmul(m: int = 1024, d: int = 4096, n: int = 4096) -> Graph:
    """layernorm(X) W, no affine weight, eps 1e-5."""
    g = GraphBuilder("LayerNormMatmul")
    x = g.input("X", m=m, d=d)
    w = g.input("W", d=d, n=n)
    g.output("Y", g.matmul(g.layernorm(x, axis="d", eps=1e-5, name="N"), w, contract="d"))
    return g.build()


CATALOG: dict[str, Callable[..., Graph]] = {
    "Attention": attention,
    "SwiGLU": swiglu,
    "Matmul": matmul,
    "RMSNorm": rmsnorm,
    "RMSNormMLP": rmsnorm_mlp,
    "ScaledAttention": scaled_attention,
    "GroupedQueryAttention": gqa,
    "GeGLU": geglu,
    "LayerNormMatmul": layernorm_matmul,
    "CausalAttention": causal_attention,
    "SlidingWindowAttention": sliding_window_attention,
}

SEED_WORKLOADS = ("Attention", "SwiGLU", "Matmul", "RMSNorm", "RMSNormMLP")


def get(name: str, sizes: dict[str, int] | None = None) -> Graph:
    """The catalog workload `name`, resized by `sizes` (axis name -> extent)."""
    by_lower = {k.lower(): k for k in CATALOG}
    key = by_lower.get(name.lower())
    if key is None:
        raise GraphError(f"unknown workload {name!r}; the catalog has: {', '.join(CATALOG)}")
    g = CATALOG[key]()
    return g.with_sizes(sizes or {})


def listing() -> str:
    """The catalog as the text table ``python -m pyrunner workloads`` prints (one row per workload)."""
    rows = [("workload", "seed", "axes (default sizes)", "inputs", "computes")]
    for name, make in CATALOG.items():
        g = make()
        rows.append((
            name,
            "yes" if name in SEED_WORKLOADS else "",
            " ".join(f"{a}={n}" for a, n in g.sizes.items()),
            " ".join(f"{t.name}[{','.join(t.axes)}]" for t in g.inputs()),
            "; ".join(f"{n} = {show(t)}" for n, t in g.outputs),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] + "\n"
                   for r in rows)
