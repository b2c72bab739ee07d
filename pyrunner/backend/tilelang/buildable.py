"""Can TileLang build a plan? The gate ``superopt`` passes a plan through before handing it out.

The planner models the device (``target.fit``), not TileLang's layout inference or the hazards of
its lowering, so a plan can be right and still not build (a fragment layout TileLang cannot find,
a hazard ``lowered.py`` refuses). Lowering to CUDA needs no GPU and takes seconds, so ``superopt``
lowers its best plan and, when that fails, hands out the next-ranked one (then the naive plan),
saying which and why: a user's graph gets a plan that builds whenever one of those does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyrunner.plan.schema import Plan

if TYPE_CHECKING:
    from pyrunner.backend.tilelang.compile_target import CompileTarget


def lowering_problem(plan: Plan, target: CompileTarget | None = None) -> str | None:
    """One line saying why TileLang cannot lower ``plan`` for ``target`` (default: ``targets.default_target``),
    or None (also without TileLang)."""
    from pyrunner.backend.tilelang.limits import size_problem

    too_big = size_problem(plan)
    if too_big is not None:  # refused before TileLang spends minutes on it
        return too_big
    try:
        import tilelang  # noqa: F401
    except ImportError:  # nothing to check against here; the GPU run will say
        return None
    from pyrunner.backend.tilelang.compile import lower_to_cuda
    from pyrunner.backend.tilelang.diagnose import one_line
    from pyrunner.backend.tilelang.lowered import (
        oversized_fragments,
        releases_in_flight,
        tma_races,
        warp_specialised_thread_reads,
    )

    try:
        sources = lower_to_cuda(plan, target=target)
    except Exception as e:  # noqa: BLE001 - any TileLang failure is a reason, reported in one line
        return one_line(e)
    for name, src in sources.items():
        races = tma_races(src)
        if races:
            return f"kernel {name!r}: {races[0]}"
        reads = warp_specialised_thread_reads(src)
        if reads:
            return f"kernel {name!r}: warp-specialised loop reads pipelined tile(s) {reads} with thread code"
        early = releases_in_flight(src)
        if early:
            return f"kernel {name!r}: a ring slot is released while a wgmma may still read it ({early[0]})"
        big = oversized_fragments(src)
        if big:
            return f"kernel {name!r}: {big}"
    return None


@dataclass(frozen=True)
class Skipped:
    """A ranked plan that TileLang cannot lower: its rank (1-based), the plan and why."""

    rank: int
    plan: Plan
    why: str

    def __str__(self) -> str:
        return f"plan {self.rank} ({self.plan.provenance.plan_hash}) does not build with TileLang, skipped: {self.why}"


def buildable(plans: list[Plan], top: int = 1,
              check: Callable[[Plan], str | None] | None = None) -> tuple[list[Plan], list[Skipped]]:
    """Up to ``top`` plans TileLang can lower, in rank order, and the plans skipped on the way.

    What ``pipeline.best_plan`` hands out, and so what ``superopt`` and the GPU sweep run: a user gets
    the best plan that builds, not the best-ranked one. ``check``: the lowering check (default
    ``lowering_problem``; a backend passes its own)."""
    check = check or lowering_problem
    good: list[Plan] = []
    skipped: list[Skipped] = []
    for i, p in enumerate(plans):
        why = check(p)
        if why is None:
            good.append(p)
            if len(good) >= top:
                break
        else:
            skipped.append(Skipped(i + 1, p, why))
    return good, skipped
