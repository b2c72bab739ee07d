"""The plan a user gets: the search, the lowering gate and the fallbacks, in one place.

Every entry point that hands out a plan (the ``superopt`` command, the GPU sweep and the benchmarks;
the frontend's ``search(graph, dtype)[0]`` is its one call site left) calls ``best_plan``, so the same
graph, dtype, backend and tuning database give the same plan whichever door it came through. The steps:

1. ``planner.search`` ranks ``top`` plans plus ``spares`` next-ranked ones (the spares are only
   asked for when the lowering gate is on);
2. the lowering gate (``backend.tilelang.buildable``) lowers them in rank order and keeps the first
   ``top`` that TileLang builds, skipping the others with a note saying why;
3. when none builds, the naive plan (one kernel per op), if that builds.

What happened on the way is reported through one channel, ``notes`` (a callback taking ``Note``);
nothing here prints. Errors are ``UserError`` (one line for the user).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pyrunner.errors import UserError
from pyrunner.ir.graph import Graph
from pyrunner.plan.schema import Plan

if TYPE_CHECKING:
    from pyrunner.backend.tilelang.backend import TileLangBackend
    from pyrunner.target.tuning import TuningDB

LOWER_CHECK_SPARES = 3
"""Next-ranked plans tried when TileLang cannot lower the best one (then the naive plan)."""

NOTE_KINDS = ("checking", "skipped", "naive-fallback", "fewer", "no-fused")
"""``checking``: the lowering gate starts (``count`` plans); ``skipped``: a ranked plan does not build;
``naive-fallback``: no ranked plan builds, the naive one is handed out; ``fewer``: fewer distinct plans
than ``top`` exist (``count`` of them); ``no-fused``: the plan handed out is the naive plan."""


@dataclass(frozen=True)
class Note:
    """Something a caller may want to tell its user: its kind (one of ``NOTE_KINDS``), a line of text,
    and the number it is about (plans checked or found), where it has one."""

    kind: str
    text: str
    count: int = 0


NoteSink = Callable[[Note], None]


def best_plan(graph: Graph, dtype: str, *, backend: TileLangBackend | None = None, tuning: TuningDB | None = None,
              top: int = 1, naive: bool = False, calibration: Path | None = None, lower_check: bool = True,
              spares: int = LOWER_CHECK_SPARES, budget=None, notes: NoteSink | None = None) -> list[Plan]:
    """The ``top`` best plans of ``graph`` at ``dtype`` that the backend builds, best first (at least one).

    ``backend``: the ``backend.tilelang.backend.TileLangBackend`` planned for: its device is the search's
    (fit limits, cost model), its lowering check gates the plans (default: ``backend_for()``);
    ``tuning``: the ``TuningDB`` whose measured times and configs take precedence over the cost model
    (``planner.search``'s ``tuning``); ``naive``: one kernel per op, no rewrites; ``calibration``: a
    results log to calibrate the cost model from; ``lower_check=False``: hand out the ranked plans
    without lowering them; ``budget``: the search's work budget (``planner.search.Budget``);
    ``notes``: called with each ``Note``. Raises ``UserError`` when no plan exists or none builds.
    """
    from pyrunner.backend.tilelang.backend import backend_for
    from pyrunner.planner import search

    if top < 1:
        raise UserError(f"best_plan: top must be at least 1, got {top}")
    say = notes or _ignore
    backend = backend or backend_for()
    plans = search(graph, dtype, top=top + (spares if lower_check else 0), naive=naive, calibration=calibration,
                   budget=budget, tuning=tuning, device=backend.device)
    if lower_check:
        plans = _buildable(graph, dtype, plans, top, naive, calibration, tuning, backend, say)
    plans = plans[:top]
    if not plans:
        raise UserError(f"the planner found no plan for graph {graph.name!r}")
    if len(plans) < top:
        say(Note("fewer", f"top {top} asked for, but only {len(plans)} distinct plan(s) exist "
                          f"for graph {graph.name!r}", len(plans)))
    if not naive and plans[0].provenance.planner.endswith("-naive"):
        say(Note("no-fused", "the search found no fused plan; this is the naive plan (every op its own kernel)"))
    return plans


def _ignore(note: Note) -> None:
    """The default note sink: a caller that asks for no notes gets none."""


def _buildable(graph: Graph, dtype: str, plans: list[Plan], top: int, naive: bool, calibration: Path | None,
               tuning: TuningDB | None, backend: TileLangBackend, say: NoteSink) -> list[Plan]:
    """The plans the backend can lower, in rank order; the naive plan when none can; a note for each skip."""
    from pyrunner.backend.tilelang.buildable import buildable
    from pyrunner.planner import search

    say(Note("checking", f"checking that TileLang builds the ranked plans ({len(plans)})", len(plans)))
    good, skipped = buildable(plans, top, backend.lowering_problem)
    for skip in skipped:
        say(Note("skipped", str(skip)))
    first_why = skipped[0].why if skipped else None
    if good or naive:
        if not good:
            raise UserError(f"TileLang cannot build the naive plan of graph {graph.name!r}: {first_why}")
        return good
    naive_skipped = next((s for s in skipped if s.plan.provenance.planner.endswith("-naive")), None)
    if naive_skipped is not None:  # the search fell back to the naive plan already, and it does not build
        raise UserError(f"TileLang cannot build any plan of graph {graph.name!r}, the naive plan included: "
                        f"{naive_skipped.why}")
    (fallback,) = search(graph, dtype, top=1, naive=True, calibration=calibration, tuning=tuning,
                         device=backend.device)
    why = backend.lowering_problem(fallback)
    if why is not None:
        raise UserError(f"TileLang cannot build any plan of graph {graph.name!r}, the naive plan included: {why}")
    say(Note("naive-fallback", "no ranked plan builds with TileLang; this is the naive plan (every op its own kernel)"))
    return [fallback]

