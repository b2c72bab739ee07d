"""The planner's switches: module-level booleans a GPU sweep decides (docs/gpu.md, "Deciding the planner switches").

One registry, read by the benchmarks that flip them (``benchmarks/switches.py``) and by the plan store, whose
entries hold for one setting of them (``frontend.plan_store``). Modules are named, not imported, so this file
sits below every layer it names.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager

SWITCHES = {
    "fit.ASYNC_PARTIAL_TILES": ("pyrunner.target.fit", "ASYNC_PARTIAL_TILES"),
    "cost.PHASED_BLOCKS": ("pyrunner.planner.cost", "PHASED_BLOCKS"),
    "emit.FOLD_EXP_SHIFT": ("pyrunner.backend.tilelang.emit", "FOLD_EXP_SHIFT"),
    "search.OPERAND_PASS_WRITTEN": ("pyrunner.planner.search", "OPERAND_PASS_WRITTEN"),
    "lower.SHARED_ACCUMULATOR": ("pyrunner.planner.lower", "SHARED_ACCUMULATOR"),
    "merge.SHARED_INTERMEDIATES": ("pyrunner.planner.merge", "SHARED_INTERMEDIATES"),
    "partition.TAIL_CUTS": ("pyrunner.frontend.partition", "TAIL_CUTS"),
}
"""Switch name -> (module, attribute)."""


def get(key: str) -> bool:
    """The switch ``key`` as set in this process."""
    module, attr = SWITCHES[key]
    return bool(getattr(importlib.import_module(module), attr))


def put(key: str, value: object) -> None:
    """Set the switch ``key`` for the rest of the process (``benchmarks/switches.py`` also empties caches)."""
    module, attr = SWITCHES[key]
    setattr(importlib.import_module(module), attr, value)


@contextmanager
def setting(key: str, value: bool) -> Iterator[None]:
    """The switch ``key`` at ``value`` inside the block, as it was after it."""
    before = get(key)
    put(key, value)
    try:
        yield
    finally:
        put(key, before)


def state() -> str:
    """Every switch as set now, ``fit.ASYNC_PARTIAL_TILES=1,cost.PHASED_BLOCKS=1,...``: what a plan depends on
    beyond the source and the tuning database."""
    return ",".join(f"{k}={int(get(k))}" for k in SWITCHES)
