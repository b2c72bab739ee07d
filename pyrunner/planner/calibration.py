"""Calibrating the cost model per kernel structure from measured results, and how well it predicts.

Each GPU record of a catalog workload is re-predicted by the current model: the workload is
re-planned at the record's shapes and dtype, the candidate with the record's kernels is taken,
and each kernel is estimated at the config that was timed. Measured kernel times (or the plan
time for a one-kernel plan) over predicted ones give a scale per *structure class* (GEMMs,
loop, reductions left in the loop; ``cost.structure_class``), never one global factor: a
fused GEMM+statistics kernel and a plain GEMM err differently.

``prediction_report`` (``python -m pyrunner.planner.predict LOG.jsonl ...`` prints it) gives the
median absolute percentage error before and after
calibration; after is leave-one-out (each record predicted with scales fitted on the others).
The planner calibrates only on records of the current renderer generation; the report reads all.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from pyrunner.planner.cost import DEFAULT_MACHINE, Machine, estimate, structure_class


@dataclass(frozen=True)
class Sample:
    """One measured kernel and what the model says of it."""

    source: str
    workload: str
    dtype: str
    kernel: str
    cls: str
    predicted_us: float
    measured_us: float


def _records(logs) -> list[tuple[str, dict]]:
    out = []
    for log in [logs] if isinstance(logs, (str, Path)) else list(logs or []):
        path = Path(log)
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                out.append((path.name, rec))
    return out


def samples(logs, planner_factory, m: Machine = DEFAULT_MACHINE, current_only: bool = False) -> list[Sample]:
    """Re-predicted kernels of every ok GPU record of a catalog workload in ``logs``.

    ``current_only``: only records of kernels from the current renderer generation
    (``target.layout.GENERATION``, stamped into each record's extra): older code measured differently.
    """
    from pyrunner.ir import catalog
    from pyrunner.target.layout import GENERATION

    Planner = planner_factory  # noqa: N806 - search.Planner, passed in: search imports this module
    out: list[Sample] = []
    planners: dict[tuple, list] = {}
    for source, rec in _records(logs):
        cfg, measured = rec.get("config"), rec.get("plan_us")
        if rec.get("status") != "ok" or not cfg or not measured or rec.get("device", "cpu") == "cpu":
            continue
        if current_only and (rec.get("extra") or {}).get("renderer") != GENERATION:
            continue
        if not same_target(rec, m):
            continue
        try:
            graph = catalog.get(rec["workload"], rec.get("shapes") or {})
        except Exception:  # noqa: BLE001 - not a catalog workload: cannot re-plan it
            continue
        key = (rec["workload"], tuple(sorted((rec.get("shapes") or {}).items())), rec["dtype"])
        if key not in planners:
            planner = Planner(graph, rec["dtype"], m)
            planners[key] = [(planner, c) for c in planner.candidates()]
        match = None
        for planner, c in planners[key]:
            names = [f"k{i}_{kc.low.writes[0]}" for i, kc in enumerate(c.kernels)]
            if names == list(cfg) and all(set(cfg[n]) <= set(kc.kernel.params)
                                          for n, kc in zip(names, c.kernels, strict=True)):
                match = (planner, c, names)
                break
        if match is None:
            continue
        planner, c, names = match
        ktimes = rec.get("kernel_times_us") or {}
        one = len(names) == 1
        for name, kc in zip(names, c.kernels, strict=True):
            meas = ktimes.get(name) if not one else measured
            if not meas:
                continue
            tb = _tensor_bytes(planner, c)
            try:
                full = {**kc.est.config, **cfg[name]}
                fp = kc.fit.footprint(full)
                est = estimate(kc.low, full, planner.sizes, tb, fp.smem_bytes, m, regs=fp.regs_per_thread)
            except (KeyError, ZeroDivisionError):
                continue
            out.append(Sample(source, rec["workload"], rec["dtype"], name, structure_class(kc.low), est.time_us,
                              float(meas)))
    return out


def same_target(rec: dict, m: Machine) -> bool:
    """Whether a record was measured on ``m``'s device with ``m``'s backend (a record without a backend
    field predates the second backend: TileLang's Hopper code; ``log.results.record_backend`` reads every
    form writers give it), so a calibration is per backend and device."""
    from pyrunner.log.results import record_backend
    from pyrunner.target.tuning import device_key

    backend = record_backend(rec.get("extra") or {})
    return device_key(str(rec.get("device", ""))) == device_key(m.device.name) and backend == m.terms.backend


def _tensor_bytes(planner, c) -> dict[str, int]:
    from pyrunner.planner.cost import DTYPE_BYTES

    return {t.name: math.prod(t.shape) * DTYPE_BYTES[t.dtype] for t in c.tensors}


def fit_scales(data: list[Sample]) -> dict[str, float]:
    """Structure class -> geometric mean of measured / predicted."""
    by: dict[str, list[float]] = {}
    for s in data:
        by.setdefault(s.cls, []).append(math.log(s.measured_us / s.predicted_us))
    return {c: round(math.exp(sum(v) / len(v)), 4) for c, v in sorted(by.items())}


def calibrate(logs, planner_factory, m: Machine = DEFAULT_MACHINE) -> Machine:
    """The model with a time scale per structure class fitted on ``logs`` (unchanged without data).

    ``planner_factory``: ``search.Planner`` (it re-plans each record's workload).
    """
    if logs is None:
        return m
    scales = fit_scales(samples(logs, planner_factory, m, current_only=True))
    if not scales:
        return m
    return replace(m, structure_scale=tuple(sorted(scales.items())))


def _mape(pairs: list[tuple[float, float]]) -> float | None:
    if not pairs:
        return None
    return 100.0 * statistics.median(abs(p - q) / q for p, q in pairs)


def prediction_report(logs, planner_factory, m: Machine = DEFAULT_MACHINE) -> dict:
    """Median absolute percentage error of predicted kernel times, before and after calibration.

    ``logged``: the prediction each record carries (the model of its day) against its plan time;
    ``before``: the current model, uncalibrated; ``after``: the current model with per-structure
    scales, leave-one-out (each sample scaled by a fit on the other samples of its class, or
    unscaled when it is alone in its class).
    """
    data = samples(logs, planner_factory, m)
    logged = [(r["predicted_us"], r["plan_us"]) for _, r in _records(logs)
              if r.get("status") == "ok" and r.get("predicted_us") and r.get("plan_us")]
    after = []
    for i, s in enumerate(data):
        scales = fit_scales([x for j, x in enumerate(data) if j != i])
        after.append((s.predicted_us * scales.get(s.cls, 1.0), s.measured_us))
    return {
        "samples": len(data),
        "logged_mape_pct": _mape(logged),
        "before_mape_pct": _mape([(s.predicted_us, s.measured_us) for s in data]),
        "after_mape_pct": _mape(after),
        "scales": fit_scales(data),
    }
