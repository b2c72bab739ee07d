"""GPU diagnosis of kernels that fail verification: which kernel, which tiles, under which lowering.

For each case (a sweep case id such as ``mlp_relu_squared@real/bf16``) and each variant, a worker
process plans the case, compiles it (variant: TileLang pass configs or config overrides), checks it
against float64 (``run.verify.GpuVerifier``) and, for the ``default`` variant, bisects it kernel by
kernel against the CPU executor on the device's own intermediates (``run.bisect``). A variant that
passes where ``default`` fails names the lowering feature at fault.

Run on the GPU machine through gpu_run.sh's environment:
    SCRIPT=benchmarks/gpu_diagnose.py TOTAL_S=300 OUT=/tmp/diag bash benchmarks/gpu_run.sh --cases A,B
    SCRIPT=benchmarks/gpu_diagnose.py TOTAL_S=300 bash benchmarks/gpu_run.sh --device a100 --cases A   # Ampere
Writes ``diagnose.jsonl`` (one record per case x variant) under ``--out`` and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests", ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

VARIANTS: dict[str, dict] = {
    "default": {},
    "no_smem_reuse": {"pass": {"tl.disable_shared_memory_reuse": True}},
    "no_warp_spec": {"pass": {"tl.disable_warp_specialized": True}},
    "no_tma": {"pass": {"tl.disable_tma_lower": True}},
    "stages1": {"stages": 1},
    "block16": {"config": {"block_d": 16, "block_e": 16, "block_n": 16}},  # narrow output columns
    "threads256": {"config": {"threads": 256}},
}


def _case(case_id: str):
    import gpu_sweep

    name = case_id.split("@")[0]
    ns = argparse.Namespace(random=64, random_seed0=0, wild=1000, wild_seed0=0, shapes="small,real,odd",
                            dtypes="bf16,fp16", only=name, graph=[])
    for c in gpu_sweep.collect(ns):
        if c.id == case_id:
            return c
    raise SystemExit(f"error: no sweep case {case_id!r}")


def sweep_plan(case_id: str, device: str | None = None):
    """The graph and plan ``gpu_sweep --device`` ran for the case: the backend of ``device`` (None: the default
    device) with its committed tuning database (``(graph, plan, backend)``)."""
    from pyrunner.backend.tilelang.backend import backend_for
    from pyrunner.ir.graph_json import graph_from_json
    from pyrunner.pipeline import best_plan
    from pyrunner.target.device import DEFAULT_DEVICE
    from pyrunner.target.tuning import committed_tuning

    case = _case(case_id)
    graph = graph_from_json(case.graph)
    backend = backend_for(device or DEFAULT_DEVICE)
    (plan,) = best_plan(graph, case.dtype, backend=backend, tuning=committed_tuning(backend.device.name))
    return graph, plan, backend


def worker(case_id: str, variant: str, device: str) -> dict:
    import torch

    from pyrunner.backend.tilelang.compile import local_gpu_arch, rendered_module
    from pyrunner.plan.analysis import resolve_config
    from pyrunner.run.bisect import bisect_kernels
    from pyrunner.run.verify import GpuVerifier

    graph, plan, backend = sweep_plan(case_id, device)
    target = backend.target.running_on(local_gpu_arch())  # an sm_80 build on a newer GPU, as the sweep builds it
    spec = VARIANTS[variant]
    over = {k.name: {"stages": spec["stages"]} for k in plan.kernels
            if "stages" in spec and k.loop is not None and isinstance(k.loop.stages, str)}
    widened = []
    for k in plan.kernels:  # config overrides of the variant where the kernel has the parameter (space widened)
        params = dict(k.params)
        for p, v in spec.get("config", {}).items():
            if p in params:
                over.setdefault(k.name, {})[p] = v
                params[p] = sorted(set(params[p]) | {v})
        widened.append(k.model_copy(update={"params": params}))
    if widened != list(plan.kernels):  # an edited plan: its stored hash no longer holds
        prov = plan.provenance.model_copy(update={"plan_hash": ""})
        plan = plan.model_copy(update={"kernels": widened, "provenance": prov})
    values = resolve_config(plan, over or None)
    module = rendered_module(plan, None, target)
    module.PASS_CONFIGS = {**module.PASS_CONFIGS, **spec.get("pass", {})}
    t0 = time.monotonic()
    kernels = module.compile_kernels(values, target=target.target)
    rec: dict = {"case": case_id, "variant": variant, "device": device,
                 "compile_s": round(time.monotonic() - t0, 1),
                 "config": values, "structure": [k.name for k in plan.kernels]}
    args = {name: a for name, _, a in module.KERNELS}

    def launch(tensors: dict) -> None:
        module.launch(tensors, values, kernels=kernels)

    verifier = GpuVerifier(plan, graph, device="cuda")
    res = verifier.check(launch)
    rec.update(ok=res.ok, error=res.error, bound=res.bound, per_output=res.per_output)
    if variant == "default":
        tensors = verifier.tensors()

        def run_one(name: str) -> None:
            kernels[name](*(tensors[a] for a in args[name]))
            torch.cuda.synchronize()

        rec["bisect"] = [vars(v) for v in bisect_kernels(plan, run_one, tensors, values, res.bound)]
    return rec


def main(argv: list[str] | None = None) -> int:
    from pyrunner.target.device import DEFAULT_DEVICE, DEVICES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="", help="comma-separated sweep case ids")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=400, help="wall-clock budget for everything")
    ap.add_argument("--device", default=DEFAULT_DEVICE, metavar="NAME",
                    help=f"the backend the sweep ran the cases for ({', '.join(DEVICES)}), as gpu_sweep --device")
    ap.add_argument("--worker", nargs=2, metavar=("CASE", "VARIANT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        try:
            print("RECORD " + json.dumps(worker(*args.worker, args.device), default=str), flush=True)
        except Exception as e:  # noqa: BLE001 - reported as the case's record
            import traceback

            traceback.print_exc()
            print("RECORD " + json.dumps({"case": args.worker[0], "variant": args.worker[1], "ok": False,
                                          "failure": f"{type(e).__name__}: {str(e).splitlines()[-1:]}"}), flush=True)
        return 0
    if not args.cases:
        ap.error("--cases is required")
    from pyrunner.backend.tilelang.backend import device_name
    from pyrunner.errors import UserError

    try:
        args.device = device_name(args.device)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(c, v) for c in args.cases.split(",") for v in args.variants.split(",")]
    log = open(out / "diagnose.log", "a")
    end = time.monotonic() + args.budget_s - 10

    def run(job: tuple[str, str]) -> dict:
        left = end - time.monotonic()
        if left < 20:
            return {"case": job[0], "variant": job[1], "ok": False, "failure": "skipped: budget spent"}
        try:
            p = subprocess.run([sys.executable, __file__, "--worker", *job, "--device", args.device],
                               capture_output=True, text=True, timeout=left)
            text = p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            text = f"timeout after {left:.0f} s\n{e.stdout or ''}"
        log.write(f"===== {job}\n{text}\n")
        log.flush()
        lines = [ln[7:] for ln in text.splitlines() if ln.startswith("RECORD ")]
        rec = json.loads(lines[-1]) if lines else {"case": job[0], "variant": job[1], "ok": False,
                                                    "failure": text.strip().splitlines()[-1:] or "no output"}
        print(f"{job[0]:44s} {job[1]:14s} {'ok' if rec.get('ok') else 'WRONG':6s} "
              f"err {rec.get('error')} {rec.get('failure', '')}", flush=True)
        return rec

    with ThreadPoolExecutor(args.jobs) as pool:
        records = list(pool.map(run, jobs))
    with open(out / "diagnose.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r, default=str) + "\n")
    print("\n== diagnosis: error per case and variant (ok / WRONG)")
    for c in args.cases.split(","):
        row = [r for r in records if r["case"] == c]
        print(c, " ".join(f"{r['variant']}={'ok' if r.get('ok') else 'WRONG'}({r.get('error')})" for r in row))
        for r in row:
            for v in r.get("bisect", []):
                print(f"   bisect {v['kernel']}: errors {v['errors']} bad tiles {v['bad_tiles']} "
                      f"rows {v['bad_rows_in_tile']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
