"""What Superopt does not take is compiled by inductor (``compile_fx``), not run eagerly, and regions are
custom ops inside inductor's graph -- on the CPU too (``executor="reference"`` puts regions in the graph;
the no-GPU ``plan`` path plans them and has inductor compile the whole graph)."""

from __future__ import annotations

import torch
from torch._inductor.utils import run_and_get_code

import pyrunner.frontend  # noqa: F401 - registers the backend
from pyrunner.frontend.backend import LAST_REPORTS


def f(x, w):
    return torch.cumsum(torch.softmax(x @ w, -1), 0) * 2 + 1


def _code(executor: str, dtype: torch.dtype) -> tuple[torch.Tensor, str, torch.Tensor]:
    x, w = torch.randn(8, 16, dtype=dtype), torch.randn(16, 16, dtype=dtype)
    torch._dynamo.reset()
    c = torch.compile(f, backend="superopt", dynamic=False, options={"fallback": "inductor", "executor": executor})
    with torch.no_grad():
        out, codes = run_and_get_code(c, x, w)
        want = f(x, w)
    return out, "\n".join(codes), want


def test_regions_are_custom_ops_inside_inductor_code() -> None:
    out, code, want = _code("reference", torch.float64)
    assert torch.allclose(out, want)
    assert LAST_REPORTS[-1].regions and LAST_REPORTS[-1].fallbacks  # cumsum is not in the graph IR
    assert "torch.ops.superopt.region" in code and "cumsum" in code  # inductor ran the rest around the op


def test_no_gpu_path_compiles_the_graph_with_inductor() -> None:
    out, code, want = _code("plan", torch.bfloat16)
    assert torch.allclose(out.float(), want.float(), rtol=2e-2, atol=2e-2)
    assert LAST_REPORTS[-1].regions and LAST_REPORTS[-1].regions[0].decision == "planned"
    assert "def call(" in code and "superopt.region" not in code  # inductor's code, regions left to it
