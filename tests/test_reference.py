"""The float64 reference interpreter agrees with hand-written torch float64
formulas of every catalog workload (the formulas are the test's oracle, written
from DESIGN section 4, independent of the graph IR)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pyrunner.ir import catalog as workloads
from pyrunner.ir import reference


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(x).to(torch.float64)


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _window_mask(tq: int, tkv: int, window: int) -> torch.Tensor:
    q, kv = torch.arange(tq)[:, None], torch.arange(tkv)[None, :]
    return (kv <= q) & (kv > q - window)


ORACLES = {
    "Attention": lambda i: torch.softmax(_t(i["Q"]) @ _t(i["K"]).transpose(-1, -2), -1) @ _t(i["V"]),
    "ScaledAttention": lambda i: torch.softmax(
        _t(i["Q"]) @ _t(i["K"]).transpose(-1, -2) / math.sqrt(i["Q"].shape[-1]), -1) @ _t(i["V"]),
    "GroupedQueryAttention": lambda i: torch.softmax(
        torch.einsum("kgqd,ktd->kgqt", _t(i["Q"]), _t(i["K"])) / math.sqrt(i["Q"].shape[-1]), -1
    ) @ _t(i["V"]).unsqueeze(1),
    "SwiGLU": lambda i: F.silu(_t(i["X"]) @ _t(i["W_gate"])) * (_t(i["X"]) @ _t(i["W_up"])),
    "GeGLU": lambda i: _gelu_tanh(_t(i["X"]) @ _t(i["W_gate"])) * (_t(i["X"]) @ _t(i["W_up"])),
    "Matmul": lambda i: _t(i["X"]) @ _t(i["W"]),
    "RMSNorm": lambda i: _rms(_t(i["X"]), 1e-6) @ _t(i["W"]),
    "RMSNormMLP": lambda i: (_rms(_t(i["X"]), 1e-6) @ _t(i["W_up"])) * (_rms(_t(i["X"]), 1e-6) @ _t(i["W_gate"])),
    "LayerNormMatmul": lambda i: F.layer_norm(_t(i["X"]), (i["X"].shape[-1],), eps=1e-5) @ _t(i["W"]),
    "CausalAttention": lambda i: F.scaled_dot_product_attention(_t(i["Q"]), _t(i["K"]), _t(i["V"]), is_causal=True),
    "SlidingWindowAttention": lambda i: F.scaled_dot_product_attention(
        _t(i["Q"]), _t(i["K"]), _t(i["V"]), attn_mask=_window_mask(i["Q"].shape[1], i["K"].shape[1], 1024)),
}


def test_every_catalog_workload_has_an_oracle() -> None:
    assert set(ORACLES) == set(workloads.CATALOG)


@pytest.mark.parametrize("name", sorted(ORACLES))
@pytest.mark.parametrize("seed", [0, 1])
def test_reference_matches_torch_float64(name: str, seed: int) -> None:
    g = workloads.get(name)
    rng = np.random.default_rng(seed)
    g = g.with_sizes({a: int(rng.integers(3, 24)) for a in g.sizes})
    inputs = reference.random_inputs(g, seed)
    (out,) = reference.evaluate(g, inputs).values()
    want = ORACLES[name](inputs).numpy()
    assert out.shape == want.shape
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)


def test_sliding_window_reference_matches_its_mask() -> None:
    """A window smaller than the sequence: rows see only their last `window` keys."""
    g = workloads.sliding_window_attention(h=2, t_q=40, t_kv=40, d=8, window=7)
    inputs = reference.random_inputs(g, 3)
    (out,) = reference.evaluate(g, inputs).values()
    want = F.scaled_dot_product_attention(_t(inputs["Q"]), _t(inputs["K"]), _t(inputs["V"]),
                                          attn_mask=_window_mask(40, 40, 7)).numpy()
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)


def test_fully_masked_row_is_nan_as_torch_softmax() -> None:
    """The stated convention: softmax over a row with every score masked (-inf) is NaN, exactly as
    ``torch.softmax`` gives (0/0); rows with any visible key are unaffected."""
    from pyrunner.ir.graph import GraphBuilder

    b = GraphBuilder("Padded")
    s = b.input("S", r=3, t=5)
    lengths = b.input("L", r=3)
    p = b.softmax(b.masked(s, b.lt(b.iota("t"), lengths)), axis="t")
    b.output("P", p)
    g = b.build()
    x = {"S": np.random.default_rng(0).standard_normal((3, 5)), "L": np.array([0.0, 2.0, 5.0])}
    (out,) = reference.evaluate(g, x).values()
    keep = torch.arange(5)[None, :] < torch.tensor([0, 2, 5])[:, None]
    want = torch.softmax(_t(x["S"]).masked_fill(~keep, -math.inf), -1).numpy()
    assert np.isnan(out[0]).all() and np.isnan(want[0]).all()
    np.testing.assert_allclose(out[1:], want[1:], rtol=1e-12)


@pytest.mark.parametrize("stable", [False, True])
def test_softmax_of_large_scores_is_finite(stable: bool) -> None:
    """Scores past exp's float64 range (divided by a small temperature, say) still have a finite
    softmax: the reference evaluates ``exp(y) / sum(exp(y))`` shifted by its maximum, like
    ``torch.softmax``, whether the graph was written with the helper or with the shift itself."""
    from pyrunner.ir.graph import GraphBuilder

    b = GraphBuilder("HotSoftmax")
    s = b.input("S", r=4, t=6)
    tau = b.input("tau", r=4)
    y = b.div(s, tau)
    if stable:
        y = b.sub(y, b.reduce("max", y, "t"))
    e = b.unary("exp", y)
    b.output("P", b.div(e, b.reduce("sum", e, "t")))
    g = b.build()
    x = {"S": np.random.default_rng(1).standard_normal((4, 6)), "tau": np.array([1e-3, -2e-3, 0.5, 1e-4])}
    (out,) = reference.evaluate(g, x).values()
    want = torch.softmax(_t(x["S"]) / _t(x["tau"])[:, None], -1).numpy()
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-300)
