"""Input Superopt does not take goes to PyTorch for the affected part, with one log line, never a traceback:
an unsupported op, dynamic shapes, autograd, CPU tensors for GPU kernels, non-contiguous inputs, mixed
dtypes; and ``dtype=`` on the backend plans a float32 model's regions in bfloat16 when asked."""

from __future__ import annotations

import logging

import pytest
import torch

import pyrunner
import pyrunner.frontend  # noqa: F401 - registers the backend
from pyrunner.frontend.backend import LAST_REPORTS


def r(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    recs = [x for x in caplog.records if x.name == "pyrunner.frontend" and x.levelno >= logging.WARNING]
    for x in recs:
        assert x.exc_info is None and "\n" not in x.getMessage() and "Traceback" not in x.getMessage()
    return recs


def _compiled(fn, caplog, *inputs, dynamic: bool = False, **options):
    torch._dynamo.reset()
    with caplog.at_level(logging.INFO, logger="pyrunner.frontend"), torch.no_grad():
        c = torch.compile(fn, backend="superopt", dynamic=dynamic, options={"fallback": "eager", **options})
        return c(*inputs)


def test_unsupported_op_is_one_line_per_op(caplog: pytest.LogCaptureFixture) -> None:
    def f(x, w):
        return torch.cumsum(torch.exp(x @ w), 0) + torch.cummax(x, 1).values.sum(-1, keepdim=True)

    x, w = r(8, 16), r(16, 16, seed=1)
    assert torch.allclose(_compiled(f, caplog, x, w, executor="reference"), f(x, w))
    rep = LAST_REPORTS[-1]
    assert rep.regions and len(rep.fallbacks) == 2
    assert len(_lines(caplog)) == len(rep.fallbacks)
    assert "torch.cumsum" in rep.fallbacks[0][1] and "test_frontend_bad_input.py" in rep.fallbacks[0][1]


def test_dynamic_shapes_are_specialised_per_shape(caplog: pytest.LogCaptureFixture) -> None:
    """``dynamic=True`` hands over symbolic sizes: each concrete shape gets its own static regions."""
    def f(x):
        return torch.softmax(x, -1) * 2

    torch._dynamo.reset()
    before = len(LAST_REPORTS)
    with caplog.at_level(logging.INFO, logger="pyrunner.frontend"), torch.no_grad():
        c = torch.compile(f, backend="superopt", dynamic=True, options={"fallback": "eager", "executor": "reference"})
        for n in (8, 12, 8):
            x = r(n, 16)
            assert torch.allclose(c(x), f(x))
    new = LAST_REPORTS[before:]
    assert len(new) == 2 and all(rep.regions and not rep.fallbacks for rep in new)  # 8 again: compiled once
    assert [rep.regions[0].region.graph.sizes for rep in new][0] != new[1].regions[0].region.graph.sizes


def test_decode_loop_keeps_its_regions_at_every_step() -> None:
    """A KV-cache decode loop (q length 1, kv length growing) under ``torch.compile``'s default
    ``dynamic=None``: the second shape goes symbolic, yet every step runs its attention as a region --
    past dynamo's recompile limit, where a per-shape recompile would have run the frame eagerly."""
    def step(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v) * 2

    torch._dynamo.reset()
    torch._dynamo.config.recompile_limit, old = 2, torch._dynamo.config.recompile_limit
    try:
        before = len(LAST_REPORTS)
        c = torch.compile(step, backend="superopt", options={"fallback": "eager", "executor": "reference"})
        q = r(1, 2, 1, 8)
        with torch.no_grad():
            for n in range(3, 9):
                k, v = r(1, 2, n, 8, seed=n), r(1, 2, n, 8, seed=n + 50)
                assert torch.allclose(c(q, k, v), step(q, k, v))
        reps = LAST_REPORTS[before:]
        assert len(reps) == 6 and all(len(rep.regions) == 1 and not rep.fallbacks for rep in reps)
        assert len({tuple(sorted(rep.regions[0].region.graph.sizes.values())) for rep in reps}) == 6
    finally:
        torch._dynamo.config.recompile_limit = old


def test_autograd_on_goes_to_pytorch(caplog: pytest.LogCaptureFixture) -> None:
    w = r(16, 4, seed=1).requires_grad_()
    torch._dynamo.reset()
    with caplog.at_level(logging.INFO, logger="pyrunner.frontend"):
        c = torch.compile(lambda x: torch.tanh(x @ w), backend="superopt",
                          options={"fallback": "eager", "executor": "reference", "backward": False})
        c(r(8, 16)).sum().backward()
    assert w.grad is not None and torch.allclose(w.grad, torch.autograd.grad(torch.tanh(r(8, 16) @ w).sum(), w)[0])
    assert "autograd" in LAST_REPORTS[-1].fallbacks[0][1] and len(_lines(caplog)) == 1


def test_cpu_tensors_for_gpu_kernels_go_to_pytorch(caplog: pytest.LogCaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import pyrunner.run.timing as timing

    monkeypatch.setattr(timing, "gpu_available", lambda: True)  # as if a GPU were here; the tensors are not on it
    x = r(8, 16)
    assert torch.allclose(_compiled(lambda x: torch.exp(x) + 1, caplog, x, executor="gpu"), torch.exp(x) + 1)
    assert "CPU tensors" in LAST_REPORTS[-1].fallbacks[0][1] and len(_lines(caplog)) == 1


def test_non_contiguous_inputs_are_read_as_they_are() -> None:
    def f(x, w):
        return torch.softmax(x @ w, -1)

    x, w = r(16, 8).T, r(32, 16, seed=1)[::2]  # a transpose and a strided slice
    opt = pyrunner.optimize(f, x, w, executor="reference", progress=False)
    assert opt.report.regions and not opt.report.fallbacks
    assert torch.allclose(opt(x, w), f(x, w), rtol=0, atol=1e-12)


def test_mixed_dtypes_leave_the_region_to_pytorch(caplog: pytest.LogCaptureFixture) -> None:
    def f(x, y):
        return torch.exp(x.float() * y)

    x, y = r(8, 16, dtype=torch.bfloat16), r(8, 16, seed=1, dtype=torch.float32)
    got = _compiled(f, caplog, x, y, executor="plan")
    assert torch.equal(got, f(x, y))
    rep = LAST_REPORTS[-1]
    assert not rep.regions and "bfloat16" in rep.fallbacks[0][1] and "dtype=" in rep.fallbacks[0][1]
    assert len(_lines(caplog)) == len(rep.fallbacks)


def test_backend_dtype_option_plans_a_float32_model_in_bfloat16(caplog: pytest.LogCaptureFixture) -> None:
    def f(x, w):
        return torch.nn.functional.silu(x @ w) * 2

    x, w = r(64, 64, dtype=torch.float32), r(64, 64, seed=1, dtype=torch.float32)
    _compiled(f, caplog, x, w, executor="plan", verify=False)
    assert not LAST_REPORTS[-1].regions and "float32" in LAST_REPORTS[-1].fallbacks[0][1]
    got = _compiled(f, caplog, x, w, executor="plan", verify=False, dtype="bfloat16")
    rep = LAST_REPORTS[-1]
    assert torch.equal(got, f(x, w))
    assert rep.regions and rep.regions[0].plan.dtype == "bfloat16" and not rep.fallbacks
    assert any("bfloat16" in n for n in rep.notes)


def test_equal_regions_are_planned_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two identical layers give one region graph: one search, one CPU check, the same plan for both."""
    import pyrunner.frontend.region_plans as comp

    calls: list[str] = []
    real = comp.plan_region
    monkeypatch.setattr(comp, "_PLANS", {})
    monkeypatch.setattr(comp, "plan_region", lambda g, dt, device=None: calls.append(dt) or real(g, dt, device))

    def two_layers(x, w1, w2):
        h = torch.exp(torch.nn.functional.rms_norm(x, (64,)) * w1)
        h = torch.cumsum(h, 0)  # left to PyTorch: it cuts the two layers apart
        return torch.exp(torch.nn.functional.rms_norm(h, (64,)) * w2)

    x, w1, w2 = (r(32, 64, seed=i, dtype=torch.bfloat16) for i in range(3))
    opt = pyrunner.optimize(two_layers, x, w1[0], w2[0], executor="plan", progress=False)
    assert len(opt.report.regions) == 2 and len(opt.report.fallbacks) == 1
    a, b = opt.report.regions
    assert a.plan is b.plan and len(calls) == 1


def test_wrong_axis_names_are_one_error_line() -> None:
    from pyrunner.frontend.errors import FrontendError

    with pytest.raises(FrontendError, match="axes for") as e:
        pyrunner.optimize(lambda x, w: x @ w, r(8, 16), r(16, 4, seed=1), executor="reference", progress=False,
                          axes={"x": "tdz"})
    assert "\n" not in str(e.value)


class _Model(torch.nn.Module):
    """Two linears around an op the IR lacks (``cumsum``): two segments and one unsupported op."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(16, 16).to(dtype), torch.nn.Linear(16, 16).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.cumsum(torch.tanh(self.a(x)), 0)).softmax(-1)


def test_float32_model_is_one_line_not_one_per_region(caplog: pytest.LogCaptureFixture) -> None:
    """A float32 model (kernels are planned in bf16/fp16) through ``optimize`` on the CPU path: the
    unsupported op and the dtype each get ONE line, not one per stage of every segment (it was five)."""
    m = _Model(torch.float32).eval()
    x = r(8, 16, dtype=torch.float32)
    with caplog.at_level(logging.INFO, logger="pyrunner.frontend"):
        opt = pyrunner.optimize(m, x, executor="plan", progress=False)
        with torch.no_grad():
            assert torch.equal(opt(x), m(x))
    assert not opt.report.regions and len(opt.report.fallbacks) == 2
    assert len(_lines(caplog)) == 2
    assert "torch.cumsum" in opt.report.fallbacks[0][1] and "float32" in opt.report.fallbacks[1][1]
    assert "dtype=" in opt.report.fallbacks[1][1]


def test_bad_input_to_a_model_through_optimize(caplog: pytest.LogCaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """One bf16 model through ``optimize``, then called as users do: a non-contiguous input, a new shape,
    autograd on, and (as if a GPU were here) CPU tensors; each gives the model's own values and at most
    one line per affected part, never a traceback."""
    import pyrunner.run.timing as timing

    m = _Model(torch.bfloat16).eval()
    x = r(8, 16, dtype=torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="pyrunner.frontend"):
        opt = pyrunner.optimize(m, x, executor="plan", progress=False)
    assert len(opt.report.regions) >= 2 and len(opt.report.fallbacks) == 1
    assert len(_lines(caplog)) == 1  # the cumsum
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pyrunner.frontend"):
        xt = r(16, 8, seed=2, dtype=torch.bfloat16).T  # non-contiguous: dynamo may compile again (its
        with torch.no_grad():                          # stride guards): then the cumsum's line again
            assert torch.equal(opt(xt), m(xt))
        assert all("torch.cumsum" in x.getMessage() for x in _lines(caplog)) and len(_lines(caplog)) <= 1
        caplog.clear()
        x12 = r(12, 16, seed=3, dtype=torch.bfloat16)  # a new shape: planned again, the cumsum again
        with torch.no_grad():
            assert torch.equal(opt(x12), m(x12))
        assert len(_lines(caplog)) == 1 and opt.later_reports[-1].regions
        caplog.clear()
        xg = r(8, 16, seed=4, dtype=torch.bfloat16).requires_grad_()  # autograd on: PyTorch, one line
        y = opt(xg)
        y.float().sum().backward()
        assert xg.grad is not None and len(_lines(caplog)) == 1 and "autograd" in caplog.text
    caplog.clear()
    monkeypatch.setattr(timing, "gpu_available", lambda: True)  # CPU tensors for GPU kernels: one line
    with caplog.at_level(logging.INFO, logger="pyrunner.frontend"):
        og = pyrunner.optimize(m, x, executor="gpu", progress=False)
        with torch.no_grad():
            assert torch.equal(og(x), m(x))
    assert len(_lines(caplog)) == 1 and "CPU tensors" in og.report.fallbacks[0][1]
