"""GPU demo of the PyTorch frontend: a decoder block through ``optimize`` and ``torch.compile(backend="superopt")``
beside eager and ``torch.compile``, and ``load`` / ``export`` round trips for every catalog plan.

Run on the GPU machine (carry ``.device``; TileLang is unpacked by gpu_run.sh, which then runs this script)::

    SCRIPT=benchmarks/torch_demo.py TOTAL_S=230 bash benchmarks/gpu_run.sh

Steps (each guarded: one failure is a table row, never the end of the run):

1. Plan everything on the CPU: the catalog workloads (bf16, DESIGN sizes) and the decoder block's regions.
2. Compile every plan in parallel worker processes into the kernel cache (``pyrunner.frontend.cache``).
3. ``load`` each catalog plan with ``verify=True`` (float64 check on fresh inputs), run it on random
   inputs; ``export`` it, and in a separate process that never imports pyrunner run each exported module
   on the same inputs: outputs must be identical (same kernels). That process then imports pyrunner and
   times ``load(plan).compile()`` from the warm cache (a second process's start).
4. The decoder block (bf16): eager, ``torch.compile``, ``optimize`` and the superopt backend, each compared
   with the float64 model (normalised max error; bound ``verify.BOUNDS['bfloat16']``) and timed
   (CUDA-event medians, same warm-up for all).

``--small`` runs steps 1 and 3's export half on a CPU (no compile, no timing) to check the script itself.
Must finish in under 4 minutes on an H200; a short table is printed last.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

DECODER = {"d": 1024, "heads": 8, "head_dim": 128, "ffn": 4096}
TOKENS = 2048
BOUND = 3e-2
CACHE = Path(os.environ.get("SUPEROPT_CACHE_DIR") or "/tmp/superopt-demo-cache")
os.environ["SUPEROPT_CACHE_DIR"] = str(CACHE)


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []

    def add(self, what: str, result: str, detail: str = "") -> None:
        self.rows.append((what, result, detail))
        print(f"[{what}] {result} {detail}", flush=True)

    def print(self) -> None:
        w0 = max(len(r[0]) for r in self.rows)
        w1 = max(len(r[1]) for r in self.rows)
        print("\n" + "=" * 100)
        for a, b, c in self.rows:
            print(f"{a.ljust(w0)}  {b.ljust(w1)}  {c}")


def short(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


def err(y, ref) -> float:
    import torch

    y = y.to(torch.float64)
    if not bool(torch.isfinite(y).all()):
        return float("inf")
    return float((y - ref).abs().max() / ref.abs().max())


# --- step 1: plans ---------------------------------------------------------------

def catalog_plans() -> dict:
    from pyrunner.ir import catalog
    from pyrunner.pipeline import best_plan
    from pyrunner.target.tuning import committed_tuning

    db = committed_tuning()
    return {name: best_plan(catalog.get(name), "bfloat16", tuning=db)[0] for name in catalog.CATALOG}


def decoder(device: str):
    import torch
    from frontend_models import DecoderBlock

    m = DecoderBlock(**DECODER).to(device=device, dtype=torch.bfloat16).eval().requires_grad_(False)
    x = torch.randn(TOKENS, DECODER["d"], generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)
    return m, x


def decoder_plans(m, x) -> list:
    from pyrunner.frontend.compile import Options, compile_graph
    from pyrunner.frontend.optimize import capture_graph
    from pyrunner.frontend.partition import example_values

    gm, inputs = capture_graph(m, x)  # dynamo's graph, as the backend and optimize see it
    values = example_values(gm, tuple(inputs))
    _, report = compile_graph(gm, values.__getitem__, Options(executor="plan", name="decoder", verify=False),
                              strict=False)
    return [c.plan for c in report.regions]


# --- step 2: parallel compile ------------------------------------------------------

def warm_worker(paths: list[str]) -> int:
    import pyrunner

    for p in paths:
        t0 = time.perf_counter()
        try:
            pyrunner.load(p).compile()
            print(f"warm: compiled {Path(p).name} in {time.perf_counter() - t0:.1f} s", flush=True)
        except Exception as e:  # noqa: BLE001 - reported, the main process retries and reports
            print(f"warm: {Path(p).name} failed: {short(e)}", flush=True)
    return 0


def warm(plan_files: list[tuple[Path, int]], jobs: int, timeout: float, table: Table) -> None:
    """Compile (path, kernel count) plans in ``jobs`` processes, longest first to the least loaded."""
    t0 = time.perf_counter()
    groups: list[list[str]] = [[] for _ in range(jobs)]
    load = [0] * jobs
    for path, kernels in sorted(plan_files, key=lambda pk: -pk[1]):
        i = load.index(min(load))
        groups[i].append(str(path))
        load[i] += kernels
    procs = [subprocess.Popen([sys.executable, __file__, "--warm", *g], cwd=ROOT) for g in groups if g]
    for p in procs:
        try:
            p.wait(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
    table.add("compile (parallel warm-up)", f"{len(plan_files)} plans", f"{time.perf_counter() - t0:.0f} s, "
              f"{len(procs)} processes")


# --- step 3: load / export round trips ------------------------------------------------

RUN_EXPORTS = r"""
import json, os, sys, time, importlib.util, torch
out = {}
cases = json.load(open(sys.argv[1]))
for name, c in cases.items():
    try:
        os.environ["TILELANG_CACHE_DIR"] = c["tilelang_cache"]
        spec = importlib.util.spec_from_file_location("exported_" + name, c["module"])
        mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
        inputs = torch.load(c["inputs"])
        y = mod.forward(*[inputs[k].cuda() for k in c["order"]])
        torch.save(tuple(t.cpu() for t in (y if isinstance(y, tuple) else (y,))), c["result"])
        out[name] = "ok"
    except Exception as e:
        out[name] = f"{type(e).__name__}: {e}"[:300]
out["__pyrunner_imported__"] = any(m.startswith("pyrunner") for m in sys.modules)
os.environ.pop("TILELANG_CACHE_DIR", None)
sys.path.insert(0, sys.argv[2])
t0 = time.perf_counter(); import pyrunner.frontend; t1 = time.perf_counter()
starts = {}
for name, c in cases.items():
    try:
        f = pyrunner.load(c["plan"]); s = time.perf_counter(); f.compile(); starts[name] = time.perf_counter() - s
    except Exception as e:
        starts[name] = f"{type(e).__name__}: {e}"[:200]
out["__import_s__"] = t1 - t0
out["__starts__"] = starts
print("RESULT " + json.dumps(out))
"""


def round_trips(plans: dict, out: Path, table: Table, small: bool, deadline: float) -> None:
    import torch

    import pyrunner
    from pyrunner.frontend.cache import device_key, entry_dir
    from pyrunner.frontend.export import export_source
    from pyrunner.plan.analysis import resolve_config

    exp = out / "export"
    exp.mkdir(parents=True, exist_ok=True)
    cases: dict[str, dict] = {}
    loaded_out: dict[str, tuple] = {}
    for name, plan in plans.items():
        if time.monotonic() > deadline:
            table.add(f"load {name}", "SKIPPED", "time budget")
            continue
        try:
            src = export_source(plan)
            mod_path = exp / f"{name}.py"
            mod_path.write_text(src)
            if small:
                table.add(f"export {name}", "written", f"{len(src.splitlines())} lines")
                continue
            f = pyrunner.load(plan, verify=True)
            g = torch.Generator().manual_seed(7)
            inputs = {s.name: (torch.randn(s.shape, generator=g) * 0.5).to("cuda", getattr(torch, s.dtype))
                      for s in f.sig.inputs}
            t0 = time.perf_counter()
            y = f(**inputs)
            y = y if isinstance(y, tuple) else (y,)
            loaded_out[name] = tuple(t.cpu() for t in y)
            table.add(f"load {name}", "verified", f"{f.verified.message}; {len(plan.kernels)} kernel(s), first call "
                      f"{time.perf_counter() - t0:.1f} s")
            ins = exp / f"{name}.inputs.pt"
            torch.save({k: v.cpu() for k, v in inputs.items()}, ins)
            cfg = resolve_config(plan, None)  # what load() compiled: its cache entry
            plan_path = exp / f"{name}.plan.json"
            plan_path.write_text(plan.model_dump_json())
            cases[name] = {"module": str(mod_path), "inputs": str(ins), "order": list(f.sig.input_names),
                           "result": str(exp / f"{name}.result.pt"), "plan": str(plan_path),
                           "tilelang_cache": str(entry_dir(plan, cfg, device_key()) / "tilelang")}
        except Exception as e:  # noqa: BLE001
            table.add(f"load {name}", "FAIL", short(e))
    if small or not cases:
        return
    spec = exp / "cases.json"
    spec.write_text(json.dumps(cases))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                        if p and Path(p).resolve() != ROOT)
    try:
        proc = subprocess.run([sys.executable, "-c", RUN_EXPORTS, str(spec), str(ROOT)], cwd=exp, env=env,
                              capture_output=True, text=True, timeout=max(10.0, deadline - time.monotonic()))
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            table.add("export subprocess", "FAIL", (proc.stderr or proc.stdout)[-400:].replace("\n", " | "))
            return
        res = json.loads(line[len("RESULT "):])
    except subprocess.TimeoutExpired:
        table.add("export subprocess", "FAIL", "timed out")
        return
    table.add("exported modules import pyrunner?", "no" if not res["__pyrunner_imported__"] else "YES (bug)")
    for name in cases:
        if res.get(name) != "ok":
            table.add(f"export {name}", "FAIL", str(res.get(name)))
            continue
        got = torch.load(cases[name]["result"])
        same = len(got) == len(loaded_out[name]) and all(torch.equal(a, b) for a, b in zip(got, loaded_out[name]))
        table.add(f"export {name}", "identical to load" if same else "DIFFERS from load")
    starts = res["__starts__"]
    ok = [v for v in starts.values() if isinstance(v, float)]
    if ok:
        table.add("second process: load().compile() from cache", f"max {max(ok):.2f} s",
                  f"median {sorted(ok)[len(ok) // 2]:.2f} s over {len(ok)} plans; `import pyrunner.frontend` "
                  f"(torch, tilelang) {res['__import_s__']:.1f} s")


# --- step 4: the decoder block ----------------------------------------------------------

LOG = Path("results.jsonl")


def decoder_demo(m, x, table: Table, deadline: float) -> None:
    import torch

    import pyrunner
    from pyrunner.frontend.backend import LAST_REPORTS
    from pyrunner.run.timing import median_us

    with torch.no_grad():
        m64 = copy.deepcopy(m).double()
        ref = m64(x.double())
        del m64
        y_eager = m(x)
        table.add("decoder eager bf16", f"err {err(y_eager, ref):.2e}", f"(vs float64 model; bound {BOUND:g})")
        times: dict[str, float] = {"eager": median_us(lambda: m(x))}
        runs: dict = {}
        try:
            t0 = time.perf_counter()
            opt = pyrunner.optimize(m, x, log=LOG)
            y = opt(x)
            e = err(y, ref)
            table.add("decoder optimize", f"err {e:.2e}", f"{'OK' if e <= BOUND else 'ABOVE BOUND'}; "
                      f"vs eager bf16 {err(y, y_eager.double()):.2e}; "
                      f"{opt.report.summary().splitlines()[0]}; built in {time.perf_counter() - t0:.0f} s")
            for line in opt.report.summary().splitlines()[1:]:
                table.add("  optimize region", line.strip())
            runs["optimize"] = lambda: opt(x)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            table.add("decoder optimize", "FAIL", short(e))
        for name, backend in (("backend superopt", "superopt"), ("torch.compile", "inductor")):
            if time.monotonic() > deadline:
                table.add(f"decoder {name}", "SKIPPED", "time budget")
                continue
            try:
                torch._dynamo.reset()
                t0 = time.perf_counter()
                c = torch.compile(m, backend=backend, options={"log": str(LOG)} if backend == "superopt" else None)
                y = c(x)
                e = err(y, ref)
                extra = LAST_REPORTS[-1].summary().splitlines() if backend == "superopt" and LAST_REPORTS else []
                table.add(f"decoder {name}", f"err {e:.2e}", f"{'OK' if e <= BOUND else 'ABOVE BOUND'}; "
                          f"vs eager bf16 {err(y, y_eager.double()):.2e}; "
                          f"compiled in {time.perf_counter() - t0:.0f} s" + (f"; {extra[0]}" if extra else ""))
                for line in extra[1:]:
                    table.add("  backend", line.strip())
                runs[name] = (lambda c=c: c(x))
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                table.add(f"decoder {name}", "FAIL", short(e))
        for name, fn in runs.items():
            try:
                times[name] = median_us(fn)
            except Exception as e:  # noqa: BLE001
                table.add(f"time {name}", "FAIL", short(e))
    base = times["eager"]
    for name, us in times.items():
        table.add(f"time decoder {name}", f"{us:9.1f} us", f"{base / us:.2f}x eager")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "results" / "torch_demo"))
    ap.add_argument("--budget-s", type=float, default=220.0)
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--small", action="store_true", help="CPU check of the script: plan and export only")
    ap.add_argument("--warm", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.warm is not None:
        return warm_worker(args.warm)
    start = time.monotonic()
    deadline = start + args.budget_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    global LOG
    LOG = out / "results.jsonl"
    table = Table()
    import torch

    device = "cpu" if args.small else "cuda"
    table.add("environment", f"torch {torch.__version__}",
              torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")
    t0 = time.perf_counter()
    plans = catalog_plans()
    m, x = decoder(device)
    dplans = decoder_plans(m, x)
    table.add("planning", f"{len(plans)} catalog + {len(dplans)} decoder plans", f"{time.perf_counter() - t0:.1f} s")
    pdir = out / "plans"
    pdir.mkdir(exist_ok=True)
    files = []
    for i, p in enumerate(list(plans.values()) + dplans):
        f = pdir / f"{i:02d}_{p.workload}_{p.provenance.plan_hash}.json"
        f.write_text(p.model_dump_json())
        files.append((f, len(p.kernels)))
    if not args.small:
        warm(files, args.jobs, 0.45 * args.budget_s, table)
    round_trips(plans, out, table, args.small, start + 0.6 * args.budget_s)
    if not args.small:
        decoder_demo(m, x, table, deadline - 40)
    table.add("total", f"{time.monotonic() - start:.0f} s")
    table.print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
