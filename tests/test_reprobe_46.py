"""Issue 46's re-probe, the library calls it listed as tracebacks that no other test drove through the
public API: ``load(plan, config=...)`` with a config that is not a mapping (a list, a ``"k=v"`` string)
or holds a 5,000-digit integer or 100,000-deep nesting. Each is one ``PlanError`` of one short line.
(tests/test_hostile_46.py drives ``resolve_config`` with the same values; ``load`` reached the runner's
``resolve`` first, which called ``.values()`` on the list and raised AttributeError.)
"""

from __future__ import annotations

import pytest

from pyrunner.errors import PlanError
from pyrunner.frontend.load import load
from pyrunner.ir import catalog
from pyrunner.planner import search
from pyrunner.planner.search import Budget


@pytest.fixture(scope="module")
def plan():
    return search(catalog.get("Matmul", {"m": 64, "d": 64, "n": 64}), "fp16", tuning=False, budget=Budget(4000))[0]


def _deep() -> list:
    nest: list = []
    inner = nest
    for _ in range(100_000):
        inner.append([])
        inner = inner[0]
    return nest


@pytest.mark.parametrize("kind", ["list", "string", "digits", "deep", "kernel digits", "kernel deep"])
def test_load_with_a_malformed_config_is_one_plan_error(plan, kind: str) -> None:
    k = plan.kernels[0].name
    config = {"list": lambda: [1, 2], "string": lambda: "block_m=64",
              "digits": lambda: {"block_m": 10 ** 5000}, "deep": lambda: {"block_m": _deep()},
              "kernel digits": lambda: {k: {"block_m": 10 ** 5000}},
              "kernel deep": lambda: {k: {"block_m": _deep()}}}[kind]()
    with pytest.raises(PlanError) as e:
        load(plan, config=config)
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 300, msg
