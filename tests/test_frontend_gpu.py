"""The frontend on a GPU (skipped, saying so, without one): load verifies and matches the float64
meaning; optimize and the backend match the float64 function within the bf16 bound."""

from __future__ import annotations

import copy

import pytest
import torch
from frontend_models import DecoderBlock

import pyrunner
from pyrunner.ir import catalog
from pyrunner.planner import search
from pyrunner.run.verify import BOUNDS

pytestmark = pytest.mark.gpu


def _err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).abs().max() / ref.abs().max())


def test_load_verifies_and_computes_the_graph(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path))
    plan = search(catalog.get("SwiGLU", {"m": 256, "n": 256, "d": 256}), "bfloat16")[0]
    f = pyrunner.load(plan, verify=True)
    x, wg, wu = (torch.randn(256, 256, device="cuda").bfloat16() * 0.5 for _ in range(3))
    y = f(x, wg, wu)
    assert f.verified.ok and f.cache_hit is False
    ref = torch.nn.functional.silu(x.double() @ wg.double()) * (x.double() @ wu.double())
    assert _err(y, ref) <= BOUNDS["bfloat16"]
    g = pyrunner.load(plan)
    g.compile()
    assert g.cache_hit is True


def test_optimize_and_backend_match_the_float64_block(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path))
    m = DecoderBlock(d=256, heads=2, head_dim=64, ffn=512).cuda().bfloat16().eval().requires_grad_(False)
    x = torch.randn(256, 256, device="cuda").bfloat16()
    with torch.no_grad():
        ref = copy.deepcopy(m).double()(x.double())  # the same bf16 weights, in float64
        opt = pyrunner.optimize(m, x, progress=False)
        assert opt.report.regions
        assert _err(opt(x), ref) <= BOUNDS["bfloat16"]
        torch._dynamo.reset()
        c = torch.compile(m, backend="superopt")
        assert _err(c(x), ref) <= BOUNDS["bfloat16"]


@pytest.mark.parametrize("name", ["SwiGLU", "Attention"])
def test_load_backward_gradients_on_the_gpu(name: str, tmp_path, monkeypatch) -> None:
    """``load(plan, backward=True, verify=True)``: both halves verified, then the gradients of a call within
    the stated gradient bound of float64 autograd (``gradient_bound``, as ``composed_error`` conditions it
    on the CPU; the largest raised bound of the catalog checks there is 0.05)."""
    from pyrunner.run.grad_check import float64_torch, gradient_bound

    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path))
    sizes = {"m": 256, "n": 256, "d": 256} if name == "SwiGLU" else {"h": 2, "t_q": 256, "t_kv": 256, "d": 64}
    g = catalog.get(name, sizes)
    f = pyrunner.load(search(g, "bfloat16")[0], backward=True, verify=True)
    gen = torch.Generator().manual_seed(0)
    xs = {t.name: (torch.randn(*[g.sizes[a] for a in t.axes], generator=gen) * 0.5).cuda().bfloat16()
          .requires_grad_() for t in g.inputs()}
    y = f(**xs)
    cot = (torch.randn(y.shape, generator=gen) * 0.5).cuda().bfloat16()
    y.backward(cot)
    leaves = {n: x.detach().double().requires_grad_() for n, x in xs.items()}
    float64_torch(g)(**leaves)[g.outputs[0][0]].backward(cot.double())
    bound = max(gradient_bound(f.plans.forward, f.plans.backward, f.plans.bwd), 0.05)
    for n, x in xs.items():
        assert _err(x.grad, leaves[n].grad) <= bound, n
