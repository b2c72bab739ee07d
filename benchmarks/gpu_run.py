"""The one GPU benchmark: plan, render, compile, verify and time every seed workload against PyTorch.

Run on the GPU machine through ``benchmarks/gpu_run.sh`` (it unpacks TileLang and the carried
wheels first). For each workload of the catalog's seed set (and each ``--graph`` JSON file) in
each dtype at the DESIGN shapes: plan with ``pyrunner.planner.search``, then run the plan in its
own process (``pyrunner.run.runner.run_plan``: compile, verify against the float64 reference, autotune
over a small sample, time beside eager / torch.compile / max-autotune / the vendor kernel), one
record each in ``$OUT/results.jsonl``. Then the report (``$OUT/report.md``, ``$OUT/speedups.png``),
the rendered sources (``$OUT/sources.tar.gz``), the full log (``$OUT/gpu_run.log``), and a short
table printed last.

Time: everything must end well inside the device tool's 10-minute command limit. Phase 1 warms
the on-disk caches (TileLang kernels, inductor graphs and autotune picks) in parallel worker
processes, bounded by a share of the budget; phase 2 runs each plan in its own process under a
per-run deadline (max-autotune is skipped when the deadline is near) and a hard kill, and a
killed or crashed run is still logged, from its checkpoint. One failing workload never stops the
others.

``--device NAME[,NAME]`` picks the backends the plans are made, rendered and compiled for (default:
the GPU found here, h200 without one). ``--device h200,a100`` times every workload on the Hopper path
and on the Ampere path (sm_80, built to run on the newer GPU from its own instruction set, as
``gpu_sweep --device a100`` does) in one command: the first device's records go to
``$OUT/results.jsonl`` as before, each other's to ``$OUT/results_<device>.jsonl`` (report in
``$OUT/<device>/``), every record says its backend (``extra.backend``), and a table of the plan times
side by side is printed last. Only the GPU's own backend's times enter the tuning database.

``--alternatives N`` also times the next N distinct plans of each graph (verified and autotuned
like the first, without baselines; records in ``$OUT/alternatives.jsonl``). Their times land in the
tuning database, whose measured times the planner prefers, so runs teach it which *plan* is
fastest, not only which config: a plan the model ranks second is measured once and then chosen
on its merits.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_BUDGET_S = 500.0
WARMUP_MS = 25.0
REP_MS = 100.0
"""Warm-up and timing per function, the same for the plan and every baseline (split over the rounds)."""
WARM_SHARE = 0.5
"""Fraction of the budget the parallel warm-up phase may use at most."""
MIN_RUN_S = 25.0


class Tee:
    """Everything printed goes to the terminal and to the full log."""

    def __init__(self, path: Path) -> None:
        self.fh = open(path, "a", buffering=1)

    def __call__(self, *parts: object) -> None:
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        self.fh.write(line + "\n")

    def raw(self, text: str) -> None:
        self.fh.write(text if text.endswith("\n") else text + "\n")


def _env_report(say: Tee) -> None:
    try:
        import torch

        dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "NO GPU"
        say(f"python {sys.version.split()[0]}  torch {torch.__version__}  device: {dev}")
    except Exception as e:  # noqa: BLE001
        say(f"torch import failed: {e}")
    for mod in ("triton", "tilelang", "pydantic"):
        try:
            m = __import__(mod)
            say(f"{mod} {getattr(m, '__version__', '?')}")
        except Exception as e:  # noqa: BLE001
            say(f"{mod}: NOT importable ({type(e).__name__}: {e})")


# --- planning --------------------------------------------------------------------

SECOND_SHAPES = (
    ("Attention", {"t_q": 8192, "t_kv": 8192}),
    ("Attention", {"t_q": 1024, "t_kv": 1024}),
    ("Matmul", {"m": 4096, "d": 4096, "n": 4096}),
    ("RMSNormMLP", {"m": 8192}),
)
"""``--shapes2``: the second shape set, so gains are not tuned to one shape."""


def _graphs(args) -> list[tuple[str, object]]:
    """(tag, graph) to run: the tag names the plan file (workload, and shapes where not the default)."""
    from pyrunner.ir import catalog as workloads
    from pyrunner.ir.graph_json import load_graph_file

    out = []
    if not args.shapes2_only:
        for name in args.workloads.split(","):
            if name:
                out.append((name, workloads.get(name)))
    if args.shapes2 or args.shapes2_only:
        for name, sizes in SECOND_SHAPES:
            tag = name + "_" + "_".join(f"{a}{n}" for a, n in sorted(sizes.items()))
            out.append((tag, workloads.get(name, sizes)))
    for path in args.graph or []:
        g = load_graph_file(path)
        out.append((g.name, g))
    return out


ALT = "~alt"
"""Job names of alternative plans: ``<tag>~alt<rank>`` (timed without baselines, logged apart)."""
AT = "@"
"""Job names of plans for a backend other than the first ``--device``: ``<tag>@<device>``."""

Job = tuple[str, str, Path, str]
"""(job name, dtype, plan file, device name of the backend it is built for)."""


def devices_of(arg: str | None) -> list[str]:
    """The known device names ``--device`` lists (comma-separated, first = the primary; None: the GPU found
    here, h200 without one), each once; UserError naming the known ones for an unknown name."""
    from pyrunner.backend.tilelang.backend import device_name
    from pyrunner.errors import UserError

    if arg is None:
        return [device_name(None)]
    names = [device_name(d) for d in arg.split(",") if d.strip()]
    if not names:
        from pyrunner.target.device import DEVICES

        raise UserError(f"--device: name at least one device ({', '.join(DEVICES)})")
    return list(dict.fromkeys(names))


def results_file(out: Path, devices: list[str], device: str) -> Path:
    """Where ``device``'s records go: ``results.jsonl`` for the first device, ``results_<device>.jsonl`` else."""
    return out / ("results.jsonl" if device == devices[0] else f"results_{device}.jsonl")


def backend_label(device: str) -> str:
    """What a record says of its backend: ``a100 (tilelang-ampere, sm_80)``."""
    from pyrunner.backend.tilelang.backend import describe

    return describe(device)


def _plan_all(args, work: Path, results: Path, say: Tee,
              graphs: list[tuple[str, object]] | None = None) -> list[Job]:
    """Plan every (device, graph, dtype), with ``--alternatives`` more per graph; a planner failure is
    logged as a failed record. ``graphs``: ``_graphs(args)`` when the caller has loaded them already."""
    from pyrunner.backend.tilelang.backend import backend_for
    from pyrunner.log.results import append_record, make_record
    from pyrunner.pipeline import best_plan
    from pyrunner.planner.search import ranked_plan_configs
    from pyrunner.target.tuning import committed_tuning

    jobs: list[Job] = []
    (work / "plans").mkdir(parents=True, exist_ok=True)
    graphs = _graphs(args) if graphs is None else graphs
    devices = getattr(args, "devices", None) or devices_of(None)
    for device in devices:
        backend = backend_for(device)
        log = results_file(results.parent, devices, device)
        at = "" if device == devices[0] else f"{AT}{device}"
        for dtype in args.dtypes.split(","):
            for tag, g in graphs:
                t = time.monotonic()
                try:
                    for part, pg, wrap in _parts(args, g, dtype, backend):
                        plans = [wrap(p) for p in best_plan(pg, dtype, backend=backend, top=1 + args.alternatives,
                                                            calibration=args.calibration,
                                                            tuning=committed_tuning(backend.device.name))]
                        configs = [ranked_plan_configs(pg, p, max(args.autotune, 1), args.calibration,
                                                       backend.device) for p in plans]
                        jobs += _write_plans(args, work, tag + part + at, dtype, device, plans, configs, t, say)
                except Exception as e:  # noqa: BLE001 - record and go on with the others
                    say(f"PLAN FAILED {g.name} {dtype} ({device}): {type(e).__name__}: {e}")
                    append_record(log, make_record(
                        plan_hash="none", workload=g.name, graph_hash="", shapes=dict(g.sizes), dtype=dtype,
                        device="planner", status="failed-compile", message=f"planner failed: {type(e).__name__}: {e}",
                        extra={"backend": backend_label(device)}))
                    continue
    return jobs


def _parts(args, graph, dtype: str, backend) -> list[tuple[str, object, object]]:
    """(tag suffix, graph to plan, plan wrapper) per graph: the graph itself, or with ``--training`` the two
    halves a training step runs (``planner.saves``): the forward that also writes the saved tensors, and the
    derived backward, whose plan records its derivation so its checks draw saved tensors that belong to the
    inputs. Their kernels are tuned and filed in the tuning database like any other."""
    if not getattr(args, "training", False):
        return [("", graph, lambda p: p)]
    from pyrunner.plan.backward_of import with_backward_of
    from pyrunner.planner.saves import choose_saves

    derived = choose_saves(graph, dtype, args.calibration, backend.device)
    return [("_fwd", derived.forward, lambda p: p), ("_bwd", derived.graph, lambda p: with_backward_of(p, derived))]


def _write_plans(args, work: Path, tag: str, dtype: str, device: str, plans: list, configs: list, t: float,
                 say: Tee) -> list[Job]:
    """Each ranked plan and its configs in ``work/plans``, one job each (the first is ``tag``)."""
    jobs: list[Job] = []
    for rank, (plan, ranked) in enumerate(zip(plans, configs, strict=True), 1):
        name = tag if rank == 1 else f"{tag}{ALT}{rank}"
        path = work / "plans" / f"{name}_{dtype}.json"
        path.write_text(plan.model_dump_json(indent=1))
        path.with_suffix(".configs.json").write_text(json.dumps(ranked))
        measured = " (measured, tuning database)" if plan.cost.model.get("measured") else ""
        say(f"planned {name:14s} {dtype:9s} plan {plan.provenance.plan_hash}  {len(plan.kernels)} kernel(s)  "
            f"predicted {plan.cost.total_us:.1f} us{measured}  {len(ranked)} ranked config(s)  "
            f"for {backend_label(device)}  ({time.monotonic() - t:.1f} s)")
        jobs.append((name, dtype, path, device))
    return jobs


# --- worker processes ---------------------------------------------------------------

def _worker_cmd(args, mode: str, plan: Path, results: Path, work: Path, deadline_s: float,
                checkpoint: Path | None = None, baselines: str | None = None, device: str | None = None) -> list[str]:
    device = device or args.devices[0]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", mode, "--plan", str(plan),
           "--results", str(results), "--work", str(work), "--autotune", str(args.autotune),
           "--deadline-s", f"{deadline_s:.0f}", "--baselines", args.baselines if baselines is None else baselines,
           "--rounds", str(args.rounds), "--device", device]
    if args.tuning_out and device == args.native:  # another backend's times are not this GPU's configs
        cmd += ["--tuning-out", str(args.tuning_out)]
    if checkpoint is not None:
        cmd += ["--checkpoint", str(checkpoint)]
    return cmd


def _run_proc(cmd: list[str], timeout: float, log: Path) -> tuple[int | None, float]:
    """Run a worker with a hard timeout; returns (exit code or None when killed, seconds)."""
    t = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            rc = proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the worker and its compile subprocesses, nothing else
            proc.wait()
            rc = None
    return rc, time.monotonic() - t


def worker(args) -> int:
    from rich.console import Console

    from pyrunner.plan.validate import load_plan
    from pyrunner.run.runner import RunOptions, print_record, run_plan
    from pyrunner.target.device import DEFAULT_DEVICE

    plan = load_plan(args.plan)
    ranked = Path(args.plan).with_suffix(".configs.json")
    opts = RunOptions(
        results=Path(args.results), out_dir=Path(args.work) / "sources", autotune=args.autotune,
        baselines=tuple(b for b in args.baselines.split(",") if b), deadline=time.monotonic() + args.deadline_s,
        checkpoint=Path(args.checkpoint) if args.checkpoint else None, warm_only=args.worker == "warm",
        warmup_ms=WARMUP_MS, rep_ms=REP_MS, rounds=args.rounds,
        candidates=json.loads(ranked.read_text()) if ranked.exists() else None,
        tuning_out=Path(args.tuning_out) if args.tuning_out and args.worker == "run" else None,
        tuning_db=Path(args.tuning_out) if args.tuning_out and args.worker == "warm" else None,
        backend=args.device or DEFAULT_DEVICE,
    )
    console = Console(stderr=True, width=120)
    rec = run_plan(plan, opts, console)
    if args.worker == "run":
        print_record(rec, Console(width=120))
    return _leave(0 if rec.status in ("ok", "skipped") else 1)


def _leave(code: int) -> NoReturn:
    """Exit the worker now, once the device has drained: interpreter teardown (torch.compile's worker
    pools, the profiler) hung past the hard limit after the record was written, so runs that had
    verified and timed were killed and logged as failed-launch (run 38: 17 of 19). An error the
    device raises late still shows: the synchronize fails and the exit code says so."""
    import torch

    try:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - any late device error makes the run a failure
        print(f"error: the device failed after the run: {e}", file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# --- the supervisor ----------------------------------------------------------------

def _warm(args, jobs, results: Path, work: Path, until: float, say: Tee) -> None:
    if args.jobs <= 1 or not jobs:
        return
    say(f"== warm-up: {len(jobs)} plan(s), {args.jobs} at a time, until {until - time.monotonic():.0f} s from now")

    def one(job):
        name, dtype, plan, device = job
        left = until - time.monotonic()
        if left < 5:
            return name, dtype, None, 0.0
        rc, secs = _run_proc(_worker_cmd(args, "warm", plan, results, work, left,
                                         baselines="" if ALT in name else None, device=device), left,
                             work / "logs" / f"warm_{name}_{dtype}.log")
        return name, dtype, rc, secs

    with ThreadPoolExecutor(args.jobs) as pool:
        for name, dtype, rc, secs in pool.map(one, jobs):
            state = "done" if rc == 0 else ("killed at the warm-up limit" if rc is None else f"exit {rc}")
            say(f"warm {name:14s} {dtype:9s} {state} ({secs:.0f} s)")


def _shapes(plan: dict) -> dict[str, int]:
    return {a: n for t in plan["tensors"] for a, n in zip(t["axes"], t["shape"], strict=True)}


def _runs_that_fit(left: float) -> int:
    """How many runs ``left`` seconds hold, at ``MIN_RUN_S / 2`` each (the least a run is started with)."""
    return int(left // (MIN_RUN_S / 2))


def runs_now(remaining: list[str], left: float) -> bool:
    """Whether the first of the ``remaining`` job names is timed with ``left`` seconds to go. When not
    all of them fit (``MIN_RUN_S / 2`` each), the ones that do are the asked-for plans before the
    alternatives, each in the order given: the time goes to the graphs a user listed first, not to
    whichever come last (run 81 skipped its first four graphs, then timed every later one)."""
    fit = _runs_that_fit(left)
    if fit >= len(remaining):
        return True
    ranked = sorted(range(len(remaining)), key=lambda j: (ALT in remaining[j], j))
    return 0 in ranked[:fit]


def _timed(args, jobs, log_path: Path, work: Path, end: float, say: Tee) -> None:
    from pyrunner.log.results import append_record, make_record, read_log
    from pyrunner.run.runner import record_after_exit, record_from_checkpoint

    for i, (name, dtype, plan_path, device) in enumerate(jobs):
        alt = ALT in name  # an alternative plan: no baselines, its own log
        own = results_file(log_path.parent, args.devices, device)
        results = own.with_name(own.name.replace("results", "alternatives")) if alt else own
        left = end - time.monotonic()
        share = left / max(1, min(len(jobs) - i, _runs_that_fit(left)))  # over the jobs that fit
        plan = json.loads(plan_path.read_text())
        phash = plan["provenance"]["plan_hash"]
        if not runs_now([n for n, *_ in jobs[i:]], left):
            say(f"SKIP {name} {dtype}: out of time budget")
            append_record(results, make_record(
                plan_hash=phash, workload=name, graph_hash=plan["provenance"]["graph_hash"],
                shapes=_shapes(plan), dtype=plan["dtype"], extra={"backend": backend_label(device)},
                device="", status="skipped", message="not run: gpu_run time budget exhausted"))
            continue
        hard = max(share, MIN_RUN_S)
        soft = max(hard - 10.0, MIN_RUN_S / 2)
        ck = work / "logs" / f"checkpoint_{name}_{dtype}.json"
        ck.unlink(missing_ok=True)
        # the worker writes its record here; this process appends exactly one record per run to the
        # results log once it knows how the worker ended (a worker killed after writing is no success)
        pending = work / "logs" / f"record_{name}_{dtype}.jsonl"
        pending.unlink(missing_ok=True)
        log = work / "logs" / f"run_{name}_{dtype}.log"
        say(f"== run {name} {dtype} plan {phash} (deadline {soft:.0f} s, hard limit {hard:.0f} s)")
        rc, secs = _run_proc(_worker_cmd(args, "run", plan_path, pending, work, soft, ck,
                                         baselines="" if alt else None, device=device), hard, log)
        text = log.read_text(errors="replace")
        say.raw(f"----- log of run {name} {dtype} -----\n{text}")
        written = read_log(pending)
        if written:
            rec = record_after_exit(written[-1], rc)
            append_record(results, rec)
            say(f"   {name} {dtype}: exit {rc} after {secs:.0f} s; logged as {rec.status}")
            continue
        why = f"killed by gpu_run's time guard after {secs:.0f} s" if rc is None else f"worker exited {rc} (crash?)"
        rec = record_from_checkpoint(ck, why)
        if rec is None:
            tail = " | ".join(text.strip().splitlines()[-3:])[-400:]
            rec = make_record(plan_hash=phash, workload=name, graph_hash=plan["provenance"]["graph_hash"],
                              shapes=_shapes(plan), extra={"backend": backend_label(device)},
                              dtype=plan["dtype"], device="", status="failed-launch",
                              message=f"{why}; no checkpoint; log tail: {tail}")
        append_record(results, rec)
        say(f"   {name} {dtype}: {why}; logged as {rec.status}")


def _seed_tuning(out: Path, say: Tee) -> Path:
    """$OUT/tuning_<device>.json, starting from the committed file: runs add to it; commit it back."""
    import shutil

    from pyrunner.run.timing import device_name
    from pyrunner.target.device import DEFAULT_DEVICE
    from pyrunner.target.tuning import TuningDB, device_key

    dev = device_name()
    key = device_key(dev if dev != "cpu" else DEFAULT_DEVICE)
    dst = out / f"tuning_{key}.json"
    src = TuningDB.for_device(key).path
    if not dst.exists() and src.exists():
        shutil.copyfile(src, dst)
    say(f"tuning database: {dst} (seeded from {src if src.exists() else 'nothing'}); "
        f"commit it as benchmarks/tuning/{key}.json")
    return dst


def _backends_report(args, say: Tee) -> None:
    """Which backend each ``--device`` is, and what its kernels are built for on this GPU."""
    try:
        from pyrunner.backend.tilelang.compile import local_gpu_arch

        gpu = local_gpu_arch()
    except Exception:  # noqa: BLE001 - no GPU: the builds are not run here
        gpu = None
    from pyrunner.backend.tilelang.backend import backend_for, unknown_gpu_note
    from pyrunner.run.timing import device_name

    note = unknown_gpu_note(device_name(), args.native) if gpu else None
    if note is not None:  # a GH200, an H100 PCIe: planned for the backend its arch runs, with that device's numbers
        say(f"note: {note}")
    for device in args.devices:
        t = backend_for(device).target
        built = t.running_on(gpu).gencode() if gpu else "(no GPU here)"
        say(f"backend {backend_label(device)}: built with {built}"
            + ("" if device == args.native else "; not this GPU's own backend: its times stay out of the tuning "
                                                 "database, and A100 times are modelled, not measured"))


def side_by_side(by_device: dict, devices: list[str]) -> str:
    """Plan times of each workload and dtype per backend, the first device's column first, and each other's
    ratio to it (>1: slower on that path on this GPU)."""
    first = {(r.workload, r.dtype): r for r in by_device[devices[0]]}
    others = [d for d in devices[1:] if d in by_device]
    rows = [("workload", "dtype", *(f"{d} us" for d in [devices[0], *others]), *(f"{d}/{devices[0]}" for d in others))]
    index = {d: {(r.workload.split(AT)[0], r.dtype): r for r in by_device[d]} for d in others}
    for (w, dt), r in first.items():
        us = [r.plan_us, *(getattr(index[d].get((w, dt)), "plan_us", None) for d in others)]
        ratios = ["-" if u is None or not us[0] else f"{u / us[0]:.2f}" for u in us[1:]]
        rows.append((w, dt, *("-" if u is None else f"{u:.1f}" for u in us), *ratios))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "plan times by backend (on this GPU):\n" + "\n".join(lines)


def _pack_sources(work: Path, out: Path) -> None:
    with tarfile.open(out / "sources.tar.gz", "w:gz") as tar:
        for sub in ("plans", "sources", "logs"):
            if (work / sub).exists():
                tar.add(work / sub, arcname=sub)


def main(argv: list[str] | None = None) -> int:
    from pyrunner.ir.catalog import SEED_WORKLOADS
    from pyrunner.target.device import DEFAULT_DEVICE, DEVICES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "results/gpu_run")))
    ap.add_argument("--workloads", default=",".join(SEED_WORKLOADS), help="comma-separated catalog names")
    ap.add_argument("--graph", action="append", help="a graph JSON file to run too (repeatable)")
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="wall-clock budget for everything")
    ap.add_argument("--autotune", type=int, default=4, help="configs timed per plan (<= 8; 1 = defaults only)")
    ap.add_argument("--jobs", type=int, default=6, help="parallel warm-up processes (1 = no warm-up)")
    ap.add_argument("--baselines", default="eager,vendor,torch_compile,max_autotune,flex")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds of plan and baselines")
    ap.add_argument("--shapes2", action="store_true",
                    help="also run the second shape set (attention t=8192 and t=1024, matmul 4096^3, "
                         "RMSNormMLP m=8192)")
    ap.add_argument("--shapes2-only", action="store_true", help="run only the second shape set")
    ap.add_argument("--training", action="store_true",
                    help="run each graph's training halves instead: its forward with the saved tensors (<tag>_fwd) "
                         "and its derived backward (<tag>_bwd), verified, autotuned and filed like any plan")
    ap.add_argument("--alternatives", type=int, default=0,
                    help="also time the next N distinct plans of each graph (no baselines; alternatives.jsonl), "
                         "so the tuning database learns which plan is fastest")
    ap.add_argument("--tuning-out", type=Path, default=None,
                    help="tuning database to update (default: $OUT/tuning_<device>.json, seeded from "
                         "benchmarks/tuning/)")
    ap.add_argument("--calibration", type=Path, default=None, help="results log the planner calibrates from")
    ap.add_argument("--work", type=Path, default=Path("/tmp/superopt_gpu_run"))
    ap.add_argument("--device", default=None, metavar="NAME[,NAME]",
                    help=f"backends to plan, render and compile for, first = primary ({', '.join(DEVICES)}; default: "
                         f"the GPU found here, else {DEFAULT_DEVICE}); a100 on a newer GPU runs its sm_80 build there")
    # worker mode (internal)
    ap.add_argument("--worker", choices=("warm", "run"))
    ap.add_argument("--plan")
    ap.add_argument("--results")
    ap.add_argument("--deadline-s", type=float, default=120.0)
    ap.add_argument("--checkpoint")
    args = ap.parse_args(argv)
    args.autotune = max(1, min(args.autotune, 8))
    if args.worker:
        return worker(args)
    from pyrunner.backend.tilelang.backend import local_backend_name
    from pyrunner.errors import UserError

    try:
        args.devices = devices_of(args.device)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.native = local_backend_name()

    start = time.monotonic()
    end = start + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    (args.work / "logs").mkdir(parents=True, exist_ok=True)
    results = args.out / "results.jsonl"
    say = Tee(args.out / "gpu_run.log")
    say(f"== gpu_run: budget {args.budget_s:.0f} s, workloads {args.workloads}, dtypes {args.dtypes}, "
        f"graphs {args.graph or []}, autotune {args.autotune}, warm-up jobs {args.jobs}")
    _env_report(say)
    _backends_report(args, say)
    if args.tuning_out is None:
        args.tuning_out = _seed_tuning(args.out, say)
    try:
        graphs = _graphs(args)  # a missing or malformed graph file is one error line, before any planning
    except UserError as e:
        say(f"error: {e}")
        return 2
    jobs = _plan_all(args, args.work, results, say, graphs)
    warm_until = time.monotonic() + WARM_SHARE * (end - time.monotonic())
    _warm(args, jobs, results, args.work, warm_until, say)
    _timed(args, jobs, results, args.work, end, say)

    from pyrunner.log.report import latest, short_table
    from pyrunner.log.report import main as report_main
    from pyrunner.log.results import read_log

    _pack_sources(args.work, args.out)
    tables, by_device, all_ok = [], {}, True
    for device in args.devices:
        log = results_file(args.out, args.devices, device)
        if not log.exists():
            all_ok = False
            continue
        report_main(["--log", str(log), "--out", str(args.out if device == args.devices[0] else args.out / device)])
        records = by_device[device] = latest(read_log(log))
        all_ok = all_ok and bool(records) and all(r.status == "ok" for r in records)
        table = (f"{backend_label(device)}:\n" if len(args.devices) > 1 else "") + short_table(records)
        alts = log.with_name(log.name.replace("results", "alternatives"))
        if alts.exists():  # the alternatives beside the plan each workload ran with
            table += "\nalternative plans (tuning database only):\n" + "\n".join(
                f"  {r.workload:22s} {r.dtype:9s} plan {r.plan_hash}  "
                f"{'-' if r.plan_us is None else f'{r.plan_us:.1f} us'}  {r.status}" for r in read_log(alts))
        tables.append(table)
    if len(by_device) > 1:
        tables.append(side_by_side(by_device, args.devices))
    table = "\n\n".join(tables)
    say.raw(table)
    say(f"== done in {time.monotonic() - start:.0f} s; results in {args.out}")
    print("\n" + table, flush=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
