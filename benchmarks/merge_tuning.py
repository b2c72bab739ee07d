"""Merge GPU runs into the committed tuning database, so tuning accumulates across sessions.

A run writes its best configs to ``$OUT/tuning_<device>.json`` (seeded from the committed file), but
runs overlap: two runs started from the same file each hold only their own news, and copying one
back loses the other's. Merging keeps, per key, the faster entry, and takes the newer one where the
kernels' loop forms differ (it was measured under other code) or the config is the same (a
re-measurement). The device tool also returns only so many files from one call: when a run's
tuning file did not come back, its entries are rebuilt from its results log, whose every record
names its config, time and database key (``extra.tuning``; records written before that carried it
are re-planned here and matched by their plan hash).

    python benchmarks/merge_tuning.py benchmarks/tuning/h200.json --tuning RUN/tuning_h200.json
    python benchmarks/merge_tuning.py benchmarks/tuning/h200.json --results RUN/results.jsonl \\
        --graph benchmarks/graphs/rope_pair.json

Graphs are found by their workload name among ``--graph`` files, ``tests/data``,
``benchmarks/graphs`` and the catalog.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRAPH_DIRS = (ROOT / "tests" / "data", ROOT / "benchmarks" / "graphs")
ALT = "~alt"
"""Suffix ``gpu_run.py`` gives an alternative plan's workload name."""


def merge_entries(db, other) -> list[str]:
    """Merge the entries of ``other`` (a TuningDB) into ``db``; one line per entry that changed."""
    from pyrunner.target.tuning import stale, supersedes

    changes: list[str] = []
    for key, new in other.entries.items():
        old = db.entries.get(key)
        if old == new:
            continue
        if supersedes(new, old):
            why = "new" if old is None else "other code" if stale(new, old) else \
                "re-measured" if new.config == old.config else "faster"
            db.entries[key] = new
            changes.append(f"{new.workload}: {old.time_us if old else '-'} -> {new.time_us} us ({why})")
    return changes


def entry_of(record: dict):
    """The tuning entry a results record carries (its ``extra.tuning`` key and loop forms), or None
    for records written before the runner named their key."""
    from pyrunner.target.tuning import Entry

    tuning = record.get("extra", {}).get("tuning")
    if record.get("status") != "ok" or record.get("plan_us") is None or not tuning:
        return None
    tried = record["extra"].get("autotune") or []
    return tuning["key"], Entry(workload=record["workload"].split(ALT)[0], config=record["config"],
                                time_us=round(float(record["plan_us"]), 3), tried=max(1, len(tried)),
                                default_us=tuning.get("default_us"),
                                plan_hash=record["plan_hash"], extra={"forms": tuning["forms"]})


def find_graphs(extra: list[Path]) -> dict[str, object]:
    """Workload name -> Graph, from ``extra`` files, the corpus folders and the catalog (first wins)."""
    from pyrunner.ir import catalog
    from pyrunner.ir.graph_json import load_graph_file

    out: dict[str, object] = {}
    for path in [*extra, *(p for d in GRAPH_DIRS for p in sorted(d.glob("*.json")))]:
        g = load_graph_file(path)
        out.setdefault(g.name, g)
    for name in catalog.CATALOG:
        out.setdefault(name, catalog.get(name))
    return out


def rebuild_from_results(db, records: list[dict], graphs: dict[str, object], tl_version: str) -> list[str]:
    """Record each verified, timed plan of ``records`` in ``db`` at its config and time; one line each."""
    from pyrunner.planner import search
    from pyrunner.run.runner import default_config
    from pyrunner.target.tuning import TuningDB, committed_tuning

    lines: list[str] = []
    for r in records:
        carried = entry_of(r)
        if carried is not None:  # the record names its key: no re-planning
            lines += merge_entries(db, TuningDB(db.path, {carried[0]: carried[1]}))
            continue
        if r.get("status") != "ok" or r.get("plan_us") is None:
            continue
        name = r["workload"].split(ALT)[0]
        graph = graphs.get(name)
        if graph is None:
            lines.append(f"{r['workload']}: no graph of that name (pass it with --graph)")
            continue
        plans = (search(graph, r["dtype"], top=4, tuning=False)
                 + search(graph, r["dtype"], top=4, tuning=committed_tuning()))
        plan = next((p for p in plans if p.provenance.plan_hash == r["plan_hash"]), None)
        if plan is None:
            lines.append(f"{r['workload']}: plan {r['plan_hash']} is no longer among the planner's four best")
            continue
        tried = r.get("extra", {}).get("autotune") or []
        default = next((t.get("time_us") for t in tried if t.get("config") == default_config(plan)), None)
        changed = db.record(plan, r["config"], r["plan_us"], r["device"], tried=max(1, len(tried)),
                            default_us=default, tl_version=tl_version)
        lines.append(f"{r['workload']}: {r['plan_us']:.2f} us {'recorded' if changed else 'slower than stored'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("database", type=Path, help="the committed tuning file to update")
    ap.add_argument("--tuning", type=Path, action="append", default=[], help="a run's tuning file (repeatable)")
    ap.add_argument("--results", type=Path, action="append", default=[],
                    help="a run's results log, for a run whose tuning file did not come back (repeatable)")
    ap.add_argument("--graph", type=Path, action="append", default=[], help="a graph file the results name")
    ap.add_argument("--tl-version", default="0.1.15", help="TileLang version the results were measured with")
    args = ap.parse_args(argv)

    from pyrunner.errors import UserError
    from pyrunner.target.tuning import TuningDB

    try:
        db = TuningDB.load(args.database)
        lines: list[str] = []
        for path in args.tuning:
            lines += merge_entries(db, TuningDB.load(path))
        if args.results:
            records = [json.loads(line) for p in args.results for line in p.read_text().splitlines() if line.strip()]
            lines += rebuild_from_results(db, records, find_graphs(args.graph), args.tl_version)
    except (UserError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    db.save(args.database)
    print(f"{args.database}: {len(db.entries)} entries")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
