"""GPU correctness sweep: every catalog workload, every graph of tests/data and benchmarks/graphs and a
batch of random graphs, each at a small shape and at a real one, planned, rendered, compiled and
verified against float64.

Run on the GPU machine through ``benchmarks/gpu_sweep.sh`` (it unpacks TileLang and the carried
wheels first); ``--dry`` runs anywhere: it plans, renders and lowers to CUDA and skips the GPU.
``--device NAME`` picks the backend the plans are made, rendered and compiled for (default h200;
``a100``: the Ampere backend, sm_80, whose build runs on a newer GPU from its own instruction set,
``CompileTarget.running_on``, so the Ampere path is verified on the H200)::

    bash benchmarks/gpu_sweep.sh --device a100 --jobs 15 --shapes small

Each case (graph x shape) runs in its own worker process (``--jobs`` at a time): plan the best
bf16 plan (``pipeline.best_plan`` with the backend's committed tuning database, as ``superopt`` hands
it out), compile it
(``backend.tilelang.compile.compile_for_gpu``) and
check it once on fresh random inputs with the runner's verifier (``run.verify.GpuVerifier``:
NaN-poisoned outputs, float64 reference, per-dtype bound). A worker records its progress line
by line, so a case killed by the time guard still says how far it got. A case that runs out of GPU
memory beside the other workers halves how many cases run at once and is run again at once under the
narrower limit, alone at the last (``Throttle``, ``run_narrowing``). No timing
here: this is the correctness net, ``gpu_run.sh`` times.

Writes to ``--out`` (default ``$OUT``): ``sweep.log`` (everything, with each worker's full
output), ``cases.jsonl`` (one final record per case, failures with their whole message) and
``summary.json`` (counts and one line per failure); prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests", ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import switches  # noqa: E402 - benchmarks/switches.py, found through the path above

DEFAULT_BUDGET_S = 420.0
CORPUS = ROOT / "tests" / "data"
BENCH_GRAPHS = ROOT / "benchmarks" / "graphs"
"""Operators written as a new user would, at real sizes: swept with the corpus (source ``bench``)."""
FORMAT_EXAMPLES = {"gated_mixture"}
"""tests/data files that document the graph format with odd sizes, not operators to sweep."""
SMALL_CAP, SMALL_HEADS = 128, 2
REAL_SCALE, REAL_CAP = 8, 4096
"""Random graphs are generated at 64..256 per axis; their real shape is 8x that, capped at 4096."""
FINAL = ("ok", "lowered", "failed-plan", "failed-compile", "failed-verification", "failed-launch", "timeout",
         "skipped", "not-checkable")
"""``not-checkable``: compiled and run, but the float64 reference itself is not finite on the draw (the graph's
own math is undefined there, e.g. sqrt's derivative at 0), so the kernel has no verdict; not a failure."""


# --- cases ---------------------------------------------------------------------------

@dataclass
class Case:
    """One graph at one shape."""

    id: str
    source: str  # catalog | corpus | bench | random | wild | file
    graph: dict  # graph JSON document at this case's sizes
    shape: str  # small | real
    dtype: str = "bf16"
    backward: bool = False
    """Sweep the graph's derived backward graph (``--backward``) instead of the graph."""
    saving: bool = False
    """Sweep the graph's forward that also writes what its backward reads (``--with-saves``) instead."""


def small_sizes(sizes: dict[str, int]) -> dict[str, int]:
    """Tile-friendly small shape: long axes cut to 128, head/group counts to 2."""
    return {a: (min(n, SMALL_CAP) if n >= 64 else min(n, SMALL_HEADS)) for a, n in sizes.items()}


def odd_sizes(sizes: dict[str, int]) -> dict[str, int]:
    """Sizes no power-of-two tile divides: 4096 -> 4000, 1024 -> 1000, 128 -> 96 (a free head dim), 256 -> 192;
    head/group counts kept. Exercises the partial last tiles of every axis."""
    def odd(n: int) -> int:
        if n >= 512:
            return n - n * 3 // 128
        return n * 3 // 4 if n >= 64 else n
    return {a: odd(n) for a, n in sizes.items()}


def real_sizes_random(sizes: dict[str, int]) -> dict[str, int]:
    return {a: (min(n * REAL_SCALE, REAL_CAP) if n >= 64 else n) for a, n in sizes.items()}


WILD_SCALE = 4
"""Wild graphs are generated at their own odd sizes; their real shape is 4x that (axes of 48 and up), capped."""


def real_sizes_wild(sizes: dict[str, int]) -> dict[str, int]:
    return {a: (min(n * WILD_SCALE, REAL_CAP) if n >= 48 else n) for a, n in sizes.items()}


def _resized(doc: dict, sizes: dict[str, int]) -> dict:
    return {**doc, "axes": dict(sizes)}


def collect(args) -> list[Case]:
    from graph_strategies import seeded_graph_doc
    from wild_graphs import seeded_wild_doc

    from pyrunner.errors import GraphError
    from pyrunner.ir import catalog
    from pyrunner.ir.graph_json import graph_to_json, read_json_file

    graphs: list[tuple[str, str, dict, dict]] = []  # (name, source, doc, real sizes)
    for name in catalog.CATALOG:
        doc = graph_to_json(catalog.get(name))
        graphs.append((name, "catalog", doc, doc["axes"]))
    for path in sorted(CORPUS.glob("*.json")):
        if path.stem not in FORMAT_EXAMPLES:
            doc = read_json_file(path, "graph file", GraphError)
            graphs.append((path.stem, "corpus", doc, doc["axes"]))
    for path in sorted(BENCH_GRAPHS.glob("*.json")):
        doc = read_json_file(path, "graph file", GraphError)
        graphs.append((path.stem, "bench", doc, doc["axes"]))
    for seed in range(args.random_seed0, args.random_seed0 + args.random):
        doc = seeded_graph_doc(seed)
        graphs.append((doc["name"], "random", doc, real_sizes_random(doc["axes"])))
    wild0 = getattr(args, "wild_seed0", 0)  # callers that build their own options may leave wild graphs out
    for seed in range(wild0, wild0 + getattr(args, "wild", 0)):
        doc = seeded_wild_doc(seed)
        graphs.append((doc["name"], "wild", doc, real_sizes_wild(doc["axes"])))
    for f in args.graph or []:
        if Path(f).resolve().parent == BENCH_GRAPHS.resolve():
            continue  # collected above
        doc = read_json_file(f, "graph file", GraphError)
        graphs.append((Path(f).stem, "file", doc, doc["axes"]))
    if args.only:
        keep = set(args.only.split(","))
        graphs = [g for g in graphs if g[0] in keep]
    cases: list[Case] = []
    for shape in args.shapes.split(","):  # every small case before any real one
        for name, source, doc, real in graphs:
            sizes = {"small": small_sizes, "odd": odd_sizes}.get(shape, lambda s: s)(real)
            for dtype in args.dtypes.split(","):
                cases.append(Case(f"{name}@{shape}/{dtype}", source, _resized(doc, sizes), shape, dtype))
    if getattr(args, "backward", False):
        cases = [replace(c, id=f"{c.id}/bwd", backward=True) for c in cases]
    elif getattr(args, "with_saves", False):
        cases = [replace(c, id=f"{c.id}/saves", saving=True) for c in cases]
    if getattr(args, "cases", None):
        text = args.cases
        ids = set(Path(text[1:]).read_text().split() if text.startswith("@") else text.split(","))
        unknown = ids - {c.id for c in cases}
        if unknown:
            raise SystemExit(f"gpu_sweep: error: no such case(s) among those collected: {', '.join(sorted(unknown))}")
        cases = [c for c in cases if c.id in ids]
    return cases


# --- one case, in a worker process -------------------------------------------------------

@dataclass
class Record:
    id: str
    source: str
    shape: str
    dtype: str
    sizes: dict
    status: str = "started"
    stage: str = "start"  # start | planned | compiled | verified
    plan_hash: str = ""
    kernels: int = 0
    error: float | None = None
    bound: float | None = None
    message: str = ""
    detail: str = ""
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


def _emit(path: Path, rec: Record) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(asdict(rec), allow_nan=False, default=str) + "\n")


def plan_case(case: Case, backend, extra: dict, lower_check: bool = True):
    """The case's plan and the graph it computes (``plan_graph`` of the case's graph).
    ``benchmarks/switch_cases.py`` plans the cases through here too."""
    from pyrunner.ir.graph_json import graph_from_json

    return plan_graph(graph_from_json(case.graph), case.dtype, case.backward, backend, extra, lower_check,
                      saving=getattr(case, "saving", False))


def plan_graph(graph, dtype: str, backward: bool, backend, extra: dict | None = None, lower_check: bool = True,
               saving: bool = False):
    """The plan of ``graph`` (``backward``: of its derived backward; ``saving``: of its forward that also writes
    the tensors that backward reads, which training runs) and the graph it computes, as
    ``superopt --device`` hands it out (the backend's committed tuning database included; ``lower_check=False``:
    the search's top plan, TileLang's lowering gate skipped); what a reader of the record wants (saves of a
    backward, plans the gate skipped) goes to ``extra``. ``benchmarks/gpu_ab.py`` plans its arms through here."""
    from pyrunner.pipeline import best_plan
    from pyrunner.target.tuning import committed_tuning

    extra = {} if extra is None else extra
    derived = None
    if backward or saving:  # as training plans it: the saves the cost model chose, then either half
        from pyrunner.planner.saves import choose_saves

        chosen = choose_saves(graph, dtype, None, backend.device)
        graph = chosen.graph if backward else chosen.forward
        derived = chosen if backward else None
        extra["saved"] = list(chosen.saved)
    notes: list = []
    (plan,) = best_plan(graph, dtype, backend=backend, tuning=committed_tuning(backend.device.name),
                        notes=notes.append, lower_check=lower_check)
    if derived is not None:  # the plan records its derivation (`superopt --backward` writes it so too)
        from pyrunner.plan.backward_of import with_backward_of

        plan = with_backward_of(plan, derived)
    skipped = [n.text for n in notes if n.kind in ("skipped", "naive-fallback")]
    if skipped:
        extra["skipped"] = skipped
    return plan, graph


def run_case(case: Case, results: Path, dry: bool, work: Path, device: str | None = None,
             seed: int | None = None) -> Record:
    """Plan, compile, verify one case for the backend of ``device`` (None: the default device); every stage
    reached is appended to ``results``. ``seed``: the check's draws (a record's ``seed`` reproduces its check;
    None: a fresh one), recorded from the start."""
    from pyrunner.backend.tilelang.backend import backend_for
    from pyrunner.backend.tilelang.diagnose import detail, one_line
    from pyrunner.target.device import DEFAULT_DEVICE

    t0 = time.monotonic()
    rec = Record(case.id, case.source, case.shape, case.dtype, dict(case.graph["axes"]))
    backend = backend_for(device or DEFAULT_DEVICE)
    rec.extra["backend"] = f"{backend.name} ({backend.target.arch})"
    if seed is not None:
        rec.extra["seed"] = seed
    _emit(results, rec)

    def fail(status: str, e: BaseException) -> Record:
        rec.status, rec.message, rec.detail = status, one_line(e), detail(e)
        print(f"[{case.id}] {status}: {rec.message}\n{rec.detail}", flush=True)
        return rec

    try:
        plan, graph = plan_case(case, backend, rec.extra)
    except Exception as e:  # noqa: BLE001 - one failing case never stops the sweep
        return _done(results, fail("failed-plan", e), t0)
    rec.stage, rec.plan_hash, rec.kernels = "planned", plan.provenance.plan_hash, len(plan.kernels)
    rec.extra["structure"] = [f"{k.name}: grid {[g.axis for g in k.grid]}"
                              + (f", loop {k.loop.axis}" if k.loop else "") for k in plan.kernels]
    _emit(results, rec)
    src_dir = work / "sources" / case.id.replace("/", "_").replace("@", "_")
    try:
        from pyrunner.backend.tilelang.compile import check_fits, compile_for_gpu, lower_to_cuda

        check_fits(plan, device=backend.device)
        if dry:
            sources = lower_to_cuda(plan, work_dir=src_dir, target=backend.target)
            rec.extra["cuda_bytes"] = sum(len(s) for s in sources.values())
        else:
            launch = compile_for_gpu(plan, work_dir=src_dir, target=backend.target)
    except Exception as e:  # noqa: BLE001
        return _done(results, fail("failed-compile", e), t0)
    rec.stage = "compiled"
    if dry:
        rec.status, rec.message = "lowered", f"{len(plan.kernels)} kernel(s) lowered to CUDA; GPU skipped (--dry)"
        return _done(results, rec, t0)
    _emit(results, rec)
    try:
        import torch

        from pyrunner.run.verify import GpuVerifier

        # a backward plan records its derivation: every draw computes its saved tensors from its forward
        # inputs (run.backward_draws), on the normal, outlier and planted draws as any plan is checked
        verifier = GpuVerifier(plan, graph, seed=seed, device="cuda")
        res = verifier.check(launch)
        del verifier
        torch.cuda.empty_cache()
    except Exception as e:  # noqa: BLE001
        return _done(results, fail("failed-launch", e), t0)
    rec.error = res.error if math.isfinite(res.error) else None
    rec.bound = res.bound if math.isfinite(res.bound) else None
    rec.message = res.message
    rec.extra["seed"] = res.seed
    rec.extra["draws"] = res.draws_record()
    rec.extra["per_output"] = {k: (v if math.isfinite(v) else str(v)) for k, v in res.per_output.items()}
    rec.stage = "verified" if res.ok else "compiled"
    rec.status = "ok" if res.ok else "not-checkable" if res.uncheckable else "failed-verification"
    print(f"[{case.id}] {rec.status}: {res.message}", flush=True)
    return _done(results, rec, t0)


def _done(results: Path, rec: Record, t0: float) -> Record:
    rec.seconds = round(time.monotonic() - t0, 2)
    _emit(results, rec)
    return rec


def worker(args) -> int:
    case = Case(**json.loads(Path(args.case).read_text()))
    switches.apply(switches.parse_all(args.switch))
    try:
        run_case(case, Path(args.results), args.dry, Path(args.work), args.device, args.seed)
    except BaseException:  # noqa: BLE001 - the supervisor reads the last record anyway
        traceback.print_exc()
        return 1
    return 0


# --- the supervisor ---------------------------------------------------------------------

class Log:
    """Everything printed goes to the terminal and to sweep.log."""

    def __init__(self, path: Path) -> None:
        self.fh = open(path, "a", buffering=1)

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        self.fh.write(line + "\n")

    def raw(self, text: str) -> None:
        self.fh.write(text if text.endswith("\n") else text + "\n")


def _last_record(path: Path) -> dict | None:
    if not path.exists():
        return None
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    return json.loads(lines[-1]) if lines else None


def _run_worker(args, case: Case, idx: int, end: float, log: Log) -> dict:
    work = args.work
    stem = f"{idx:03d}"
    case_file, res_file, out_file = (work / "cases" / f"{stem}.json", work / "results" / f"{stem}.jsonl",
                                     work / "logs" / f"{stem}.log")
    case_file.write_text(json.dumps(asdict(case)))
    res_file.unlink(missing_ok=True)
    left = end - time.monotonic()
    base = {"id": case.id, "source": case.source, "shape": case.shape, "dtype": case.dtype,
            "sizes": case.graph["axes"], "stage": "start", "message": "", "detail": ""}
    if left < 5:
        return {**base, "status": "skipped", "message": "not started: sweep time budget exhausted"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--case", str(case_file),
           "--results", str(res_file), "--work", str(work), "--device", args.device] + (["--dry"] if args.dry else []) \
        + (["--switch", switches.label(args.switches)] if args.switches else []) \
        + (["--seed", str(args.seed)] if args.seed is not None else [])
    t0 = time.monotonic()
    with open(out_file, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            rc = proc.wait(timeout=min(left, args.case_timeout_s))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the worker and its nvcc children, nothing else
            proc.wait()
            rc = None
    secs = time.monotonic() - t0
    log.raw(f"----- worker log of {case.id} (exit {rc}, {secs:.0f} s) -----\n{out_file.read_text(errors='replace')}")
    rec = _last_record(res_file) or base
    if rec.get("status") not in FINAL:
        tail = " | ".join(out_file.read_text(errors="replace").strip().splitlines()[-2:])[-300:]
        why = (f"killed by the time guard after {secs:.0f} s" if rc is None
               else f"worker exited {rc} without a final record: {tail}")
        rec = {**base, **rec, "status": "timeout" if rc is None else "failed-launch",
               "message": f"{why} (last stage reached: {rec.get('stage', 'start')})"}
    rec["seconds"] = round(secs, 2)
    return rec


def out_of_memory(rec: dict) -> bool:
    """The case could not get GPU memory beside the other workers' cases (a launch failure, not a verdict)."""
    return rec.get("status") == "failed-launch" and "out of memory" in str(rec.get("message", "")).lower()


class Throttle:
    """How many cases run at once: ``jobs`` at first, halved by each out-of-memory (never below 1, where a
    case runs alone). Run 168 started 15 real-shape backward checks together; 13 ran out of GPU memory
    and, kept for a retry after the pool, found the budget spent. Run 169 passed all 13 with 4 at once."""

    def __init__(self, jobs: int) -> None:
        self.limit, self.running = max(1, jobs), 0
        self._cond = threading.Condition()

    def acquire(self) -> int:
        """Wait for a slot; the limit it was taken under."""
        with self._cond:
            self._cond.wait_for(lambda: self.running < self.limit)
            self.running += 1
            return self.limit

    def release(self) -> None:
        with self._cond:
            self.running -= 1
            self._cond.notify_all()

    def narrow(self, under: int) -> int:
        """Halve the limit after a case ran out of memory under ``under`` (once per limit: several cases
        failing together narrow it once); the new limit."""
        with self._cond:
            if self.limit >= under and self.limit > 1:
                self.limit = max(1, under // 2)
            return self.limit


def run_narrowing(run: Callable[[], dict], throttle: Throttle, log: Callable[[str], None]) -> dict:
    """``run()`` under the throttle; a case that ran out of GPU memory narrows it and runs again at once, until
    it passes that point or has run alone. The last record counts (``extra.out_of_memory_under``: the limits
    it ran out of memory under)."""
    under: list[int] = []
    while True:
        limit = throttle.acquire()
        try:
            rec = run()
        finally:
            throttle.release()
        if not out_of_memory(rec) or limit == 1:
            break
        under.append(limit)
        log(f"{rec['id']} ran out of GPU memory with {limit} case(s) at once: now at most "
            f"{throttle.narrow(limit)}, and it runs again")
    if under:
        rec["extra"] = {**(rec.get("extra") or {}), "out_of_memory_under": under}
    return rec


def summarize(records: list[dict], dry: bool, seconds: float, device: str | None = None) -> dict:
    """The sweep's figures for ``device`` (None: the default device)."""
    from pyrunner.target.device import DEFAULT_DEVICE

    failed = [r for r in records if r["status"].startswith("failed") or r["status"] == "timeout"]
    return {
        "mode": "dry (no GPU)" if dry else "gpu",
        "device": device or DEFAULT_DEVICE,
        "seconds": round(seconds, 1),
        "cases": len(records),
        "planned": sum(r["stage"] in ("planned", "compiled", "verified") for r in records),
        "compiled": sum(r["stage"] in ("compiled", "verified") for r in records),
        "gpu_verified": sum(r["status"] == "ok" for r in records),
        "failed": len(failed),
        "skipped": sum(r["status"] == "skipped" for r in records),
        "not_checkable": [{"id": r["id"], "message": r["message"]} for r in records if r["status"] == "not-checkable"],
        "draws": draw_counts(records),
        "by_source": {s: sum(r["source"] == s for r in records) for s in sorted({r["source"] for r in records})},
        "failures": [{"id": r["id"], "status": r["status"], "message": r["message"]} for r in failed],
    }


def draw_counts(records: list[dict]) -> dict[str, dict[str, int]]:
    """Per draw (normal, outlier, planted), how many cases' checks ran it and how many skipped it because the
    graph's own values leave the dtype on every magnitude of it (``VerifyResult.draws_record``)."""
    out: dict[str, dict[str, int]] = {}
    for r in records:
        draws = (r.get("extra") or {}).get("draws") or {}
        for key in ("checked", "not_checked"):
            for name in draws.get(key, []):
                out.setdefault(name, {"checked": 0, "not_checked": 0})[key] += 1
    return out


def table(s: dict) -> str:
    lines = [f"== GPU sweep ({s['mode']}, --device {s['device']}"
             + (f", switches {s['switches']}" if s.get("switches") else "") + f"): {s['cases']} cases in "
             f"{s['seconds']:.0f} s",
             f"   planned {s['planned']} / compiled {s['compiled']} / GPU-verified {s['gpu_verified']} / "
             f"failed {s['failed']} / skipped {s['skipped']} / not checkable {len(s.get('not_checkable', []))}"]
    if s.get("draws"):
        lines.append("   draws checked: " + ", ".join(f"{n} {c['checked']}" + (f" ({c['not_checked']} not checked)"
                                                                                 if c["not_checked"] else "")
                                                      for n, c in s["draws"].items()))
    for f in s["failures"]:
        lines.append(f"   FAIL {f['id']:52s} {f['status']:20s} {f['message'][:160]}")
    for f in s.get("not_checkable", []):
        lines.append(f"   NOT CHECKABLE {f['id']:43s} {f['message'][:160]}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The sweep's options (``benchmarks/changed_cases.py`` collects the same cases with them)."""
    from pyrunner.target.device import DEFAULT_DEVICE, DEVICES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "results/gpu_sweep")))
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="wall-clock budget for everything")
    ap.add_argument("--jobs", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--case-timeout-s", type=float, default=240.0, help="hard limit for one case")
    ap.add_argument("--random", type=int, default=12, help="number of random graphs (seeds from --random-seed0)")
    ap.add_argument("--random-seed0", type=int, default=0)
    ap.add_argument("--wild", type=int, default=0,
                    help="number of wild graphs (tests/wild_graphs.py; seeds from --wild-seed0)")
    ap.add_argument("--wild-seed0", type=int, default=0)
    ap.add_argument("--shapes", default="small,real")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--only", help="comma-separated graph names (catalog names, tests/data stems, RandomN, WildN)")
    ap.add_argument("--graph", action="append", help="another graph JSON file to sweep (repeatable)")
    ap.add_argument("--cases", help="only these case ids (NAME@SHAPE/DTYPE), comma-separated, or @FILE with "
                    "one per line (benchmarks/changed_cases.py writes it)")
    ap.add_argument("--seed", type=int, default=None,
                    help="check every case on the draws of this seed (a record's 'seed': its check again); "
                         "default: a fresh seed per case")
    ap.add_argument("--dry", action="store_true", help="no GPU: plan, render, lower to CUDA only")
    ap.add_argument("--backward", action="store_true",
                    help="sweep each graph's derived backward graph instead (ids end in /bwd): saves chosen as "
                         "training chooses them, checked on inputs whose saved tensors the forward computes")
    ap.add_argument("--with-saves", action="store_true",
                    help="sweep each graph's forward that also writes what its backward reads, as training runs it "
                         "(ids end in /saves; run 157 found a kernel form only these plans have)")
    ap.add_argument("--switch", action="append", metavar="NAME=0|1",
                    help=f"set a planner switch for every case ({', '.join(switches.SWITCHES)}; repeatable or "
                         "comma-separated): the sweep of the cases benchmarks/switch_cases.py lists")
    ap.add_argument("--device", default=DEFAULT_DEVICE, metavar="NAME",
                    help=f"the backend to plan, render and compile for ({', '.join(DEVICES)}; a100: sm_80, run on a "
                         "newer GPU from its own instruction set)")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--results", help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.worker:
        return worker(args)

    start = time.monotonic()
    end = start + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    args.work = args.work or (args.out / "work")
    for sub in ("cases", "results", "logs", "sources"):
        (args.work / sub).mkdir(parents=True, exist_ok=True)
    log = Log(args.out / "sweep.log")
    from pyrunner.errors import UserError

    try:
        args.switches = switches.parse_all(args.switch)
    except ValueError as e:
        log(f"error: {e}")
        return 2
    if args.switches:
        log(f"planner switches: {switches.label(args.switches)}")

    try:
        backend = _backend(args.device)
    except UserError as e:
        log(f"error: {e}")
        return 2
    if not args.dry:
        try:
            import torch

            if not torch.cuda.is_available():
                log("error: no CUDA GPU visible; use --dry to plan, render and lower without one")
                return 2
            log(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
            from pyrunner.backend.tilelang.compile import local_gpu_arch

            built = backend.target.running_on(local_gpu_arch())
            log(f"backend: {backend.name}, {backend.target.arch} instruction set, built with "
                f"{' '.join(built.gencode())}")
        except ImportError as e:
            log(f"error: torch is not importable ({e}); use --dry")
            return 2
    cases = collect(args)
    log(f"== sweep: {len(cases)} case(s), {args.jobs} worker(s), budget {args.budget_s:.0f} s, "
        f"{'dry (no GPU)' if args.dry else 'GPU'}")

    throttle = Throttle(args.jobs)

    def one(item: tuple[int, Case]) -> dict:
        idx, case = item
        rec = run_narrowing(lambda: _run_worker(args, case, idx, end, log), throttle, log)
        err = f" error {rec['error']:.1e}" if isinstance(rec.get("error"), (int, float)) else ""
        log(f"{rec['status']:20s} {case.id:52s} {rec.get('seconds', 0):6.1f} s{err}  {rec['message'][:200]}")
        return rec

    with ThreadPoolExecutor(args.jobs) as pool:
        records = list(pool.map(one, enumerate(cases)))
    with open(args.out / "cases.jsonl", "w") as fh:
        for r in records:
            fh.write(json.dumps(r, default=str) + "\n")
    summary = summarize(records, args.dry, time.monotonic() - start, args.device)
    if args.switches:
        summary["switches"] = switches.label(args.switches)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    text = table(summary)
    log.raw(text)
    print("\n" + text, flush=True)
    return 0 if summary["failed"] == 0 and summary["skipped"] == 0 else 1


def _backend(device: str):
    """The backend ``--device`` names (``UserError`` naming the known ones)."""
    from pyrunner.backend.tilelang.backend import backend_for

    return backend_for(device)


if __name__ == "__main__":
    sys.exit(main())
