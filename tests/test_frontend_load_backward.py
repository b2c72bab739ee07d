"""``pyrunner.load(plan, backward=True)`` (issue 44): the plan as a differentiable function whose backward runs
the derived backward graph's plan. Without a GPU the call says so in one line; the autograd wiring (saved
tensors, cotangents, gradient layouts) is checked with both halves in the float64 interpreter."""

from __future__ import annotations

import pytest
import torch

import pyrunner
from pyrunner.frontend.errors import FrontendError
from pyrunner.frontend.trainable import Trainable
from pyrunner.ir import catalog
from pyrunner.planner import search
from pyrunner.run.grad_check import float64_torch
from pyrunner.run.verify import UNIT_ROUNDOFF

STORE_FP16 = UNIT_ROUNDOFF["float16"]
"""The reference executor computes each gradient in float64 and stores it in the inputs' float16: one
rounding, at most u(float16) of the largest element (normalised max error)."""


def _plan(name: str, sizes: dict[str, int]):
    return search(catalog.get(name, sizes), "fp16")[0]


def _inputs(graph, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {t.name: (torch.randn(*[graph.sizes[a] for a in t.axes], generator=g) * 0.5).half().requires_grad_()
            for t in graph.inputs()}


def test_load_backward_plans_both_halves_and_needs_a_gpu() -> None:
    f = pyrunner.load(_plan("Attention", {"h": 1, "t_q": 64, "t_kv": 64, "d": 32}), backward=True)
    assert isinstance(f, Trainable)
    fwd, back = f.plans.forward, f.plans.backward
    saved = set(f.plans.bwd.saved)  # at this toy size the cost model may keep the scores too (test_grad_plans)
    assert {"O", "LSE_P"} <= saved == {t.name for t in fwd.tensors if t.role == "output"}  # the forward writes the LSE
    assert {t.name for t in back.tensors if t.role == "input"} == {"Q", "K", "V", "d_O"} | saved
    assert {t.name for t in back.tensors if t.role == "output"} == {"d_Q", "d_K", "d_V"}
    if not torch.cuda.is_available():
        with pytest.raises(FrontendError, match="no CUDA GPU"):
            f(**_inputs(f.graph))


@pytest.mark.parametrize("name, sizes", [("Attention", {"h": 2, "t_q": 64, "t_kv": 48, "d": 32}),
                                         ("SwiGLU", {"m": 32, "d": 64, "n": 48}),
                                         ("RMSNormMLP", {"m": 32, "d": 64, "n": 48})])
def test_load_backward_gradients_match_float64_autograd(name: str, sizes: dict[str, int]) -> None:
    plan = _plan(name, sizes)
    f = Trainable(plan, executor="reference")
    xs = _inputs(f.graph, seed=1)
    outs = f(**xs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    cot = [torch.randn(o.shape, generator=torch.Generator().manual_seed(2 + i)).half() for i, o in enumerate(outs)]
    torch.autograd.backward(outs, cot)
    leaves = {n: x.detach().double().requires_grad_() for n, x in xs.items()}
    ref = float64_torch(f.graph)(**leaves)
    torch.autograd.backward([ref[n] for n, _ in f.graph.outputs], [c.double() for c in cot])
    for n, x in xs.items():
        want = leaves[n].grad
        assert x.grad is not None and x.grad.dtype == torch.float16 and x.grad.shape == want.shape
        err = float((x.grad.double() - want).abs().max() / want.abs().max())
        assert err <= STORE_FP16, (n, err)


def test_grad_bench_small_smoke(tmp_path) -> None:
    """``benchmarks/grad_bench.py --small`` (the GPU benchmark's CPU smoke test) writes one verified row per
    variant: Superopt's gradients within its bound, the baseline's beside it."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    res = subprocess.run([sys.executable, str(root / "benchmarks" / "grad_bench.py"), "--small", "--cases", "swiglu",
                          "--rounds", "1", "--out", str(tmp_path)], cwd=root, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "grad-bench.jsonl").read_text().splitlines()]
    assert {r["variant"] for r in rows} == {"superopt", "eager"}
    for r in rows:
        assert r["grad_err_vs_f64"] <= r["bound"] and r["fwd_bwd_us"] > 0, r


def test_grad_bench_plan_only_fills_the_store_a_second_run_reads(tmp_path) -> None:
    """``grad_bench.py --plan-only --plan-store DIR`` plans each variant into DIR without a GPU; the next process
    finds every plan there (the same hashes, nothing planned again: no new entry); without a store it refuses."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, str(root / "benchmarks" / "grad_bench.py"), "--small", "--cases", "swiglu",
           "--ab-switch", "merge.SHARED_INTERMEDIATES", "--plan-only", "--plan-store", str(tmp_path)]
    first = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    entries = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.json")}
    assert {p.parent.name for p in entries} == {"plans", "derivations"}
    assert len({p.parent.parent for p in entries}) == 2  # one folder per switch setting
    again = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.json")} == entries  # read, none written again

    def plans(out: str) -> list[str]:
        return [line.split(";")[0] for line in out.splitlines() if line.startswith("[swiglu]")]
    assert len(plans(first.stdout)) == 2 and plans(again.stdout) == plans(first.stdout)
    refused = subprocess.run(cmd[:-2], cwd=root, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and "--plan-only needs --plan-store" in refused.stderr
    timed = [c for c in cmd if c != "--plan-only"][:-2] + ["--plan-device", "h100"]
    refused = subprocess.run(timed, cwd=root, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and "--plan-device goes with --plan-only" in refused.stderr


def test_a_region_input_no_output_reads_is_left_out_of_the_plans_call() -> None:
    """A region can list an input its graph never reads (a value the captured code used only for its shape or
    dtype: ``type_as``, ``view_as``); the plan's signature leaves it out, so feeding it made the Llama-3-8B
    training step fail ("unexpected input 'in2'", run 154). The region's runs feed only what the plan takes."""
    from pyrunner.frontend.autograd import plan_run
    from pyrunner.frontend.load import LoadedPlan
    from pyrunner.frontend.signature import plan_inputs
    from pyrunner.ir.graph_json import graph_from_json

    g = graph_from_json({"name": "ShapeOnlyInput", "axes": {"m": 32, "d": 64, "n": 48},
                         "inputs": {"X": ["m", "d"], "W": ["d", "n"], "Z": ["m", "n"]},
                         "nodes": [{"name": "Y", "op": "matmul", "args": ["X", "W"], "contract": "d"}],
                         "outputs": ["Y"]})
    loaded = LoadedPlan(search(g, "fp16")[0])
    assert loaded.sig.input_names == ("X", "W")
    feed = {"X": torch.randn(32, 64).half(), "W": torch.randn(64, 48).half(), "Z": torch.randn(32, 48).half()}
    assert list(plan_inputs(loaded.sig, feed)) == ["X", "W"]
    with pytest.raises(FrontendError, match="missing input"):
        loaded(**plan_inputs(loaded.sig, {"X": feed["X"]}))  # an input the plan needs is still asked for
    if not torch.cuda.is_available():  # binding passes; what stops the call is the missing GPU
        with pytest.raises(FrontendError, match="no CUDA GPU"):
            plan_run(loaded)(feed)
