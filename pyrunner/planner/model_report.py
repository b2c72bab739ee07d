"""The cost model's error figures over the committed records: ``python -m pyrunner report --model-error``.

Samples come from ``planner.model_error`` (each timed plan re-predicted by the model alone). Figures:
median and mean relative error |predicted - measured| / measured, uncalibrated, and leave-one-workload-
out calibrated: every plan of a workload predicted with per-structure scales (``cost.structure_class``,
``fit_scales``) fitted on the other workloads' plans only (a plan's time beyond its launches attributed
to the class of its longest kernel); and, over the tuning database, how often the model orders the
plans measured for one graph as they measured (``ranking``).
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from pyrunner.errors import UserError
from pyrunner.planner.cost import DEFAULT_MACHINE, Machine
from pyrunner.planner.model_error import (
    RESULTS_DIR,
    Graphs,
    Sample,
    samples,
    side_by_side_records,
    tuning_entries,
)

CALIBRATION_WORKLOADS = 3
"""Workloads a structure class needs among the fitting plans to get a scale (fewer: it stays at 1)."""
CALIBRATION_SHRINK = 3.0
"""Pseudo-plans at ratio 1 added to each class's fit: a class seen a few times is scaled a little."""


def _body(s: Sample, launch_us: float) -> tuple[float, float]:
    """(predicted, measured) time of a plan beyond its kernels' launches: what a scale can correct."""
    n = len(s.kernels)
    return s.predicted_us - launch_us * n, s.measured_us - launch_us * n


def fit_scales(data: list[Sample], launch_us: float) -> dict[str, float]:
    """Structure class -> measured/predicted beyond launches: the median log ratio of the plans whose
    longest kernel is of that class, shrunk toward 1 (``CALIBRATION_SHRINK``), for classes seen in
    ``CALIBRATION_WORKLOADS`` workloads or more. Medians, as one plan the model misses elevenfold
    (a kernel with a bug of its own) must not move a class."""
    by: dict[str, list[float]] = {}
    seen: dict[str, set[str]] = {}
    for s in data:
        body, measured = _body(s, launch_us)
        if body <= 0.05 * s.predicted_us or measured <= 0:
            continue  # launch-bound: nothing left to scale
        by.setdefault(s.dominant, []).append(math.log(measured / body))
        seen.setdefault(s.dominant, set()).add(s.workload)
    return {c: math.exp(statistics.median(v) * len(v) / (len(v) + CALIBRATION_SHRINK))
            for c, v in by.items() if len(seen[c]) >= CALIBRATION_WORKLOADS}


def calibrated(s: Sample, scales: dict[str, float], launch_us: float) -> float:
    """``s``'s plan time with its time beyond launches scaled by its class's calibration (1 where none)."""
    body, _ = _body(s, launch_us)
    return s.predicted_us + (scales.get(s.dominant, 1.0) - 1.0) * body


def leave_one_workload_out(data: list[Sample], launch_us: float) -> list[float]:
    """Relative error of each sample predicted with scales fitted on the other workloads only."""
    errors = []
    for w in sorted({s.workload for s in data}):
        scales = fit_scales([s for s in data if s.workload != w], launch_us)
        errors += [abs(calibrated(s, scales, launch_us) - s.measured_us) / s.measured_us
                   for s in data if s.workload == w]
    return errors


@dataclass(frozen=True)
class Figures:
    samples: int
    median_pct: float
    mean_pct: float
    over_pct: float
    """Share of samples the model over-predicts (predicts slower than measured)."""
    lowo_median_pct: float
    lowo_mean_pct: float


def figures(data: list[Sample], m: Machine = DEFAULT_MACHINE) -> Figures | None:
    """The error figures of ``data`` (samples predicted with ``m``)."""
    if not data:
        return None
    errs = [s.error for s in data]
    lowo = leave_one_workload_out(data, m.launch_us)
    return Figures(len(data), 100 * statistics.median(errs), 100 * statistics.fmean(errs),
                   100 * sum(s.predicted_us > s.measured_us for s in data) / len(data),
                   100 * statistics.median(lowo), 100 * statistics.fmean(lowo))


@dataclass(frozen=True)
class Ranking:
    cases: int
    """Cases (workload, shapes, dtype) with two or more plans measured apart by more than ``TIE``."""
    first: int
    """Of those, cases whose measured-fastest plan the model also predicts fastest."""
    pairs: int
    concordant: int
    """Pairs of plans of one case (apart by more than ``TIE``) the model orders as they measured."""


TIE = 0.03
"""Plans measured within 3% of each other are a tie (rounds vary by about that much)."""


def ranking(data: list[Sample]) -> Ranking:
    """How often the model ranks the plans of one case as they measured (the tuning database's entries
    of one graph at one shape: the plans the GPU timed for it, each at its best config)."""
    by: dict[tuple, dict[float, Sample]] = {}
    for s in data:
        by.setdefault((s.workload, s.shapes, s.dtype), {})[round(s.measured_us, 3)] = s
    cases = first = pairs = concordant = 0
    for group in by.values():
        plans = sorted(group.values(), key=lambda s: s.measured_us)
        if len(plans) < 2 or plans[1].measured_us < plans[0].measured_us * (1 + TIE):
            continue
        cases += 1
        first += min(plans, key=lambda s: s.predicted_us) is plans[0]
        for i, a in enumerate(plans):
            for b in plans[i + 1:]:
                if b.measured_us >= a.measured_us * (1 + TIE):
                    pairs += 1
                    concordant += a.predicted_us < b.predicted_us
    return Ranking(cases, first, pairs, concordant)


def report(sets: dict[str, list[Sample]], worst: int = 0, m: Machine = DEFAULT_MACHINE) -> str:
    """A markdown table of each set's figures, then the ``worst`` samples of the set "all"."""
    lines = ["| samples | n | median error | mean error | over-predicted | LOWO calibrated median | LOWO mean |",
             "|---|---|---|---|---|---|---|"]
    for name, data in sets.items():
        f = figures(data, m)
        if f is None:
            lines.append(f"| {name} | 0 | - | - | - | - | - |")
            continue
        lines.append(f"| {name} | {f.samples} | {f.median_pct:.1f}% | {f.mean_pct:.1f}% | {f.over_pct:.0f}% | "
                     f"{f.lowo_median_pct:.1f}% | {f.lowo_mean_pct:.1f}% |")
    tuned = sets.get("tuning database")
    if tuned:
        r = ranking(tuned)
        lines += ["", f"Ranking (tuning database): the measured-fastest plan is predicted fastest in {r.first} of "
                      f"{r.cases} graphs with plans measured apart; {r.concordant} of {r.pairs} pairs of plans "
                      f"ordered as measured."]
    if worst:
        every = sets.get("all") or [s for data in sets.values() for s in data]
        lines += ["", f"Worst {worst}:", ""]
        for s in sorted(every, key=lambda s: -s.error)[:worst]:
            shape = " ".join(f"{a}={n}" for a, n in s.shapes)
            lines.append(f"- {s.workload} {s.dtype} {shape} ({s.source}): predicted {s.predicted_us:.1f} us, "
                         f"measured {s.measured_us:.1f} ({s.dominant})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pyrunner report --model-error", description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=RESULTS_DIR, help="folder of results logs")
    ap.add_argument("--tuning", type=Path, default=None,
                    help="tuning database file (default: the committed one of the default device)")
    ap.add_argument("--worst", type=int, default=0, help="also list the N samples the model misses most")
    args = ap.parse_args(argv)
    if not args.results.is_dir():
        raise UserError(f"report --model-error: {str(args.results)!r} is not a folder of results logs")
    graphs = Graphs()
    sets = {"side-by-side records": samples(side_by_side_records(args.results), graphs=graphs),
            "newest per case (RESULTS.md rows)": samples(side_by_side_records(args.results, True), graphs=graphs),
            "tuning database": samples(tuning_entries(args.tuning), graphs=graphs)}
    sets["all"] = sets["side-by-side records"] + sets["tuning database"]
    print(report(sets, args.worst))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
