"""The PyTorch interpreter computes each graph's reference meaning; vendor paths are found by structure."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from pyrunner.ir import catalog as workloads
from pyrunner.ir import graph as G
from pyrunner.ir.graph import Graph, GraphBuilder
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.ir.reference import evaluate, random_inputs
from pyrunner.run.baselines import attention_matches, torch_fn, torch_source, vendor_fn

DATA = Path(__file__).resolve().parent / "data"

# small, distinct sizes per axis so a transposed axis cannot pass by accident
SMALL = [8, 12, 16, 20, 24, 6]


def _small(name: str) -> Graph:
    g = workloads.CATALOG[name]()
    return g.with_sizes({a: SMALL[i % len(SMALL)] for i, a in enumerate(sorted(g.sizes))})


def _run(fn, g: Graph, seed: int = 0) -> tuple[dict, dict]:
    x = random_inputs(g, seed)
    out = fn(**{k: torch.from_numpy(v) for k, v in x.items()})
    return {k: v.numpy() for k, v in out.items()}, evaluate(g, x)


@pytest.mark.parametrize("name", sorted(workloads.CATALOG))
def test_eager_matches_reference_float64(name: str) -> None:
    g = _small(name)
    out, ref = _run(torch_fn(g), g)
    assert set(out) == set(ref)
    for k in ref:
        assert out[k].shape == ref[k].shape
        np.testing.assert_allclose(out[k], ref[k], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", [n for n in sorted(workloads.CATALOG) if vendor_fn(_small(n)) is not None])
def test_vendor_path_matches_reference_float64(name: str) -> None:
    g = _small(name)
    out, ref = _run(vendor_fn(g)[1], g)
    for k in ref:
        np.testing.assert_allclose(out[k], ref[k], rtol=1e-10, atol=1e-12)


def test_vendor_detection_is_structural() -> None:
    found = {name: (vendor_fn(_small(name)) or ("none",))[0] for name in workloads.CATALOG}
    assert found["Attention"] == "sdpa"
    assert found["ScaledAttention"] == "sdpa"
    assert found["GroupedQueryAttention"] == "sdpa"
    assert found["Matmul"] == "cublas"
    for name in ("SwiGLU", "RMSNorm", "RMSNormMLP", "GeGLU", "LayerNormMatmul"):
        assert found[name] == "none", name


def test_detected_scale_is_the_constant() -> None:
    g = _small("ScaledAttention")
    (m,) = attention_matches(g)
    assert m.scale == pytest.approx(1.0 / np.sqrt(g.sizes["d"]))
    (m0,) = attention_matches(_small("Attention"))
    assert m0.scale == 1.0


def test_softmax_over_a_non_contracted_axis_is_not_attention() -> None:
    b = GraphBuilder("NotAttention")
    q = b.input("Q", t=8, d=4)
    k = b.input("K", s=6, d=4)
    v = b.input("V", s=6, e=5)
    s = b.matmul(q, k, contract="d")
    p = b.softmax(s, axis="t")  # normalised over queries, not over the contracted axis
    b.output("O", b.matmul(p, v, contract="s"))
    g = b.build()
    assert attention_matches(g) == []
    out, ref = _run(torch_fn(g), g)
    np.testing.assert_allclose(out["O"], ref["O"], rtol=1e-10)


def test_attention_inside_a_larger_graph_uses_sdpa_and_stays_correct() -> None:
    b = GraphBuilder("AttnPlus")
    q = b.input("Q", h=2, t=8, d=4)
    k = b.input("K", h=2, s=10, d=4)
    v = b.input("V", h=2, s=10, e=3)
    s = b.mul(b.matmul(q, k, contract="d"), 0.25)
    o = b.matmul(b.softmax(s, axis="s"), v, contract="s")
    b.output("Y", b.unary("silu", o))
    g = b.build()
    name, fn = vendor_fn(g)
    assert name == "sdpa"
    out, ref = _run(fn, g)
    np.testing.assert_allclose(out["Y"], ref["Y"], rtol=1e-10, atol=1e-12)


def test_a_query_without_rows_is_sdpa_with_one_row() -> None:
    g = load_graph_file(DATA / "attention_mha_decode_batched.json").with_sizes({"b": 2, "h": 3, "t": 20, "d": 8})
    name, fn = vendor_fn(g)
    assert name == "sdpa"
    out, ref = _run(fn, g)
    assert out["O"].shape == ref["O"].shape == (2, 3, 8)
    np.testing.assert_allclose(out["O"], ref["O"], rtol=1e-10, atol=1e-12)


def test_permuted_operands_and_broadcast_binary() -> None:
    # W stored [n, d] (transposed) and a bias over n only: exercises permutes and name broadcasting
    b = GraphBuilder("Perm")
    x = b.input("X", m=5, d=7)
    w = b.input("W", n=3, d=7)
    bias = b.input("B", n=3)
    y = b.add(b.matmul(x, w, contract="d"), bias)
    b.output("Y", b.binary("max", y, b.reduce("mean", y, "m")))
    g = b.build()
    out, ref = _run(torch_fn(g), g)
    np.testing.assert_allclose(out["Y"], ref["Y"], rtol=1e-10)


def test_half_precision_softmax_does_not_overflow() -> None:
    # exp(S) overflows float16 for S > 11; the softmax pattern lowers to torch.softmax, which is stable
    g = workloads.get("Attention", {"h": 1, "t_q": 4, "t_kv": 8, "d": 4})
    x = {k: torch.full(v.shape, 3.0, dtype=torch.float16) for k, v in random_inputs(g, 0).items()}
    out = torch_fn(g)(**x)["O"]
    assert torch.isfinite(out).all()
    assert out.dtype == torch.float16


def test_matmul_stays_in_the_input_dtype() -> None:
    g = workloads.get("SwiGLU", {"m": 4, "n": 6, "d": 8})
    x = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in random_inputs(g, 0).items()}
    assert torch_fn(g)(**x)["Y"].dtype == torch.bfloat16


def test_index_built_bias_feeds_a_half_precision_matmul() -> None:
    """ALiBi: (iota_k - iota_q) * slope is float32, so the scores are; the eager baseline failed with
    'expected m1 and m2 to have the same dtype' (run 34). The GEMM now takes them in the inputs' dtype."""
    from pyrunner.ir.graph_json import graph_from_json, read_json_file

    doc = read_json_file(DATA / "attention_alibi.json", "graph file", ValueError)
    g = graph_from_json({**doc, "axes": {"h": 2, "t_q": 64, "t_kv": 64, "d": 32}})
    x = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in random_inputs(g, 0).items()}
    out = torch_fn(g)(**x)["O"].double().numpy()
    ref = evaluate(g, random_inputs(g, 0))["O"]
    assert np.max(np.abs(out - ref)) / np.max(np.abs(ref)) < 2e-2  # bf16 inputs and operands


def test_a_comparison_mask_feeds_a_float64_matmul() -> None:
    """The float64 reference of a max's backward (its argmax mask times the cotangent, then a GEMM) had a
    float32 mask, so torch.matmul got float and double (gemm_max_scalar's backward, run 127)."""
    b = GraphBuilder("MaskGemm")
    y = b.input("Y", m=5, n=6)
    x = b.input("X", m=5, d=7)
    total = b.reduce("sum", b.reduce("sum", y, "n"), "m")  # no axes: a 0-d tensor does not promote a mask
    mask = b.binary("le", b.reduce("max", y, "n"), y)
    b.output("D", b.matmul(b.binary("mul", total, mask), x, contract="m"))
    g = b.build()
    out, ref = _run(torch_fn(g), g)
    assert out["D"].dtype == np.float64
    np.testing.assert_allclose(out["D"], ref["D"], rtol=1e-10, atol=1e-12)


def test_constant_subgraphs_fold() -> None:
    t = G.binary("mul", G.inp("X", ("m",)), G.unary("rsqrt", G.axis_size("m")))
    g = Graph("C", {"m": 4}, (("Y", t),))
    out, ref = _run(torch_fn(g), g)
    np.testing.assert_allclose(out["Y"], ref["Y"], rtol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["Attention", "SwiGLU", "Matmul", "RMSNorm", "RMSNormMLP"])
def test_eager_and_vendor_on_gpu_half(name: str) -> None:
    g = _small(name)
    x = random_inputs(g, 3)
    ref = evaluate(g, {k: v.astype(np.float16).astype(np.float64) for k, v in x.items()})
    inputs = {k: torch.from_numpy(v).to("cuda", torch.float16) for k, v in x.items()}
    fns = [torch_fn(g)] + ([vendor_fn(g)[1]] if vendor_fn(g) else [])
    for fn in fns:
        out = fn(**inputs)
        for k in ref:
            err = float(np.abs(out[k].double().cpu().numpy() - ref[k]).max() / np.abs(ref[k]).max())
            assert err < 1e-2, (name, k, err)


@pytest.mark.parametrize("name", ["Attention", "RMSNormMLP"])
def test_dynamo_captures_one_graph_without_breaks(name: str) -> None:
    # torch.compile's baselines are only fair if dynamo sees the whole function as one graph
    g = _small(name)
    x = {k: torch.from_numpy(v).float() for k, v in random_inputs(g, 0).items()}
    for fn in [torch_fn(g)] + ([vendor_fn(g)[1]] if vendor_fn(g) else []):
        torch._dynamo.reset()
        e = torch._dynamo.explain(fn)(**x)
        assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons


def test_generated_source_is_plain_pytorch() -> None:
    src = torch_source(_small("Attention"), vendor=True)
    assert "F.scaled_dot_product_attention(" in src and "scale=1.0" in src
    assert "torch.softmax" in torch_source(_small("Attention"))


def _softcap_bias_graph():
    from pyrunner.ir.graph_json import graph_from_json

    return graph_from_json({
        "name": "SoftcapBiasAttention",
        "axes": {"h": 2, "t_q": 128, "t_kv": 256, "d": 64},
        "inputs": {"Q": ["h", "t_q", "d"], "K": ["h", "t_kv", "d"], "V": ["h", "t_kv", "d"],
                   "Bias": ["t_q", "t_kv"]},
        "nodes": [
            {"name": "S", "op": "matmul", "args": ["Q", "K"], "contract": "d"},
            {"name": "c", "op": "const", "value": 30.0},
            {"name": "Sc", "op": "div", "args": ["S", "c"]},
            {"name": "T", "op": "tanh", "args": ["Sc"]},
            {"name": "Sx", "op": "mul", "args": ["T", "c"]},
            {"name": "Sb", "op": "add", "args": ["Sx", "Bias"]},
            {"name": "P", "op": "softmax", "args": ["Sb"], "axis": "t_kv"},
            {"name": "O", "op": "matmul", "args": ["P", "V"], "contract": "t_kv"},
        ],
        "outputs": ["O"],
    })


def test_flex_attention_baseline_matches_the_reference_for_a_score_modification() -> None:
    """softcap + bias: score_mod computes the graph (checked uncompiled on the CPU against float64)."""
    import numpy as np

    from pyrunner.ir.reference import evaluate, random_inputs
    from pyrunner.run import flex as B

    g = _softcap_bias_graph()
    src = B._flex_source(g)
    assert "torch.compile(flex_attention)" in src and "torch.tanh" in src and "bias0[q_idx, kv_idx]" in src
    fn = B._load(src.replace("_flex = torch.compile(flex_attention)", "_flex = flex_attention"))
    inputs = random_inputs(g, 5)
    ref = evaluate(g, inputs)
    with pytest.warns(UserWarning):
        out = fn(**{k: torch.from_numpy(v).double() for k, v in inputs.items()})
    assert np.abs(out["O"].numpy() - ref["O"]).max() < 1e-9


def test_flex_baseline_only_for_score_modifications() -> None:
    from pyrunner.ir import catalog
    from pyrunner.run.flex import flex_fn

    assert flex_fn(catalog.get("Attention")) is None  # plain attention: SDPA covers it
    assert flex_fn(catalog.get("ScaledAttention")) is None
    assert flex_fn(catalog.get("SwiGLU")) is None
    assert flex_fn(_softcap_bias_graph()) is not None


@pytest.mark.parametrize("name", ["CausalAttention", "SlidingWindowAttention"])
def test_flex_attention_baseline_takes_the_mask_as_a_block_mask(name: str) -> None:
    """A mask over (query, key) indices becomes FlexAttention's mask_mod and block mask (fully masked
    blocks skipped), checked uncompiled on the CPU against float64."""
    import numpy as np

    from pyrunner.ir import catalog
    from pyrunner.ir.reference import evaluate, random_inputs
    from pyrunner.run import flex as B

    g = catalog.get(name, {"h": 2, "t_q": 256, "t_kv": 256, "d": 16})
    src = B._flex_source(g)
    assert "def mask_mod(b, h, q_idx, kv_idx)" in src and "block_mask=" in src
    fn = B._load(src.replace("_flex = torch.compile(flex_attention)", "_flex = flex_attention")
                 .replace("device=device)", "device='cpu')"))
    inputs = random_inputs(g, 7)
    ref = evaluate(g, inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fn(**{k: torch.from_numpy(v).double() for k, v in inputs.items()})
    assert np.abs(out["O"].numpy() - ref["O"]).max() < 1e-9


def test_autotuning_keeps_time_back_for_a_flex_compile_only_where_one_happens() -> None:
    """``flex`` asked for beside graphs with no FlexAttention form reserved its compile time anyway,
    which stopped every autotune of run 77 after its first config."""
    from pyrunner.ir import catalog
    from pyrunner.run.flex import flex_applies
    from pyrunner.run.runner import AUTOTUNE_RESERVE_S, SLOW_BASELINES_S, RunOptions, autotune_reserve_s

    assert flex_applies(_softcap_bias_graph()) and not flex_applies(catalog.get("SwiGLU"))
    flex = RunOptions(baselines=("eager", "torch_compile", "flex"))
    assert autotune_reserve_s(flex, catalog.get("SwiGLU")) == AUTOTUNE_RESERVE_S
    assert autotune_reserve_s(flex, _softcap_bias_graph()) == AUTOTUNE_RESERVE_S + SLOW_BASELINES_S
    slow = RunOptions(baselines=("max_autotune",))
    assert autotune_reserve_s(slow, catalog.get("SwiGLU")) == AUTOTUNE_RESERVE_S + SLOW_BASELINES_S
