"""Hand-built kernel plans for renderer/compiler tests; every shape is a parameter.

These are written the way a planner would emit them (pydantic models, no
shortcuts), so they double as examples of the plan semantics.
"""

from __future__ import annotations

import numpy as np

from pyrunner.ir.graph import LOG2E
from pyrunner.ir.ops import BINARY, ELEMENTWISE, UNARY
from pyrunner.plan.schema import (
    Buffer,
    Call,
    Const,
    CostEstimate,
    Fill,
    Gemm,
    GlobalTensor,
    GridAxis,
    Kernel,
    Load,
    Map,
    Plan,
    Provenance,
    Reduce,
    Ref,
    Store,
    StreamLoop,
    with_hash,
)


def ref(buf: str) -> Ref:
    return Ref(buf=buf)


def const(v: float) -> Const:
    return Const(value=v)


def call(fn: str, *args) -> Call:
    return Call(fn=fn, args=list(args))


def _plan(workload: str, dtype: str, tensors: list[GlobalTensor], kernels: list[Kernel]) -> Plan:
    plan = Plan(
        workload=workload, dtype=dtype, graph={"name": workload}, derivation=[], tensors=tensors, kernels=kernels,
        cost=CostEstimate(total_us=0.0, kernels=[], launches=len(kernels), model={}),
        provenance=Provenance(planner="tests.plan_fixtures", version="0", graph_hash="none"),
    )
    return with_hash(plan)


def _tensor(name: str, axes: dict[str, int], dtype: str, role: str) -> GlobalTensor:
    return GlobalTensor(name=name, axes=list(axes), shape=list(axes.values()), dtype=dtype, role=role)


def _gemm_kernel(name: str, extra_reads: list[str], epilogue_pre: list, out_expr, extra_buffers: list[Buffer],
                 dtype: str, out: str = "Y", body_extra: list | None = None, prologue_extra: list | None = None
                 ) -> Kernel:
    """X[m,d] @ W[d,n] streamed over d, with hooks for fused row work."""
    return Kernel(
        name=name,
        grid=[GridAxis(axis="m", block="block_m"), GridAxis(axis="n", block="block_n")],
        loop=StreamLoop(axis="d", block="block_d", stages="stages"),
        threads="threads",
        buffers=[
            Buffer(name="X_s", axes=["m", "d"], scope="shared", dtype=dtype),
            Buffer(name="W_s", axes=["d", "n"], scope="shared", dtype=dtype),
            Buffer(name="acc", axes=["m", "n"], scope="fragment", dtype="float32", state=True),
            *extra_buffers,
            Buffer(name="out", axes=["m", "n"], scope="fragment", dtype="float32"),
        ],
        prologue=[Fill(dst="acc", value=0.0), *(prologue_extra or [])],
        body=[
            Load(src="X", dst="X_s"),
            Load(src="W", dst="W_s"),
            *(body_extra or []),
            Gemm(a="X_s", b="W_s", c="acc", contract="d", clear=False),
        ],
        epilogue=[*epilogue_pre, Map(dst="out", expr=out_expr), Store(src="out", dst=out)],
        reads=["X", "W", *extra_reads],
        writes=[out],
        params={"block_m": [64, 128], "block_n": [64, 128], "block_d": [32, 64], "stages": [2, 3],
                "threads": [128, 256]},
        defaults={"block_m": 128, "block_n": 128, "block_d": 32, "stages": 2, "threads": 128},
    )


def gemm_plan(m: int = 256, d: int = 256, n: int = 256, dtype: str = "float16") -> Plan:
    """Y[m,n] = X[m,d] @ W[d,n], one kernel streaming d."""
    tensors = [_tensor("X", {"m": m, "d": d}, dtype, "input"), _tensor("W", {"d": d, "n": n}, dtype, "input"),
               _tensor("Y", {"m": m, "n": n}, dtype, "output")]
    return _plan("Matmul", dtype, tensors, [_gemm_kernel("matmul", [], [], ref("acc"), [], dtype)])


def rmsnorm_gemm_plan(m: int = 256, d: int = 256, n: int = 256, dtype: str = "float16", eps: float = 1e-6) -> Plan:
    """Y = (X * rsqrt(mean_d X^2 + eps)) @ W in one kernel: the sum of squares rides the d loop."""
    tensors = [_tensor("X", {"m": m, "d": d}, dtype, "input"), _tensor("W", {"d": d, "n": n}, dtype, "input"),
               _tensor("Y", {"m": m, "n": n}, dtype, "output")]
    extra = [
        Buffer(name="sq", axes=["m", "d"], scope="fragment", dtype="float32"),
        Buffer(name="ss", axes=["m"], scope="fragment", dtype="float32", state=True),
        Buffer(name="rs", axes=["m"], scope="fragment", dtype="float32"),
    ]
    body_extra = [
        Map(dst="sq", expr=call("square", ref("X_s"))),
        Reduce(fn="sum", src="sq", dst="ss", axis="d", accumulate=True),
    ]
    scale = Map(dst="rs", expr=call("rsqrt", call("add", call("mul", ref("ss"), const(1.0 / d)), const(eps))))
    k = _gemm_kernel("rmsnorm_matmul", [], [scale], call("mul", ref("acc"), ref("rs")), extra, dtype,
                     body_extra=body_extra, prologue_extra=[Fill(dst="ss", value=0.0)])
    return _plan("RMSNorm", dtype, tensors, [k])


def two_kernel_plan(m: int = 256, d: int = 256, n: int = 256, dtype: str = "float16", eps: float = 1e-6) -> Plan:
    """Row scale S[m] = rsqrt(mean_d X^2 + eps) (one block per row, scalar state), then Y = (X @ W) * S."""
    tensors = [_tensor("X", {"m": m, "d": d}, dtype, "input"), _tensor("W", {"d": d, "n": n}, dtype, "input"),
               _tensor("S", {"m": m}, "float32", "intermediate"), _tensor("Y", {"m": m, "n": n}, dtype, "output")]
    rownorm = Kernel(
        name="row_scale",
        grid=[GridAxis(axis="m", block=1)],
        loop=StreamLoop(axis="d", block="block_d", stages=2),
        threads=128,
        buffers=[
            Buffer(name="x", axes=["d"], scope="shared", dtype=dtype),
            Buffer(name="sq", axes=["d"], scope="fragment", dtype="float32"),
            Buffer(name="ss", axes=[], scope="fragment", dtype="float32", state=True),
            Buffer(name="r", axes=[], scope="fragment", dtype="float32"),
        ],
        prologue=[Fill(dst="ss", value=0.0)],
        body=[Load(src="X", dst="x"), Map(dst="sq", expr=call("square", ref("x"))),
              Reduce(fn="sum", src="sq", dst="ss", axis="d", accumulate=True)],
        epilogue=[Map(dst="r", expr=call("rsqrt", call("add", call("div", ref("ss"), const(float(d))),
                                                           const(eps)))),
                  Store(src="r", dst="S")],
        reads=["X"], writes=["S"],
        params={"block_d": [64, 128, 256]}, defaults={"block_d": 128},
    )
    extra = [Buffer(name="s", axes=["m"], scope="fragment", dtype="float32")]
    scaled = _gemm_kernel("scaled_matmul", ["S"], [Load(src="S", dst="s")], call("mul", ref("acc"), ref("s")),
                          extra, dtype)
    return _plan("RowScaledMatmul", dtype, tensors, [rownorm, scaled])


def attention_plan(h: int = 2, t_q: int = 256, t_kv: int = 256, d: int = 64, dtype: str = "float16") -> Plan:
    """O = softmax_{t_kv}(Q K^T) V with online softmax: the worked example of the plan semantics."""
    tensors = [_tensor("Q", {"h": h, "t_q": t_q, "d": d}, dtype, "input"),
               _tensor("K", {"h": h, "t_kv": t_kv, "d": d}, dtype, "input"),
               _tensor("V", {"h": h, "t_kv": t_kv, "d": d}, dtype, "input"),
               _tensor("O", {"h": h, "t_q": t_q, "d": d}, dtype, "output")]
    f32 = "float32"
    k = Kernel(
        name="attention",
        grid=[GridAxis(axis="h", block=1), GridAxis(axis="t_q", block="block_t_q"), GridAxis(axis="d", block=d)],
        loop=StreamLoop(axis="t_kv", block="block_t_kv", stages="stages"),
        threads="threads",
        buffers=[
            Buffer(name="Q_s", axes=["t_q", "d"], scope="shared", dtype=dtype),
            Buffer(name="K_s", axes=["t_kv", "d"], scope="shared", dtype=dtype),
            Buffer(name="V_s", axes=["t_kv", "d"], scope="shared", dtype=dtype),
            Buffer(name="S", axes=["t_q", "t_kv"], scope="fragment", dtype=f32),
            Buffer(name="m", axes=["t_q"], scope="fragment", dtype=f32, state=True),
            Buffer(name="m_prev", axes=["t_q"], scope="fragment", dtype=f32),
            Buffer(name="scale", axes=["t_q"], scope="fragment", dtype=f32),
            Buffer(name="l", axes=["t_q"], scope="fragment", dtype=f32, state=True),
            Buffer(name="rs", axes=["t_q"], scope="fragment", dtype=f32),
            Buffer(name="P16", axes=["t_q", "t_kv"], scope="fragment", dtype=dtype),
            Buffer(name="acc", axes=["t_q", "d"], scope="fragment", dtype=f32, state=True),
            Buffer(name="out", axes=["t_q", "d"], scope="fragment", dtype=f32),
        ],
        prologue=[Load(src="Q", dst="Q_s"), Fill(dst="m", value="-inf"), Fill(dst="l", value=0.0),
                  Fill(dst="acc", value=0.0)],
        body=[
            Load(src="K", dst="K_s"),
            Load(src="V", dst="V_s"),
            Gemm(a="Q_s", b="K_s", c="S", contract="d", clear=True),
            Map(dst="m_prev", expr=ref("m")),
            Reduce(fn="max", src="S", dst="m", axis="t_kv", accumulate=True),
            Map(dst="scale", expr=call("exp2", call("mul", call("sub", ref("m_prev"), ref("m")), const(LOG2E)))),
            Map(dst="S", expr=call("exp2", call("mul", call("sub", ref("S"), ref("m")), const(LOG2E)))),
            Reduce(fn="sum", src="S", dst="rs", axis="t_kv", accumulate=False),
            Map(dst="l", expr=call("add", call("mul", ref("l"), ref("scale")), ref("rs"))),
            Map(dst="acc", expr=call("mul", ref("acc"), ref("scale"))),
            Map(dst="P16", expr=ref("S")),
            Gemm(a="P16", b="V_s", c="acc", contract="t_kv", clear=False),
        ],
        epilogue=[Map(dst="out", expr=call("div", ref("acc"), ref("l"))), Store(src="out", dst="O")],
        reads=["Q", "K", "V"],
        writes=["O"],
        params={"block_t_q": [64, 128], "block_t_kv": [64, 128], "stages": [1, 2], "threads": [128, 256]},
        defaults={"block_t_q": 64, "block_t_kv": 64, "stages": 2, "threads": 128},
    )
    return _plan("Attention", dtype, tensors, [k])


def _needs_positive(name: str) -> bool:
    with np.errstate(invalid="ignore", divide="ignore"):
        return not np.isfinite(ELEMENTWISE[name].numpy(np.float64(-0.5)))


def _all_functions_expr(x):
    """An expression using every function of the op table (x is the operand, an Expr).

    Unary functions defined only for positive arguments get p = 1 + x*x/4; binary ones get (x, p).
    """
    p = call("add", const(1.0), call("mul", call("mul", x, x), const(0.25)))
    terms = [call(n, p if _needs_positive(n) else x) for n in UNARY]
    terms += [call(n, x, p) for n in BINARY]
    out = terms[0]
    for t in terms[1:]:
        out = call("add", out, t)
    return out


def _all_functions_np(x):
    """The float64 value of ``_all_functions_expr`` from the op table's numpy meanings."""
    p = 1.0 + x * x * 0.25
    out = sum(UNARY[n].numpy(p if _needs_positive(n) else x) for n in UNARY)
    return out + sum(BINARY[n].numpy(x, p) for n in BINARY)


def elementwise4d_plan(a: int = 2, b: int = 3, c: int = 64, e: int = 64, dtype: str = "float16") -> Plan:
    """Y = f(X) over four tiled/indexed grid axes (launch dims must fold); f uses every Map function."""
    tensors = [_tensor("X", {"a": a, "b": b, "c": c, "e": e}, dtype, "input"),
               _tensor("Y", {"a": a, "b": b, "c": c, "e": e}, dtype, "output")]
    k = Kernel(
        name="pointwise",
        grid=[GridAxis(axis="a", block=1), GridAxis(axis="b", block=1), GridAxis(axis="c", block="block_c"),
              GridAxis(axis="e", block="block_e")],
        threads=128,
        buffers=[Buffer(name="x", axes=["c", "e"], scope="fragment", dtype="float32"),
                 Buffer(name="y", axes=["c", "e"], scope="fragment", dtype=dtype)],
        body=[Load(src="X", dst="x"), Map(dst="y", expr=_all_functions_expr(ref("x"))), Store(src="y", dst="Y")],
        reads=["X"], writes=["Y"],
        params={"block_c": [16, 32], "block_e": [32, 64]}, defaults={"block_c": 16, "block_e": 32},
    )
    return _plan("Pointwise4D", dtype, tensors, [k])


FIXTURES = {
    "gemm": gemm_plan,
    "attention": attention_plan,
    "rmsnorm_gemm": rmsnorm_gemm_plan,
    "two_kernel": two_kernel_plan,
    "elementwise4d": elementwise4d_plan,
}


# --- float64 references: inputs (name -> array) -> outputs (name -> array) ---------------------

def _rms_scale(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return 1.0 / np.sqrt(np.mean(x * x, axis=-1) + eps)


def _softmax_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    s = np.einsum("hqd,hkd->hqk", q, k)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return np.einsum("hqk,hkd->hqd", p / p.sum(axis=-1, keepdims=True), v)


REFERENCES = {
    "gemm": lambda t: {"Y": t["X"] @ t["W"]},
    "attention": lambda t: {"O": _softmax_attention(t["Q"], t["K"], t["V"])},
    "rmsnorm_gemm": lambda t: {"Y": (t["X"] * _rms_scale(t["X"])[:, None]) @ t["W"]},
    "two_kernel": lambda t: {"S": _rms_scale(t["X"]), "Y": (t["X"] @ t["W"]) * _rms_scale(t["X"])[:, None]},
    "elementwise4d": lambda t: {"Y": _all_functions_np(t["X"])},
}


def assert_scaled_plan_matches_float64(plan: Plan, label: str) -> None:
    """A searched plan, scaled down, through the CPU executor and its emulated TileLang against the
    float64 reference, at the per-dtype bound of ``run.verify.error_bound`` (a one-kernel plan:
    float16 about 1.1e-3, bfloat16 about 8e-3; each stored intermediate adds a rounding)."""
    from pyrunner.backend.tilelang.emulate import execute_rendered
    from pyrunner.run.executor import execute
    from pyrunner.run.runner import graph_of
    from pyrunner.run.shrink import scale_down
    from pyrunner.run.verify import error_bound, reduction_length, verify_executor

    small = scale_down(plan)
    graph = graph_of(small)
    bound = error_bound(small.dtype, reduction_length(graph), stores=len(small.kernels))
    if len(small.kernels) == 1:
        assert bound < {"float16": 1.1e-3, "bfloat16": 8e-3}[small.dtype]
    for run in (execute, execute_rendered):
        res = verify_executor(small, graph, run, bound=bound)
        assert res.ok, f"{label} ({run.__name__}): {res.message} (seed {res.seed})"
        assert set(res.per_output) == {t.name for t in small.tensors if t.role == "output"}
