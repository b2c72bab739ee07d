"""Planning time per workload on this machine (DESIGN shapes, fp16).

usage: python benchmarks/planning_time.py [--top K] [--repeat N]
Prints one row per workload: median wall time of `search` and the plan found.
"""

from __future__ import annotations

import argparse
import statistics
import time

from rich.console import Console
from rich.table import Table

from pyrunner.ir import catalog as workloads
from pyrunner.planner import search
from pyrunner.target.tuning import committed_tuning


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    table = Table(title="planning time (python planner, this machine)")
    for col in ("workload", "median s", "max s", "kernels", "predicted us", "derivation steps"):
        table.add_column(col)
    for name in workloads.CATALOG:
        g = workloads.get(name)
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            plan = search(g, "fp16", top=args.top, tuning=committed_tuning())[0]
            times.append(time.perf_counter() - t0)
        table.add_row(name, f"{statistics.median(times):.2f}", f"{max(times):.2f}", str(len(plan.kernels)),
                      f"{plan.cost.total_us:.1f}", str(len(plan.derivation)))
    Console().print(table)


if __name__ == "__main__":
    main()
