"""Region ops lay out their outputs as the model's own tensors: a node that is a view in the model (heads split
by ``view(...).transpose(1, 2)``) keeps a view's strides, so where the plan's storage already has that layout no
copy is made; where it has not, one copy gives the promised strides, never a stride inductor was not promised."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import pyrunner.frontend  # noqa: F401 - registers the backend
from pyrunner.frontend.runtime import region_callable, with_strides


def _region(node: torch.Tensor, perm: tuple[int, ...], graph_shape: tuple[int, ...]):
    """A one-output region whose FX node looks like ``node`` (meta) and whose graph output has ``graph_shape``."""
    shape = tuple(node.shape)
    rg = SimpleNamespace(inputs=[("x", None, graph_shape)], outputs=[("out0", "node", (perm, shape, shape), shape)])
    return rg, (lambda n: node)


def test_an_output_whose_storage_already_has_the_nodes_strides_is_that_view() -> None:
    t, h, d = 4, 2, 3
    node = torch.empty(1, t, h * d, device="meta").view(1, t, h, d).transpose(1, 2)  # (1, h, t, d), strided
    rg, meta = _region(node, (1, 0, 2), (t, h, d))
    stored: list[torch.Tensor] = []

    def impl(feed):  # the plan's output, graph axis order (t, h, d), contiguous
        stored.append(feed["x"] * 2)
        return (stored[-1],)

    out, = region_callable(rg, impl, meta)(torch.randn(t, h, d))
    assert out.shape == node.shape and out.stride()[1:] == node.stride()[1:]  # a size-one dimension's is free
    assert out.data_ptr() == stored[-1].data_ptr()  # no copy
    assert torch.equal(out, stored[-1].permute(1, 0, 2).unsqueeze(0))


def test_an_output_laid_out_otherwise_is_copied_once_into_the_nodes_strides() -> None:
    t, h, d = 4, 2, 3
    node = torch.empty(1, h, t, d, device="meta")  # contiguous in the model
    rg, meta = _region(node, (1, 0, 2), (t, h, d))
    x = torch.randn(t, h, d)
    out, = region_callable(rg, lambda feed: (feed["x"] + 1,), meta)(x)
    assert out.stride() == node.stride() and out.is_contiguous()
    assert torch.equal(out, (x + 1).permute(1, 0, 2).unsqueeze(0))


def test_with_strides_ignores_size_one_dimensions_and_copies_otherwise() -> None:
    x = torch.randn(1, 4, 3)
    assert with_strides(x, (999, 3, 1)) is x
    y = with_strides(x, (12, 1, 4))
    assert y.stride() == (12, 1, 4) and torch.equal(y, x)
    assert with_strides(x.transpose(1, 2), None).is_contiguous()


@pytest.mark.parametrize("executor", ["reference"])
def test_the_backend_returns_head_split_views_with_the_models_strides(executor: str) -> None:
    """End to end on the CPU: the compiled function's outputs have eager's strides (a transposed view stays one)."""
    w = torch.randn(16, 32, dtype=torch.float64)

    def f(x):
        q = (x @ w).view(1, 8, 4, 8).transpose(1, 2)  # (batch, heads, tokens, head_dim)
        return q * 2, torch.softmax(q, -1)

    x = torch.randn(1, 8, 16, dtype=torch.float64)
    torch._dynamo.reset()
    c = torch.compile(f, backend="superopt", dynamic=False, options={"fallback": "eager", "executor": executor})
    with torch.no_grad():
        got, want = c(x), f(x)
    for g, e in zip(got, want, strict=True):
        assert g.shape == e.shape and g.stride()[1:] == e.stride()[1:]  # batch 1: its stride is free
        assert torch.allclose(g, e)
