"""Runs one kernel plan end to end: validate, fit, render, compile, verify, time, log.

With a GPU: the plan is compiled, verified on fresh random inputs against the
float64 reference, optionally autotuned over a small sample of its tuning
space, and timed beside the PyTorch baselines (eager, torch.compile default and
max-autotune-no-cudagraphs, and the vendor kernel the graph admits) in one
process. Without one it does what it can -- render, lower to CUDA, build a cubin
when nvcc exists, run the plan's tiled algorithm on the CPU at small shapes --
and says what it skipped. Every run appends one record to the results log.

Why one module: the steps of one run (fit, render, compile, verify, time, log, checkpoint) build one
results record together and must agree on what a failure at each step records.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import re
import shutil
import time
import traceback
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pyrunner.backend.tilelang.backend import describe
from pyrunner.backend.tilelang.diagnose import detail, one_line
from pyrunner.errors import DeviceFitError, PlanError, UserError
from pyrunner.files import check_output_file, inside, output_dir, write_text_atomic
from pyrunner.ir.graph import Graph
from pyrunner.log.results import RunRecord, append_record, make_record
from pyrunner.plan.analysis import resolve_config, safe_repr
from pyrunner.plan.schema import Plan
from pyrunner.plan.validate import check_config, check_values
from pyrunner.run.runtime import COMPILE_MODES, GpuRuntime, TileLangRuntime
from pyrunner.run.verify import GpuVerifier, fresh_seed, verify_executor
from pyrunner.target.device import DEFAULT_DEVICE
from pyrunner.target.layout import GENERATION

BASELINES = ("eager", "vendor", "torch_compile", "max_autotune", "flex")
"""Baselines timed beside each plan; ``vendor`` becomes ``sdpa``/``cublas`` where the graph admits one."""
MAX_AUTOTUNE_CONFIGS = 8
AUTOTUNE_RESERVE_S = 12.0
"""Autotuning stops trying configs when less than this is left before the deadline: the side-by-side
timing with eager and torch.compile (cached by the warm-up) comes next. Runs 45-46 took 12-16 s
whole, process start included; a flat 25 s stopped nearly every run after its first config."""
SLOW_BASELINES_S = 12.0
"""Kept back on top where max-autotune or FlexAttention is timed too (their compiles can miss the cache)."""

Config = dict[str, dict[str, int]]


@dataclass
class RunOptions:
    """What one run does (the CLI builds it from its flags; benchmarks/gpu_run.py directly)."""

    results: Path = Path("results/results.jsonl")
    out_dir: Path = Path("results")
    autotune: int = 0
    """Sampled tile configs to time besides the default (0: only the default)."""
    baselines: tuple[str, ...] = BASELINES
    seed: int | None = None
    config: dict | None = None
    """Tile config: ``{kernel: {param: v}}`` or flat ``{PARAM or KERNEL.PARAM: v}``."""
    deadline: float | None = None
    """``time.monotonic()`` by which the run must end (None: no limit)."""
    checkpoint: Path | None = None
    warm_only: bool = False
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    quiet: bool = False
    force_cpu: bool = False
    """Skip the GPU even where one exists (``--small``)."""
    device: str = "cuda"
    candidates: list | None = None
    """Whole-plan configs to autotune after the default, best first (the planner's ranked list)."""
    use_tuned: bool = True
    """Start from the tuning database's config for this plan where it has one."""
    tuning_db: Path | None = None
    """Tuning file to read (default: the committed one of the device)."""
    tuning_out: Path | None = None
    """Where to write the best config measured (None: nothing is written)."""
    rounds: int = 3
    """Interleaved timing rounds of the plan and its baselines."""
    runtime: GpuRuntime | None = None
    """The device the GPU path runs on (``run.runtime``; None: ``TileLangRuntime``, TileLang on CUDA, whose
    ``available()`` says whether torch sees a GPU). Tests pass a fake to run the GPU path on the CPU."""
    backend: str = DEFAULT_DEVICE
    """The TileLang backend (``backend.tilelang.backend.BACKENDS``) the plan is fit-checked, rendered and
    compiled for (``--device``); a backend older than the GPU runs there from its own instruction set.
    A tuned config is taken only from an entry of this backend on this GPU (``_tuned_entry``): an Ampere
    build timed on a Hopper GPU never starts from the Hopper backend's config, nor from an A100's."""

    def __post_init__(self) -> None:
        self.results, self.out_dir = Path(self.results), Path(self.out_dir)
        unknown = [x for x in self.baselines if x not in BASELINES]
        if unknown:
            raise UserError(f"--baselines: unknown baseline(s) {unknown}; choose from {', '.join(BASELINES)}")
        from pyrunner.backend.tilelang.backend import device_name

        self.backend = device_name(self.backend)  # an unknown device: one error line naming the known ones


# --- small helpers -------------------------------------------------------------

def _safe_name(s: str) -> str:
    """A file name from a validated plan name (already an ASCII identifier; this is a second guard)."""
    return re.sub(r"[^A-Za-z0-9_]+", "_", s) or "plan"


def hash_of(plan: Plan) -> str:
    """The plan's hash, recomputed (PlanError if the stored one differs): never trusted from the file."""
    from pyrunner.plan.validate import checked_hash

    return checked_hash(plan)


def default_config(plan: Plan) -> Config:
    return {k.name: dict(k.defaults) for k in plan.kernels}


def resolve(plan: Plan, config: dict | None) -> Config:
    """A full per-kernel config from a partial one: ``{kernel: {param: v}}`` or flat ``{param: v}``."""
    if config is not None and not isinstance(config, Mapping):  # load(plan, config=[1, 2]): one error, no traceback
        raise PlanError(f"config must be a mapping ({{kernel: {{param: value}}}} or {{param: value}}), "
                        f"got {safe_repr(config)}")
    if not config:
        return default_config(plan)
    if all(isinstance(v, dict) for v in config.values()):
        values = resolve_config(plan, config)
        check_values(plan, values)
        return values

    return check_config(plan, config)


def graph_of(plan: Plan) -> Graph:
    from pyrunner.plan.validate import plan_graph

    return plan_graph(plan)


def dominant_bound(plan: Plan) -> str | None:
    if not plan.cost.kernels:
        return None
    return max(plan.cost.kernels, key=lambda k: k.time_us).bound


def sample_configs(plan: Plan, n: int, seed: str | int | None = None) -> list[Config]:
    """The default config plus up to n-1 other distinct points of the tuning space.

    Deterministic for a plan (seeded by its hash), so a warm-up process and the
    timed run compile the same configs. Points that do not resolve (tiles that
    do not divide, say) are dropped.
    """
    base = default_config(plan)
    out = [base]
    keys = [(k.name, p) for k in plan.kernels for p in k.params]
    spaces = [next(k for k in plan.kernels if k.name == kn).params[p] for kn, p in keys]
    if n <= 1 or not keys:
        return out
    total = math.prod(len(s) for s in spaces)
    rng = random.Random(str(seed if seed is not None else hash_of(plan)))
    if total <= 256:
        points = list(itertools.product(*spaces))
        rng.shuffle(points)
    else:
        points = [tuple(rng.choice(s) for s in spaces) for _ in range(64)]
    seen = {tuple(base[kn][p] for kn, p in keys)}
    for pt in points:
        if len(out) >= n:
            break
        if pt in seen:
            continue
        seen.add(pt)
        cfg: Config = {k.name: {} for k in plan.kernels}
        for (kn, p), v in zip(keys, pt, strict=True):
            cfg[kn][p] = v
        try:
            check_values(plan, resolve_config(plan, cfg))
        except UserError:
            continue
        out.append(cfg)
    return out


def _tuning_db(opts: RunOptions, device: str):
    """The tuning database a run reads: its output file once written, else the given or committed one."""
    from pyrunner.target.tuning import TuningDB

    if opts.tuning_out is not None and Path(opts.tuning_out).exists():
        return TuningDB.load(opts.tuning_out)
    if opts.tuning_db is not None:
        return TuningDB.load(opts.tuning_db)
    return TuningDB.for_device(DEFAULT_DEVICE if device == "cpu" else device)


def _tuned_entry(plan: Plan, device: str, opts: RunOptions):
    """The tuning database's entry for this plan on this device (the CPU plans for the default target) with
    this run's backend, its config fitted against the backend's device (the one the plan is made for)."""
    from pyrunner.backend.tilelang.backend import backend_for

    backend = backend_for(opts.backend)
    try:
        return _tuning_db(opts, device).lookup(plan, DEFAULT_DEVICE if device == "cpu" else device,
                                               backend=backend.name, fit=backend.device)
    except UserError:
        return None


def autotune_candidates(plan: Plan, cfg: Config, opts: RunOptions) -> list[Config]:
    """What autotuning times, in order: the starting config, the planner's ranked configs, then samples."""
    out: list[Config] = [cfg]
    for c in list(opts.candidates or []) + sample_configs(plan, max(opts.autotune, 1)):
        try:
            full = resolve(plan, c)
        except UserError:
            continue
        if full not in out:
            out.append(full)
        if len(out) >= max(opts.autotune, 1):
            break
    return out


def _target(opts: RunOptions):
    """The compile target of ``opts.backend`` (UserError naming the known ones)."""
    from pyrunner.backend.tilelang.backend import backend_for

    return backend_for(opts.backend).target


def check_fits(plan: Plan, config: Config, target=None) -> None:
    """Raise DeviceFitError if a kernel does not fit ``target``'s GPU (default: the default target's)."""
    from pyrunner.backend.tilelang.compile import check_fits as fits

    fits(plan, config, None if target is None else target.device)


def write_source(plan: Plan, out_dir: Path, target=None) -> Path:
    """Render the plan's TileLang module for ``target`` to ``out_dir/<plan_hash>/<workload>.py``."""
    from pyrunner.backend.tilelang.render import render

    src = render(plan, target)  # checks every name and the hash first
    folder = inside(output_dir(out_dir, "--out folder"), hash_of(plan))
    folder.mkdir(exist_ok=True)
    path = inside(folder, f"{_safe_name(plan.workload)}.py")
    write_text_atomic(path, src, "rendered source")
    return path


def model_prediction(plan: Plan) -> float | None:
    """The cost model's predicted time of a plan, or None: where the plan's total is a tuning-database
    measurement, its model total (``cost.model["model_total_us"]``), never the measurement itself."""
    if plan.cost.model.get("measured"):
        return plan.cost.model.get("model_total_us") or None
    return plan.cost.total_us or None


def check_log_path(path: Path) -> None:
    """Refuse a results log the run could not append to, before the run (not after it, losing it)."""
    p = Path(path)
    if p.exists() or p.is_symlink():
        check_output_file(p, "results log")
        if not os.access(p, os.W_OK):
            raise UserError(f"results log {str(p)!r} is not writable")
        return
    output_dir(p.parent if str(p.parent) else Path("."), "results log folder")
    if not os.access(p.parent if str(p.parent) else Path("."), os.W_OK | os.X_OK):
        raise UserError(f"results log {str(p)!r}: folder {str(p.parent)!r} is not writable")


def _err(e: BaseException) -> str:
    """The one line of a failure that says what went wrong (TileLang's conflict, nvcc's error)."""
    return one_line(e)[:500]


def _fail(run: _Run, status: str, e: BaseException, prefix: str = "", suffix: str = "") -> RunRecord:
    """Finish with the failure's meaningful line; the whole message goes into the record's extra."""
    run.fields["extra"]["error_detail"] = detail(e)
    return run.finish(status, f"{prefix}{_err(e)}{suffix}")


def exit_code(rec: RunRecord) -> int:
    return 0 if rec.status in ("ok", "skipped") else 1


# --- one run -------------------------------------------------------------------

@dataclass
class _Run:
    plan: Plan
    graph: Graph
    opts: RunOptions
    console: Console
    runtime: GpuRuntime = field(default_factory=TileLangRuntime)
    phash: str = ""
    fields: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.phash = hash_of(self.plan)
        self.fields = {
            "plan_hash": self.phash, "workload": self.plan.workload, "graph_hash": self.plan.provenance.graph_hash,
            "shapes": dict(self.graph.sizes), "dtype": self.plan.dtype, "device": "", "status": "skipped",
            "predicted_us": model_prediction(self.plan), "bound": dominant_bound(self.plan),
            "baselines_us": {}, "extra": {"renderer": GENERATION, "backend": describe(self.opts.backend)},
        }
        if self.plan.cost.model.get("measured"):  # the plan's total is a copied measurement: kept apart
            self.fields["extra"]["tuning_db_us"] = self.plan.cost.total_us

    def step(self, what: str):
        """A spinner while a stage runs (nothing when quiet or not a terminal)."""
        self.fields["extra"]["stage"] = what
        self.checkpoint()
        if self.opts.quiet:
            return nullcontext()
        self.console.log(escape(f"[{self.phash}] {what}"))
        return self.console.status(escape(f"[{self.phash}] {what} ..."))

    def checkpoint(self) -> None:
        """The record so far, so a supervisor can log a run killed mid-way (gpu_run's time guard)."""
        if self.opts.checkpoint is None:
            return
        data = dict(self.fields, message="; ".join(self.notes))
        write_text_atomic(self.opts.checkpoint, json.dumps(data, default=str), "run checkpoint")

    def finish(self, status: str, message: str = "") -> RunRecord:
        msg = "; ".join([m for m in [message, *self.notes] if m])
        self.fields["extra"].pop("stage", None)
        rec = make_record(**dict(self.fields, status=status, message=msg))
        if not self.opts.warm_only:
            append_record(self.opts.results, rec)
        return rec

    def time_left(self) -> float:
        return math.inf if self.opts.deadline is None else self.opts.deadline - time.monotonic()


def run_plan(plan: Plan, opts: RunOptions | None = None, console: Console | None = None,
             graph: Graph | None = None) -> RunRecord:
    """Run one validated plan; returns the record it appended to ``opts.results``.

    Raises DeviceFitError (a UserError) when the plan cannot fit the device,
    after logging it, and PlanError, logging nothing, when it exceeds what TileLang is asked to lower
    (``backend.tilelang.limits``); every other failure becomes a failed record.
    """
    from pyrunner.backend.tilelang.limits import size_problem

    too_big = size_problem(plan)  # before anything is rendered, lowered or logged
    if too_big is not None:
        raise PlanError(f"plan {hash_of(plan)}: {too_big}")
    opts = opts or RunOptions()
    console = console or Console(stderr=True)
    run = _Run(plan, graph or graph_of(plan), opts, console, opts.runtime or TileLangRuntime())
    use_gpu = not opts.force_cpu and run.runtime.available()
    run.fields["device"] = run.runtime.name() if use_gpu else "cpu"
    run.fields["seed"] = opts.seed if opts.seed is not None else fresh_seed()
    try:
        cfg = resolve(plan, opts.config)
        if opts.config is None and opts.use_tuned:
            tuned = _tuned_entry(plan, run.fields["device"], opts)
            if tuned is not None:
                cfg = resolve(plan, tuned.config)
                run.notes.append(f"config from the tuning database ({tuned.time_us:.1f} us measured)")
        run.fields["config"] = cfg
        with run.step("checking device fit"):
            check_fits(plan, cfg, _target(opts))
    except DeviceFitError as e:
        run.finish("failed-compile", f"does not fit the device: {e}")
        raise
    try:
        with run.step("rendering TileLang"):
            src = write_source(plan, opts.out_dir, _target(opts))
        run.fields["extra"]["source"] = str(src)
    except UserError as e:
        return run.finish("failed-compile", f"render failed: {e}")
    except Exception as e:  # noqa: BLE001 - a renderer bug must not lose the record
        return _fail(run, "failed-compile", e, "render failed: ")
    if use_gpu:
        return _run_gpu(run, cfg)
    return _run_cpu(run, cfg)


# --- without a GPU --------------------------------------------------------------

def _run_cpu(run: _Run, cfg: Config) -> RunRecord:
    from pyrunner.backend.tilelang.compile import compile_cubin, lower_to_cuda

    plan, opts = run.plan, run.opts
    out = Path(opts.out_dir) / run.phash
    done: list[str] = ["validated", "fits the device", "rendered TileLang"]
    try:
        with run.step("lowering to CUDA source"):
            cuda = lower_to_cuda(plan, cfg, target=_target(opts))
        for name, text in cuda.items():
            write_text_atomic(inside(out, f"{_safe_name(name)}.cu"), text, "CUDA source")
        done.append(f"lowered {len(cuda)} kernel(s) to CUDA source")
        if shutil.which("nvcc"):
            with run.step("compiling cubin with nvcc"):
                cub = compile_cubin(cuda, out, _target(opts))
            done.append(cub.message or f"compiled {len(cub)} cubin(s) with nvcc")
            run.fields["extra"]["cubins"] = [str(p) for p in cub]
        else:
            run.notes.append("nvcc not found: cubin not built")
    except Exception as e:  # noqa: BLE001 - any lowering/nvcc failure is a compile failure
        return _fail(run, "failed-compile", e, suffix=f" (after: {', '.join(done)})")
    from pyrunner.run.executor import execute
    from pyrunner.run.shrink import cpu_check_plan

    with run.step("running the tiled algorithm on the CPU"):
        try:
            small = cpu_check_plan(plan)
            gsmall = graph_of(small)
        except Exception as e:  # noqa: BLE001
            return run.finish("failed-verification", f"the CPU check could not shape the plan: {_err(e)}")
        res = verify_executor(small, gsmall, partial(execute, audit=True), seed=run.fields["seed"])
    run.fields.update(error=res.error, error_bound=res.bound)
    run.fields["extra"]["executor_shapes"] = dict(gsmall.sizes)
    run.fields["extra"]["draws"] = res.draws_record()
    skipped = "skipped (no GPU): GPU compile, GPU verification, timing, baselines"
    if not res.ok:
        return run.finish("failed-verification", f"{res.message}; {skipped}")
    done.append(f"{res.message} at {dict(gsmall.sizes)}")
    return run.finish("skipped", "; ".join(done) + f"; {skipped}")


# --- with a GPU ------------------------------------------------------------------

def _compile(run: _Run, cfg: Config) -> Callable:
    return run.runtime.compile(run.plan, cfg, _target(run.opts))


def autotune_reserve_s(opts: RunOptions, graph: Graph | None = None) -> float:
    """Seconds before the deadline at which autotuning stops, so the baselines are still timed. The
    FlexAttention compile is reserved for only where ``graph`` has one (run 77 asked for it beside
    ten graphs with none, and the reserve stopped every autotune after its first config)."""
    from pyrunner.run.flex import flex_applies

    flex = "flex" in opts.baselines and (graph is None or flex_applies(graph))
    slow = "max_autotune" in opts.baselines or flex
    return AUTOTUNE_RESERVE_S + (SLOW_BASELINES_S if slow else 0.0)


def _autotune(run: _Run, verifier: GpuVerifier, cfg: Config, launch: Callable) -> tuple[Config, Callable]:
    """Time up to opts.autotune verified configs (default first); keep the fastest."""
    tried: list[dict] = []
    best = (None, cfg, launch)
    cands = autotune_candidates(run.plan, cfg, run.opts)  # the compiled one first
    reserve = autotune_reserve_s(run.opts, run.graph)
    for i, c in enumerate(cands):
        if run.time_left() < reserve and i > 0:
            run.notes.append(f"autotune stopped after {i} config(s): time budget")
            break
        entry: dict = {"config": c}
        try:
            fn = launch if i == 0 else None
            if fn is None:
                check_fits(run.plan, c, _target(run.opts))
                fn = _compile(run, c)
            res = verifier.check(fn)
            if not res.ok:
                entry["status"] = f"failed-verification: {res.message}"
            else:
                t = verifier.tensors()
                entry["time_us"] = _config_time_us(run, lambda fn=fn, t=t: fn(t))
                if best[0] is None or entry["time_us"] < best[0]:
                    best = (entry["time_us"], c, fn)
        except Exception as e:  # noqa: BLE001 - a bad config is skipped, not fatal
            entry["status"] = _err(e)
        tried.append(entry)
    run.fields["extra"]["autotune"] = tried
    return best[1], best[2]


def _config_time_us(run: _Run, fn: Callable) -> float:
    """One autotuning measurement (the runtime's: CUDA-graph replay as the final timing, else do_bench)."""
    return run.runtime.time_us(fn, run.opts.warmup_ms, run.opts.rep_ms)


def _run_gpu(run: _Run, cfg: Config) -> RunRecord:
    plan, opts = run.plan, run.opts
    try:
        with run.step("compiling with TileLang"):
            launch = _compile(run, cfg)
    except Exception as e:  # noqa: BLE001
        # a config the device model accepted can still fail in TileLang (its own shared-memory
        # scratch, say): unless the user pinned it, fall back to the next autotuning candidate
        fallbacks = autotune_candidates(plan, cfg, opts)[1:] if opts.config is None else []
        for c in fallbacks:
            try:
                check_fits(plan, c, _target(opts))
                launch = _compile(run, c)
            except Exception:  # noqa: BLE001, S112 - try the next one
                continue
            run.notes.append(f"config {cfg} failed to compile ({_err(e)}); used the next candidate")
            cfg = c
            run.fields["config"] = cfg
            break
        else:
            return _fail(run, "failed-compile", e)
    if opts.warm_only:  # the baselines' caches first: a warm-up cut short leaves only autotuning cold
        run.runtime.warm(run.graph, plan.dtype, tuple(b for b in opts.baselines if b in COMPILE_MODES or b == "flex"))
        for c in autotune_candidates(plan, cfg, opts)[1:]:
            try:
                _compile(run, c)
            except Exception:  # noqa: BLE001, S112 - the timed run reports it
                continue
        return run.finish("skipped", "warm-up only")
    try:
        with run.step("verifying against the float64 reference"):
            verifier = GpuVerifier(plan, run.graph, seed=run.fields["seed"], device=opts.device)
            res = verifier.check(launch)
    except Exception as e:  # noqa: BLE001 - launch errors (bad address, ...) end the run
        return _fail(run, "failed-launch", e)
    run.fields.update(error=res.error, error_bound=res.bound)
    run.fields["extra"]["draws"] = res.draws_record()  # which draws the device check ran, which it skipped
    if not res.ok:
        return run.finish("failed-verification", res.message)
    run.checkpoint()
    if opts.autotune > 1:
        with run.step(f"autotuning over up to {opts.autotune} configs"):
            cfg, launch = _autotune(run, verifier, cfg, launch)
        run.fields["config"] = cfg
    # a provisional plan time, so a run killed while its baselines compile still logs one
    best = [t.get("time_us") for t in run.fields["extra"].get("autotune", []) if t.get("config") == cfg]
    try:
        provisional = best[0] if best and best[0] else _config_time_us(run, lambda: launch(verifier.tensors()))
        run.fields["plan_us"] = provisional
        run.fields["extra"]["timing"] = {"method": {"plan": "provisional (autotuning measurement)"}}
        run.checkpoint()
    except Exception as e:  # noqa: BLE001
        return run.finish("failed-launch", _err(e))
    try:
        tensors = verifier.tensors()
        fns = {"plan": lambda: launch(tensors)}
        fns.update(_prepare_baselines(run, verifier))
        with run.step(f"timing the plan and {len(fns) - 1} baseline(s) side by side"):
            times, method, rounds = run.runtime.side_by_side_us(fns, opts.rounds, opts.warmup_ms, opts.rep_ms)
        if "plan" not in times:
            raise RuntimeError("the plan could not be timed")
        run.fields["plan_us"] = times["plan"]
        for name in fns:
            if name != "plan":
                run.fields["baselines_us"][name] = times.get(name)
        run.fields["extra"]["timing"] = {"method": method, "rounds_us": rounds, "warmup_ms": opts.warmup_ms,
                                         "rep_ms": opts.rep_ms}
        try:
            run.fields["kernel_times_us"] = run.runtime.kernel_times_us(lambda: launch(tensors),
                                                                       [k.name for k in plan.kernels])
        except Exception as e:  # noqa: BLE001 - per-kernel times are informative
            run.notes.append(f"per-kernel times unavailable: {_err(e)}")
    except Exception as e:  # noqa: BLE001
        return run.finish("failed-launch", _err(e))
    run.checkpoint()
    _record_tuning(run)
    run.runtime.release()
    return run.finish("ok", res.message)


def _record_tuning(run: _Run) -> None:
    """Write the config just timed into the tuning file (opts.tuning_out) when it beats the stored one."""
    from pyrunner.backend.tilelang.backend import backend_for
    from pyrunner.target.tuning import measured_forms, tuning_key

    opts = run.opts
    if run.fields.get("plan_us") is None:
        return
    tried = run.fields["extra"].get("autotune") or []
    default = next((t.get("time_us") for t in tried if t.get("config") == default_config(run.plan)), None)
    # filed under the backend that rendered the plan: an Ampere build timed on a Hopper GPU never becomes
    # an entry of the Hopper backend (nor, through the record, a Hopper calibration sample)
    backend = backend_for(opts.backend).name
    run.fields["extra"]["backend"] = backend
    try:  # the record names its database key, so a results log alone can rebuild the entry
        forms = measured_forms(run.plan)
        run.fields["extra"]["tuning"] = {"key": tuning_key(run.plan, run.fields["device"], backend=backend),
                                         "forms": forms, "default_us": default}
    except Exception as e:  # noqa: BLE001 - tuning bookkeeping must not fail a run
        run.notes.append(f"tuning key not recorded: {_err(e)}")
    if opts.tuning_out is None:
        return
    try:
        db = _tuning_db(opts, run.fields["device"])
        changed = db.record(run.plan, run.fields["config"], run.fields["plan_us"], run.fields["device"],
                            tried=max(1, len(tried)), default_us=default, backend=backend)
        db.save(opts.tuning_out)
        run.notes.append("tuning database updated" if changed else "tuning database kept its faster entry")
    except Exception as e:  # noqa: BLE001 - tuning bookkeeping must not fail a run
        run.notes.append(f"tuning database not updated: {_err(e)}")


def _prepare_baselines(run: _Run, verifier: GpuVerifier) -> dict[str, Callable]:
    """Build, compile and check every baseline; name -> a no-argument call, timed beside the plan.

    None is skipped for time: torch.compile's caches are warmed in gpu_run's warm-up phase, so
    max-autotune costs a cache hit here. A failing baseline is recorded as None with the reason.
    """
    import torch

    opts, graph = run.opts, run.graph
    inputs = verifier.inputs
    errors: dict[str, float] = {}
    out: dict[str, Callable] = {}
    for name in opts.baselines:
        made = run.runtime.baseline(graph, name)
        if made is None:
            continue
        key, build = made
        try:
            with run.step(f"baseline {key}"), torch.no_grad():
                fn = build()
                errors[key] = verifier.check_fn(fn)  # first call also compiles

                def call(fn=fn):
                    with torch.no_grad():
                        return fn(**inputs)

                out[key] = call
        except Exception as e:  # noqa: BLE001 - a failing baseline is recorded, not fatal
            run.fields["baselines_us"][key] = None
            run.notes.append(f"baseline {key} failed: {_err(e)}")
        run.fields["extra"]["baseline_errors"] = errors
        run.checkpoint()
    return out


# --- entry point for the CLI -------------------------------------------------------

def _fmt_us(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def print_record(rec: RunRecord, console: Console | None = None) -> None:
    """A table of one run: status, plan and baseline times, speedups, error."""
    console = console or Console()
    if rec.plan_us is None and not rec.baselines_us:
        _print_status(rec, console)
        return
    t = Table(title=escape(f"{rec.workload} {rec.dtype} {rec.shapes}  plan {rec.plan_hash}  on {rec.device}"))
    t.add_column("what")
    t.add_column("time (us)", justify="right")
    t.add_column("plan speedup", justify="right")
    t.add_row("plan", _fmt_us(rec.plan_us), "")
    for k, v in rec.kernel_times_us.items():
        t.add_row(f"  kernel {k}", _fmt_us(v), "")
    for k, v in rec.baselines_us.items():
        sp = rec.speedups.get(k)
        t.add_row(k, _fmt_us(v), "-" if sp is None else f"{sp:.2f}x")
    if rec.speedup_vs_best is not None:
        t.add_row(f"best baseline ({rec.best_baseline})", _fmt_us(rec.baselines_us.get(rec.best_baseline or "")),
                  f"{rec.speedup_vs_best:.2f}x")
    console.print(t)
    _print_status(rec, console)


def _print_status(rec: RunRecord, console: Console) -> None:
    err = "-" if rec.error is None else f"{rec.error:.2e} (bound {rec.error_bound:.0e})"
    style = "green" if rec.status in ("ok", "skipped") else "bold red"
    console.print(f"[{style}]status: {rec.status}[/{style}]  plan {rec.plan_hash}  error: {err}  seed: {rec.seed}")
    if rec.message:
        console.print(rec.message, markup=False)


def run_plan_file(path: str | os.PathLike, opts: RunOptions | None = None) -> int:
    """``python -m pyrunner plan.json``: exit 0 on success, 1 on a failed plan; UserError -> CLI exit 2."""
    from pyrunner.plan.validate import load_plan

    opts = opts or RunOptions()
    console = Console(stderr=True)
    plan = load_plan(path)
    check_log_path(opts.results)
    output_dir(opts.out_dir, "--out folder")
    try:
        rec = run_plan(plan, opts, console)
    except UserError:
        raise
    except Exception:  # noqa: BLE001 - a bug: say which plan, keep the traceback
        console.print(f"[bold red]internal error while running plan {hash_of(plan)}[/bold red]")
        console.print(traceback.format_exc(), markup=False)
        return 1
    print_record(rec, Console())
    if rec.status not in ("ok", "skipped"):
        Console(stderr=True).print(f"[bold red]plan {rec.plan_hash} {rec.status}[/bold red]: {escape(rec.message)}",
                                   highlight=False)
    return exit_code(rec)


_COMPILE_STAGES = ("checking device fit", "rendering TileLang", "compiling with TileLang")


def record_from_checkpoint(checkpoint: Path, why: str) -> RunRecord | None:
    """The record of a run that was killed (time guard, crash), built from its last checkpoint.

    A run killed after its plan was timed keeps status ok (its missing baselines
    are named); before that it failed in the stage it was in.
    """
    try:
        data = json.loads(Path(checkpoint).read_text())
    except (OSError, ValueError):
        return None
    extra = dict(data.get("extra") or {})
    stage = extra.pop("stage", "unknown stage")
    data["extra"] = extra
    if data.get("plan_us") is not None:
        status = "ok"
    elif stage in _COMPILE_STAGES:
        status = "failed-compile"
    else:
        status = "failed-launch"
    note = f"{why} during '{stage}'"
    data["message"] = "; ".join(m for m in (note, data.get("message", "")) if m)
    data["status"] = status
    return make_record(**data)


def record_after_exit(rec: RunRecord, rc: int | None) -> RunRecord:
    """A worker's record amended by how the worker ended (``rc`` None: killed by a time guard).

    A worker that wrote an ok/skipped record and then did not exit 0 (killed, exit 137, a crash
    in teardown) is not logged as a success: its status becomes failed-launch, its measurements
    are kept and ``extra.exit_code`` says how it ended.
    """
    if rc == 0:
        return rec
    data = rec.model_dump()
    data["extra"] = dict(rec.extra, exit_code=rc)
    if rec.status in ("ok", "skipped"):
        how = "was killed" if rc is None else f"exited {rc}"
        data["status"] = "failed-launch"
        data["message"] = "; ".join(m for m in (f"the worker {how} after writing this record "
                                                f"(measurements kept, status was {rec.status})", rec.message) if m)
    for k in ("speedups", "best_baseline", "speedup_vs_best"):
        data.pop(k, None)
    return make_record(**data)
