"""Measured tables generated from the committed records: ``python -m pyrunner report --tables``.

Why generated: a figure typed into a README drifts from its record, and a plan timed apart from
its baselines (an alternative, a probe) reads like a side-by-side result. Here a row exists only
for a **side-by-side record**: status ``ok`` (so verified against float64 first), a plan time,
torch.compile measured, and the plan and every baseline it reports timed in the same call (each
has its rounds in ``extra.timing.rounds_us``). Per case (workload, dtype, shapes, backend, device) the
newest such record is the row; speedups are recomputed from the times. Each row names its run and its file.
The backend is part of the case because ``gpu_run --device h200,a100`` times the Ampere path (an sm_80
build) on the same GPU: its row stands beside the Hopper row, marked with the backend's name, instead of
replacing it (``log.results.record_backend``; a record without the field is Hopper's). The device is part
of it because the lent GPU is sometimes another card than the default device (an H100): its times are not
the default card's, so such a record stands beside the default card's row, marked with its card, and never
replaces it (the caller names the default card: ``target.device.DEFAULT_GPU_NAME``).

``benchmarks/RESULTS.md`` is this module's output over ``benchmarks/results/``; a test fails when
the committed file differs from what the records generate. README's short table is the seed
section of it, verbatim.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from pyrunner.errors import UserError
from pyrunner.files import check_output_file, output_dir, write_text_atomic
from pyrunner.ir import catalog
from pyrunner.log.results import (
    PRIMARY_BASELINE,
    UNNAMED_BACKEND,
    RunRecord,
    read_log_counted,
    record_backend,
    speedups,
)

RESULTS_DIR = Path("benchmarks/results")
TABLES_FILE = "RESULTS.md"
SEEDS = catalog.SEED_WORKLOADS
"""The five seed workloads; at their catalog shapes they form README's short table."""
NAMES = {"torch_compile": "torch.compile", "max_autotune": "max-autotune", "sdpa": "SDPA", "cublas": "cuBLAS",
         "flex": "FlexAttention", "flex_attention": "FlexAttention", "eager": "eager"}
DTYPES = {"bfloat16": "bf16", "float16": "fp16"}
_RUN = re.compile(r"run(\d+[a-z]?)")


@dataclass(frozen=True)
class Row:
    """One case's newest side-by-side record and the file it came from."""

    record: RunRecord
    file: str
    reference: str = ""
    """The card README's tables are about (the default device's driver name, which the caller gives: this
    layer knows no device); rows timed on any other card are marked with its name. A record with an empty
    device name (a few of runs 36-81, all on the card the results folder's names give) is the reference's."""

    @property
    def run(self) -> str:
        """The record's own ``extra.run`` tag (a file may gather several runs), else the file name's."""
        tag = self.record.extra.get("run")
        if isinstance(tag, (int, str)) and _RUN.fullmatch(f"run{tag}"):
            return str(tag)
        m = _RUN.search(self.file)
        return m.group(1) if m else "-"

    @property
    def backend(self) -> str:
        """The backend that made and rendered the plan (``log.results.record_backend``)."""
        return record_backend(self.record.extra)

    @property
    def device(self) -> str:
        """The GPU the record was timed on, as the driver named it."""
        return " ".join(self.record.device.split()) or self.reference

    @property
    def group(self) -> tuple[str, str]:
        """(backend, device): rows of one group compare with each other; other groups' never average in."""
        return self.backend, self.device

    @property
    def key(self) -> tuple:
        r = self.record
        return r.workload, r.dtype, tuple(sorted(r.shapes.items())), self.backend, self.device


def side_by_side(r: RunRecord) -> bool:
    """True when the record timed the plan and each of its baselines in the same call."""
    measured = [k for k, v in r.baselines_us.items() if v is not None and v > 0 and math.isfinite(v)]
    rounds = (r.extra.get("timing") or {}).get("rounds_us") or {}
    if not isinstance(rounds, dict):
        return False
    return (r.status == "ok" and r.plan_us is not None and r.plan_us > 0 and PRIMARY_BASELINE in measured
            and "plan" in rounds and all(k in rounds for k in measured))


def newest_rows(results_dir: Path, reference: str) -> list[Row]:
    """The newest side-by-side record of each case over every ``*.jsonl`` log in the folder.

    Lines that are not run records (sweep cases, A/B logs) are skipped; ties in timestamp go to the
    later file in name order, then the later line.
    """
    if not results_dir.is_dir():
        raise UserError(f"report --tables: {str(results_dir)!r} is not a folder of results logs")
    best: dict[tuple, Row] = {}
    for path in sorted(results_dir.glob("*.jsonl")):
        records, _ = read_log_counted(path)
        for r in records:
            if not side_by_side(r):
                continue
            per, name, vs = speedups(r.plan_us, r.baselines_us)
            row = Row(r.model_copy(update={"speedups": per, "best_baseline": name, "speedup_vs_best": vs}), path.name,
                      reference)
            old = best.get(row.key)
            if old is None or r.timestamp >= old.record.timestamp:
                best[row.key] = row
    return list(best.values())


def _cell(x: object) -> str:
    text = " ".join("".join(c if c.isprintable() else " " for c in str(x)).split())
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


HEAD = ["workload", "dtype", "shape", "plan (us)", "torch.compile", "best baseline", "vs torch.compile",
        "vs best", "run (file)"]


def _default(rows: list[Row]) -> tuple[str, str]:
    """The default group: the unnamed (Hopper) backend on the reference card (README's table)."""
    return UNNAMED_BACKEND, rows[0].reference if rows else ""


def _group_name(group: tuple[str, str], reference: str) -> str:
    """A group's mark: its backend unless the unnamed (Hopper) one, its card unless the default one."""
    backend, device = group
    parts = [backend] if backend != UNNAMED_BACKEND else []
    parts += [device.removeprefix("NVIDIA ")] if device != reference else []
    return _cell(", ".join(parts))


def _marked(row: Row) -> str:
    """The row's workload, followed by its group's mark when that is not the default group."""
    name = _cell(row.record.workload)
    default = (UNNAMED_BACKEND, row.reference)
    return name if row.group == default else f"{name} ({_group_name(row.group, row.reference)})"


def _line(row: Row) -> str:
    r = row.record
    best = r.best_baseline or PRIMARY_BASELINE
    shape = _cell(" ".join(f"{a}={n}" for a, n in r.shapes.items()))
    cells = [_marked(row), DTYPES.get(r.dtype, _cell(r.dtype)), shape,
             _us(r.plan_us), _us(r.baselines_us.get(PRIMARY_BASELINE)),
             f"{_us(r.baselines_us.get(best))} ({NAMES.get(best, _cell(best))})",
             _x(r.speedups.get(PRIMARY_BASELINE)), _x(r.speedup_vs_best), f"{row.run} (`{_cell(row.file)}`)"]
    return "| " + " | ".join(cells) + " |"


def table(rows: list[Row]) -> str:
    """A markdown table of the rows, in the given order."""
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    return "\n".join(lines + [_line(r) for r in rows])


def _is_seed(row: Row) -> bool:
    r = row.record
    return r.workload in SEEDS and dict(r.shapes) == dict(catalog.get(r.workload).sizes)


def _order(row: Row) -> tuple:
    r = row.record
    seed = SEEDS.index(r.workload) if r.workload in SEEDS else len(SEEDS)
    return (seed, r.workload.lower(), r.workload, r.dtype, tuple(sorted(r.shapes.items())),
            row.group != (UNNAMED_BACKEND, row.reference), row.group)


def seed_table(rows: list[Row], group: tuple[str, str] | None = None) -> str:
    """The five seeds at their catalog shapes, both dtypes, of one (backend, device) group; the default
    group's (Hopper backend, default card) is README's short table."""
    group = group or _default(rows)
    return table(sorted((r for r in rows if _is_seed(r) and r.group == group), key=_order))


def _seed_tables(rows: list[Row]) -> list[str]:
    """The seeds section: the default group's table, then each other group's under its mark."""
    out, default = [seed_table(rows)], _default(rows)
    for g in _groups(rows):
        if g != default and any(_is_seed(r) and r.group == g for r in rows):
            out += ["", f"On {_group_name(g, default[1])}:", "", seed_table(rows, g)]
    return out


def _groups(rows: list[Row]) -> list[tuple[str, str]]:
    """The (backend, device) groups of the rows: the default one first, then the others by name."""
    default = _default(rows)
    return sorted({r.group for r in rows}, key=lambda g: (g != default, g))


def _summary(rows: list[Row]) -> list[str]:
    """Geomeans per group: one backend's or one card's times never average with another's."""
    out = ["| rows | vs torch.compile (geomean) | vs best baseline (geomean) | at least 0.95x the best |",
           "|---|---|---|---|"]
    groups, default = [], _default(rows)
    for g in _groups(rows):
        mine = [r for r in rows if r.group == g]
        tag = "" if g == default else f", {_group_name(g, default[1])}"
        groups += [(f"seeds{tag}", [r for r in mine if _is_seed(r)]), (f"all{tag}", mine)]
    for name, sel in groups or [("seeds", []), ("all", [])]:
        tc = _geomean([r.record.speedups[PRIMARY_BASELINE] for r in sel])
        vs = [r.record.speedup_vs_best for r in sel if r.record.speedup_vs_best is not None]
        near = sum(v >= 0.95 for v in vs)
        out.append(f"| {name} ({len(sel)}) | {_x(tc)} | {_x(_geomean(vs))} | {near} of {len(vs)} |")
    return out


def _backend_note(rows: list[Row]) -> list[str]:
    """Lines naming the other groups' rows, when there are any (none: the text is what it always was)."""
    default = _default(rows)
    reference = default[1]
    others = [g for g in _groups(rows) if g != default]
    if not others:
        return []
    named = ", ".join(f"`({_group_name(g, reference)})`" for g in others)
    return ["A case is also its backend and card. Rows marked", f"{named}",
            "were planned, rendered and built by the backend named (`gpu_run.py --device`; the Ampere path is an",
            "sm_80 build) and timed on the card named",
            f"(else the {reference}); unmarked rows are {UNNAMED_BACKEND}'s on the {reference}.",
            "Each group's rows have their own summary lines; no row of one card replaces another card's."]


def render(rows: list[Row]) -> str:
    """The whole of ``benchmarks/RESULTS.md`` for these rows."""
    rows = sorted(rows, key=_order)
    devices = sorted({r.record.device for r in rows})
    out = [
        "# Measured results (generated)",
        "",
        "Generated by `python -m pyrunner report --tables` from the records in `benchmarks/results/`; do not",
        "edit by hand (`tests/test_results_tables.py` fails when this file differs from what the records give).",
        "",
        "A row is the newest **side-by-side** record of its case (workload, dtype, shapes): the plan was",
        "verified against float64, then timed in the same call as every baseline the row names",
        "(CUDA-graph replay, interleaved rounds, medians, microseconds). Plans timed apart from their",
        "baselines (alternatives, probes) are not here. Speedup = baseline time / plan time. The last",
        "column names the run and its log; `benchmarks/results/INDEX.md` gives each run's command.",
        "Where the planner changed a case's plan after its newest side-by-side run, the row is the older",
        "plan's time until a run re-times it (`bash benchmarks/gpu_run.sh --graph ...`).",
        f"Device(s): {_cell(', '.join(devices)) or '-'}.",
        *_backend_note(rows),
        "",
        "## Summary",
        "",
        *_summary(rows),
        "",
        "## The five seeds (catalog shapes)",
        "",
        *_seed_tables(rows),
        "",
        "## Every case",
        "",
        table([r for r in rows if not _is_seed(r)]),
        "",
    ]
    return "\n".join(out)


def write_tables(results_dir: str | None, out_dir: str | None, reference: str) -> int:
    """``report --tables``: write RESULTS.md (into ``out_dir``, default ``benchmarks/``) from the logs."""
    src = Path(results_dir) if results_dir else RESULTS_DIR
    rows = newest_rows(src, reference)
    folder = output_dir(Path(out_dir) if out_dir else src.parent, "report --out folder")
    path = check_output_file(folder / TABLES_FILE, "tables file")
    write_text_atomic(path, render(rows), "tables file")
    print(f"wrote {path}: {len(rows)} side-by-side rows from {src}")
    return 0
