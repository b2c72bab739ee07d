"""Shape buckets: free axes (never reduced, contracted, indexed or measured) are planned at a bucket size,
so nearby shapes share one plan; padding them and slicing back is exact, reduced axes stay exact."""

from __future__ import annotations

import numpy as np
import torch

import pyrunner.frontend  # noqa: F401 - registers the backend
from pyrunner.frontend.backend import LAST_REPORTS
from pyrunner.frontend.buckets import bucket, bucketed, free_axes, padded_impl
from pyrunner.ir import graph as ir
from pyrunner.ir.reference import evaluate
from pyrunner.plan.schema import axis_sizes


def _graph(t: int, d: int) -> ir.Graph:
    """log-softmax over d of x * w (w broadcast over t): t is free, d is reduced."""
    x, w = ir.inp("in0", ("t", "d")), ir.inp("in1", ("d",))
    s = ir.binary("mul", x, w)
    m = ir.reduce("max", s, "d")
    e = ir.unary("exp", ir.binary("sub", s, m))
    out = ir.unary("log", ir.binary("div", e, ir.reduce("sum", e, "d")))
    return ir.Graph("region", {"t": t, "d": d}, (("out0", out),), {})


def _ref(g: ir.Graph):
    return lambda feed: tuple(torch.from_numpy(evaluate(g, {k: v.numpy() for k, v in feed.items()})[n])
                              for n, _ in g.outputs)


def test_rule_and_free_axes() -> None:
    assert [bucket(n) for n in (1, 7, 64, 65, 100, 128, 2048, 2049)] == [1, 7, 64, 128, 128, 128, 2048, 2112]
    g = _graph(100, 16)
    assert free_axes(g) == {"t"}
    padded, pads = bucketed(g)
    assert pads == {"t": 100} and padded.sizes == {"t": 128, "d": 16}
    assert bucketed(_graph(100, 100))[0].sizes == {"t": 128, "d": 100}  # a reduced axis is never padded


def test_padding_a_free_axis_is_exact() -> None:
    g = _graph(100, 16)
    padded, pads = bucketed(g)
    rng = np.random.default_rng(0)
    feed = {"in0": torch.from_numpy(rng.standard_normal((100, 16))), "in1": torch.from_numpy(rng.random(16))}
    got = padded_impl(_ref(padded), padded, pads)(feed)  # padded rows: log(1/16) garbage, sliced away
    want = _ref(g)(feed)
    assert got[0].shape == (100, 16) and torch.equal(got[0], want[0])


def test_two_shapes_in_a_bucket_share_one_plan() -> None:
    def f(x):
        return torch.softmax(x, -1) * 2

    hashes = []
    for t in (70, 100):
        torch._dynamo.reset()
        c = torch.compile(f, backend="superopt", dynamic=False, options={"fallback": "eager", "executor": "plan"})
        with torch.no_grad():
            x = torch.randn(t, 16, dtype=torch.bfloat16)
            assert torch.equal(c(x), f(x))
        (choice,) = LAST_REPORTS[-1].regions
        assert choice.plan is not None and 128 in axis_sizes(choice.plan).values()
        assert 128 not in choice.region.graph.sizes.values()  # the region itself keeps its own size
        assert "planned at bucket" in choice.reason and f"(is {t})" in choice.reason
        hashes.append(choice.plan.provenance.plan_hash)
    assert hashes[0] == hashes[1]
