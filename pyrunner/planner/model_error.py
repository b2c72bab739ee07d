"""How far the cost model is from the GPU: its error over every committed side-by-side record.

``python -m pyrunner report --model-error`` (or ``python -m pyrunner.planner.model_report``) prints the
figures; this module makes the samples.

Why this exists apart from ``planner.calibration``: a record's own ``predicted_us`` is not a model
prediction where the plan's time came from the tuning database (until ``cost.model["model_total_us"]``
was kept apart, the measurement was copied into it), so this module never reads it. Each sample is
re-predicted by the current model alone:

- the record's graph is rebuilt (a catalog workload, or the graph file of ``benchmarks/graphs`` or
  ``tests/data`` of that name) at the record's shapes and dtype and planned in every view the search
  plans it in (as written, axes merged, a reduction split, a unit axis), with no tuning database, and
  again with each switch that reprices kernel forms flipped (``REPRICING``): the search keeps one form
  per partition, the one the model prices lowest, so a plan timed when the model priced it lower is
  otherwise no longer among the candidates (with ``cost.PHASED_BLOCKS`` on, 24 of 533 samples, mostly
  ones the model had under-predicted: leaving them out flattered it);
- the candidate whose kernels carry the record's kernel names and parameters is the plan that was
  timed; each kernel is estimated at the timed config (the record's ``config``), and the plan's total is
  their sum less what co-scheduling saves (``coschedule.pairings``), as the planner totals a plan;
- the measured time is the record's ``plan_us`` (side-by-side records: ``log.tables.side_by_side``),
  or a tuning-database entry's ``time_us`` (the plan at its best config, matched by structure hash).

The figures (``planner.model_report``): median and mean relative error, uncalibrated and
leave-one-workload-out calibrated, and how often the model orders measured plans as they measured.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pyrunner.errors import UserError
from pyrunner.planner.cost import DEFAULT_MACHINE, DTYPE_BYTES, LoweringFacts, Machine, estimate, structure_class
from pyrunner.target.device import Device

GRAPH_DIRS = ("benchmarks/graphs", "tests/data")
"""Folders whose graph files the timed records name (``gpu_run.py --graph``)."""
RESULTS_DIR = Path("benchmarks/results")


def tuning_file(device: Device = DEFAULT_MACHINE.device) -> Path:
    """The committed tuning database of ``device`` (``benchmarks/tuning/<device>.json``, ``target.tuning``'s
    name for it), which the report reads by default: the default device decides it, no file name here."""
    from pyrunner.target.tuning import TUNING_DIR, tuning_path

    return tuning_path(device.name, TUNING_DIR)


@dataclass(frozen=True)
class Sample:
    """One timed plan and what the model says of it."""

    source: str
    """The log file (or ``tuning``) the measurement comes from."""
    workload: str
    dtype: str
    shapes: tuple[tuple[str, int], ...]
    predicted_us: float
    measured_us: float
    kernels: tuple[tuple[str, float], ...]
    """Per kernel: its structure class and predicted time (for calibration)."""

    @property
    def error(self) -> float:
        return abs(self.predicted_us - self.measured_us) / self.measured_us

    @property
    def dominant(self) -> str:
        """The structure class of the plan's longest predicted kernel."""
        return max(self.kernels, key=lambda k: k[1])[0]


class Graphs:
    """Graphs by workload name: the catalog's, then the graph files of ``GRAPH_DIRS``."""

    def __init__(self, root: Path = Path(".")) -> None:
        from pyrunner.ir.graph_json import load_graph_file

        self.files: dict[str, Path] = {}
        for folder in GRAPH_DIRS:
            for path in sorted((root / folder).glob("*.json")):
                try:
                    g = load_graph_file(path)
                except Exception:  # noqa: BLE001 - not a graph file (plans, fixtures): not a record's graph
                    continue
                self.files.setdefault(g.name, path)
        self._load = load_graph_file
        self._planned: dict[tuple, list] = {}

    def candidates(self, workload: str, shapes: tuple[tuple[str, int], ...], dtype: str, m: Machine) -> list:
        """(planner, candidate) pairs of the case in every view (``views``), planned once per case."""
        key = (workload, shapes, dtype, id(m))
        if key not in self._planned:
            graph = self.get(workload, dict(shapes))
            try:
                self._planned[key] = [] if graph is None else list(every_view(graph, dtype, m))
            except Exception:  # noqa: BLE001 - a graph the current planner refuses: nothing to predict
                self._planned[key] = []
        return self._planned[key]

    def get(self, workload: str, shapes: dict[str, int]):
        """The graph called ``workload`` at ``shapes``, or None when no catalog entry or file has it."""
        from pyrunner.ir import catalog

        try:
            if workload in catalog.CATALOG:
                return catalog.get(workload, shapes)
            if workload in self.files:
                return self._load(self.files[workload]).with_sizes(shapes)
        except Exception:  # noqa: BLE001 - shapes this graph cannot take: the record is skipped
            return None
        return None


REPRICING = ("cost.PHASED_BLOCKS",)
"""Planner switches that change which kernel form the search keeps for a partition, by pricing the forms
differently, not which forms exist (``pyrunner.switches``)."""


def every_view(graph, dtype: str, machine: Machine) -> Iterator[tuple[object, object]]:
    """``views``, then ``views`` again with each ``REPRICING`` switch flipped: candidates to find the timed
    plan among. Each is predicted afterwards by the model as set (``predict`` reads it at call time)."""
    from pyrunner.switches import get, setting

    yield from views(graph, dtype, machine)
    for key in REPRICING:
        with setting(key, not get(key)):
            flipped = list(views(graph, dtype, machine))
        yield from flipped


def views(graph, dtype: str, machine: Machine) -> Iterator[tuple[object, object]]:
    """(planner, candidate) of every view the search plans ``graph`` in, best first per view (as
    ``search.search`` builds them; the tuning database plays no part)."""
    from pyrunner.ir.merge_axes import merge_all
    from pyrunner.ir.unit_axes import add_unit, unit_candidate
    from pyrunner.planner.aliases import distinct_outputs
    from pyrunner.planner.search import SPLIT_WORK, Budget, Planner, split_candidates

    graph, _ = distinct_outputs(graph)
    planners = [Planner(graph, dtype, machine)]
    merged, merges = merge_all(graph)
    if merges:
        planners.append(Planner(merged, dtype, machine, source=graph, merges=tuple(merges)))
    for sp in split_candidates(merged, machine):
        planners.append(Planner(merged, dtype, machine, source=graph, merges=tuple(merges), split=sp))
    unit = unit_candidate(graph)
    if unit is not None:
        widened, wmerges = merge_all(add_unit(graph, unit))
        planners.append(Planner(widened, dtype, machine, source=graph, merges=tuple(wmerges), units=(unit,)))
    for p in planners:
        budget = Budget(SPLIT_WORK) if p.split is not None else None
        for c in p.candidates(budget=budget):
            yield p, c
        if p is planners[0]:
            for c in p.candidates(naive=True):
                yield p, c


def kernel_names(c) -> list[str]:
    return [f"k{i}_{kc.low.writes[0]}" for i, kc in enumerate(c.kernels)]


def matches(c, config: dict[str, dict[str, int]]) -> bool:
    """Whether candidate ``c`` is the plan a record timed under ``config``: its kernel names, each
    kernel's parameters holding every timed one."""
    names = kernel_names(c)
    return names == list(config) and all(set(config[n]) <= set(kc.kernel.params)
                                         for n, kc in zip(names, c.kernels, strict=True))


def predict(planner, c, config: dict[str, dict[str, int]], m: Machine) -> tuple[float, tuple] | None:
    """The model's time of candidate ``c`` at the timed ``config`` and its per-kernel (class, time)."""
    from pyrunner.planner.coschedule import pairings
    from pyrunner.planner.search import KernelChoice

    tb = {t.name: math.prod(t.shape) * DTYPE_BYTES[t.dtype] for t in c.tensors}
    chosen = []
    for name, kc in zip(kernel_names(c), c.kernels, strict=True):
        full = {**kc.est.config, **config[name]}
        try:
            fp = kc.fit.footprint(full)
            est = estimate(kc.low, full, planner.sizes, tb, fp.smem_bytes, m, LoweringFacts.of(kc.low, tb, m),
                           fp.regs_per_thread)
        except (KeyError, ZeroDivisionError, ValueError):
            return None
        chosen.append(KernelChoice(kc.low, kc.kernel, est, planner.sizes, m, kc._fit))
    total = sum(k.est.time_us for k in chosen)
    tensors = {t.name: t for t in c.tensors}
    total -= sum(p.saved_us for p in pairings(chosen, planner.sizes, tensors, m))
    return total, tuple((structure_class(k.low), k.est.time_us) for k in chosen)


@dataclass(frozen=True)
class Timed:
    """One measurement to re-predict: a record's plan time or a tuning entry's."""

    source: str
    workload: str
    dtype: str
    shapes: dict[str, int]
    config: dict[str, dict[str, int]]
    measured_us: float
    structure: str = ""
    """The tuning key's structure hash (tuning entries), matched against each candidate's plan."""


def side_by_side_records(results_dir: Path = RESULTS_DIR, newest_only: bool = False,
                         device: Device = DEFAULT_MACHINE.device,
                         backend: str = DEFAULT_MACHINE.terms.backend) -> list[Timed]:
    """Every side-by-side record of the folder (``log.tables.side_by_side``) measured on ``device`` with
    ``backend`` (``log.results.record_backend``: the Ampere path timed on a Hopper GPU is no sample of the Hopper
    model); with ``newest_only``, the newest per case (the rows of ``benchmarks/RESULTS.md``)."""
    from pyrunner.log.results import read_log_counted, record_backend
    from pyrunner.log.tables import newest_rows, side_by_side
    from pyrunner.target.device import DEFAULT_GPU_NAME
    from pyrunner.target.tuning import device_key

    if newest_only:
        rows = [(r.file, r.record) for r in newest_rows(results_dir, DEFAULT_GPU_NAME)]
    else:
        rows = [(p.name, r) for p in sorted(results_dir.glob("*.jsonl")) for r in read_log_counted(p)[0]
                if side_by_side(r)]
    return [Timed(f, r.workload, r.dtype, dict(r.shapes), r.config, float(r.plan_us)) for f, r in rows
            if r.config and r.plan_us and device_key(r.device) == device_key(device.name)
            and record_backend(r.extra) == backend]


def tuning_entries(path: Path | None = None, generation: int | None = None,
                   backend: str = DEFAULT_MACHINE.terms.backend) -> list[Timed]:
    """Every entry of a tuning database file (default: ``tuning_file()``) of the current renderer generation
    (``generation``) measured with ``backend`` (``target.tuning.tuning_key``: a key names a backend other than
    Hopper's)."""
    import json

    from pyrunner.target.layout import GENERATION
    from pyrunner.target.tuning import HOPPER_BACKEND

    gen = GENERATION if generation is None else generation
    path = tuning_file() if path is None else path
    try:
        entries = json.loads(path.read_text()).get("entries", {})
    except (OSError, ValueError) as e:
        raise UserError(f"tuning database {path}: {e}") from None
    out = []
    for key, e in sorted(entries.items()):
        parts = key.split("|")
        if len(parts) not in (6, 7) or parts[5] != f"renderer-{gen}":
            continue
        if (parts[6] if len(parts) == 7 else HOPPER_BACKEND) != backend:
            continue
        shapes = dict((a, int(n)) for a, n in (kv.split("=") for kv in parts[1].split(",") if kv))
        out.append(Timed("tuning", e["workload"], parts[2], shapes, e["config"], float(e["time_us"]), parts[0]))
    return out


def samples(timed: Iterable[Timed], m: Machine = DEFAULT_MACHINE, graphs: Graphs | None = None) -> list[Sample]:
    """The model's prediction of every measurement it can re-plan (the others are left out)."""
    graphs = graphs or Graphs()
    by_case: dict[tuple, list[Timed]] = {}
    for t in timed:
        by_case.setdefault((t.workload, tuple(sorted(t.shapes.items())), t.dtype), []).append(t)
    out: list[Sample] = []
    for (workload, shapes, dtype), group in by_case.items():
        cands = graphs.candidates(workload, shapes, dtype, m)
        for t in group:
            got = _match(cands, t, m)
            if got is not None:
                out.append(Sample(t.source, workload, dtype, shapes, got[0], t.measured_us, got[1]))
    return out


def _match(cands: list, t: Timed, m: Machine) -> tuple[float, tuple] | None:
    for planner, c in cands:
        if not matches(c, t.config):
            continue
        if t.structure and not _same_structure(planner, c, t.structure):
            continue
        return predict(planner, c, t.config, m)
    return None


def _same_structure(planner, c, structure: str) -> bool:
    from pyrunner.planner.search import to_plan
    from pyrunner.target.tuning import structure_hash

    try:
        return structure_hash(to_plan(planner, c, False)) == structure
    except Exception:  # noqa: BLE001 - a candidate that does not make a plan is not the one timed
        return False
