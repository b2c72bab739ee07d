"""Every check measures how far float32 arithmetic alone (its roundings and its range) moves the graph's
float64 value on its inputs (``run.conditioning``): the bound follows it, and where it is lost the draw is
not checkable (a later draw is taken smaller), never passed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from pyrunner.ir.graph import GraphBuilder
from pyrunner.ir.reference import evaluate
from pyrunner.planner import search
from pyrunner.run.conditioning import arithmetic_error, arithmetic_error_torch
from pyrunner.run.executor import execute
from pyrunner.run.verify import GpuVerifier, max_error, verify_executor

DATA = Path(__file__).resolve().parent / "data"


def _cancelling(scale: float):
    """Y = ((X + 1) - 1) * W: X of size 1e-6 survives float64 but a float32 rounding of X + 1 is 1e-1 of it."""
    b = GraphBuilder("Cancel")
    x, w = b.input("X", m=64, n=64), b.input("W", m=64, n=64)
    b.output("Y", b.mul(b.sub(b.add(x, 1.0), 1.0), w))
    graph = b.build()
    rng = np.random.default_rng(0)
    inputs = {"X": rng.standard_normal((64, 64)) * scale, "W": rng.standard_normal((64, 64))}
    return graph, inputs


def test_float32_rounding_of_a_cancellation_is_measured_on_the_given_inputs() -> None:
    graph, inputs = _cancelling(1e-6)
    ref = evaluate(graph, inputs)
    lost = arithmetic_error(graph, inputs, ref, 0, max_error)
    assert lost > 1e-2  # u32 / 1e-6 = 6e-2 per element
    tensors = {k: torch.from_numpy(v) for k, v in inputs.items()}
    on_torch = arithmetic_error_torch(graph, tensors, {k: torch.from_numpy(v) for k, v in ref.items()}, 0,
                                      lambda a, b: max_error(a.numpy(), b.numpy()))
    assert 0.2 < on_torch / lost < 5  # the same measure, other draws of the roundings
    graph, inputs = _cancelling(1.0)
    assert arithmetic_error(graph, inputs, evaluate(graph, inputs), 0, max_error) < 1e-6


def test_an_ill_conditioned_draw_is_not_checkable_and_a_well_conditioned_one_keeps_its_bound() -> None:
    graph, inputs = _cancelling(1e-9)  # u32 / 1e-9: float32 roundings alone move Y by ~60x its scale
    (plan,) = search(graph, "bf16", top=1, tuning=False)
    res = verify_executor(plan, graph, execute, seed=1, inputs=inputs)
    assert res.uncheckable and not res.ok and "ill-conditioned" in res.message
    gpu = GpuVerifier(plan, graph, seed=1, device="cpu", inputs=inputs)
    assert gpu.check(lambda t: None).uncheckable  # judged before any kernel runs: the outputs stay NaN
    graph, inputs = _cancelling(1.0)
    (plan,) = search(graph, "bf16", top=1, tuning=False)
    res = verify_executor(plan, graph, execute, seed=1, inputs=inputs)
    assert res.ok and res.bound == GpuVerifier(plan, graph, seed=1, device="cpu", inputs=inputs).a_priori


def test_the_query_temperature_backward_on_the_gpu_sweeps_draw_is_not_checkable() -> None:
    """Run 127's failure, on the CPU: with S0 saved (the saves the sweep chose, then in bfloat16) and tau = -0.0031
    at one query, exp(S0 / tau - LSE) leaves the float64 reference's row of P summing to 5e5 and d_tau a
    cancellation amplified by P S0 / tau^2; the CPU executor missed by 1.6e2 as the GPU did by 2.4e2. That
    draw is now not checkable (float32 roundings alone move the reference by more than its scale); a draw
    whose smallest |tau| is 0.0063 still passes under the a-priori bound."""
    from plan_cache import search as cached_search

    from pyrunner.ir.grad import derive
    from pyrunner.ir.graph_json import load_graph_file
    from pyrunner.planner.saves import choose_saves
    from pyrunner.run.grad_check import backward_inputs
    from pyrunner.target.device import DEVICES

    forward = load_graph_file(DATA / "attention_query_temperature.json").with_sizes(
        {"h": 2, "t_q": 128, "t_kv": 128, "d": 128})
    swept = choose_saves(forward, "bf16", None, DEVICES["h200"])
    assert "S0" not in swept.saved or "S0" in swept.forward.float32_io  # issue 44: never a bf16 score any more
    (s0,) = [t for t in derive(forward).recomputed if forward.labels.get(t) == "S0"]
    der = derive(forward, save=(s0,))  # the saves the sweep chose then, with S0 stored as it was then (bf16)
    assert "S0" in der.saved and "S0" in der.graph.float32_io
    der = dataclasses.replace(der, graph=dataclasses.replace(der.graph, float32_io=der.graph.float32_io - {"S0"}))
    (plan,) = cached_search(der.graph, "bf16", top=1)
    gpu_draw = verify_executor(plan, der.graph, execute, seed=2020119715,
                               inputs=backward_inputs(der, der.graph, 2020119715))
    assert gpu_draw.uncheckable and "ill-conditioned" in gpu_draw.message
    other = verify_executor(plan, der.graph, execute, seed=0, inputs=backward_inputs(der, der.graph, 0))
    assert other.ok and other.bound < 0.02, other.message


def _rbf_smoother():
    """Run 134's failure: Y = (W V) / sum_k W with W = exp(-|q - k|^2 / 2), at the sweep's small shape."""
    from pyrunner.ir.graph_json import load_graph_file

    root = Path(__file__).resolve().parent.parent
    return load_graph_file(root / "benchmarks" / "graphs" / "rbf_smoother.json").with_sizes(
        {"q": 128, "k": 128, "d": 2, "e": 64})


def test_weights_that_underflow_float32_are_measured_as_lost() -> None:
    """A query 20 from every key weighs each at 1e-87: finite in float64, 0 in float32 (flushed below its
    smallest normal), so its row is 0/0 in any float32 kernel. The perturbed reference holds every value to
    float32's range and finds that row lost; on normal inputs nothing leaves the range."""
    from pyrunner.ir.reference import outlier_inputs, random_inputs

    graph = _rbf_smoother()
    inputs = outlier_inputs(graph, 970199984, magnitude=20.0)
    ref = evaluate(graph, inputs)
    assert np.isfinite(ref["Y"]).all()
    assert arithmetic_error(graph, inputs, ref, 0, max_error) == float("inf")
    tensors = {k: torch.from_numpy(v) for k, v in inputs.items()}
    on_torch = arithmetic_error_torch(graph, tensors, {k: torch.from_numpy(v) for k, v in ref.items()}, 0,
                                      lambda a, b: max_error(a.numpy(), b.numpy()))
    assert on_torch == float("inf")
    normal = random_inputs(graph, 970199984)
    assert arithmetic_error(graph, normal, evaluate(graph, normal), 0, max_error) < 1e-5


def test_an_outlier_draw_float32_cannot_hold_is_taken_smaller() -> None:
    """Run 134's seed: the GPU check took the outlier draw at magnitude 20 (its computed GEMM operands moved
    the reference by 6e-2 only) and the kernel's NaN failed it. Every draw's conditioning is measured now, on
    the GPU check and the CPU one alike, so that draw is taken at a magnitude float32 can hold."""
    graph = _rbf_smoother()
    (plan,) = search(graph, "bf16", top=1, tuning=False)
    gpu = GpuVerifier(plan, graph, seed=970199984, device="cpu")
    labels = [label for label, _ in gpu.draws]
    assert "on outlier inputs (up to 10)" in labels, labels
    assert all(d.arith_error < 1e-3 for _, d in gpu.draws)
    cpu = verify_executor(plan, graph, execute, seed=970199984)
    assert cpu.ok and "on outlier inputs (up to 10)" in cpu.message, cpu.message


def test_a_one_hot_softmax_of_huge_scores_stays_checkable() -> None:
    """Runs 132-133's draw in kind: a temperature exp(20) puts scores near 1e9, where one float32 rounding moves
    a score by about 60, yet every row's gaps are far wider, its softmax stays one-hot and the graph is
    well-conditioned: a kernel that gives NaN there (the FMA form of the shift) is wrong, not excused."""
    from pyrunner.ir.graph_json import load_graph_file
    from pyrunner.ir.reference import random_inputs

    graph = load_graph_file(DATA / "attention_head_temperature.json").with_sizes(
        {"h": 2, "t_q": 64, "t_kv": 64, "d": 64})
    inputs = random_inputs(graph, 3)
    inputs["log_scale"] = np.full_like(inputs["log_scale"], 20.0)
    ref = evaluate(graph, inputs)
    scores = np.einsum("hqd,hkd->hqk", inputs["Q"], inputs["K"]) * np.exp(20.0)
    assert np.abs(scores).max() > 2.0**30
    assert arithmetic_error(graph, inputs, ref, 0, max_error) < 1e-3
