"""Training through Superopt regions (issue 44): each region under autograd is a ``torch.autograd.Function``
whose backward runs the derived backward graph (``frontend.autograd``).

A Llama-shaped Hugging Face layer (``frontend_models``, random weights from config) takes two SGD steps
through ``optimize`` and through the ``torch.compile`` backend with the float64 interpreter running both
halves of every region (``executor="reference"``: the whole path, layouts and cotangents included, checked
on a CPU); gradients and weights are compared with eager PyTorch, and the planned halves must have run.
Without a GPU (``executor="plan"``) both halves are planned and CPU-checked and PyTorch runs the step.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from frontend_models import llama_layer
from torch import nn

import pyrunner
import pyrunner.frontend  # noqa: F401 - registers the backend
from pyrunner.frontend.autograd import CALLS
from pyrunner.frontend.backend import LAST_REPORTS

pytest.importorskip("transformers")

GRAD_FP32_VS_F64 = 1e-5
"""Eager computes the layer and its gradients in float32, the reference executor each region's forward and
derived backward in float64 (inputs and outputs at the region's edges in float32): the largest gradient
error relative to the gradient's largest element stays within float32 rounding through a layer and its
backward, like the forward's FP32_VS_F64 in test_frontend_hf.py (measured: 2e-7 to 7e-7)."""
WEIGHT_FP32 = 1e-6
"""After two SGD steps (lr 0.1) the weights differ by lr times the gradient differences: far below this."""


def _first(y):
    return y[0] if isinstance(y, tuple) else y


def _two_steps(model: nn.Module, f, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Two SGD steps of mean(f(x)^2); the gradients of the second step."""
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        sgd.zero_grad()
        _first(f(*args, **kwargs)).pow(2).mean().backward()
        sgd.step()
    return [p.grad.detach().clone() for p in model.parameters()]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _llama_steps_through_the_backend() -> None:
    """Two SGD steps of the Llama layer through the backend with both halves of every region in the float64
    interpreter, its gradients and weights compared with eager's."""
    ref, args, kwargs = llama_layer()
    m = llama_layer()[0]
    want = _two_steps(ref, ref, args, kwargs)
    torch._dynamo.reset()
    c = torch.compile(m, backend="superopt", options={"executor": "reference", "fallback": "eager"})
    _compare(ref, m, want, _two_steps(m, c, args, kwargs))


def _compare(ref: nn.Module, m: nn.Module, want: list[torch.Tensor], got: list[torch.Tensor]) -> None:
    names = [n for n, _ in ref.named_parameters()]
    for name, g, w in zip(names, got, want, strict=True):
        assert _relative(g, w) <= GRAD_FP32_VS_F64, (name, _relative(g, w))
    for name, p, q in zip(names, m.parameters(), ref.parameters(), strict=True):
        assert float((p - q).abs().max()) <= WEIGHT_FP32, name


def _ran_backward(report, before: int) -> None:
    """Every region ran its derived backward, at each of the two steps (not PyTorch's ops)."""
    assert report.regions and not report.fallbacks, report.fallbacks
    assert all(c.decision == "reference" and "derived backward" in c.reason for c in report.regions)
    assert CALLS["backward"] - before == 2 * len(report.regions)


def test_llama_layer_trains_through_optimize() -> None:
    ref, args, kwargs = llama_layer()
    m = llama_layer()[0]
    want = _two_steps(ref, ref, args, kwargs)
    opt = pyrunner.optimize(m, *args, executor="reference", progress=False, **kwargs)
    before = CALLS["backward"]
    got = _two_steps(m, opt, args, kwargs)
    _ran_backward(opt.later_reports[-1], before)  # captured under no_grad; with autograd on, compiled again
    _compare(ref, m, want, got)


@pytest.mark.parametrize("fallback", ["inductor", "eager"])
def test_llama_layer_trains_through_the_backend(fallback: str) -> None:
    """Inductor (AOTAutograd) sees each half as an opaque custom op with a fake kernel."""
    ref, args, kwargs = llama_layer()
    m = llama_layer()[0]
    want = _two_steps(ref, ref, args, kwargs)
    torch._dynamo.reset()
    c = torch.compile(m, backend="superopt", options={"executor": "reference", "fallback": fallback})
    before = CALLS["backward"]
    got = _two_steps(m, c, args, kwargs)
    _ran_backward(LAST_REPORTS[-1], before)
    _compare(ref, m, want, got)


class Mlp(nn.Module):
    """RMSNorm then SwiGLU, in bfloat16 (the planned dtype)."""

    def __init__(self, d: int = 64, ffn: int = 128) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.gate, self.up = (nn.Parameter(torch.randn(d, ffn, generator=g) * d ** -0.5) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return F.silu(h @ self.gate) * (h @ self.up)


def test_without_a_gpu_backward_plans_are_cpu_checked_and_pytorch_trains(caplog: pytest.LogCaptureFixture) -> None:
    ref, m = Mlp().bfloat16(), Mlp().bfloat16()
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(4)).bfloat16()
    want = _two_steps(ref, ref, (x,), {})
    opt = pyrunner.optimize(m, x, executor="plan", progress=False)
    before = CALLS["backward"]
    with caplog.at_level(logging.INFO, logger="pyrunner.frontend"):
        got = _two_steps(m, opt, (x,), {})
    assert CALLS["backward"] == before  # PyTorch ran the step
    rep = opt.later_reports[-1]
    assert rep.regions and not rep.fallbacks
    for c, row in zip(rep.regions, rep.rows(), strict=True):
        assert c.decision == "planned" and "planned with its backward" in c.reason
        assert "backward CPU-checked" in c.reason and "of float64 autograd" in c.reason
        # the table shows both halves a training step spends: forward + derived backward
        assert c.backward is not None and c.backward.workload.endswith("Backward")
        assert row[2] == f"{len(c.plan.kernels)} + {len(c.backward.kernels)}"
        assert [float(x) for x in row[3].split(" + ")] == pytest.approx(
            [c.plan.cost.total_us, c.backward.cost.total_us], abs=0.01)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_no_backward_plan_leaves_the_region_to_pytorch(monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A region whose backward cannot be made stays PyTorch ops, with one log line; gradients are PyTorch's."""
    from pyrunner.errors import GraphError
    from pyrunner.frontend import training

    def refuse(graph, dtype, wrt=None):
        raise GraphError("backward: refused for this test")

    monkeypatch.setattr(training, "derivation", refuse)
    ref, m = Mlp().double(), Mlp().double()
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    want = _two_steps(ref, ref, (x,), {})
    opt = pyrunner.optimize(m, x, executor="reference", progress=False)
    before = CALLS["backward"]
    with caplog.at_level(logging.INFO, logger="pyrunner.frontend"):
        got = _two_steps(m, opt, (x,), {})
    assert CALLS["backward"] == before
    rep = opt.later_reports[-1]
    assert not rep.regions and rep.fallbacks and all("no backward plan" in why for _, why in rep.fallbacks)
    lines = [r for r in caplog.records if "no backward plan" in r.getMessage() and r.levelno >= logging.WARNING]
    assert len(lines) == len(rep.fallbacks)
    # each split on the way says why (a region split for a failed check looked like a planned one)
    splits = [r.getMessage() for r in caplog.records if "splitting" in r.getMessage()]
    assert splits and all("refused for this test" in msg for msg in splits)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_backward_false_leaves_training_graphs_to_pytorch() -> None:
    ref, m = Mlp().double(), Mlp().double()
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    want = _two_steps(ref, ref, (x,), {})
    opt = pyrunner.optimize(m, x, executor="reference", progress=False, backward=False)
    before = CALLS["forward"]
    got = _two_steps(m, opt, (x,), {})
    assert CALLS["forward"] == before
    rep = opt.later_reports[-1]
    assert not rep.regions and "backward=False" in rep.fallbacks[0][1]
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_saved_tensors_cross_between_the_halves_in_the_dtype_the_forward_plan_writes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A region keeps each added save as its forward plan writes it (``TrainingImpl.save_dtypes``): widening a
    bf16 contraction to float32 and back cost two conversions of a layer's largest tensor. Here the saves are
    declared float64 (the float64 interpreter's own), so the backward must receive float64, not float32."""
    import pyrunner.frontend.autograd as ag

    prepare, seen = ag._prepare, {}

    def declared_f64(rg, meta, opts, flops, wrt=None):
        impl, choice = prepare(rg, meta, opts, flops, wrt)
        impl.save_dtypes = {n: torch.float64 for n in impl.bwd.saved}
        back = impl.backward

        def recording(feed):
            seen.update({k: v.dtype for k, v in feed.items() if k in impl.bwd.saved})
            return back(feed)

        impl.backward = recording
        return impl, choice

    monkeypatch.setattr(ag, "_prepare", declared_f64)
    _llama_steps_through_the_backend()
    assert seen and set(seen.values()) == {torch.float64}, seen


def test_regions_derive_gradients_only_for_inputs_that_need_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama's rotary tables and the layer's input need no gradient here: the regions reading them derive none for
    them (on the H100 the rotary region's backward with the tables' gradients was a kernel TileLang could not
    lay out, and the region fell to 55 unfused kernels), and the weights' gradients still match eager's."""
    import pyrunner.frontend.autograd as ag

    prepare, asked = ag._prepare, []

    def recording(rg, meta, opts, flops, wrt=None):
        asked.append((rg, wrt, opts.needs_grad))
        return prepare(rg, meta, opts, flops, wrt)

    monkeypatch.setattr(ag, "_prepare", recording)
    _llama_steps_through_the_backend()
    assert asked and all(wrt is not None for _, wrt, _ in asked)
    left = [(rg, name, src) for rg, wrt, _ in asked for name, src, _ in rg.inputs if name not in wrt]
    kept = [src for rg, wrt, _ in asked for name, src, _ in rg.inputs if name in wrt]
    assert left and kept
    needs = asked[0][2]
    assert all(src not in needs for _, _, src in left) and all(src in needs for src in kept)
    tables = {src.name for _, _, src in left if "position_embeddings" in src.name}
    assert len(tables) == 2, sorted(src.name for _, _, src in left)  # cos and sin


def test_grad_nodes_follow_what_the_parameters_reach() -> None:
    """``grad_nodes``: the placeholders whose example input requires a gradient and every node computed from one;
    a value computed from inputs that need none (a mask, a table) is not among them."""
    from pyrunner.frontend.autograd import grad_nodes

    def f(x, w, table):
        scaled = table * 2.0
        return (x @ w) * scaled, scaled + 1.0

    gm = torch.fx.symbolic_trace(f)
    x, w, table = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True), torch.randn(4, 8)
    names = {n.name for n in grad_nodes(gm, [x, w, table])}
    assert names == {"w", "matmul", "mul_1", "output"}, names


def test_a_graph_holding_its_own_parameter_is_a_training_graph() -> None:
    """Dynamo keeps some modules' weights as the graph's own attributes (``get_attr``), not as inputs: a graph whose
    only gradient-needing tensor is such a parameter is still compiled for training (its regions get their
    derived backward), and not with grad mode off."""
    from pyrunner.frontend.backend import _training

    class Held(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Module()
            self.inner.w = torch.nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            return torch.tanh(x @ self.inner.w)

    gm = torch.fx.symbolic_trace(Held())
    assert [str(n.target) for n in gm.graph.nodes if n.op == "get_attr"] == ["inner.w"]  # a dotted target
    x = torch.randn(4, 8)
    assert _training(gm, [x])
    with torch.no_grad():
        assert not _training(gm, [x])
    gm.inner.w.requires_grad_(False)
    assert not _training(gm, [x])


@pytest.mark.parametrize("superopt_us, kept, fallback", [(1.0, True, "eager"), (3.0, False, "eager"),
                                                        (3.0, False, "inductor")])
def test_a_training_region_is_measured_forward_and_backward_against_the_fallback(
        superopt_us: float, kept: bool, fallback: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under autograd a region is timed as a training step spends it: the measure gets its forward and derived
    backward, and the fallback's forward and backward of the same ops; the slower side is dropped. Before, a
    training region was never measured, and the Llama-3-8B training step ran every region in Superopt kernels
    at 0.48x torch.compile (run 155), though the inference path hands losing regions to inductor."""
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path))
    calls: list[tuple[int, int]] = []

    def measure(label, superopt, fallback):
        b0 = CALLS["backward"]
        got = superopt()
        b1 = CALLS["backward"]
        theirs = fallback()
        assert b1 == b0 + 1 and CALLS["backward"] == b1  # ours ran the derived backward, the fallback did not
        assert all(isinstance(g, torch.Tensor) for g in (*got, *theirs)) and len(got) == len(theirs) == 4
        calls.append((b0, b1))
        return superopt_us, 2.0

    ref, m = Mlp().double(), Mlp().double()
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(4), dtype=torch.float64).requires_grad_()
    want = _two_steps(ref, ref, (x,), {})
    torch._dynamo.reset()
    c = torch.compile(m, backend="superopt", options={"executor": "reference", "fallback": fallback,
                                                      "measure": measure})
    before = CALLS["backward"]
    got = _two_steps(m, c, (x,), {})
    rep = LAST_REPORTS[-1]
    assert calls and rep.regions
    assert all(ch.decision == ("superopt" if kept else "fallback") for ch in rep.regions), rep
    assert (CALLS["backward"] - before - len(calls) > 0) == kept  # the step's own backward: ours or PyTorch's
    for g, w in zip(got, want, strict=True):
        assert _relative(g, w) <= GRAD_FP32_VS_F64


def test_the_backends_own_measure_times_a_training_region_and_the_step_stays_right(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``decide.gpu_measure`` itself (its wall-clock path here, no GPU) on a training region: both steps run
    repeatedly (warm-up, rounds) on fresh leaves, a decision with its reason is recorded, and the model's
    gradients are eager's whichever side won."""
    from pyrunner.frontend.decide import gpu_measure

    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path))
    ref, m = Mlp().double(), Mlp().double()
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(4), dtype=torch.float64).requires_grad_()
    want = _two_steps(ref, ref, (x,), {})
    torch._dynamo.reset()
    c = torch.compile(m, backend="superopt", options={"executor": "reference", "fallback": "inductor",
                                                      "measure": gpu_measure})
    got = _two_steps(m, c, (x,), {})
    rep = LAST_REPORTS[-1]
    assert rep.regions and not rep.fallbacks, rep
    assert all(ch.decision in ("superopt", "fallback") and "us" in ch.reason for ch in rep.regions), rep
    for g, w in zip(got, want, strict=True):
        assert _relative(g, w) <= GRAD_FP32_VS_F64
