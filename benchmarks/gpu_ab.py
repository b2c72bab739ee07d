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

Planner switches (``benchmarks/switches.py``) are features too: "with" is the plan searched and rendered
with the switch on, "without" the plan searched with it off (the default), each at its own config, both
verified, then timed side by side. A case whose two plans render the same kernels (``changed_cases.masked``)
is skipped:
- ``async_partial_tiles``: ``target.fit.ASYNC_PARTIAL_TILES`` (asynchronous forms over loaded axes that end
  in a partial tile; attention over 4000 or 2000 keys: ``Attention:t_kv=4000``).
- ``phased_blocks``: ``planner.cost.PHASED_BLOCKS`` (a lone block's phases added; attention's backward in
  FlashAttention-2's form: ``ScaledAttention/bwd``).
- ``fold_exp_shift``: ``backend.tilelang.emit.FOLD_EXP_SHIFT`` (a softmax's ``exp2((S - m) * c)`` as one FMA
  per element, ``S * c - m * c``; the plan is the same, only the rendered exponent differs).

Workloads: catalog names (``NAME:axis=N;axis=N`` overrides shapes) or graph JSON files; ``/bwd`` after
either times the graph's derived backward (saves as training chooses them, the plan records its derivation,
its saved tensors computed from the forward on each draw, as ``gpu_sweep --backward`` checks it).
``--plan-only`` runs anywhere without a GPU: it plans and renders both arms of every case, says which
would be timed and which skipped (and the modelled microseconds of both plans), and writes ``ab.jsonl``.
Plans are kept under ``--work`` (``plans/<tree hash>/``): planned there on the CPU with ``--plan-only
--work .device/ab-work`` and carried, the GPU call takes them instead of searching again.

Run on the GPU machine through gpu_run.sh's environment:
    SCRIPT=benchmarks/gpu_ab.py TOTAL_S=200 OUT=/tmp/ab bash benchmarks/gpu_run.sh \
        --feature pdl --workloads RMSNorm --dtypes bfloat16,float16
    SCRIPT=benchmarks/gpu_ab.py TOTAL_S=400 bash benchmarks/gpu_run.sh --feature async_partial_tiles \
        --workloads 'Attention:t_kv=4000,Attention:t_kv=2000,CausalAttention:t_kv=4000'
Writes ``ab.jsonl`` under ``--out`` and prints a table last.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import switches  # noqa: E402 - benchmarks/switches.py

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

PLANNER_FEATURES = {"async_partial_tiles": "fit.ASYNC_PARTIAL_TILES", "phased_blocks": "cost.PHASED_BLOCKS",
                    "fold_exp_shift": "emit.FOLD_EXP_SHIFT"}
"""Feature -> the planner switch (``benchmarks/switches.py``) whose two settings are the two arms."""
ALL_FEATURES = sorted({*FEATURES, *PLANNER_FEATURES})


def load_workload(graph_name: str):
    """The graph a ``--workloads`` entry names (``/bwd`` stripped): a graph JSON file or ``NAME:axis=N;axis=N``."""
    from pyrunner.ir import catalog
    from pyrunner.ir.graph_json import load_graph_file

    spec = graph_name.removesuffix("/bwd")
    if spec.endswith(".json"):
        return load_graph_file(Path(spec))
    name, _, shape = spec.partition(":")  # e.g. RMSNormMLP:m=8192
    try:
        sizes = {a: int(n) for a, n in (kv.split("=") for kv in shape.split(";") if kv)} or None
    except ValueError:
        raise ValueError(f"workload {graph_name!r}: shapes are NAME:axis=N;axis=N") from None
    return catalog.get(name, sizes)


def plan_arm(graph_name: str, dtype: str, settings: dict[str, bool], work: Path | None = None):
    """(plan, graph it computes, rendered source) of a workload, searched and rendered with ``settings``
    (``{}``: the switches as they are); ``/bwd``: the derived backward, as ``gpu_sweep --backward`` plans it.
    ``work``: kept there as JSON, so the measuring process takes what a warm-up process planned (the search
    is deterministic; an attention backward at h16 t4096 plans for about a minute)."""
    import json as json_module

    from pyrunner.ir.graph_json import graph_from_json, graph_to_json
    from pyrunner.plan.schema import Plan

    with switches.switched(settings):
        state = switches.label({k: switches.get(k) for k in switches.SWITCHES})
        kept = work / "plans" / _tree_hash() / f"{_stem(graph_name)}_{dtype}_{_stem(state)}.json" if work else None
        if kept is not None and kept.is_file():
            doc = json_module.loads(kept.read_text())
            return Plan.model_validate(doc["plan"]), graph_from_json(doc["graph"]), doc["source"]
        plan, graph, source = _plan_and_render(graph_name, dtype)
        if kept is not None:
            kept.parent.mkdir(parents=True, exist_ok=True)
            tmp = kept.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json_module.dumps({"plan": plan.model_dump(mode="json"), "graph": graph_to_json(graph),
                                              "source": source}))
            os.replace(tmp, kept)
        return plan, graph, source


@functools.cache
def _tree_hash() -> str:
    """Hash of the planner's and renderer's source, the tuning databases and this script: kept plans of another
    tree are never taken (the work folder outlives a call on a warm machine)."""
    h = hashlib.sha256()
    for f in sorted([*(ROOT / "pyrunner").rglob("*.py"), *(ROOT / "benchmarks" / "tuning").glob("*.json"),
                     Path(__file__).resolve()]):
        h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _plan_and_render(graph_name: str, dtype: str):
    """``plan_arm`` under the switches as they are set (planned as ``gpu_sweep`` plans a case)."""
    from gpu_sweep import plan_graph

    from pyrunner.backend.tilelang.backend import backend_for
    from pyrunner.backend.tilelang.render import render

    backend = backend_for()
    plan, graph = plan_graph(load_workload(graph_name), DTYPES[dtype], graph_name.endswith("/bwd"), backend)
    return plan, graph, render(plan, backend.target)


def _masked(plan, source: str) -> str:
    from changed_cases import masked

    return masked(source.replace(plan.provenance.plan_hash, "PLAN"))


def measure_switch(feature: str, graph_name: str, dtype: str, work: Path, rounds: int, warm_only: bool = False,
                   plan_only: bool = False) -> dict:
    """A planner switch's A/B: the plan searched with it on ("with") against the plan searched with it off."""
    from pyrunner.backend.tilelang.compile import load_module
    from pyrunner.plan.analysis import resolve_config

    key = PLANNER_FEATURES[feature]
    arms = {v: plan_arm(graph_name, dtype, {key: on}, work) for v, on in (("without", False), ("with", True))}
    rec: dict = {"workload": graph_name, "dtype": dtype, "switch": key}
    for v, (plan, _, _) in arms.items():
        rec[f"{v}_kernels"] = [k.name for k in plan.kernels]
        rec[f"{v}_modelled_us"] = round(plan.cost.total_us, 2)
        rec[f"{v}_config"] = resolve_config(plan)
    if _masked(arms["with"][0], arms["with"][2]) == _masked(arms["without"][0], arms["without"][2]):
        return {**rec, "status": f"skipped: the same kernels with {key} on and off"}
    if _guard_only(arms["without"][0], arms["with"][0], key):
        return {**rec, "status": f"skipped: {key} changes only a guard the default config decides alike"}
    if plan_only:
        return {**rec, "status": "planned: would time"}
    launches = {}
    for variant in ("with", "without"):
        plan, graph, src = arms[variant]
        cfg = rec[f"{variant}_config"]
        module = load_module(src, work / f"{_stem(graph_name)}_{dtype}_{feature}_{variant}.py")
        t0 = time.monotonic()
        kernels = module.compile_kernels(cfg)
        rec[f"{variant}_compile_s"] = round(time.monotonic() - t0, 1)
        if warm_only:
            continue
        launch = _verified_launch(_verifier(plan, graph), module, kernels, cfg)
        if isinstance(launch, str):
            return {**rec, "status": f"failed verification ({variant}): {launch}"}
        rec[f"{variant}_error"], launches[variant] = launch
    if warm_only:
        return {**rec, "status": "warm"}
    return _timed(rec, launches, rounds)


def _guard_only(off, on, key: str) -> bool:
    """``switch_cases.guard_only_change`` on the default backend: the two arms would build the same kernels."""
    from switch_cases import guard_only_change

    from pyrunner.backend.tilelang.backend import backend_for

    return guard_only_change(off, on, key, backend_for(), {key: False})


def _stem(graph_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", graph_name)


def _verifier(plan, graph):
    from pyrunner.run.verify import GpuVerifier

    return GpuVerifier(plan, graph, device="cuda")


def _verified_launch(verifier, module, kernels, cfg):
    """(error, a launch on the verifier's tensors) once the plan agrees with float64 on the device; else why not."""
    tensors = verifier.tensors()

    def launch(t: dict) -> None:
        module.launch(t, cfg, kernels=kernels)

    res = verifier.check(launch)
    if not res.ok:
        return res.message
    return res.error, (lambda: launch(tensors))


def _timed(rec: dict, launches: dict, rounds: int) -> dict:
    from pyrunner.run.timing import side_by_side_us

    times, method, per_round = side_by_side_us(launches, rounds=rounds)
    return {**rec, "status": "ok", "us": times, "method": method, "rounds": per_round}


def measure(feature: str, graph_name: str, dtype: str, work: Path, rounds: int, warm_only: bool = False,
            plan_only: bool = False) -> dict:
    """One feature's A/B on one workload and dtype: a record with both arms' times, or why none."""
    if feature in PLANNER_FEATURES:
        return measure_switch(feature, graph_name, dtype, work, rounds, warm_only, plan_only)
    from pyrunner.backend.tilelang.compile import load_module
    from pyrunner.plan.analysis import resolve_config

    plan, graph, source = plan_arm(graph_name, dtype, {}, work)
    rec: dict = {"workload": graph_name, "dtype": dtype, "kernels": [k.name for k in plan.kernels]}
    if feature == "pdl" and len(plan.kernels) < 2:
        return {**rec, "status": "skipped: one kernel"}
    cfg = resolve_config(plan)
    launches = {}
    verifier = None
    without = FEATURES[feature](plan, source)
    if without == source:
        return {**rec, "status": f"skipped: no {feature} code"}
    if plan_only:
        return {**rec, "status": "planned: would time"}
    if feature == "persistent":
        funcs = {}
        for variant, src in (("with", source), ("without", without)):
            module = load_module(src, work / f"{re.sub(r'[^A-Za-z0-9_]', '_', graph_name)}_{dtype}_{variant}_s.py")
            funcs[variant] = {k: str(f) for k, f in module.build_kernels(cfg).items()}
        if funcs["with"] == funcs["without"]:
            return {**rec, "status": "skipped: one wave at this config"}
    for variant, src in (("with", source), ("without", without)):
        module = load_module(src, work / f"{_stem(graph_name)}_{dtype}_{variant}.py")
        t0 = time.monotonic()
        kernels = module.compile_kernels(cfg)
        rec[f"{variant}_compile_s"] = round(time.monotonic() - t0, 1)
        if warm_only:  # TileLang's kernel cache now holds it: the measuring process compiles in seconds
            continue
        verifier = verifier or _verifier(plan, graph)
        launch = _verified_launch(verifier, module, kernels, cfg)
        if isinstance(launch, str):
            return {**rec, "status": f"failed verification ({variant}): {launch}"}
        rec[f"{variant}_error"], launches[variant] = launch
    if warm_only:
        return {**rec, "status": "warm"}
    return {**_timed(rec, launches, rounds), "config": cfg}


def warm_cases(script: str, cases: list[tuple[str, ...]], end: float, jobs: int, work: Path) -> None:
    """Run ``script --warm CASE...`` for every case, ``jobs`` at a time, each stopped a minute before
    ``end`` (monotonic): the compiles fill TileLang's kernel cache, so the one process that measures
    compiles in seconds and its timings are not disturbed by compiles beside them."""
    def warm(case: tuple[str, ...]) -> None:
        left = end - time.monotonic() - 60
        if left > 0:
            try:
                subprocess.run([sys.executable, script, "--warm", *case, "--work", str(work)], timeout=left,
                               capture_output=True)
            except subprocess.TimeoutExpired:
                pass

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(warm, cases))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--feature", default="pdl", help=f"comma-separated features of {ALL_FEATURES}")
    ap.add_argument("--workloads", default="RMSNorm",
                    help="comma-separated catalog names (NAME:axis=N;axis=N overrides shapes) or graph JSON files; "
                         "/bwd after one: its derived backward")
    ap.add_argument("--plan-only", action="store_true",
                    help="no GPU: plan and render both arms of every case, say which would be timed")
    ap.add_argument("--dtypes", default="bfloat16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=200)
    ap.add_argument("--jobs", type=int, default=8, help="parallel compile (warm-up) processes")
    ap.add_argument("--work", type=Path, default=Path("/tmp/superopt_ab"),
                    help="modules and kept plans (plans/<tree hash>/): plan here with --plan-only --work "
                         ".device/ab-work and carry .device, and the GPU call takes the plans instead of searching")
    ap.add_argument("--warm", nargs=3, metavar=("FEATURE", "WORKLOAD", "DTYPE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    features = args.feature.split(",")
    if set(features) - set(ALL_FEATURES):
        ap.error(f"unknown feature(s) {sorted(set(features) - set(ALL_FEATURES))}: choose from {ALL_FEATURES}")
    if set(args.dtypes.split(",")) - set(DTYPES):
        ap.error(f"unknown dtype(s) {sorted(set(args.dtypes.split(',')) - set(DTYPES))}: choose from {sorted(DTYPES)}")
    for w in args.workloads.split(",") if not args.warm else ():
        try:
            load_workload(w)
        except Exception as e:  # noqa: BLE001 - a bad name, shape or file: one line, exit 2
            ap.error(f"workload {w!r}: {' '.join(str(e).split())[:300]}")
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    if args.warm:
        print(json.dumps(measure(*args.warm, work, args.rounds, warm_only=True), default=str))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    end = time.monotonic() + (float("inf") if args.plan_only else args.budget_s - 10)  # --plan-only: no GPU time
    cases = [(f, w, dt) for f in features for w in args.workloads.split(",") for dt in args.dtypes.split(",")]

    t0 = time.monotonic()
    if not args.plan_only:
        warm_cases(__file__, cases, end, args.jobs, work)
        print(f"warm-up: {len(cases)} case(s) compiled in {time.monotonic() - t0:.0f} s", flush=True)
    rows = []
    with open(out / "ab.jsonl", "a") as log:
        for f, w, dt in cases:
            if time.monotonic() > end - 30:
                rows.append({"feature": f, "workload": w, "dtype": dt, "status": "skipped: budget spent"})
                continue
            try:
                rec = measure(f, w, dt, work, args.rounds, plan_only=args.plan_only)
            except Exception as e:  # noqa: BLE001 - one failing workload must not lose the others
                rec = {"workload": w, "dtype": dt, "status": f"error: {type(e).__name__}: {e}"}
            rec["feature"] = f
            print(json.dumps(rec, default=str), flush=True)
            log.write(json.dumps(rec, default=str) + "\n")
            rows.append(rec)
    print(f"\n{len(rows)} case(s) in {time.monotonic() - t0:.0f} s")
    print(table(rows))
    return 0


def table(rows: list[dict]) -> str:
    """The markdown table printed last: both arms' times (planner switches: also both plans' modelled times)."""
    lines = ["| feature | workload | dtype | with (us) | without (us) | gain | modelled with / without (us) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r['feature']} | {r['workload']} | {r['dtype']} |"
        model = (f" {r['with_modelled_us']} / {r['without_modelled_us']} |" if "with_modelled_us" in r else " |")
        if r.get("status") == "ok":
            a, b = r["us"]["with"], r["us"]["without"]
            lines.append(f"{head} {a:.1f} | {b:.1f} | {b - a:+.1f} us ({b / a:.3f}x) |{model}")
        else:
            lines.append(f"{head} - | - | {r.get('status')} |{model}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
