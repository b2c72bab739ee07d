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
