"""Planning time per workload on this machine (DESIGN shapes, fp16).

usage: python benchmarks/planning_time.py [--top K] [--repeat N] [--corpus] [--only TEXT] [--alone]
Prints one row per workload (with ``--corpus``, also per graph file of tests/data and benchmarks/graphs at
its own shapes): median wall and CPU time of `search`, the plan found, and whether a work budget cut the
search (``provenance.search_cut``). CPU time is the search's own process: where the prefetch helper
runs beside it (``planner.prefetch``, searches of 8 or more derivation variants on 2 or more CPUs), wall
time is what a user waits and the helper's CPU is not counted. ``--alone`` runs every search without the
helper (one process), for comparison; compare runs taken in turn on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pyrunner.ir import catalog as workloads
from pyrunner.ir.graph import Graph
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.planner import prefetch, search
from pyrunner.target.tuning import committed_tuning

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ("tests/data", "benchmarks/graphs")


def cases(corpus: bool) -> list[tuple[str, Callable[[], Graph]]]:
    """(name, graph maker) of every catalog workload and, with ``corpus``, every graph file."""
    out: list[tuple[str, Callable[[], Graph]]] = [(n, lambda n=n: workloads.get(n)) for n in workloads.CATALOG]
    if corpus:
        out += [(f"{Path(d).name}/{p.stem}", lambda p=p: load_graph_file(p))
                for d in CORPUS for p in sorted((ROOT / d).glob("*.json"))]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--corpus", action="store_true", help="also every graph file of tests/data and benchmarks/graphs")
    ap.add_argument("--only", help="only the cases whose name contains this")
    ap.add_argument("--alone", action="store_true", help="no prefetch helper: every search in one process")
    args = ap.parse_args()
    prefetch.ENABLED = not args.alone
    table = Table(title="planning time (python planner, this machine" + (", one process)" if args.alone else ")"))
    for col in ("workload", "median s", "max s", "cpu s", "kernels", "predicted us", "derivation steps", "cut"):
        table.add_column(col)
    for name, make in cases(args.corpus):
        if args.only and args.only not in name:
            continue
        g = make()
        times, cpu = [], []
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            plan = search(g, "fp16", top=args.top, tuning=committed_tuning())[0]
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        cut = "yes" if any("partition search" in n for n in plan.provenance.search_cut) else ""
        table.add_row(name, f"{statistics.median(times):.2f}", f"{max(times):.2f}", f"{statistics.median(cpu):.2f}",
                      str(len(plan.kernels)), f"{plan.cost.total_us:.1f}", str(len(plan.derivation)), cut)
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
