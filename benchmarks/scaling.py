"""Scaling of graph loading, printing and planning on adversarial graph families (issue 8).

    python benchmarks/scaling.py [--sizes 10,40,1000] [--families ...] [--timeout 60] [--no-plan]

Families: ``shared`` (d_i = add(d_{i-1}, d_{i-1}): exponential as a tree), ``chain`` (alternating
elementwise ops), ``matmul_chain`` (Y_i = Y_{i-1} @ W_i), ``reductions`` (a sum of n softmaxes over
one axis). Each case runs in its own process (a hang or a blow-up cannot stop the table) and
reports load + print time, planning time, and the process's peak resident memory. CPU only.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = ("shared", "chain", "matmul_chain", "reductions")


def graph(family: str, n: int) -> dict:
    """The JSON graph of one family member with ``n`` nodes."""
    if family == "shared":
        nodes = [{"name": "d0", "op": "exp", "args": ["X"]}]
        nodes += [{"name": f"d{i}", "op": "add", "args": [f"d{i - 1}", f"d{i - 1}"]} for i in range(1, n)]
        return {"name": "Shared", "axes": {"m": 256, "n": 256}, "inputs": {"X": ["m", "n"]}, "nodes": nodes,
                "outputs": [f"d{n - 1}"]}
    if family == "chain":
        ops = ("exp", "neg", "silu", "square", "sigmoid")
        nodes = [{"name": f"d{i}", "op": ops[i % len(ops)], "args": [f"d{i - 1}" if i else "X"]} for i in range(n)]
        return {"name": "Chain", "axes": {"m": 256, "n": 256}, "inputs": {"X": ["m", "n"]}, "nodes": nodes,
                "outputs": [f"d{n - 1}"]}
    if family == "matmul_chain":
        inputs = {"Y0": ["m", "a0"]} | {f"W{i}": [f"a{(i - 1) % 2}", f"a{i % 2}"] for i in range(1, n + 1)}
        nodes = [{"name": f"Y{i}", "op": "matmul", "args": [f"Y{i - 1}", f"W{i}"], "contract": f"a{(i - 1) % 2}"}
                 for i in range(1, n + 1)]
        return {"name": "MatmulChain", "axes": {"m": 256, "a0": 256, "a1": 256}, "inputs": inputs,
                "nodes": nodes, "outputs": [f"Y{n}"]}
    if family == "reductions":
        k = max(1, n // 4)  # a softmax is four nodes (exp, sum, div) plus the add
        nodes = [{"name": "s0", "op": "softmax", "args": ["X"], "axis": "n"}]
        for i in range(1, k):
            nodes.append({"name": f"x{i}", "op": "mul", "args": ["X", float(i + 1)]})
            nodes.append({"name": f"p{i}", "op": "softmax", "args": [f"x{i}"], "axis": "n"})
            nodes.append({"name": f"s{i}", "op": "add", "args": [f"s{i - 1}", f"p{i}"]})
        return {"name": "Reductions", "axes": {"m": 256, "n": 256}, "inputs": {"X": ["m", "n"]}, "nodes": nodes,
                "outputs": [f"s{k - 1}"]}
    raise SystemExit(f"unknown family {family!r}")


def one(family: str, n: int, plan: bool) -> dict:
    """Measure one case in this process (the worker side)."""
    sys.path.insert(0, str(ROOT))
    from pyrunner.errors import UserError
    from pyrunner.ir.graph import show
    from pyrunner.ir.graph_json import graph_from_json

    data = graph(family, n)
    t = time.perf_counter()
    g = graph_from_json(json.loads(json.dumps(data)))
    text = "; ".join(show(x) for _, x in g.outputs)
    load_s = time.perf_counter() - t
    row = {"family": family, "n": n, "terms": len(g.terms()), "load_print_s": round(load_s, 3),
           "shown_chars": len(text)}
    if plan:
        from pyrunner.planner import search
        from pyrunner.target.tuning import committed_tuning

        t = time.perf_counter()
        try:
            plans = search(g, "fp16", tuning=committed_tuning())
            row["planned"] = f"{len(plans[0].kernels)} kernel(s)"
        except UserError as e:
            row["planned"] = f"error: {str(e)[:80]}"
        except RecursionError:
            row["planned"] = "RecursionError"
        row["plan_s"] = round(time.perf_counter() - t, 3)
    row["peak_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,40,1000")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--no-plan", action="store_true")
    ap.add_argument("--worker", nargs=2, metavar=("FAMILY", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(one(args.worker[0], int(args.worker[1]), not args.no_plan)))
        return 0
    print("| family | nodes | terms | load+print s | plan s | planned | peak MB |")
    print("|---|---|---|---|---|---|---|")
    for family in args.families.split(","):
        for n in (int(x) for x in args.sizes.split(",")):
            cmd = [sys.executable, __file__, "--worker", family, str(n)] + (["--no-plan"] if args.no_plan else [])
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                row = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else \
                    {"planned": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1][:80]}"}
            except subprocess.TimeoutExpired:
                row = {"planned": f"timed out after {args.timeout:.0f} s"}
            print(f"| {family} | {n} | {row.get('terms', '-')} | {row.get('load_print_s', '-')} | "
                  f"{row.get('plan_s', '-')} | {row.get('planned', '-')} | {row.get('peak_mb', '-')} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
