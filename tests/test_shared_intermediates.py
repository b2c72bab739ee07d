"""An intermediate two kernels read, computed and stored by one of them (``merge.SHARED_INTERMEDIATES``).

Attention's backward reads ``D = rowsum(dO * O)`` in its dK/dV kernel and its dQ kernel; the plan had a third
kernel for it alone (run 164: 13.8 us of a 1167 us training step). With the switch the dependent-merge pass
also pairs the D kernel with the dQ kernel, which loads dO already: the merged kernel computes D, uses it and
stores it for dK/dV. The switch is off until a GPU sweep and a timing decide it; these tests switch it on.
"""

from __future__ import annotations

import importlib

from pyrunner.ir import catalog
from pyrunner.plan.validate import check_plan
from pyrunner.planner.saves import choose_saves
from pyrunner.planner.search import search
from pyrunner.run.executor import execute
from pyrunner.run.grad_check import backward_inputs
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import cpu_check_plan
from pyrunner.run.verify import verify_executor
from pyrunner.target.device import device_named

merge_module = importlib.import_module("pyrunner.planner.merge")
H100 = device_named("h100")


def _attention_backward(on: bool, monkeypatch):
    monkeypatch.setattr(merge_module, "SHARED_INTERMEDIATES", on)
    bwd = choose_saves(catalog.get("ScaledAttention"), "bfloat16", None, H100)
    (plan,) = search(bwd.graph, "bf16", device=H100)
    check_plan(plan)
    return bwd, plan


def test_the_attention_backward_stores_d_from_its_dq_kernel(monkeypatch) -> None:
    _, off = _attention_backward(False, monkeypatch)
    bwd, on = _attention_backward(True, monkeypatch)
    (d_only,) = [k for k in off.kernels if "d_Q" not in k.writes and "d_K" not in k.writes]  # the D pass
    (stat,) = d_only.writes
    (both,) = [k for k in on.kernels if "d_Q" in k.writes]
    assert stat in both.writes and len(on.kernels) == len(off.kernels) - 1
    assert any(stat in k.reads for k in on.kernels if k is not both)  # the dK/dV kernel reads what it stored
    assert on.cost.total_us < off.cost.total_us
    small = cpu_check_plan(on)
    graph = graph_of(small)
    res = verify_executor(small, graph, execute, seed=2, inputs=backward_inputs(bwd, graph, 2))
    assert res.ok, res.message


def test_switched_off_an_intermediate_keeps_its_kernel(monkeypatch) -> None:
    _, off = _attention_backward(False, monkeypatch)
    assert [sorted(k.writes) for k in off.kernels if "d_Q" in k.writes] == [["d_Q"]]
