"""Shape buckets: free axes (never reduced, contracted, indexed or measured) are planned at a bucket size,
so nearby shapes share one plan; padding them and slicing back is exact, reduced axes stay exact."""

from __future__ import annotations

import numpy as np
import torch

import pyrunner.frontend  # noqa: F401 - registers the backend
from pyrunner.frontend.backend import LAST_REPORTS
from pyrunner.frontend.buckets import bucket, bucketed, free_axes, padded_impl
from pyrunner.frontend.padmask import mask_name, masked
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
    assert bucketed(_graph(100, 100), softmax_rule=None)[0].sizes == {"t": 128, "d": 100}
    padded, pads = bucketed(_graph(100, 100))  # a softmax axis is padded too, with its mask
    assert padded.sizes == {"t": 128, "d": 128} and pads == {"t": 100, "d": 100}
    assert mask_name("d") in {t.name for t in padded.inputs()}


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


def _attention(t_kv: int, scale: float = 0.25, mean_over_keys: bool = False) -> ir.Graph:
    """One decode step's attention: softmax over keys j of q . k_j, times v (as HF's sdpa maps)."""
    q, k, v = ir.inp("in0", ("h", "d")), ir.inp("in1", ("h", "j", "d")), ir.inp("in2", ("h", "j", "e"))
    s = ir.binary("mul", ir.matmul(q, k, "d"), ir.const(scale))
    p = ir.binary("div", ir.unary("exp", s), ir.reduce("sum", ir.unary("exp", s), "j"))
    out = ir.matmul(p, v, "j")
    if mean_over_keys:
        out = ir.binary("add", out, ir.reduce("mean", ir.reduce("sum", v, "e"), "j"))
    return ir.Graph("region", {"h": 2, "d": 8, "j": t_kv, "e": 8}, (("out0", out),), {})


def _feed(t_kv: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"in0": torch.from_numpy(rng.standard_normal((2, 8)) * 3),
            "in1": torch.from_numpy(rng.standard_normal((2, t_kv, 8))),
            "in2": torch.from_numpy(rng.standard_normal((2, t_kv, 8)))}


def test_attention_keys_are_padded_with_a_mask_and_excluded() -> None:
    """A decode step's KV axis (reduced by the softmax) is planned at its bucket: padded keys get -inf
    through the mask input, so the output equals the unpadded one; zero keys without the mask would not."""
    for t_kv in (5, 17, 70):
        g = _attention(t_kv)
        padded, pads = bucketed(g)
        assert pads == {"j": t_kv} and padded.sizes["j"] == {5: 8, 17: 32, 70: 128}[t_kv]
        feed = _feed(t_kv)
        got = padded_impl(_ref(padded), padded, pads)(feed)[0]
        want = _ref(g)(feed)[0]
        assert got.shape == want.shape == (2, 8)
        assert torch.allclose(got, want, rtol=1e-13, atol=1e-13)
    # the same padding without the mask: zero keys score 0 and take part in the softmax -- a wrong answer
    unmasked = g.with_sizes({"j": 128})
    assert not torch.allclose(padded_impl(_ref(unmasked), unmasked, {"j": 70})(feed)[0], want, atol=1e-3)


def test_softmax_axis_stays_exact_where_padding_cannot_be_proved() -> None:
    """A mean over the keys (it divides by the padded size) or an axis_size of them: no bucket."""
    g = _attention(17, mean_over_keys=True)
    assert masked(g, "j", 32) is None
    assert bucketed(g)[1] == {}
    q, k = ir.inp("in0", ("h", "d")), ir.inp("in1", ("h", "j", "d"))
    s = ir.binary("div", ir.matmul(q, k, "d"), ir.axis_size("j"))
    sized = ir.Graph("region", {"h": 2, "d": 8, "j": 17},
                     (("out0", ir.reduce("max", s, "j")),), {})
    assert masked(sized, "j", 32) is None


def test_decode_loop_shares_one_plan_per_kv_bucket() -> None:
    """A decode loop (q length 1, KV length growing each step) on the CPU path: steps whose KV length falls
    in one bucket share one plan (the mask input carries the real length), and every step is a region."""
    def step(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v) * 2

    torch._dynamo.reset()
    c = torch.compile(step, backend="superopt", options={"fallback": "eager", "executor": "plan"})
    before = len(LAST_REPORTS)
    q = torch.randn(1, 2, 1, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        for n in range(17, 23):
            k, v = torch.randn(1, 2, n, 16, dtype=torch.bfloat16), torch.randn(1, 2, n, 16, dtype=torch.bfloat16)
            assert torch.equal(c(q, k, v), step(q, k, v))
    reps = [rep for rep in LAST_REPORTS[before:] if rep.regions or rep.fallbacks]
    assert len(reps) == 6 and all(len(rep.regions) == 1 and not rep.fallbacks for rep in reps)
    plans = {rep.regions[0].plan.provenance.plan_hash for rep in reps}
    assert len(plans) == 1, plans
    assert all("planned at bucket" in rep.regions[0].reason for rep in reps)


def test_masked_attention_plan_runs_exactly_on_padded_keys() -> None:
    """The plan for the padded graph (bf16, the planner's own kernels on the CPU executor), fed zero-padded
    keys and values and the real mask, gives the unpadded attention within bf16 rounding and no NaN: the
    tiles that hold only padded keys add nothing, even where a whole tile is padding (65 keys -> 128)."""
    from pyrunner.frontend.padmask import mask_values
    from pyrunner.frontend.region_plans import plan_region
    from pyrunner.run.executor import execute

    g = _attention(65)
    padded, pads = bucketed(g)
    assert padded.sizes["j"] == 128
    plan = plan_region(padded, "bfloat16")
    feed = {k: v.numpy() for k, v in _feed(65, seed=3).items()}
    fed = {k: (np.concatenate([v, np.zeros((2, 128 - 65, 8))], 1) if v.ndim == 3 else v) for k, v in feed.items()}
    fed[mask_name("j")] = mask_values(65, 128, torch.zeros(1, dtype=torch.float64)).numpy()
    out, want = execute(plan, fed)["out0"], evaluate(g, feed)["out0"]
    assert not np.isnan(out).any()
    assert float(np.abs(out - want).max() / np.abs(want).max()) <= 2e-2
