"""Region ops lay out their outputs as the model's own tensors: a node that is a view in the model (heads split
by ``view(...).transpose(1, 2)``) keeps a view's strides, so where the plan's storage already has that layout no
copy is made; where it has not, one copy gives the promised strides, never a stride inductor was not promised."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import pyrunner.frontend  # noqa: F401 - registers the backend
from pyrunner.frontend.region import RegionGraph
from pyrunner.frontend.runtime import region_callable
from pyrunner.frontend.strides import with_strides


def _region(node: torch.Tensor, perm: tuple[int, ...], graph_shape: tuple[int, ...]):
    """A one-output region whose FX node looks like ``node`` (meta) and whose graph output has ``graph_shape``."""
    shape = tuple(node.shape)
    rg = RegionGraph(SimpleNamespace(outputs=[("out0", None)]), [], [("x", None, graph_shape)],
                     [("out0", "node", (perm, shape, shape), shape)])
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


def test_a_broadcast_weight_first_leaves_the_result_in_the_tensors_own_axis_order() -> None:
    """``weight * x`` (as Hugging Face's RMSNorm writes it) is the tensor's layout, [tokens, hidden]: the region
    output is not stored transposed (which cost a copy back per call) and the norm plans as one kernel."""
    from pyrunner.frontend.optimize import capture_graph
    from pyrunner.frontend.partition import example_values, partition, region_of

    w = torch.randn(64, dtype=torch.float64)

    def rmsnorm(x):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    x = torch.randn(32, 64, dtype=torch.float64)
    gm, ins = capture_graph(rmsnorm, x)
    values = example_values(gm, tuple(ins))
    part = partition(gm, values.__getitem__, strict=True)
    (seg,) = part.segments
    rg = region_of(seg, values.__getitem__, "norm")
    (name, out), = rg.graph.outputs
    x_axes = next(t.axes for t in rg.graph.inputs() if len(t.axes) == 2)
    assert rg.graph.axes_of(out) == tuple(x_axes)


def test_only_dense_layouts_are_promised_a_slice_has_its_gaps_closed() -> None:
    """A permuted view is dense and promised as it is; a ``split`` piece (a slice with gaps) is not: inductor
    would not keep the gaps, so the op promises the piece's own axis order made dense (a head-split Q of a fused
    QKV stays token-major, as the next region reads it), or contiguous where the strides tell no order."""
    from pyrunner.frontend.strides import contiguous_strides, dense, dense_in_order

    assert dense((2, 4, 3), (3, 6, 1)) and dense((1, 2, 4, 3), (99, 3, 6, 1))
    assert not dense((8, 16), (48, 1)) and not dense((4, 4), (0, 1))
    assert contiguous_strides((2, 3, 4)) == (12, 4, 1) and contiguous_strides((0, 3)) == (3, 1)
    assert dense_in_order((8, 16), (48, 1)) == (16, 1)
    assert dense_in_order((1, 4, 8, 16), (1536, 16, 192, 1)) == (512, 16, 64, 1)  # (b, h, t, d), token-major
    assert dense_in_order((4, 4), (0, 1)) == (4, 1)  # a broadcast: no order to keep


def _head_major_region(downstream):
    """``q * 2 + 1`` on a head-split view ``q`` (its storage token-major, as a projection leaves it) as a region
    planned for real, and ``downstream`` of it left outside the region; with an impl that returns what the plan's
    kernels would: the values in the plan's own storage, seen in the graph's axis order (CPU: the reference
    interpreter's values copied into that storage). ``q`` is declared in its logical (head-major) order, as a
    region under autograd declares its inputs (``views=False``), so the plan stores the result head-major."""
    from pyrunner.frontend.load import LoadedPlan
    from pyrunner.frontend.optimize import capture_graph
    from pyrunner.frontend.partition import example_values, partition, region_of
    from pyrunner.frontend.region_plans import cached_plan
    from pyrunner.frontend.runtime import plan_layouts, reference_impl

    def f(q):
        return downstream(q * 2 + 1)

    base = torch.randn(1, 8, 4 * 16, dtype=torch.bfloat16)
    q = base.view(1, 8, 4, 16).transpose(1, 2)  # (batch, heads, tokens, head_dim), token-major storage
    gm, ins = capture_graph(f, q)
    meta = example_values(gm, tuple(ins)).__getitem__
    (seg,) = partition(gm, meta).segments
    cut = next(i for i, n in enumerate(seg) if "add" in n.name) + 1
    rg = region_of(seg[:cut], meta, "rotary_like", views=False)
    plan, _ = cached_plan(rg.graph, "bfloat16")
    lp = LoadedPlan(plan, views=True)
    ref = reference_impl(rg)

    def impl(feed):
        return tuple(s.from_plan(s.to_plan(o.to(torch.bfloat16)), contiguous=False)
                     for s, o in zip(lp.sig.outputs, ref(feed), strict=True))

    impl.layouts = lambda: plan_layouts(lp)
    return f, q, gm, meta, rg, impl, lp


def test_an_output_is_promised_the_layout_the_plans_kernels_write_and_handed_back_without_a_copy() -> None:
    """Issue 40 (a): the plan stores ``q * 2 + 1`` head-major while the model's tensor is token-major; the op
    promised the model's strides and copied (Llama-3-8B's rotary region: ~28 us a call on the H100). It now
    promises the plan's dense layout, returns the kernels' storage as it is, and the graph after it (traced by
    inductor with the promised strides) still computes eager's values."""
    from pyrunner.frontend.runtime import assemble, layouts_checked, output_strides, plan_layouts, region_callable

    f, q, gm, meta, rg, impl, lp = _head_major_region(lambda y: y.transpose(1, 2).reshape(1, 8, 64).sum(-1))
    ((mine,),) = layouts_checked(gm, [(rg, impl)], meta)
    (stored,) = plan_layouts(lp)
    (_, _, (perm, _, _), shape), = rg.outputs
    assert mine[1:] == stored.permute(perm).reshape(shape).stride()[1:]  # batch 1: its stride is free
    stored_at: list[torch.Tensor] = []

    def keep(feed):
        got = impl(feed)
        stored_at.extend(got)
        return got

    (out,) = region_callable(rg, keep, meta, [mine])(q)
    assert out.data_ptr() == stored_at[-1].data_ptr()  # no copy
    assert [mine] != output_strides(rg, meta)  # not the model's token-major strides: those cost the copy
    assemble(gm, [(rg, impl)], meta)
    with torch.no_grad():
        want = f(q)
        assert torch.allclose(gm(q)[0].float(), want.float(), rtol=0, atol=2e-2 * float(want.abs().max()))
        torch._dynamo.reset()
        traced = torch.compile(gm, backend="aot_eager")(q)[0]  # fake tensors: the promised strides flow on
        assert torch.allclose(traced.float(), want.float(), rtol=0, atol=2e-2 * float(want.abs().max()))


def test_a_view_after_the_region_that_needs_the_models_strides_keeps_them() -> None:
    """The graph's own code after a region may ``.view`` the output in a way only the model's layout allows; the
    op then promises the model's strides (one copy) rather than a layout inductor could not trace."""
    from pyrunner.frontend.runtime import assemble, layouts_checked, output_strides

    f, q, gm, meta, rg, impl, _ = _head_major_region(lambda y: y.transpose(1, 2).view(1, 8, 64).sum(-1))
    assert layouts_checked(gm, [(rg, impl)], meta) == [output_strides(rg, meta)]
    assemble(gm, [(rg, impl)], meta)
    with torch.no_grad():
        want = f(q)
        assert torch.allclose(gm(q)[0].float(), want.float(), rtol=0, atol=2e-2 * float(want.abs().max()))
