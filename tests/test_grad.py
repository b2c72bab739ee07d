"""Reverse-mode differentiation (``ir.grad``): every op has a VJP, and derived backward graphs equal
PyTorch float64 autograd of the forward reference on every catalog workload and corpus graph.

The planning half (backward graphs planned by the search, run on the CPU executor) is in
tests/test_grad_plans.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pyrunner.errors import GraphError
from pyrunner.ir import catalog
from pyrunner.ir.grad import backward_graph, derive
from pyrunner.ir.graph import Graph, GraphBuilder, subterms
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.ir.ops import BINARY, REDUCTIONS, TERM_KINDS, TERNARY, UNARY
from pyrunner.ir.reference import evaluate, random_inputs
from pyrunner.ir.vjp import BINARY_VJP, KIND_VJP, REDUCE_VJP, TERNARY_VJP, UNARY_VJP
from pyrunner.run.grad_check import check_gradients

DATA = Path(__file__).resolve().parent / "data"
TOL = 1e-9
"""Largest gradient error relative to the largest autograd gradient: two float64 derivations."""


def small(g: Graph) -> Graph:
    """g at small, pairwise distinct sizes (a head/group-like axis 2 or 3, the rest 8, 9, ...)."""
    sizes, k = {}, 0
    for a, n in sorted(g.sizes.items()):
        if n <= 16:
            sizes[a] = min(n, 2 + len(sizes) % 2)
        else:
            sizes[a] = 8 + k
            k += 1
    return g.with_sizes(sizes)


def _assert_matches_autograd(g: Graph, inputs: dict | None = None, seed: int = 0) -> None:
    res = check_gradients(g, derive(g), seed=seed, inputs=inputs)
    assert res.worst() <= TOL, res.errors


# --- the VJP table ----------------------------------------------------------------------------

@pytest.mark.parametrize("vjps, ops", [(UNARY_VJP, UNARY), (BINARY_VJP, BINARY), (TERNARY_VJP, TERNARY),
                                       (REDUCE_VJP, REDUCTIONS), (KIND_VJP, TERM_KINDS)])
def test_every_op_has_exactly_one_vjp(vjps: dict, ops: dict) -> None:
    assert set(vjps) == set(ops), f"ops without a VJP: {sorted(set(ops) - set(vjps))}"


POSITIVE = {"log", "sqrt", "rsqrt", "recip"}


@pytest.mark.parametrize("fn", list(UNARY))
def test_unary_vjp(fn: str) -> None:
    g = GraphBuilder("Unary")
    x = g.input("X", m=3, n=5)
    g.output("Y", g.mul(g.unary(fn, x), g.input("W", n=5)))
    graph = g.build()
    inputs = random_inputs(graph, 7, scale=1.5)
    if fn in POSITIVE:
        inputs["X"] = np.abs(inputs["X"]) + 0.3
    _assert_matches_autograd(graph, inputs)


@pytest.mark.parametrize("fn", list(BINARY))
def test_binary_vjp_broadcasts_by_axis_name(fn: str) -> None:
    """b lacks axis m and has axis k that a lacks: each gradient is summed over the other's axes."""
    g = GraphBuilder("Binary")
    a = g.input("A", m=3, n=4)
    b = g.input("B", n=4, k=2)
    y = g.binary(fn, a, b)
    g.output("Y", g.add(y, g.mul(g.unary("tanh", a), g.unary("tanh", b))))  # lt/le: the rest has a gradient
    graph = g.build()
    inputs = random_inputs(graph, 3)
    if fn == "div":
        inputs["B"] = np.abs(inputs["B"]) + 0.5
    _assert_matches_autograd(graph, inputs)


@pytest.mark.parametrize("fn", list(REDUCTIONS))
def test_reduce_vjp(fn: str) -> None:
    g = GraphBuilder("Reduce")
    x = g.input("X", m=3, n=6, k=2)
    g.output("Y", g.reduce(fn, g.unary("exp", x), "n"))
    _assert_matches_autograd(g.build())


def test_matmul_vjp_with_batch_and_several_free_axes() -> None:
    """A (b, m, p, d) @d B (b, d, n, q): two free axes on each side, one batch axis."""
    g = GraphBuilder("Contract")
    a = g.input("A", b=2, m=3, p=2, d=4)
    w = g.input("B", b=2, d=4, n=3, q=2)
    g.output("Y", g.matmul(a, w, contract="d"))
    _assert_matches_autograd(g.build())


def test_matvec_vjp_and_scalar_output() -> None:
    """A contraction with no free axis on one side, and a scalar loss (its unit axis) on top."""
    g = GraphBuilder("Loss")
    x = g.input("X", m=4, d=5)
    v = g.input("v", d=5)
    r = g.matmul(x, v, contract="d")
    g.output("L", g.reduce("sum", g.unary("square", r), "m"))
    _assert_matches_autograd(g.build())


def test_ties_follow_torch() -> None:
    """amax shares the gradient among tied maxima; maximum/minimum of two tensors split it at a tie;
    against a constant (clamp) the tensor keeps it; relu and abs have slope 0 at 0."""
    g = GraphBuilder("Ties")
    x = g.input("X", m=2, n=4)
    z = g.input("Z", m=2, n=4)
    parts = [g.reduce("max", x, "n"), g.reduce("sum", g.binary("max", x, z), "n"),
             g.reduce("sum", g.binary("min", x, z), "n"), g.reduce("sum", g.binary("max", x, 1.0), "n"),
             g.reduce("sum", g.binary("min", x, 1.0), "n"), g.reduce("sum", g.unary("relu", x), "n"),
             g.reduce("sum", g.unary("abs", z), "n")]
    total = parts[0]
    for p in parts[1:]:
        total = g.add(total, p)
    g.output("Y", total)
    graph = g.build()
    inputs = {"X": np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 1.0]]),
              "Z": np.array([[1.0, 0.0, 3.0, 0.0], [-1.0, 2.0, 0.0, 5.0]])}
    _assert_matches_autograd(graph, inputs)


def test_amax_shares_the_gradient_among_tied_maxima() -> None:
    g = GraphBuilder("RowMax")
    g.output("Y", g.reduce("max", g.input("X", m=2, n=4), "n"))
    got = evaluate(backward_graph(g.build()), {"X": np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]]),
                                               "Y": np.array([3.0, 2.0]), "d_Y": np.array([1.0, 2.0])})["d_X"]
    assert np.array_equal(got, [[0.0, 0.5, 0.5, 0.0], [0.5, 0.5, 0.5, 0.5]])


def test_masked_positions_get_zero_gradient() -> None:
    g = GraphBuilder("MaskedSoftmax")
    x = g.input("X", m=5, n=5)
    keep = g.le(g.iota("n"), g.iota("m"))
    p = g.softmax(g.masked(x, keep), "n")
    g.output("Y", g.mul(p, g.input("W", m=5, n=5)))
    graph = g.build()
    _assert_matches_autograd(graph)
    b = derive(graph)
    inputs = random_inputs(b.graph, 1)
    inputs.update(evaluate(b.forward, random_inputs(graph, 1)))
    d_x = evaluate(b.graph, {t.name: inputs[t.name] for t in b.graph.inputs()})["d_X"]
    masked = np.triu(np.ones((5, 5), dtype=bool), k=1)  # n > m
    assert np.all(d_x[masked] == 0.0) and np.all(d_x[~masked] != 0.0)


# --- saved tensors ------------------------------------------------------------------------------

def test_attention_backward_reads_only_o_and_lse() -> None:
    """Attention's backward reads Q, K, V, O, the row LSE and dO; P is recomputed as exp(S - LSE), so
    the backward graph reduces over t_kv nowhere (no max, no normaliser) and D = rowsum(dO * O)."""
    g = small(catalog.get("CausalAttention"))
    b = derive(g)
    assert {t.name for t in b.graph.inputs()} == {"Q", "K", "V", "O", "LSE_P", "d_O"}
    assert b.saved == ("O", "LSE_P") and b.cotangents == {"d_O": "O"}
    assert b.gradients == {"d_K": "K", "d_Q": "Q", "d_V": "V"}
    terms = subterms(t for _, t in b.graph.outputs)
    assert not [t for t in terms if t.op == "reduce" and t.axis == "t_kv"]
    assert [(t.fn, t.axis) for t in terms if t.op == "reduce"] == [("sum", "d")]  # D
    x = random_inputs(g, 2)
    s = np.einsum("hqd,hkd->hqk", x["Q"], x["K"]) / math.sqrt(g.sizes["d"])
    s[:, np.triu(np.ones(s.shape[1:], dtype=bool), k=1)] = -np.inf  # causal: key after query
    top = s.max(axis=-1, keepdims=True)
    lse = (top + np.log(np.exp(s - top).sum(axis=-1, keepdims=True)))[..., 0]
    assert np.allclose(evaluate(b.forward, x)["LSE_P"], lse, rtol=1e-12, atol=1e-12)


def test_a_saved_softmax_output_needs_no_lse() -> None:
    b = derive(load_graph_file(DATA / "softmax_rows.json"))
    assert b.saved == ("P",) and b.forward.outputs == load_graph_file(DATA / "softmax_rows.json").outputs


def test_contraction_after_softmax_is_saved_when_not_an_output() -> None:
    """attention_gated_output: O = sigmoid(G) * (P V); the D identity needs P V, written as a saved output."""
    g = load_graph_file(DATA / "attention_gated_output.json")
    b = derive(g)
    extra = [n for n, _ in b.forward.outputs][len(g.outputs):]
    assert len(extra) == 2 and set(extra) <= set(b.saved)


# --- every graph we have --------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(catalog.CATALOG))
def test_catalog_backward_matches_autograd(name: str) -> None:
    _assert_matches_autograd(small(catalog.get(name)))


@pytest.mark.parametrize("path", sorted(DATA.glob("*.json")), ids=lambda p: p.stem)
def test_corpus_backward_matches_autograd(path: Path) -> None:
    _assert_matches_autograd(small(load_graph_file(path)))


def test_outputs_and_wrt_select_the_sweep() -> None:
    g = load_graph_file(DATA / "multi_attention_lse.json")
    only_o = derive(g, outputs=["O"], wrt=["V"])
    assert only_o.gradients == {"d_V": "V"} and only_o.cotangents == {"d_O": "O"}
    assert {t.name for t in only_o.graph.inputs()} <= {"Q", "K", "O", "LSE_P", "d_O"}  # dV = P^T dO
    res = check_gradients(g.with_outputs(tuple((n, t) for n, t in g.outputs if n == "O")), only_o)
    assert set(res.errors) == {"V"} and res.errors["V"] <= TOL


def test_bad_requests_are_one_clear_error() -> None:
    g = catalog.get("Matmul")
    with pytest.raises(GraphError, match="has no output 'Z'"):
        derive(g, outputs=["Z"])
    with pytest.raises(GraphError, match="has no input 'Z'"):
        derive(g, wrt=["Z"])
    b = GraphBuilder("Flat")
    x = b.input("X", m=4)
    b.output("Y", b.lt(x, 0.0))
    with pytest.raises(GraphError, match="every gradient is zero"):
        derive(b.build())


def test_scores_that_overflow_exp_still_differentiate() -> None:
    """Temperature 1e-3: exp of the raw scores overflows float64, exp(S - LSE) does not."""
    g = GraphBuilder("Hot")
    x = g.input("X", m=3, n=6)
    p = g.softmax(g.mul(x, 1000.0), "n")
    g.output("Y", g.matmul(p, g.input("V", n=6, e=2), contract="n"))
    graph = g.build()
    b = derive(graph)
    assert all(math.isfinite(v) for v in check_gradients(graph, b).errors.values())
    _assert_matches_autograd(graph)


def test_a_value_the_forward_masks_away_may_overflow_without_poisoning_the_gradient() -> None:
    """Y = where(X < 0, exp(1000 X), 0): exp overflows float64 where X > 0, and the forward discards it there.
    The chain rule multiplies the local derivative exp(1000 X) under the mask, not after it (0 * inf was
    NaN: retention's decay exp2((j - i) g) at j > i in float32, d_g NaN on the GPU, run 127)."""
    g = GraphBuilder("MaskedOverflow")
    x = g.input("X", m=4, n=6)
    g.output("Y", g.where(g.lt(x, 0.0), g.unary("exp", g.mul(x, 1000.0)), 0.0))
    graph = g.build()
    b = derive(graph)
    xs = np.linspace(-0.01, 1.0, 24).reshape(4, 6)
    with np.errstate(over="ignore", invalid="ignore"):
        d_x = evaluate(b.graph, {"X": xs, "d_Y": np.ones((4, 6))})["d_X"]
    assert np.all(np.isfinite(d_x)) and np.all(d_x[xs > 0] == 0.0)
    np.testing.assert_allclose(d_x[xs < 0], 1000.0 * np.exp(1000.0 * xs[xs < 0]))
    _assert_matches_autograd(graph)


def test_a_passed_through_gradient_is_an_alias_not_an_output() -> None:
    """Y = tanh(X) + R: d_R is d_Y itself, so the backward graph (which a plan must compute) leaves it out."""
    g = GraphBuilder("Residual")
    x = g.input("X", m=4, n=3)
    g.output("Y", g.add(g.unary("tanh", x), g.input("R", m=4, n=3)))
    graph = g.build()
    b = derive(graph)
    assert b.aliases == {"d_R": "d_Y"} and [n for n, _ in b.graph.outputs] == ["d_X"]
    _assert_matches_autograd(graph)
    g = GraphBuilder("Shift")
    g.output("Y", g.add(g.input("X", m=4), 1.0))
    with pytest.raises(GraphError, match="passed through unchanged"):
        derive(g.build())


def test_max_gradient_survives_a_rounded_saved_maximum() -> None:
    """A saved row maximum is stored rounded (possibly above every element the backward recomputes);
    the max VJP compares against the maximum it computes itself, so the gradient stays finite and exact."""
    g = load_graph_file(DATA / "reduce_gemm_row_max.json").with_sizes({"m": 4, "k": 5, "n": 6})
    b = derive(g)
    x = random_inputs(g, 4)
    feed = {**x, **evaluate(b.forward, x), "d_M": np.ones(4)}
    exact = evaluate(b.graph, {t.name: feed[t.name] for t in b.graph.inputs()})
    feed["M"] = feed["M"] * (1 + 2.0**-8) + 1e-6  # bf16-sized rounding up
    nudged = evaluate(b.graph, {t.name: feed[t.name] for t in b.graph.inputs()})
    assert all(np.isfinite(v).all() and np.array_equal(v, exact[k]) for k, v in nudged.items())
