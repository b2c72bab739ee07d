"""Failures real model code hit in the PyTorch entry points (issue 40), each pinned by a test that failed
before its fix: tuple-valued ops (``split``/``chunk``) in the backend, gradients lost through
``optimize``, and model code that ``torch.fx`` symbolic tracing could not take."""

from __future__ import annotations

import functools
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pyrunner
import pyrunner.frontend  # noqa: F401 - registers the backend
from pyrunner.frontend.backend import LAST_REPORTS


def r(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def swiglu_fused(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    gate, up = (x @ w).chunk(2, dim=-1)  # one GEMM for gate and up, as fused SwiGLU layers do
    return F.silu(gate) * up


def qkv_split(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    q, k, v = (x @ w).split(16, dim=1)  # GPT-2's fused c_attn
    return torch.softmax(q @ k.T, dim=-1) @ v


@pytest.mark.parametrize("fn", [swiglu_fused, qkv_split])
@pytest.mark.parametrize("fallback", ["eager", "inductor"])
def test_backend_takes_split_and_chunk(fn, fallback: str) -> None:
    """A tuple of tensors is a computation, not a constant: before the fix the backend baked the example
    tensors into the graph (inductor: 'convert all Tensors to FakeTensors'; eager: NameError 'float64')."""
    x, w = r(8, 16), r(16, 48, seed=1)
    torch._dynamo.reset()
    with torch.no_grad():
        c = torch.compile(fn, backend="superopt", options={"fallback": fallback, "executor": "reference"})
        got = c(x, w)
        assert torch.allclose(got, fn(x, w), rtol=0, atol=1e-10)
        x2 = r(8, 16, seed=5)  # other values, same shapes: nothing of the first call was baked in
        assert torch.allclose(c(x2, w), fn(x2, w), rtol=0, atol=1e-10)
    assert LAST_REPORTS[-1].regions


class TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


def test_training_through_optimize_gets_eager_gradients(caplog: pytest.LogCaptureFixture) -> None:
    """Two SGD steps through ``optimize`` give eager's gradients and weights. Before the fix every
    ``.grad`` was None: the regions had no backward and PyTorch only warned. The regions now run their
    derived backward graphs (``frontend.autograd``), in float64 here."""
    from pyrunner.frontend.autograd import CALLS

    before = CALLS["backward"]
    ref, m = TwoLayer().double(), TwoLayer().double()
    x, y = r(8, 16), r(8, 4, seed=1)
    opt = pyrunner.optimize(m, x, executor="reference", progress=False)
    assert opt.report.regions  # under no_grad the regions run
    with torch.no_grad():
        assert torch.allclose(opt(x), ref(x), rtol=0, atol=1e-12)
    for model, f in ((ref, ref), (m, opt)):
        sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            sgd.zero_grad()
            with caplog.at_level(logging.INFO, logger="pyrunner.frontend"):
                F.mse_loss(f(x), y).backward()
            sgd.step()
    for p, q in zip(ref.parameters(), m.parameters(), strict=True):
        assert q.grad is not None
        assert torch.allclose(p.grad, q.grad, rtol=0, atol=1e-12)
        assert torch.allclose(p, q, rtol=0, atol=1e-12)
    assert CALLS["backward"] - before == 2 * len(opt.later_reports[-1].regions) > 0  # each step, each region
    assert "derived backward" in caplog.text  # one line per region says how it runs


def test_region_without_backward_raises_one_clear_error() -> None:
    """A region op reached by autograd anyway (called directly) raises, never returns no gradient."""
    from pyrunner.frontend.runtime import register_op

    op = register_op(lambda x: (x * 2,), 1, [((4,), torch.float64)])
    x = r(4).requires_grad_()
    with pytest.raises(Exception, match="no backward"):
        op(x).sum().backward()


def _deprecated(fn):
    """A kwargs-renaming decorator in the style of transformers' ``deprecate_kwarg`` (fx: 'co_varnames is too
    small')."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if "hidden" in kwargs:
            kwargs["x"] = kwargs.pop("hidden")
        return fn(*args, **kwargs)
    return wrapped


class HeadsModel(nn.Module):
    """``(*input_shape, -1, head_dim)`` views (fx: 'Proxy object cannot be iterated'), a decorated forward,
    and a keyword-only extra input."""

    def __init__(self, d: int = 32, head_dim: int = 8) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.q, self.o, self.head_dim = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False), head_dim

    @_deprecated
    def forward(self, x: torch.Tensor, *, scale: torch.Tensor | None = None) -> torch.Tensor:
        shape = x.shape[:-1]
        h = self.q(x).view(*shape, -1, self.head_dim).transpose(1, 2)
        h = torch.exp(h) if scale is None else torch.exp(h) * scale
        return self.o(h.transpose(1, 2).reshape(*shape, -1))


def layer_from_function(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return m(x) + 1  # a module called from a plain function (fx: the module was invisible)


def test_model_code_fx_could_not_trace() -> None:
    m = HeadsModel().double()
    x, s = r(2, 8, 32), r(1, 4, 1, 1, seed=3).abs()
    opt = pyrunner.optimize(m, x, executor="reference", progress=False, scale=s)  # an example by keyword
    with torch.no_grad():
        assert torch.allclose(opt(x, scale=s), m(x, scale=s), rtol=0, atol=1e-12)
    assert opt.report.regions
    fn = pyrunner.optimize(layer_from_function, m, x, executor="reference", progress=False)
    with torch.no_grad():
        assert torch.allclose(fn(m, x), layer_from_function(m, x), rtol=0, atol=1e-12)
    assert fn.report.regions


def test_region_ops_hand_back_the_contiguous_layout_their_fake_promises() -> None:
    """H200 torch_demo run: under the backend, inductor's stride assert failed on a region whose code
    returned a strided view ("expected size 8==8, stride 128==262144"): the fake promises contiguous."""
    import torch

    from pyrunner.frontend.runtime import register_op

    op = register_op(lambda x: (x.t(),), 1, [((3, 2), torch.float32)])
    x = torch.arange(6.0).reshape(2, 3)
    y = op(x)
    assert y.shape == (3, 2) and y.is_contiguous()
    assert torch.equal(y, x.t())
    compiled = torch.compile(lambda a: op(a) * 2, backend="inductor", dynamic=False)
    assert torch.equal(compiled(x), x.t() * 2)


def test_split_parts_a_region_also_reads_are_views_of_one_output() -> None:
    """Every part of a split leaves the region and one is read inside it too: the parts cannot stay the model's
    views, so the region's one output is the whole projection and each part a chunk of it (no kernel copies a
    part out through an index predicate), with eager's values."""
    from pyrunner.frontend.optimize import capture_graph
    from pyrunner.frontend.partition import example_values, partition, region_of
    from pyrunner.frontend.runtime import reference_impl, region_callable, region_module

    def f(x, w):
        q, k, v = (x @ w).split(16, dim=1)
        return q, k, v, q.sum(-1)

    x, w = r(8, 16), r(16, 48, seed=1)
    gm, ins = capture_graph(f, x, w)
    meta = example_values(gm, tuple(ins)).__getitem__
    (seg,) = partition(gm, meta, strict=True).segments
    rg = region_of(seg, meta, "split")
    assert len(rg.outputs) == 4 and len(rg.graph.outputs) == 2
    assert sorted(c for _, c in rg.selects.values()) == [0, 1, 2]
    got = region_callable(rg, reference_impl(rg), meta)(x, w)
    want = region_module(gm, rg, tuple(src for _, src, _ in rg.inputs))(x, w)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=1e-12)


def test_a_failure_while_splicing_leaves_the_graph_as_captured(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regions are spliced into the captured graph in place; a failure halfway (here: as the graph is put back in
    order) used to hand the fallback compiler that half-spliced graph, which read a value it never defined
    (CodeGen under autograd: UnboundLocalError). The fallback now compiles the graph as captured."""
    from pyrunner.frontend import partition

    def broken(graph) -> None:  # leaves a region's op after what reads it, as the CodeGen graph was, then fails
        op = next(n for n in graph.nodes if "superopt" in str(n.target))
        list(graph.nodes)[-1].append(op)
        raise RuntimeError("splice failed halfway")

    monkeypatch.setattr(partition, "restore_order", broken)
    x, w = r(8, 16), r(16, 48, seed=1)
    torch._dynamo.reset()
    with torch.no_grad():
        c = torch.compile(qkv_split, backend="superopt", options={"fallback": "eager", "executor": "reference"})
        assert torch.allclose(c(x, w), qkv_split(x, w), rtol=0, atol=1e-10)
    report = LAST_REPORTS[-1]
    assert not report.regions
    assert any("splice failed halfway" in why for _, why in report.fallbacks), report.fallbacks


def test_a_region_that_would_read_what_it_computes_is_refused() -> None:
    """A segment's nodes need not be contiguous (tuple-valued nodes and chunk views are skipped), so a region could
    read a value computed outside it from one of its own: its op would run before that input exists. Such a
    region is refused with the node named (``partition.reentry``), and the segment is cut instead; the GPT-NeoX
    model (``test_frontend_hf_models``) reached this through its chunk views."""
    from pyrunner.frontend.optimize import capture_graph
    from pyrunner.frontend.partition import example_values, region_of
    from pyrunner.frontend.trace import Unmappable

    def f(x, w):
        a = x @ w
        b = torch.tanh(a)  # outside the region below, computed from its first node
        return a * b

    x, w = r(8, 16), r(16, 16, seed=1)
    gm, ins = capture_graph(f, x, w)
    meta = example_values(gm, tuple(ins)).__getitem__
    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert len(calls) == 3
    with pytest.raises(Unmappable, match="comes back"):
        region_of([calls[0], calls[2]], meta, "gap")
    assert region_of(calls, meta, "whole") is not None


def test_attention_rows_whose_every_key_is_masked_are_zero_with_finite_gradients() -> None:
    """A boolean ``attn_mask`` row with no key kept (a left-padded prompt's first queries) is 0 in PyTorch's SDPA.
    Mapped as ``where(mask, s, -inf)`` its softmax was 0/0: NaN logits in every Hugging Face family with SDPA
    attention given a padded batch, and NaN gradients. Every row is read by the loss here, the dead ones too."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    mask[1, :, :, :2] = False  # batch 1: keys 0 and 1 padded, so its queries 0 and 1 see no key

    def f(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    opt = pyrunner.optimize(f, q, k, v, mask, executor="reference", progress=False)
    got = opt(q, k, v, mask)
    want = f(q, k, v, mask)
    assert torch.equal(got[1, :, :2], torch.zeros_like(got[1, :, :2]))
    assert torch.allclose(got, want, rtol=0, atol=1e-12)
    got.pow(2).sum().backward()
    mine = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    want.pow(2).sum().backward()
    for a, b in zip(mine, (q.grad, k.grad, v.grad), strict=True):
        assert torch.isfinite(a).all() and torch.allclose(a, b, rtol=0, atol=1e-12)
