"""Keep only what wins: each region is measured once against the fallback compiler's code for its ops
(through the public ``measure=`` seam, here a fake), the faster kept, the decision cached on disk under
``$SUPEROPT_CACHE_DIR`` keyed by region graph (shape bucket), dtype, device and TileLang version."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

import pyrunner.frontend  # noqa: F401 - registers the backend
from pyrunner.frontend.backend import LAST_REPORTS
from pyrunner.frontend.decide import DecisionCache, decide, decision_key


class FakeMeasure:
    """Says Superopt takes ``superopt_us`` and the fallback ``fallback_us``; runs each once to show both work."""

    def __init__(self, superopt_us: float, fallback_us: float) -> None:
        self.times, self.calls = (superopt_us, fallback_us), []

    def __call__(self, label, superopt, fallback):
        a, b = superopt(), fallback()
        assert all(torch.allclose(x, y) for x, y in zip(a, b, strict=True))
        self.calls.append(label)
        return self.times


def f(x):
    return torch.softmax(x, -1) * 2


def _run(x: torch.Tensor, measure: FakeMeasure) -> torch.Tensor:
    torch._dynamo.reset()
    c = torch.compile(f, backend="superopt", dynamic=False,
                      options={"fallback": "eager", "executor": "reference", "measure": measure})
    with torch.no_grad():
        out = c(x)
        assert torch.allclose(c(x), out)  # a second call: decided already
    return out


def test_decision_measured_once_cached_on_disk_and_keyed_by_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path))
    x = torch.randn(8, 16, dtype=torch.float64)
    m = FakeMeasure(1.0, 2.0)
    with caplog.at_level(logging.INFO, logger="pyrunner.frontend"):
        assert torch.allclose(_run(x, m), f(x))
    assert len(m.calls) == 1
    rep = LAST_REPORTS[-1]
    assert rep.regions[0].decision == "superopt" and "1.00 us" in rep.regions[0].reason
    files = list(tmp_path.glob("decisions/*/cpu/float64/*.json"))
    assert len(files) == 1
    assert any("measured now" in r.getMessage() for r in caplog.records)
    # A new compile (another process, another layer with the same graph) reads the decision: no measurement.
    m2 = FakeMeasure(9.0, 1.0)
    _run(x, m2)
    assert not m2.calls and LAST_REPORTS[-1].regions[0].decision == "superopt"
    # Another shape is another bucket: measured, and here the fallback compiler's code wins and runs.
    x2 = torch.randn(4, 16, dtype=torch.float64)
    assert torch.allclose(_run(x2, m2), f(x2))
    assert len(m2.calls) == 1 and LAST_REPORTS[-1].regions[0].decision == "fallback"
    assert len(list(tmp_path.glob("decisions/*/cpu/float64/*.json"))) == 2


def test_decision_key_names_dtype_device_and_tilelang(tmp_path: Path) -> None:
    from pyrunner.ir import graph as ir

    g = ir.Graph("region", {"t": 8, "d": 16}, (("out0", ir.unary("exp", ir.inp("in0", ("t", "d")))),), {})
    base = decision_key(g, "bfloat16", "NVIDIA_H200-sm90", "0.1.6")
    others = [decision_key(g, "float16", "NVIDIA_H200-sm90", "0.1.6"), decision_key(g, "bfloat16", "cpu", "0.1.6"),
              decision_key(g, "bfloat16", "NVIDIA_H200-sm90", "0.1.7"),
              decision_key(ir.Graph("region", {"t": 16, "d": 16}, g.outputs, {}), "bfloat16", "NVIDIA_H200-sm90",
                           "0.1.6")]
    cache = DecisionCache(tmp_path)
    cache.put(base, decide(3.0, 2.0, base.sizes))
    assert cache.get(base) is not None and cache.get(base).choice == "fallback"
    assert len({base.path(tmp_path)} | {k.path(tmp_path) for k in others}) == 5
    assert all(cache.get(k) is None for k in others)
    assert decide(2.0, 2.0).choice == "fallback"  # a tie keeps the fallback compiler's code


def test_a_region_that_loses_leaves_its_ops_to_the_fallback_compiler_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decided when the graph is compiled: the losing region's own ops reach the fallback compiler inside the
    one graph it compiles (no region op left around them), the winning region's op does; neither is measured
    again at run time."""
    import pyrunner.frontend.backend as backend

    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path))
    seen: list[str] = []

    def eager(gm, example_inputs):  # the fallback compiler: records the graph it is handed
        seen.append(str(gm.graph))
        return gm

    monkeypatch.setitem(backend.FALLBACKS, "eager", eager)
    x = torch.randn(8, 16, dtype=torch.float64)
    for times, region_op in (((2.0, 1.0), False), ((1.0, 2.0), True)):
        seen.clear()
        for p in tmp_path.glob("decisions/**/*.json"):
            p.unlink()
        m = FakeMeasure(*times)
        assert torch.allclose(_run(x, m), f(x))
        assert len(m.calls) == 1
        # A losing region's op appears in no graph the fallback compiler is handed (its ops do); a winner's does.
        assert any("superopt." in g for g in seen) is region_op, seen
        assert any("softmax" in g and "superopt." not in g for g in seen), seen  # measured alone (and kept)
        assert LAST_REPORTS[-1].regions[0].decision == ("superopt" if region_op else "fallback")
