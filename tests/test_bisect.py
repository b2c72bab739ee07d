"""Kernel bisection names the one wrong kernel of a plan and the tiles it got wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyrunner.errors import GraphError
from pyrunner.ir.graph_json import graph_from_json, read_json_file
from pyrunner.ir.reference import random_inputs
from pyrunner.plan.analysis import resolve_config
from pyrunner.plan.schema import axis_sizes
from pyrunner.planner import search
from pyrunner.run.bisect import bisect_kernels
from pyrunner.run.executor import run_kernel
from pyrunner.target.rounding import round_to

torch = pytest.importorskip("torch")
BOUND = 1e-6  # the fake device is the executor itself: only the planted fault differs


def _two_kernel_plan():
    doc = read_json_file(Path(__file__).parent / "data" / "mlp_relu_squared.json", "graph file", GraphError)
    doc["axes"] = {"m": 128, "d": 64, "f": 256, "n": 64}
    graph = graph_from_json(doc)
    plans = [p for p in search(graph, "bf16", top=8) if len(p.kernels) == 2]
    assert plans, "the planner offers a two-kernel plan (the intermediate through global memory)"
    return graph, plans[0]


def _fake_device(plan, tensors, values, fault: str | None):
    sizes = axis_sizes(plan)
    dtypes = {t.name: t.dtype for t in plan.tensors}
    taxes = {t.name: list(t.axes) for t in plan.tensors}
    kernels = {k.name: k for k in plan.kernels}

    def run(name: str) -> None:
        host = {n: t.numpy().copy() for n, t in tensors.items()}
        run_kernel(kernels[name], values[name], sizes, host, dtypes, taxes)
        for n, arr in host.items():
            tensors[n].copy_(torch.from_numpy(arr))
        if name == fault:  # plant a wrong block: rows 8..15 of the first tile of the kernel's output
            out = plan.kernels[[k.name for k in plan.kernels].index(name)]
            dst = [op.dst for op in out.epilogue if hasattr(op, "dst") and op.dst in tensors][-1]
            tensors[dst][8:16, :4] += 1.0
    return run


@pytest.mark.parametrize("faulty", [0, 1, None])
def test_bisect_names_the_faulty_kernel(faulty: int | None) -> None:
    graph, plan = _two_kernel_plan()
    values = resolve_config(plan)
    raw = random_inputs(graph, seed=5)
    tensors = {}
    for t in plan.tensors:
        x = round_to(np.asarray(raw[t.name], np.float32), t.dtype) if t.role == "input" else np.full(t.shape, np.nan)
        tensors[t.name] = torch.from_numpy(np.asarray(x, np.float32))
    fault = plan.kernels[faulty].name if faulty is not None else None
    verdicts = bisect_kernels(plan, _fake_device(plan, tensors, values, fault), tensors, values, BOUND)
    assert [v.kernel for v in verdicts] == [k.name for k in plan.kernels]
    bad = [v.kernel for v in verdicts if not v.ok(BOUND)]
    assert bad == ([fault] if fault else [])
    if fault:
        (v,) = [v for v in verdicts if v.kernel == fault]
        (tiles,) = v.bad_tiles.values()
        assert tiles and all(c == 0 for c in tiles[0].values())
        assert list(v.bad_rows_in_tile.values())[0] == list(range(8, 16))


def test_a_kernel_verdict_with_a_nan_or_inf_error_is_never_ok() -> None:
    from pyrunner.run.bisect import KernelVerdict

    assert KernelVerdict("k0", {"Y": 1e-4}).ok(1e-2)
    for bad in (float("inf"), float("nan")):
        assert not KernelVerdict("k0", {"Y": bad}).ok(float("inf"))
