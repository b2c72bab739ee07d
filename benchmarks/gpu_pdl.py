"""A/B timing of programmatic dependent launch: multi-kernel plans with and without it, same run.

For each workload the planner's top plan (tuned config from the database) is rendered as usual
(every kernel but the last triggers its successor, every kernel but the first waits where
``plan.dependent_launch`` says) and once more with those calls replaced by ``pass`` (plain stream
order, the renderer before dependent launch). Both are compiled, verified against float64 on the
device, and timed side by side, interleaved (``run.timing.side_by_side_us``). Single-kernel plans
are skipped: they have nothing to overlap.

Run on the GPU machine through gpu_run.sh's environment:
    SCRIPT=benchmarks/gpu_pdl.py TOTAL_S=200 OUT=/tmp/pdl bash benchmarks/gpu_run.sh \
        --workloads RMSNorm --dtypes bfloat16,float16
Writes ``pdl.jsonl`` under ``--out`` and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DTYPES = {"bfloat16": "bf16", "float16": "fp16", "bf16": "bf16", "fp16": "fp16"}


def without_dependent_launch(source: str) -> str:
    """The rendered module with every ``T.pdl_trigger()`` / ``T.pdl_sync()`` statement made a ``pass``."""
    return re.sub(r"\bT\.pdl_(trigger|sync)\(\)", "pass", source)


def measure(graph_name: str, dtype: str, work: Path, rounds: int, warm_only: bool = False) -> dict:
    from pyrunner.backend.tilelang.compile import TARGET, load_module
    from pyrunner.backend.tilelang.render import render
    from pyrunner.ir import catalog
    from pyrunner.ir.graph_json import load_graph_file
    from pyrunner.plan.analysis import resolve_config
    from pyrunner.planner import search
    from pyrunner.run.timing import side_by_side_us
    from pyrunner.run.verify import GpuVerifier

    if graph_name.endswith(".json"):
        graph = load_graph_file(Path(graph_name))
    else:
        name, _, shape = graph_name.partition(":")  # e.g. RMSNormMLP:m=8192
        sizes = {a: int(n) for a, n in (kv.split("=") for kv in shape.split(";") if kv)} or None
        graph = catalog.get(name, sizes)
    (plan,) = search(graph, DTYPES[dtype], top=1)
    rec: dict = {"workload": graph_name, "dtype": dtype, "kernels": [k.name for k in plan.kernels]}
    if len(plan.kernels) < 2:
        return {**rec, "status": "skipped: one kernel"}
    cfg = resolve_config(plan)
    source = render(plan)
    launches = {}
    verifier = GpuVerifier(plan, graph, device="cuda")
    for variant, src in (("pdl", source), ("plain", without_dependent_launch(source))):
        module = load_module(src, work / f"{re.sub(r'[^A-Za-z0-9_]', '_', graph_name)}_{dtype}_{variant}.py")
        t0 = time.monotonic()
        kernels = module.compile_kernels(cfg, target=TARGET)
        rec[f"{variant}_compile_s"] = round(time.monotonic() - t0, 1)
        if warm_only:  # TileLang's kernel cache now holds it: the measuring process compiles in seconds
            continue
        tensors = verifier.tensors()

        def launch(t: dict, module=module, kernels=kernels) -> None:
            module.launch(t, cfg, kernels=kernels)

        res = verifier.check(launch)
        rec[f"{variant}_error"] = res.error
        if not res.ok:
            return {**rec, "status": f"failed verification ({variant}): {res.message}"}
        launches[variant] = (lambda launch=launch, tensors=tensors: launch(tensors))
    if warm_only:
        return {**rec, "status": "warm"}
    times, method, per_round = side_by_side_us(launches, rounds=rounds)
    return {**rec, "status": "ok", "config": cfg, "us": times, "method": method, "rounds": per_round}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="RMSNorm",
                    help="comma-separated catalog names (NAME:axis=N;axis=N overrides shapes) or graph JSON files")
    ap.add_argument("--dtypes", default="bfloat16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=200)
    ap.add_argument("--jobs", type=int, default=8, help="parallel compile (warm-up) processes")
    ap.add_argument("--warm", nargs=2, metavar=("WORKLOAD", "DTYPE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    work = Path("/tmp/superopt_pdl")
    work.mkdir(parents=True, exist_ok=True)
    if args.warm:
        print(json.dumps(measure(*args.warm, work, args.rounds, warm_only=True), default=str))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    end = time.monotonic() + args.budget_s - 10
    cases = [(w, dt) for w in args.workloads.split(",") for dt in args.dtypes.split(",")]

    def warm(case: tuple[str, str]) -> None:
        left = end - time.monotonic() - 60
        if left > 0:
            try:
                subprocess.run([sys.executable, __file__, "--warm", *case], timeout=left, capture_output=True)
            except subprocess.TimeoutExpired:
                pass

    t0 = time.monotonic()
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        list(pool.map(warm, cases))
    print(f"warm-up: {len(cases)} case(s) compiled in {time.monotonic() - t0:.0f} s", flush=True)
    rows = []
    with open(out / "pdl.jsonl", "a") as log:
        for w, dt in cases:
            if time.monotonic() > end - 30:
                rows.append({"workload": w, "dtype": dt, "status": "skipped: budget spent"})
                continue
            try:
                rec = measure(w, dt, work, args.rounds)
            except Exception as e:  # noqa: BLE001 - one failing workload must not lose the others
                rec = {"workload": w, "dtype": dt, "status": f"error: {type(e).__name__}: {e}"}
            print(json.dumps(rec, default=str), flush=True)
            log.write(json.dumps(rec, default=str) + "\n")
            rows.append(rec)
    print("\n| workload | dtype | with PDL (us) | without (us) | gain |")
    print("|---|---|---|---|---|")
    for r in rows:
        if r.get("status") == "ok":
            a, b = r["us"]["pdl"], r["us"]["plain"]
            print(f"| {r['workload']} | {r['dtype']} | {a:.1f} | {b:.1f} | {b - a:+.1f} us ({b / a:.3f}x) |")
        else:
            print(f"| {r['workload']} | {r['dtype']} | - | - | {r.get('status')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
