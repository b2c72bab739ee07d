"""Masks as graph data: index predicates, per-tile classification, skipped tiles, and every stage
(reference, planner, CPU executor, renderer, PyTorch baselines) on causal, sliding-window,
prefix-LM and padding masks.

Error bounds: exact (float32 buffers) plans agree with float64 within 1e-5 (a few ulps of the
softmax sums); bf16 plans within 2e-2 (bf16 keeps 8 bits: 2^-8 = 3.9e-3 per rounding, a few
roundings along the loop) at these sizes.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyrunner.backend.tilelang.render import render
from pyrunner.ir import catalog
from pyrunner.ir.graph import Graph, GraphBuilder
from pyrunner.ir.graph_json import graph_from_json, graph_to_json
from pyrunner.ir.reference import evaluate, random_inputs
from pyrunner.plan import masks
from pyrunner.plan.schema import Call, Const, Index, Plan
from pyrunner.planner.search import search
from pyrunner.rules.registry import RULES
from pyrunner.rules.symbolic import WRONG_VARIANTS, check_rule
from pyrunner.run.baselines import torch_fn, torch_source, vendor_fn
from pyrunner.run.executor import execute

EXACT_TOL = 1e-5
BF16_TOL = 2e-2


def prefix_lm(t: int = 512, prefix: int = 100) -> Graph:
    """Bidirectional over the first `prefix` keys, causal after them."""
    b = GraphBuilder("PrefixLM")
    q = b.input("Q", h=1, t_q=t, d=32)
    k = b.input("K", h=1, t_kv=t, d=32)
    v = b.input("V", h=1, t_kv=t, d=32)
    s = b.mul(b.matmul(q, k, contract="d"), 0.125)
    kv, tq = b.iota("t_kv"), b.iota("t_q")
    keep = b.binary("max", b.le(kv, tq), b.lt(kv, float(prefix)))
    b.output("O", b.matmul(b.softmax(b.masked(s, keep), axis="t_kv"), v, contract="t_kv"))
    return b.build()


def padded(t_kv: int = 512) -> Graph:
    """Key lengths per batch row as an input tensor: key t_kv visible iff t_kv < L[b]."""
    b = GraphBuilder("Padded")
    q = b.input("Q", bt=3, t_q=64, d=32)
    k = b.input("K", bt=3, t_kv=t_kv, d=32)
    v = b.input("V", bt=3, t_kv=t_kv, d=32)
    lengths = b.input("L", bt=3)
    s = b.matmul(q, k, contract="d")
    b.output("O", b.matmul(b.softmax(b.masked(s, b.lt(b.iota("t_kv"), lengths)), axis="t_kv"), v,
                           contract="t_kv"))
    return b.build()


def check_plans(g: Graph, inputs: dict[str, np.ndarray], top: int = 2) -> list[Plan]:
    """Every top plan, exact and in bf16, agrees with float64; skipped tiles are audited."""
    ref = evaluate(g, inputs)
    plans = search(g, "bf16", top=top)
    for plan in plans:
        for exact, tol in ((True, EXACT_TOL), (False, BF16_TOL)):
            out = execute(plan, inputs, exact=exact, audit=True)
            for name, want in ref.items():
                got = out[name]
                assert np.array_equal(np.isnan(got), np.isnan(want)), "NaN (fully masked rows) must match"
                err = np.nanmax(np.abs(got - want)) if not np.isnan(want).all() else 0.0
                assert err <= tol, f"{g.name} exact={exact}: error {err} > {tol}"
    return plans


# --- interval reasoning ------------------------------------------------------------------------

CAUSAL = Call(fn="le", args=[Index(axis="kv"), Index(axis="q")])


def _window(w: int) -> Call:
    return Call(fn="min", args=[CAUSAL, Call(fn="lt", args=[Call(fn="sub", args=[Index(axis="q"),
                                                                              Const(value=w)]), Index(axis="kv")])])


def _prefix(p: int) -> Call:
    return Call(fn="max", args=[CAUSAL, Call(fn="lt", args=[Index(axis="kv"), Const(value=p)])])


@settings(max_examples=60, deadline=None, derandomize=True)
@given(kind=st.sampled_from(["causal", "window", "prefix"]), w=st.integers(1, 40), bq=st.integers(1, 9),
       bk=st.integers(1, 9), n=st.integers(1, 40))
def test_tile_classification_is_sound_and_bounds_tight(kind: str, w: int, bq: int, bk: int, n: int) -> None:
    """Brute force over every tile: skipped steps are fully masked, all-true/all-false proofs hold, and
    for single affine atoms and their conjunctions the bounds are exact (no fully masked step is run)."""
    expr = {"causal": CAUSAL, "window": _window(w), "prefix": _prefix(w)}[kind]
    pred = masks.predicate(expr)
    q, kv = np.arange(n)[:, None], np.arange(n)[None, :]
    truth = {"causal": kv <= q, "window": (kv <= q) & (q - w < kv), "prefix": (kv <= q) | (kv < w)}[kind]
    steps = -(-n // bk)
    for qb in range(-(-n // bq)):
        box = {"q": (qb * bq, qb * bq + bq - 1)}
        run = masks.visible_steps(pred, "kv", bk, steps, box)
        for j in range(steps):
            tile = truth[qb * bq:(qb + 1) * bq, j * bk:(j + 1) * bk]
            test = masks.tile_test(pred, {**box, "kv": (j * bk, j * bk + bk - 1)}, masks.IntArith())
            full_box = (qb + 1) * bq <= n and (j + 1) * bk <= n  # tail tiles reach past the end
            if j not in run:
                assert not tile.any()
            elif full_box and kind != "prefix":
                assert tile.any(), "a fully masked step was left in the loop"
            if test.all_true is not None and test.all_true <= 0:
                assert tile.all()
            if test.all_false is not None and test.all_false > 0:
                assert not tile.any()


def test_unknown_predicates_are_never_proven() -> None:
    pred = masks.predicate(Call(fn="lt", args=[Index(axis="kv"), Call(fn="exp", args=[Index(axis="q")])]))
    assert isinstance(pred, masks.Unknown)
    assert masks.tile_test(pred, {"kv": (0, 3), "q": (0, 3)}, masks.IntArith()) == masks.TileTest(None, None)
    assert masks.visible_steps(pred, "kv", 4, 5, {"q": (0, 3)}) == range(5)


def test_masked_tile_skip_rule_is_proven_and_its_wrong_variant_refuted() -> None:
    assert RULES["masked_tile_skip"].kind == "schedule"
    assert check_rule("masked_tile_skip").ok
    assert not WRONG_VARIANTS["masked_tile_skip_bound_too_tight"]().ok


# --- graph data ---------------------------------------------------------------------------------

@pytest.mark.parametrize("g", [catalog.get("CausalAttention"), catalog.get("SlidingWindowAttention"), prefix_lm(),
                               padded()], ids=lambda g: g.name)
def test_masks_round_trip_through_graph_json(g: Graph) -> None:
    text = json.dumps(graph_to_json(g))
    assert "-inf" in text and "Infinity" not in text
    g2 = graph_from_json(json.loads(text))
    assert g2.key() == g.key() and g2.sizes == g.sizes


def test_json_rejects_a_node_named_like_an_infinity() -> None:
    from pyrunner.errors import GraphError

    doc = graph_to_json(catalog.get("CausalAttention", {"h": 1, "t_q": 8, "t_kv": 8, "d": 4}))
    doc["nodes"][0]["name"] = "inf"  # an identifier, so only the constant check can refuse it
    with pytest.raises(GraphError, match="cannot name a node"):
        graph_from_json(doc)
    doc["nodes"][0]["name"] = "-inf"
    with pytest.raises(GraphError, match="not an ASCII identifier"):
        graph_from_json(doc)


# --- planner, executor, renderer ----------------------------------------------------------------

def test_causal_plan_skips_masked_tiles_and_halves_the_cost(monkeypatch, tmp_path) -> None:
    # the cost model's view: measured times in the tuning database come from different kernels
    monkeypatch.setenv("SUPEROPT_TUNING_DIR", str(tmp_path))
    causal = search(catalog.get("CausalAttention"), "bf16")[0]
    full = search(catalog.get("ScaledAttention"), "bf16")[0]
    (k,) = causal.kernels
    assert k.loop is not None and k.loop.visible is not None
    assert "masked_tile_skip" in k.fused_rules and "online_softmax_rescale" in k.fused_rules
    assert causal.cost.total_us < 0.8 * full.cost.total_us
    src = render(causal)
    assert "T.serial(t_kv_lo, t_kv_hi)" in src  # the asynchronous chain over the visible steps
    assert re.search(r"T\.Pipelined\(t_kv_lo\w*, t_kv_hi\w*,", src)  # and the fallback for configs it does not fit
    hi = next(line for line in src.splitlines() if "t_kv_hi =" in line)
    assert "t_q_blk" in hi and "block_t_kv" in hi, hi
    assert "if " in src and "# the mask, only on tiles it does not show whole" in src


@pytest.mark.parametrize("make", [
    lambda: catalog.get("CausalAttention", {"h": 1, "t_q": 512, "t_kv": 512, "d": 32}),
    lambda: catalog.sliding_window_attention(h=1, t_q=512, t_kv=512, d=32, window=40),
    lambda: prefix_lm(),
], ids=["causal", "sliding", "prefix"])
def test_masked_attention_plans_verify_on_the_executor(make) -> None:
    g = make()
    plans = check_plans(g, random_inputs(g, 7))
    assert any(k.loop is not None and k.loop.visible is not None for p in plans for k in p.kernels)


def test_padding_mask_with_empty_rows_follows_torch_softmax() -> None:
    """Key lengths 0, 70 and 512: the empty row is NaN (torch.softmax's 0/0), as in the reference."""
    g = padded()
    x = random_inputs(g, 3)
    x["L"] = np.array([0.0, 70.0, 512.0])
    check_plans(g, x)
    ref = evaluate(g, x)["O"]
    assert np.isnan(ref[0]).all() and not np.isnan(ref[1:]).any()


def test_sliding_window_rows_whose_first_tiles_are_masked_stay_finite() -> None:
    """The running max is still -inf after a tile that hides a whole row; the loop body reads it as 0
    (exp(-inf - 0) = 0) instead of making NaN from -inf - (-inf)."""
    g = catalog.sliding_window_attention(h=1, t_q=512, t_kv=512, d=16, window=5)
    online = [k for p in check_plans(g, random_inputs(g, 1), top=3) for k in p.kernels
              if "online_softmax_rescale" in k.fused_rules]
    assert online and all(any(b.name.endswith("_safe") for b in k.buffers) for k in online)


# --- PyTorch baselines ----------------------------------------------------------------------------

def _torch_out(fn, g: Graph, x: dict[str, np.ndarray]) -> np.ndarray:
    (out,) = fn(**{k: torch.tensor(v) for k, v in x.items()}).values()
    return out.numpy()


def test_causal_vendor_baseline_is_sdpa_is_causal() -> None:
    g = catalog.get("CausalAttention", {"h": 2, "t_q": 64, "t_kv": 64, "d": 16})
    name, fn = vendor_fn(g)
    assert name == "sdpa" and "is_causal=True" in fn.source and "attn_mask" not in fn.source
    x = random_inputs(g, 0)
    np.testing.assert_allclose(_torch_out(fn, g, x), evaluate(g, x)["O"], atol=1e-12)


@pytest.mark.parametrize("g", [catalog.sliding_window_attention(h=2, t_q=64, t_kv=64, d=16, window=9),
                               prefix_lm(64, 20)], ids=lambda g: g.name)
def test_other_masks_run_as_sdpa_with_a_boolean_mask(g: Graph) -> None:
    name, fn = vendor_fn(g)
    assert name == "sdpa" and "attn_mask=" in fn.source and "is_causal" not in fn.source
    x = random_inputs(g, 0)
    want = evaluate(g, x)["O"]
    np.testing.assert_allclose(_torch_out(fn, g, x), want, atol=1e-12)
    np.testing.assert_allclose(_torch_out(torch_fn(g), g, x), want, atol=1e-12)


def test_eager_baseline_builds_masks_from_arange() -> None:
    src = torch_source(catalog.get("SlidingWindowAttention", {"h": 1, "t_q": 8, "t_kv": 8, "d": 4}))
    assert "torch.arange(8" in src and "torch.where(" in src and "float('-inf')" in src
    assert math.isinf(-math.inf)


@pytest.mark.slow
def test_causal_cuda_loop_bound_depends_on_the_query_block() -> None:
    """The lowered CUDA runs the key loop only up to the diagonal block: about half the steps."""
    from pyrunner.backend.tilelang.compile import lower_to_cuda

    plan = search(catalog.get("CausalAttention"), "bf16")[0]
    (src,) = lower_to_cuda(plan).values()
    loops = [line for line in src.splitlines() if "for (int t_kv_step" in line]
    assert loops and all("blockIdx" in line for line in loops), loops
