"""A/B timing of renderer features: each plan rendered as usual and once with a feature taken
out, both compiled, verified against float64 on the device, and timed side by side, interleaved
(``run.timing.side_by_side_us``), in the same process.

Features (``--feature``, comma-separated; each is timed on every workload it applies to):
- ``pdl``: programmatic dependent launch. Without it, every ``T.pdl_trigger()`` / ``T.pdl_sync()`` is
  a ``pass`` (plain stream order, the renderer before dependent launch). Single-kernel plans are
  skipped: they have nothing to overlap.
- ``persistent``: the persistent form of asynchronous kernels past one wave (``render_ws``). Without
  it, the build function takes the one-block-per-tile form at every config. Plans whose kernels
  build the same prim_func either way (one wave at their config) are skipped.
- ``prologue_tma``: prologue tiles only the GEMMs read (attention's Q) loaded by the producer
  warpgroup's TMA (``ws_forms.producer_prologue``). Without it, the consumers copy them in.
- ``sink``: prologue ops that only feed the epilogue, reading an earlier kernel's output, moved
  after the loop (``plan.passes.sink_late_inputs``), so the dependent-launch wait comes late.
- ``staged``: loop loads of rows TMA cannot fetch staged in registers one step ahead
  (``target.layout.staged_loop_loads``). Without it, each step loads its own tiles and waits for
  them before its MMAs or reductions.

Run on the GPU machine through gpu_run.sh's environment:
    SCRIPT=benchmarks/gpu_ab.py TOTAL_S=200 OUT=/tmp/ab bash benchmarks/gpu_run.sh \
        --feature pdl --workloads RMSNorm --dtypes bfloat16,float16
Writes ``ab.jsonl`` under ``--out`` and prints a table last.
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


def without_persistence(source: str) -> str:
    """The rendered module whose build functions never take the persistent branch."""
    return re.sub(r"\bif (\w+) > SM_COUNT:  # past one wave: persistent", r"if False:  # (A/B) was \1 > SM_COUNT",
                  source)


def without_producer_prologue(plan) -> str:
    """The plan rendered with the consumers loading every prologue tile themselves (thread copies)."""
    from pyrunner.backend.tilelang import ws_forms
    from pyrunner.backend.tilelang.render import render

    kept = ws_forms.producer_prologue
    ws_forms.producer_prologue = lambda ctx: ()
    try:
        return render(plan)
    finally:
        ws_forms.producer_prologue = kept


def without_sunk_inputs(plan) -> str:
    """The plan rendered with every prologue op left in the prologue (``plan.passes.sink_late_inputs`` off)."""
    from pyrunner.backend.tilelang.render import render
    from pyrunner.plan import passes

    kept = passes.sink_late_inputs
    passes.sink_late_inputs = lambda kernel, earlier: kernel
    try:
        return render(plan)
    finally:
        passes.sink_late_inputs = kept


def without_staged_loads(plan) -> str:
    """The plan rendered with every synchronous loop loading its own step (no register staging)."""
    from pyrunner.backend.tilelang import render as render_module

    kept = render_module.staged_loop_loads
    render_module.staged_loop_loads = lambda kernel, tensors: []
    try:
        return render_module.render(plan)
    finally:
        render_module.staged_loop_loads = kept


FEATURES = {
    "pdl": lambda plan, source: without_dependent_launch(source),
    "persistent": lambda plan, source: without_persistence(source),
    "prologue_tma": lambda plan, source: without_producer_prologue(plan),
    "sink": lambda plan, source: without_sunk_inputs(plan),
    "staged": lambda plan, source: without_staged_loads(plan),
}
"""Feature -> (plan, its rendered source) -> the source with the feature taken out."""


def measure(feature: str, graph_name: str, dtype: str, work: Path, rounds: int, warm_only: bool = False) -> dict:
    from pyrunner.backend.tilelang.compile import load_module
    from pyrunner.backend.tilelang.render import render
    from pyrunner.ir import catalog
    from pyrunner.ir.graph_json import load_graph_file
    from pyrunner.pipeline import best_plan
    from pyrunner.plan.analysis import resolve_config
    from pyrunner.run.timing import side_by_side_us
    from pyrunner.run.verify import GpuVerifier
    from pyrunner.target.tuning import committed_tuning

    if graph_name.endswith(".json"):
        graph = load_graph_file(Path(graph_name))
    else:
        name, _, shape = graph_name.partition(":")  # e.g. RMSNormMLP:m=8192
        sizes = {a: int(n) for a, n in (kv.split("=") for kv in shape.split(";") if kv)} or None
        graph = catalog.get(name, sizes)
    (plan,) = best_plan(graph, DTYPES[dtype], tuning=committed_tuning())
    rec: dict = {"workload": graph_name, "dtype": dtype, "kernels": [k.name for k in plan.kernels]}
    if feature == "pdl" and len(plan.kernels) < 2:
        return {**rec, "status": "skipped: one kernel"}
    cfg = resolve_config(plan)
    source = render(plan)
    launches = {}
    verifier = GpuVerifier(plan, graph, device="cuda")
    without = FEATURES[feature](plan, source)
    if without == source:
        return {**rec, "status": f"skipped: no {feature} code"}
    if feature == "persistent":
        funcs = {}
        for variant, src in (("with", source), ("without", without)):
            module = load_module(src, work / f"{re.sub(r'[^A-Za-z0-9_]', '_', graph_name)}_{dtype}_{variant}_s.py")
            funcs[variant] = {k: str(f) for k, f in module.build_kernels(cfg).items()}
        if funcs["with"] == funcs["without"]:
            return {**rec, "status": "skipped: one wave at this config"}
    for variant, src in (("with", source), ("without", without)):
        module = load_module(src, work / f"{re.sub(r'[^A-Za-z0-9_]', '_', graph_name)}_{dtype}_{variant}.py")
        t0 = time.monotonic()
        kernels = module.compile_kernels(cfg)
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


def warm_cases(script: str, cases: list[tuple[str, ...]], end: float, jobs: int) -> None:
    """Run ``script --warm CASE...`` for every case, ``jobs`` at a time, each stopped a minute before
    ``end`` (monotonic): the compiles fill TileLang's kernel cache, so the one process that measures
    compiles in seconds and its timings are not disturbed by compiles beside them."""
    def warm(case: tuple[str, ...]) -> None:
        left = end - time.monotonic() - 60
        if left > 0:
            try:
                subprocess.run([sys.executable, script, "--warm", *case], timeout=left, capture_output=True)
            except subprocess.TimeoutExpired:
                pass

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(warm, cases))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--feature", default="pdl", help=f"comma-separated features of {sorted(FEATURES)}")
    ap.add_argument("--workloads", default="RMSNorm",
                    help="comma-separated catalog names (NAME:axis=N;axis=N overrides shapes) or graph JSON files")
    ap.add_argument("--dtypes", default="bfloat16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=200)
    ap.add_argument("--jobs", type=int, default=8, help="parallel compile (warm-up) processes")
    ap.add_argument("--warm", nargs=3, metavar=("FEATURE", "WORKLOAD", "DTYPE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    features = args.feature.split(",")
    if set(features) - set(FEATURES):
        ap.error(f"unknown feature(s) {sorted(set(features) - set(FEATURES))}: choose from {sorted(FEATURES)}")
    work = Path("/tmp/superopt_ab")
    work.mkdir(parents=True, exist_ok=True)
    if args.warm:
        print(json.dumps(measure(*args.warm, work, args.rounds, warm_only=True), default=str))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    end = time.monotonic() + args.budget_s - 10
    cases = [(f, w, dt) for f in features for w in args.workloads.split(",") for dt in args.dtypes.split(",")]

    t0 = time.monotonic()
    warm_cases(__file__, cases, end, args.jobs)
    print(f"warm-up: {len(cases)} case(s) compiled in {time.monotonic() - t0:.0f} s", flush=True)
    rows = []
    with open(out / "ab.jsonl", "a") as log:
        for f, w, dt in cases:
            if time.monotonic() > end - 30:
                rows.append({"feature": f, "workload": w, "dtype": dt, "status": "skipped: budget spent"})
                continue
            try:
                rec = measure(f, w, dt, work, args.rounds)
            except Exception as e:  # noqa: BLE001 - one failing workload must not lose the others
                rec = {"workload": w, "dtype": dt, "status": f"error: {type(e).__name__}: {e}"}
            rec["feature"] = f
            print(json.dumps(rec, default=str), flush=True)
            log.write(json.dumps(rec, default=str) + "\n")
            rows.append(rec)
    print("\n| feature | workload | dtype | with (us) | without (us) | gain |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        head = f"| {r['feature']} | {r['workload']} | {r['dtype']} |"
        if r.get("status") == "ok":
            a, b = r["us"]["with"], r["us"]["without"]
            print(f"{head} {a:.1f} | {b:.1f} | {b - a:+.1f} us ({b / a:.3f}x) |")
        else:
            print(f"{head} - | - | {r.get('status')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
