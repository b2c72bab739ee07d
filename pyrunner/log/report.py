"""Benchmark report from the results log: a markdown table, geomean speedups, a bar plot.

``python -m pyrunner report [--log results/results.jsonl] [--out benchmarks/results/]``
By default the latest record of each (workload, dtype, shapes) is reported.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable
from pathlib import Path

from pyrunner.log.results import PRIMARY_BASELINE, RunRecord, read_log

DEFAULT_LOG = Path("results/results.jsonl")
DEFAULT_OUT = Path("benchmarks/results")
VENDORS = ("sdpa", "cublas")


def latest(records: Iterable[RunRecord]) -> list[RunRecord]:
    """The last record of each (workload, dtype, shapes), in first-seen order."""
    last: dict[tuple, RunRecord] = {}
    for r in records:
        last[(r.workload, r.dtype, tuple(sorted(r.shapes.items())))] = r
    return list(last.values())


def geomean(xs: Iterable[float]) -> float | None:
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _vendor(r: RunRecord) -> tuple[str, float | None] | None:
    for v in VENDORS:
        if v in r.baselines_us:
            return v, r.baselines_us[v]
    return None


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _shape(r: RunRecord) -> str:
    return " ".join(f"{a}={n}" for a, n in r.shapes.items())


def geomeans(records: list[RunRecord]) -> dict[str, float | None]:
    """Geomean speedup over torch.compile and over the best baseline, per dtype and overall."""
    ok = [r for r in records if r.status == "ok"]
    out: dict[str, float | None] = {}
    for dt in sorted({r.dtype for r in ok}) + ["all"]:
        sel = [r for r in ok if dt in ("all", r.dtype)]
        out[f"{dt}.{PRIMARY_BASELINE}"] = geomean(r.speedups.get(PRIMARY_BASELINE) for r in sel)
        out[f"{dt}.best"] = geomean(r.speedup_vs_best for r in sel)
    return out


def markdown(records: list[RunRecord]) -> str:
    head = ["workload", "dtype", "shape", "plan (us)", "eager", "torch.compile", "max-autotune", "vendor",
            "vs torch.compile", "vs best", "error", "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        v = _vendor(r)
        vendor = "-" if v is None else f"{_us(v[1])} ({v[0]})"
        err = "-" if r.error is None else f"{r.error:.1e}"
        status = r.status if r.status in ("ok", "skipped") else f"**{r.status}**"
        lines.append("| " + " | ".join([
            r.workload, r.dtype, _shape(r), _us(r.plan_us), _us(r.baselines_us.get("eager")),
            _us(r.baselines_us.get("torch_compile")), _us(r.baselines_us.get("max_autotune")), vendor,
            _x(r.speedups.get(PRIMARY_BASELINE)),
            _x(r.speedup_vs_best) + (f" ({r.best_baseline})" if r.best_baseline else ""), err, status,
        ]) + " |")
    g = geomeans(records)
    out = ["# Superopt benchmark report", ""]
    devices = sorted({r.device for r in records})
    out.append(f"Device(s): {', '.join(devices) or '-'}. Times are medians in microseconds; speedup = "
               "baseline time / plan time (higher is better).")
    out.append("")
    out += lines
    out.append("")
    out.append("## Geomean speedups (records with status ok)")
    out.append("")
    out.append("| dtype | vs torch.compile | vs best baseline |")
    out.append("|---|---|---|")
    for dt in sorted({k.split(".")[0] for k in g}, key=lambda d: (d == "all", d)):
        out.append(f"| {dt} | {_x(g.get(f'{dt}.{PRIMARY_BASELINE}'))} | {_x(g.get(f'{dt}.best'))} |")
    slower = [r for r in records if r.status == "ok" and r.speedup_vs_best is not None and r.speedup_vs_best < 1]
    failed = [r for r in records if r.status not in ("ok", "skipped")]
    if slower:
        out += ["", "Slower than the best baseline: " + ", ".join(
            f"{r.workload} {r.dtype} ({_x(r.speedup_vs_best)} vs {r.best_baseline})" for r in slower)]
    if failed:
        out += ["", "## Failures", ""]
        out += [f"- {r.workload} {r.dtype} plan `{r.plan_hash}`: {r.status}: {r.message}" for r in failed]
    return "\n".join(out) + "\n"


def plot(records: list[RunRecord], path: Path) -> Path | None:
    """Bar plot of speedup vs torch.compile and vs the best baseline per workload/dtype."""
    rows = [r for r in records if r.status == "ok" and r.plan_us]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.workload}\n{r.dtype}" for r in rows]
    vs_tc = [r.speedups.get(PRIMARY_BASELINE) or 0.0 for r in rows]
    vs_best = [r.speedup_vs_best or 0.0 for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows)), 4.0))
    xs = range(len(rows))
    w = 0.38
    ax.bar([x - w / 2 for x in xs], vs_tc, w, label="vs torch.compile")
    ax.bar([x + w / 2 for x in xs], vs_best, w, label="vs best baseline")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("speedup (x)")
    ax.set_title("Superopt plan speedups" + (f" on {rows[0].device}" if rows else ""))
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def short_table(records: list[RunRecord]) -> str:
    """A compact plain-text table (gpu_run prints it last)."""
    rows = [("workload", "dtype", "plan us", "t.compile", "best base", "vs tc", "vs best", "error", "status")]
    for r in records:
        best = r.best_baseline or "-"
        rows.append((r.workload, r.dtype, _us(r.plan_us), _us(r.baselines_us.get("torch_compile")),
                     f"{_us(r.baselines_us.get(best))} {best}" if r.best_baseline else "-",
                     _x(r.speedups.get(PRIMARY_BASELINE)), _x(r.speedup_vs_best),
                     "-" if r.error is None else f"{r.error:.1e}", r.status))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    text = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() for row in rows]
    g = geomeans(records)
    text.append(f"geomean vs torch.compile: {_x(g.get('all.' + PRIMARY_BASELINE))}   "
                f"vs best baseline: {_x(g.get('all.best'))}")
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pyrunner report", description=__doc__.splitlines()[0])
    ap.add_argument("--log", type=Path, default=DEFAULT_LOG, help="results log (JSON Lines)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for report.md and speedups.png")
    ap.add_argument("--all", action="store_true", help="every record, not only the latest per workload")
    args = ap.parse_args(argv)
    records = read_log(args.log)
    if not args.all:
        records = latest(records)
    args.out.mkdir(parents=True, exist_ok=True)
    md = args.out / "report.md"
    md.write_text(markdown(records))
    png = plot(records, args.out / "speedups.png")
    print(f"wrote {md}" + (f" and {png}" if png else " (no timed records: no plot)"))
    if records:
        print(short_table(records))
    else:
        print(f"no records in {args.log}")
    return 0
