"""The device model and the one fit check: the planner emits only tuning spaces that fit."""

from __future__ import annotations

import itertools

import pytest

from pyrunner.backend.tilelang.compile import check_fits
from pyrunner.ir import catalog as workloads
from pyrunner.plan.schema import axis_sizes
from pyrunner.planner import search
from pyrunner.planner.cost import H200 as MACHINE
from pyrunner.planner.cost import fitting_space
from pyrunner.target import H200
from pyrunner.target.fit import FitModel


def _configs(space: dict[str, list[int]]) -> list[dict[str, int]]:
    names = list(space)
    return [dict(zip(names, vals)) for vals in itertools.product(*(space[n] for n in names))]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("name", sorted(workloads.CATALOG))
def test_every_config_of_every_emitted_space_fits(name: str, dtype: str) -> None:
    plan = search(workloads.get(name), dtype)[0]
    sizes = axis_sizes(plan)
    checked = 0
    for k in plan.kernels:
        model = FitModel(k, sizes)
        for cfg in _configs(k.params):
            assert model.why_not(cfg) is None, f"{k.name} {cfg}: {model.why_not(cfg)}"
            checked += 1
        assert len(k.params.get("threads", [])) >= 1
    assert checked >= len(plan.kernels)
    check_fits(plan)  # the runner's entry point agrees for the defaults


def test_fitting_space_keeps_the_default_and_drops_only_failing_values() -> None:
    space = {"a": [1, 2, 3], "b": [10, 20]}
    ok = lambda c: c["a"] * c["b"] <= 40  # noqa: E731 - a small predicate
    out = fitting_space(space, {"a": 1, "b": 20}, ok)
    assert out == {"a": [1, 2], "b": [10, 20]}
    assert all(ok(c) for c in _configs(out))


def test_planner_and_fit_check_share_one_device() -> None:
    assert MACHINE.device is H200
    assert H200.smem_per_block == 227 * 1024 and H200.regs_per_thread == 255
    assert MACHINE.as_dict()["tc_flops"] == H200.tc_flops
