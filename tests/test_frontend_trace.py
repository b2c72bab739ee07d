"""Tracing PyTorch into the graph IR, on the CPU: every traced function's IR evaluates (float64 reference
interpreter) to the function's own float64 values; regions are cut where the IR needs them; every op
the IR lacks is a one-line error naming the op and the source line."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from frontend_models import DecoderBlock

import pyrunner
import pyrunner.frontend  # noqa: F401 - registers the backend
from pyrunner.frontend.backend import LAST_REPORTS
from pyrunner.frontend.errors import FrontendError
from pyrunner.frontend.optimize import capture_graph
from pyrunner.frontend.partition import example_values, partition, region_of, stages
from pyrunner.frontend.torchops import target_name
from pyrunner.frontend.trace import Unmappable
from pyrunner.planner import search

VIEWS = ("t", "getattr", "transpose", "permute", "view", "reshape", "unsqueeze", "squeeze", "contiguous")

F64 = 1e-10
"""float64 on both sides: only summation order differs."""


def r(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


CASES = {
    "matmul_scale": (lambda x, w: (x @ w) * 0.5 + 1.0, (r(8, 16), r(16, 12, seed=1))),
    "linear_bias": (lambda x, w, b: F.linear(x, w, b), (r(8, 16), r(12, 16, seed=1), r(12, seed=2))),
    "bmm_batched": (lambda a, b: torch.bmm(a, b), (r(3, 8, 16), r(3, 16, 4, seed=1))),
    "einsum_two_contracted": (lambda a, w: torch.einsum("thk,hkd->td", a, w), (r(8, 2, 4), r(2, 4, 16, seed=1))),
    "softmax_transpose": (lambda x, w: torch.softmax(x @ w.T, dim=-1), (r(8, 16), r(12, 16, seed=1))),
    "rms_norm_weight": (lambda x, g: F.rms_norm(x, (16,), g, eps=1e-6), (r(8, 16), r(16, seed=1))),
    "layer_norm_affine": (lambda x, g, b: F.layer_norm(x, (16,), g, b), (r(8, 16), r(16, seed=1), r(16, seed=2))),
    "elementwise": (lambda x, y: F.silu(x) * torch.sigmoid(y) - torch.tanh(x) / (1 + y.abs()) + F.relu(-x),
                    (r(8, 16), r(8, 16, seed=1))),
    "pow_rsqrt_gelu": (lambda x: F.gelu(x, approximate="tanh") + (x * x + 1) ** -0.5 + x.pow(2) + torch.exp(x),
                       (r(8, 16),)),
    "broadcast_keepdim": (lambda x: x - x.amax(dim=-1, keepdim=True) + x.mean(0) + x.sum(-1, keepdim=True),
                          (r(8, 16),)),
    "rsub_rdiv_clamp": (lambda x: 1.0 - x + 2.0 / (x.clamp(min=0.5) + 1), (r(8, 16),)),
    "size_one_views": (lambda x, w: (x.unsqueeze(0) @ w).squeeze(0).reshape(1, 8, 12).contiguous(),
                       (r(8, 16), r(16, 12, seed=1))),
    "column_vector": (lambda x, s: x * s, (r(8, 16), r(8, 1, seed=1))),
    "shape_arithmetic": (lambda x, w: (x @ w) * x.shape[-1] ** -0.5, (r(8, 16), r(16, 12, seed=1))),
    "gram_of_input": (lambda x: x @ x.T, (r(8, 8),)),
    "gram_of_computed": (lambda x: torch.exp(x) @ torch.exp(x).T + 1, (r(8, 8),)),
    "sdpa_cross": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
                   (r(2, 8, 16), r(2, 12, 16, seed=1), r(2, 12, 4, seed=2))),
    # real model code (issue 40): views that split and merge axes, rotary embeddings, masks, GQA, fused splits
    "heads_split_merge": (lambda x, w, o: F.linear((x @ w).view(2, 8, 4, 8).transpose(1, 2).exp()
                                                   .transpose(1, 2).reshape(16, 32), o),
                          (r(2, 8, 16), r(16, 32, seed=1), r(16, 32, seed=2))),
    "rotate_half": (lambda x, c, s: x * c + torch.cat((-x[..., 4:], x[..., :4]), dim=-1) * s,
                    (r(2, 8, 8), r(8, 8, seed=1), r(8, 8, seed=2))),
    "chunk_swiglu": (lambda x, w: F.silu((x @ w).chunk(2, -1)[0]) * (x @ w).chunk(2, -1)[1],
                     (r(8, 16), r(16, 24, seed=1))),
    "addmm_split": (lambda x, b, w: torch.addmm(b, x, w).split(8, dim=1)[2] + 1,
                    (r(8, 16), r(24, seed=1), r(16, 24, seed=2))),
    "where_mask": (lambda x, m: torch.softmax(torch.where(m, x, float("-inf")), -1),
                   (r(8, 8), torch.ones(8, 8, dtype=torch.bool).tril())),
    "masked_fill": (lambda x, m: torch.softmax(x.masked_fill(~m, -1e9), -1),
                    (r(8, 8), torch.ones(8, 8, dtype=torch.bool).tril())),
    "repeat_kv_matmul": (lambda q, k: q @ k[:, None].expand(2, 3, 8, 4).reshape(6, 8, 4).transpose(1, 2),
                         (r(6, 5, 4), r(2, 8, 4, seed=1))),
    "sdpa_causal_gqa": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                        (r(4, 8, 16), r(2, 8, 16, seed=1), r(2, 8, 16, seed=2))),
    "sdpa_bool_mask": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                       (r(2, 8, 16), r(2, 8, 16, seed=1), r(2, 8, 16, seed=2),
                        torch.ones(8, 8, dtype=torch.bool).tril(-1).logical_not().T)),
    "sdpa_float_mask_softcap": (lambda q, k, m: torch.softmax(torch.tanh((q @ k.transpose(-1, -2)) / 5) * 5 + m, -1),
                                (r(2, 8, 16), r(2, 8, 16, seed=1), torch.zeros(8, 8).triu(1) * -1e4)),
    "slice_of_masked_scores": (lambda x, m: torch.softmax((x + m)[:, :4], -1) + torch.cat((m, m), -1)[:, 8:12].exp(),
                               (r(8, 8), torch.zeros(8, 8, dtype=torch.float64).masked_fill(
                                   torch.ones(8, 8).triu(1).bool(), float("-inf")))),
    "comparison_masks": (lambda x, y: torch.exp(x) * ((x > y) & (y >= 0)) + (x < 0) * 2.0,
                         (r(8, 16), r(8, 16, seed=1))),
    "gelu_new_pow3": (lambda x: 0.5 * x * (1 + torch.tanh(0.79788456 * (x + 0.044715 * torch.pow(x, 3.0)))),
                      (r(8, 16),)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_traced_ir_matches_function_in_float64(name: str) -> None:
    fn, inputs = CASES[name]
    opt = pyrunner.optimize(fn, *inputs, executor="reference", progress=False)
    assert opt.report.regions and not opt.report.fallbacks
    left = [n for n in opt.graph_module.graph.nodes if n.op.startswith("call")
            and not str(n.target).startswith("superopt.") and target_name(n) not in ("getitem", *VIEWS)]
    assert not left, f"computation left outside the regions: {left}"
    want = fn(*inputs)
    got = opt(*inputs)
    assert got.shape == want.shape and got.dtype == want.dtype
    err = float((got - want).abs().max() / want.abs().max())
    assert err <= F64, err


def test_optimized_keeps_signature_and_keywords() -> None:
    def f(x, w, scale=2.0):
        return (x @ w) * scale

    x, w = r(8, 16), r(16, 4, seed=1)
    opt = pyrunner.optimize(f, x, w, executor="reference", progress=False)
    assert list(opt.__signature__.parameters) == ["x", "w", "scale"]
    assert torch.allclose(opt(w=w, x=x), f(x, w))


def test_self_attention_gives_queries_and_keys_their_own_axes() -> None:
    """An input used as queries and as keys enters the graph twice, under two token axes; a computed
    value cannot, so the region is cut before the scores and the keys become an input."""
    def attn(x, wq, wk, wv):
        q, k, v = x @ wq, x @ wk, x @ wv
        return torch.softmax(q @ k.T, dim=-1) @ v

    inputs = (r(16, 8), r(8, 8, seed=1), r(8, 8, seed=2), r(8, 8, seed=3))
    opt = pyrunner.optimize(attn, *inputs, executor="reference", progress=False)
    (region,) = [c.region for c in opt.report.regions]
    assert len([name for name, src, _ in region.inputs if src.name in ("x", "l_x_")]) == 2  # dynamo: l_x_
    assert torch.allclose(opt(*inputs), attn(*inputs), rtol=0, atol=1e-12)

    def attn_normed(x, wq, wk, wv):
        h = F.rms_norm(x, (8,))
        q, k, v = h @ wq, h @ wk, h @ wv
        return torch.softmax(q @ k.T, dim=-1) @ v

    opt = pyrunner.optimize(attn_normed, *inputs, executor="reference", progress=False)
    assert len(opt.report.regions) == 2
    assert len(opt.report.regions[1].region.graph.sizes) == 4  # query and key tokens, qk and v features
    assert torch.allclose(opt(*inputs), attn_normed(*inputs), rtol=0, atol=1e-12)


def test_axis_names_can_be_given() -> None:
    opt = pyrunner.optimize(lambda x, w: x @ w, r(8, 16), r(16, 4, seed=1), executor="reference",
                            progress=False, axes={"x": "td", "w": ("d", "n")})
    assert set(opt.report.regions[0].region.graph.sizes) == {"t", "d", "n"}


def test_decoder_block_matches_eager_in_float64() -> None:
    m = DecoderBlock(d=64, heads=2, head_dim=16, ffn=128).double()
    x = r(32, 64)
    opt = pyrunner.optimize(m, x, executor="reference", progress=False)
    with torch.no_grad():
        want = m(x)
        got = opt(x)
    assert float((got - want).abs().max() / want.abs().max()) <= F64
    assert len(opt.report.regions) == 2  # attention scores need the token axis twice: one cut


def test_decoder_stages_all_plan() -> None:
    """The pieces the GPU path plans: norm+QKV, attention, out-projection+residual+norm+SwiGLU, down+residual."""
    m = DecoderBlock(d=256, heads=2, head_dim=64, ffn=512).bfloat16()
    x = torch.randn(256, 256, dtype=torch.bfloat16)
    gm, ins = capture_graph(m, x)
    values = example_values(gm, tuple(ins))
    part = partition(gm, values.__getitem__, strict=True)
    pieces = [p for seg in part.segments for p in stages(seg)]
    assert len(pieces) == 4
    names = [[str(n.target) for n in p] for p in pieces]
    assert any("scaled_dot_product_attention" in t for t in names[1])
    for i, p in enumerate(pieces):
        rg = region_of(p, values.__getitem__, f"piece{i}")
        plan = search(rg.graph, "bfloat16")[0]
        assert plan.kernels


def _fallback(fn, *inputs) -> str:
    """The reason the first op left to PyTorch gives; the function still runs and gives its own values."""
    opt = pyrunner.optimize(fn, *inputs, executor="reference", progress=False)
    assert opt.report.fallbacks, "expected an op left to PyTorch"
    want, got = fn(*inputs), opt(*inputs)
    assert torch.allclose(got, want, rtol=0, atol=1e-12)
    msg = opt.report.fallbacks[0][1]
    assert "\n" not in msg
    return msg


def test_unmappable_ops_are_named_with_their_source_line() -> None:
    """An op the IR lacks stays a PyTorch op (never a failure); the reason names it and its source line."""
    def uses_cumsum(x):
        return torch.cumsum(x, 0) * 2  # the line the reason must quote

    msg = _fallback(uses_cumsum, r(8, 16))
    assert "torch.cumsum" in msg and "test_frontend_trace.py" in msg and "torch.cumsum(x, 0) * 2" in msg
    assert "F.gelu(x, approximate='tanh')" in _fallback(lambda x: F.gelu(x), r(8, 16))
    assert "log_softmax" in _fallback(lambda x: torch.log_softmax(x, -1), r(8, 16))
    assert "rounding_mode=" in _fallback(lambda x: torch.div(x, 2.0, rounding_mode="floor"), r(8, 16))
    assert "cumprod" in _fallback(lambda x: torch.cumprod(x, 1) + 1, r(8, 16))


def test_data_dependent_branch_is_a_graph_break_not_an_error() -> None:
    """What torch.fx could not trace, dynamo captures as two graphs around the branch."""
    def branchy(x):
        if x.sum() > 0:
            return torch.exp(x) * 2
        return -x

    x = r(4, 4).abs()
    opt = pyrunner.optimize(branchy, x, executor="reference", progress=False)
    assert opt.report.regions
    assert torch.allclose(opt(x), branchy(x)) and torch.allclose(opt(-x), branchy(-x))


def test_optimize_without_gpu_says_so() -> None:
    if torch.cuda.is_available():
        pytest.skip("checks the note a machine without a GPU gives")
    x = r(4, 4)
    opt = pyrunner.optimize(lambda x: x * 2, x, progress=False)
    assert any("no CUDA GPU" in n for n in opt.report.notes)
    assert torch.equal(opt(x), x * 2)
    with pytest.raises(FrontendError, match="executor"):
        pyrunner.optimize(lambda x: x * 2, x, executor="tpu", progress=False)


def test_partition_falls_back_per_node_and_says_why() -> None:
    def f(x, w, v):
        return torch.cumsum(torch.softmax(x @ w, -1) @ v, 0) + 1

    gm, ins = capture_graph(f, r(8, 16), r(16, 12, seed=1), r(12, 4, seed=2))
    values = example_values(gm, tuple(ins))
    part = partition(gm, values.__getitem__)
    assert [len(s) for s in part.segments] == [3, 1]
    (node, why), = part.fallbacks
    assert node.name == "cumsum" and "no such op" in why
    with pytest.raises(Unmappable):
        partition(gm, values.__getitem__, strict=True)


def test_backend_regions_fallbacks_and_values(caplog: pytest.LogCaptureFixture) -> None:
    m = DecoderBlock(d=64, heads=2, head_dim=16, ffn=128).double().eval()
    x = r(32, 64)
    with torch.no_grad():
        c = torch.compile(m, backend="superopt", options={"fallback": "eager", "executor": "reference"})
        got = c(x)
        want = m(x)
    assert float((got - want).abs().max() / want.abs().max()) <= F64
    assert len(LAST_REPORTS[-1].regions) == 2 and not LAST_REPORTS[-1].fallbacks

    def g(x, w):
        return torch.cumsum(x @ w, 0).softmax(-1)

    with caplog.at_level(logging.WARNING, logger="pyrunner.frontend"), torch.no_grad():
        c = torch.compile(g, backend="superopt", options={"fallback": "eager", "executor": "reference"})
        w = r(64, 16, seed=1)
        assert torch.allclose(c(x, w), g(x, w), rtol=0, atol=1e-12)
    assert "torch.cumsum" in caplog.text and "left to PyTorch" in caplog.text


def test_backend_without_gpu_hands_everything_to_the_fallback(caplog: pytest.LogCaptureFixture) -> None:
    if torch.cuda.is_available():
        pytest.skip("checks what a machine without a GPU does")
    torch._dynamo.reset()
    with caplog.at_level(logging.WARNING, logger="pyrunner.frontend"):
        c = torch.compile(lambda x: x @ x.T + 1, backend="superopt",
                          options={"fallback": "eager", "executor": "gpu"})
        x = r(8, 4)
        assert torch.allclose(c(x), x @ x.T + 1)
    assert "no CUDA GPU" in LAST_REPORTS[-1].fallbacks[0][1]
    torch._dynamo.reset()
    c = torch.compile(lambda x: x @ x.T + 2, backend="superopt", options={"fallback": "eager"})
    assert torch.allclose(c(x), x @ x.T + 2)
    assert any("no CUDA GPU" in n for n in LAST_REPORTS[-1].notes)  # auto: planned, checked, run by PyTorch


@pytest.mark.slow
def test_backend_with_inductor_runs_regions_as_custom_ops() -> None:
    def g(x, w, v):
        return torch.cumsum(torch.softmax(x @ w, -1) @ v, 0) + 1

    x, w, v = (t.float() for t in (r(64, 32), r(32, 48, seed=1), r(48, 16, seed=2)))
    torch._dynamo.reset()
    with torch.no_grad():
        c = torch.compile(g, backend="superopt", options={"fallback": "inductor", "executor": "reference"})
        assert torch.allclose(c(x, w, v), g(x, w, v), rtol=1e-4, atol=1e-4)
    assert len(LAST_REPORTS[-1].regions) == 2
