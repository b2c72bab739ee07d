"""Benchmark report from the results log: a markdown table, geomean speedups, a bar plot.

``python -m pyrunner report --out DIR [--log results/results.jsonl] [--all]``
By default the latest record of each (workload, dtype, shapes) is reported. The log is
untrusted: speedups are recomputed from the times (stored ones are ignored), names are
escaped for markdown, lines that are not valid records are counted and reported, and
the report goes only to the folder ``--out`` names (there is no default that could
overwrite the committed ``benchmarks/results/report.md``).
"""

from __future__ import annotations

import argparse
import io
import math
from collections.abc import Iterable
from pathlib import Path

from pyrunner.errors import UserError
from pyrunner.files import check_output_file, output_dir, write_bytes_atomic, write_text_atomic
from pyrunner.log.results import PRIMARY_BASELINE, RunRecord, read_log_counted, speedups

DEFAULT_LOG = Path("results/results.jsonl")
VENDORS = ("sdpa", "cublas")


def recomputed(r: RunRecord) -> RunRecord:
    """The record with its speedups derived from its times (a log line's own speedups are not trusted)."""
    per, best, vs_best = speedups(r.plan_us, r.baselines_us)
    return r.model_copy(update={"speedups": per, "best_baseline": best, "speedup_vs_best": vs_best})


MAX_CELL = 120
"""Longest text a report cell shows (a workload name or message is cut there, with an ellipsis)."""
MAX_TABLE_ROWS = 2000
"""Records the table lists; the rest are counted (geomeans still cover every record)."""
MAX_PLOT_BARS = 60
"""Records the bar plot shows (a plot 1.1 inches per bar: 20,000 bars took gigabytes)."""


def cell(x: object, limit: int = MAX_CELL) -> str:
    """Text safe inside a markdown table cell: one line, at most ``limit`` characters, ``|`` and link
    or image brackets escaped, no HTML."""
    raw = str(x)
    raw = raw[:limit] + "..." if len(raw) > limit else raw
    text = " ".join("".join(c if c.isprintable() else " " for c in raw).split())
    for ch in "\\|[]":
        text = text.replace(ch, "\\" + ch)
    return text.replace("<", "&lt;").replace(">", "&gt;")


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
    return cell(" ".join(f"{a}={n}" for a, n in r.shapes.items()))


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
    for r in records[:MAX_TABLE_ROWS]:
        v = _vendor(r)
        vendor = "-" if v is None else f"{_us(v[1])} ({v[0]})"
        err = "-" if r.error is None else f"{r.error:.1e}"
        status = r.status if r.status in ("ok", "skipped") else f"**{r.status}**"
        lines.append("| " + " | ".join([
            cell(r.workload), cell(r.dtype), _shape(r), _us(r.plan_us), _us(r.baselines_us.get("eager")),
            _us(r.baselines_us.get("torch_compile")), _us(r.baselines_us.get("max_autotune")), vendor,
            _x(r.speedups.get(PRIMARY_BASELINE)),
            _x(r.speedup_vs_best) + (f" ({cell(r.best_baseline)})" if r.best_baseline else ""), err, status,
        ]) + " |")
    g = geomeans(records)
    out = ["# Superopt benchmark report", ""]
    devices = sorted({r.device for r in records})
    out.append(f"Device(s): {cell(', '.join(devices)) or '-'}. Times are medians in microseconds; speedup = "
               "baseline time / plan time (higher is better).")
    out.append("")
    out += lines
    if len(records) > MAX_TABLE_ROWS:
        out += ["", f"{len(records) - MAX_TABLE_ROWS} more record(s) not listed (the table shows the first "
                    f"{MAX_TABLE_ROWS}); the geomeans below cover all {len(records)}."]
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
            f"{cell(r.workload)} {cell(r.dtype)} ({_x(r.speedup_vs_best)} vs {cell(r.best_baseline)})"
            for r in slower[:MAX_TABLE_ROWS])]
    if failed:
        out += ["", "## Failures", ""]
        out += [f"- {cell(r.workload)} {cell(r.dtype)} plan {cell(r.plan_hash)}: {r.status}: {cell(r.message)}"
                for r in failed[:MAX_TABLE_ROWS]]
    return "\n".join(out) + "\n"


def plot(records: list[RunRecord], path: Path) -> Path | None:
    """Bar plot of speedup vs torch.compile and vs the best baseline per workload/dtype."""
    rows = [r for r in records if r.status == "ok" and r.plan_us][:MAX_PLOT_BARS]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{cell(r.workload)}\n{cell(r.dtype)}".replace("$", r"\$") for r in rows]
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
    ax.set_title(("Superopt plan speedups" + (f" on {cell(rows[0].device)}" if rows else "")).replace("$", r"\$"))
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    png = io.BytesIO()
    try:
        fig.savefig(png, format="png", dpi=120)
    finally:
        plt.close(fig)
    write_bytes_atomic(path, png.getvalue(), "plot file")
    return path


def short_table(records: list[RunRecord]) -> str:
    """A compact plain-text table (gpu_run prints it last)."""
    rows = [("workload", "dtype", "plan us", "t.compile", "best base", "vs tc", "vs best", "error", "status")]
    for r in records:
        best = r.best_baseline or "-"
        rows.append((cell(r.workload), cell(r.dtype), _us(r.plan_us), _us(r.baselines_us.get("torch_compile")),
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
    ap.add_argument("--out", type=Path, help="folder for report.md and speedups.png (required)")
    ap.add_argument("--all", action="store_true", help="every record, not only the latest per workload")
    args = ap.parse_args(argv)
    if args.out is None:
        raise UserError("report needs --out DIR: the folder to write report.md and speedups.png to "
                        "(no default, so a committed report is never overwritten by accident)")
    records, skipped = read_log_counted(args.log)
    records = [recomputed(r) for r in records]
    if not args.all:
        records = latest(records)
    out = output_dir(args.out, "report --out folder")
    md = check_output_file(out / "report.md", "report file")
    check_output_file(out / "speedups.png", "plot file")
    text = markdown(records)
    if skipped:
        text += f"\n{skipped} line(s) of {cell(args.log)} were skipped: not valid records.\n"
    write_text_atomic(md, text, "report file")
    png = plot(records, out / "speedups.png")
    print(f"wrote {md}" + (f" and {png}" if png else " (no timed records: no plot)"))
    if skipped:
        print(f"skipped {skipped} line(s) of {args.log} that are not valid records")
    if records:
        print(short_table(records[:MAX_TABLE_ROWS]))
    else:
        print(f"no records in {args.log}")
    return 0
