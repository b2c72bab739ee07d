"""Planning time and peak memory against graph size (issue 8's scaling table).

usage: python benchmarks/planning_scaling.py [--sizes 10 40 1000] [--families ...]
Four families, each at each size n (n = the number of ops that grow):
  shared-subgraph     d_i = add(d_{i-1}, d_{i-1})       (a tree walk would be 2**n)
  elementwise-chain   alternating add(t, X) and tanh(t)  (deep: recursion would overflow)
  matmul-chain        X @ W_1 @ ... @ W_n over n+1 axes  (n contractions to partition)
  reduction-count     sum of n/4 softmaxes (4 ops each: n/4 reductions, 2n/4 after max-shift)
Each case runs in a fresh process (peak RSS via resource.getrusage is per process) and
prints one row: wall seconds, CPU seconds of the process (what a loaded machine inflates
least), peak RSS (the whole interpreter), kernels, plan source.
The bar: every case under 10 s and 2 GB, every case planned.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from pyrunner.ir.graph import Graph, Term, binary, inp, matmul, reduce, unary


def shared_subgraph(n: int) -> Graph:
    t = inp("X", ("m", "d"))
    for _ in range(n):
        t = binary("add", t, t)
    return Graph(f"SharedSubgraph{n}", {"m": 256, "d": 256}, (("Y", t),))


def elementwise_chain(n: int) -> Graph:
    x = inp("X", ("m", "d"))
    t = x
    for i in range(n):
        t = unary("tanh", t) if i % 2 else binary("add", t, x)
    return Graph(f"ElementwiseChain{n}", {"m": 256, "d": 256}, (("Y", t),))


def matmul_chain(n: int) -> Graph:
    t = inp("X", ("m", "a0"))
    sizes = {"m": 256, "a0": 256}
    for i in range(n):
        sizes[f"a{i + 1}"] = 256
        t = matmul(t, inp(f"W{i}", (f"a{i}", f"a{i + 1}")), f"a{i}")
    return Graph(f"MatmulChain{n}", sizes, (("Y", t),))


def reduction_count(n: int) -> Graph:
    x = inp("X", ("m", "d"))
    acc: Term | None = None
    for i in range(max(1, n // 4)):
        e = unary("exp", binary("mul", x, inp(f"s{i}", ("d",))))
        sm = binary("div", e, reduce("sum", e, "d"))
        acc = sm if acc is None else binary("add", acc, sm)
    assert acc is not None
    return Graph(f"ReductionCount{n}", {"m": 1024, "d": 1024}, (("Y", acc),))


FAMILIES = {
    "shared-subgraph": shared_subgraph,
    "elementwise-chain": elementwise_chain,
    "matmul-chain": matmul_chain,
    "reduction-count": reduction_count,
}


def one(family: str, n: int) -> dict:
    """Plan one case in this process; the measurements as a dict."""
    from pyrunner.planner import search
    from pyrunner.target.tuning import committed_tuning

    g = FAMILIES[family](n)
    t0 = time.perf_counter()
    c0 = time.process_time()
    try:
        plan = search(g, "fp16", tuning=committed_tuning())[0]
        status, kernels, source = "planned", len(plan.kernels), plan.provenance.planner
    except Exception as e:  # noqa: BLE001 - the table reports any failure as a row
        status, kernels, source = f"{type(e).__name__}: {str(e)[:80]}", 0, "-"
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - c0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"family": family, "n": n, "terms": len(g.terms()), "seconds": round(seconds, 2), "cpu_s": round(cpu, 2),
            "peak_rss_mb": round(rss_mb), "kernels": kernels,
            "plan": source, "status": status}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 40, 1000])
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--one", nargs=2, metavar=("FAMILY", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]))))
        return
    rows = []
    for fam in args.families:
        for n in args.sizes:
            run = subprocess.run([sys.executable, __file__, "--one", fam, str(n)], capture_output=True, text=True)
            if run.returncode != 0:
                tail = (run.stderr.strip().splitlines() or ["?"])[-1]
                rows.append({"family": fam, "n": n, "terms": "-", "seconds": "-", "cpu_s": "-", "peak_rss_mb": "-",
                             "kernels": 0, "plan": "-", "status": f"exit {run.returncode}: {tail}"})
            else:
                rows.append(json.loads(run.stdout.strip().splitlines()[-1]))
    cols = ["family", "n", "terms", "seconds", "cpu_s", "peak_rss_mb", "kernels", "plan", "status"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    ok = all(r["status"] == "planned" and r["seconds"] < 10 and r["peak_rss_mb"] < 2048 for r in rows)
    cpu_ok = all(r["status"] == "planned" and r["cpu_s"] < 10 and r["peak_rss_mb"] < 2048 for r in rows)
    print(f"\nall planned, under 10 s and 2 GB: {'yes' if ok else 'NO'} (wall); {'yes' if cpu_ok else 'NO'} (CPU); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
