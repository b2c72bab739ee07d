"""Time one plan under several variants side by side: tile configs (inside or outside the plan's
tuning space) and renderer passes switched off, each compiled, verified against float64 and
timed interleaved (``run.timing.side_by_side_us``) in one process.

Why: a question such as "does a statistics kernel on the SMs a one-wave GEMM leaves idle overlap
its mainloop?" needs configs the tuning space does not offer yet, measured like for like.

On the GPU machine, in gpu_run.sh's environment:
    SCRIPT=benchmarks/probes/config_variants.py TOTAL_S=300 OUT=$OUT bash benchmarks/gpu_run.sh \
        --workload RMSNorm --dtypes bfloat16 \
        --variant 'base' --variant 'k0_tmp2.block_m=256;k0_tmp2.block_d=128;-sink'

A variant is ``;``-separated ``KERNEL.PARAM=N`` overrides, ``-sink`` (``plan.passes.sink_late_inputs``
off) and source edits of the rendered module, each a design question put to the device before the
renderer takes it (``EDITS``): ``+split_epilogue=C`` (the TMA-store staging tile of the epilogue in C
column chunks, so less shared memory and a deeper ring fit), ``+direct_epilogue`` (the epilogue stores
from registers, no staging tile) and ``+unguard`` (the asynchronous form's shared-memory guard
lifted, so a config it refuses is built and TileLang says whether it fits); ``base`` is the planner's
default config. ``--vendor`` times the vendor library's kernel (cuBLAS, SDPA) in the same rounds and
prints its kernel names. Writes ``variants.jsonl`` under ``--out``, a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT, ROOT / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from gpu_ab import warm_cases  # noqa: E402 - after the path set-up

DTYPES = {"bfloat16": "bf16", "float16": "fp16", "bf16": "bf16", "fp16": "fp16"}


_STAGED_STORE = re.compile(
    r"(?P<ind> +)T\.copy\((?P<frag>\w+), (?P<stage>\w+_out\w*)\)\n"
    r"(?P=ind)T\.copy\((?P=stage), (?P<dst>\w+)\[(?P<lead>.*), (?P<lo>[^,\[\]:]+):(?P<hi>[^,\[\]:]+)\]\)")
"""An epilogue store staged for TMA: fragment -> shared tile -> the global tile (last axis sliced)."""


def split_epilogue(source: str, chunks: int) -> str:
    """Each staged epilogue store written in ``chunks`` column chunks through a tile ``chunks`` times
    narrower; a consumer barrier before each chunk, so the last chunk's TMA store has read the tile."""
    from pyrunner.backend.tilelang.render_ws import CONSUMER_BARRIER

    def one(m: re.Match) -> str:
        ind, frag, stage, dst, lead, lo, hi = m.group("ind", "frag", "stage", "dst", "lead", "lo", "hi")
        shape = re.search(rf"\b{stage} = T\.alloc_shared\(\((?P<r>[^,]+), (?P<c>[^)]+)\)", source)
        width = f"({shape['c']}) // {chunks}"
        return (f"{ind}for ep_c in T.serial({chunks}):  # (probe) the epilogue in column chunks\n"
                f"{ind}    T.sync_threads({CONSUMER_BARRIER}, threads)\n"
                f"{ind}    for ep_i, ep_j in T.Parallel({shape['r']}, {width}):\n"
                f"{ind}        {stage}[ep_i, ep_j] = {frag}[ep_i, ep_c * ({width}) + ep_j]\n"
                f"{ind}    T.copy({stage}, {dst}[{lead}, ({lo}) + ep_c * ({width}):({lo}) + (ep_c + 1) * ({width})])")

    out = _STAGED_STORE.sub(one, source)
    return re.sub(r"(\w+_out\w* = T\.alloc_shared\(\([^,]+, )([^)]+)\)",
                  lambda m: f"{m[1]}({m[2]}) // {chunks})", out)


def direct_epilogue(source: str) -> str:
    """Each staged epilogue store written from the fragment straight to global memory."""
    out = _STAGED_STORE.sub(lambda m: f"{m['ind']}T.copy({m['frag']}, {m['dst']}[{m['lead']}, {m['lo']}:{m['hi']}])",
                            source)
    return re.sub(r"\n *\w+_out\w* = T\.alloc_shared\(.*", "", out)


def unguard(source: str) -> str:
    """The asynchronous forms' guards without their shared-memory bound."""
    return re.sub(r"<= \d+:(  # asynchronous)", r"<= 1 << 30:\1", source)


EDITS = {
    "split_epilogue": lambda src, n: split_epilogue(src, n or 2),
    "direct_epilogue": lambda src, n: direct_epilogue(src),
    "unguard": lambda src, n: unguard(src),
}
"""Source edit -> (rendered module, its argument) -> the edited module."""


def parse_variant(spec: str) -> tuple[dict[str, dict[str, int]], set[str]]:
    """``k0.block_m=256;-sink;+split_epilogue=2`` -> ({"k0": {"block_m": 256}}, {"sink", "+split_epilogue=2"})."""
    overrides: dict[str, dict[str, int]] = {}
    off: set[str] = set()
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        if part == "base":
            continue
        if part.startswith("-"):
            off.add(part[1:])
            continue
        if part.startswith("+"):
            name, _, n = part[1:].partition("=")
            if name not in EDITS or (n and not n.isdigit()):
                raise SystemExit(f"error: variant part {part!r}: edits are {sorted(EDITS)} (+NAME or +NAME=N)")
            off.add(part)
            continue
        key, _, value = part.partition("=")
        kernel, _, param = key.partition(".")
        if not (kernel and param and value.isdigit()):
            raise SystemExit(f"error: variant part {part!r} is not KERNEL.PARAM=N, -sink or base")
        overrides.setdefault(kernel, {})[param] = int(value)
    return overrides, off


def plan_for(graph_name: str, dtype: str):
    from pyrunner.ir import catalog
    from pyrunner.ir.graph_json import load_graph_file
    from pyrunner.pipeline import best_plan
    from pyrunner.target.tuning import committed_tuning

    if graph_name.endswith(".json"):
        graph = load_graph_file(Path(graph_name))
    else:
        name, _, shape = graph_name.partition(":")
        sizes = {a: int(n) for a, n in (kv.split("=") for kv in shape.split(";") if kv)} or None
        graph = catalog.get(name, sizes)
    (plan,) = best_plan(graph, DTYPES[dtype], tuning=committed_tuning())
    return graph, plan


def variant_source(plan, spec: str) -> tuple[str, dict[str, dict[str, int]]]:
    """The rendered module and config of one variant (the plan's spaces widened to hold it)."""
    from pyrunner.backend.tilelang.render import render
    from pyrunner.plan import passes
    from pyrunner.plan.analysis import resolve_config
    from pyrunner.plan.schema import plan_hash

    overrides, off = parse_variant(spec)
    kernels = []
    for k in plan.kernels:
        params = {p: list(v) for p, v in k.params.items()}
        for p, n in overrides.get(k.name, {}).items():
            if p not in params:
                raise SystemExit(f"error: kernel {k.name!r} has no parameter {p!r} ({sorted(params)})")
            params[p] = sorted({*params[p], n})
        kernels.append(k.model_copy(update={"params": params}))
    wide = plan.model_copy(update={"kernels": kernels})
    wide = wide.model_copy(update={"provenance": wide.provenance.model_copy(update={"plan_hash": plan_hash(wide)})})
    cfg = resolve_config(wide)
    for kname, ps in overrides.items():
        cfg[kname].update(ps)
    kept = passes.sink_late_inputs
    if "sink" in off:
        passes.sink_late_inputs = lambda kernel, earlier: kernel
    try:
        source = render(wide)
    finally:
        passes.sink_late_inputs = kept
    for part in sorted(p for p in off if p.startswith("+")):
        name, _, n = part[1:].partition("=")
        source = EDITS[name](source, int(n) if n else None)
    return source, cfg


def compile_variant(graph_name: str, dtype: str, spec: str, work: Path):
    from pyrunner.backend.tilelang.compile import load_module

    graph, plan = plan_for(graph_name, dtype)
    source, cfg = variant_source(plan, spec)
    tag = re.sub(r"[^A-Za-z0-9_]", "_", f"{graph_name}_{dtype}_{spec}")[:120]
    module = load_module(source, work / f"{tag}.py")
    return graph, plan, module, module.compile_kernels(cfg), cfg


def vendor_kernels(fn) -> list[str]:
    """The CUDA kernels one call of a vendor baseline launches (names say tile shape, cluster, stages)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


def measure(graph_name: str, dtype: str, specs: list[str], work: Path, rounds: int,
            vendor: bool = False) -> list[dict]:
    from pyrunner.run.baselines import vendor_fn
    from pyrunner.run.timing import side_by_side_us
    from pyrunner.run.verify import GpuVerifier

    rows, launches = [], {}
    graph, plan = plan_for(graph_name, dtype)
    verifier = GpuVerifier(plan, graph, device="cuda")
    tensors = verifier.tensors()
    for spec in specs:
        rec: dict = {"workload": graph_name, "dtype": dtype, "variant": spec}
        try:
            _, _, module, kernels, cfg = compile_variant(graph_name, dtype, spec, work)
        except Exception as e:  # noqa: BLE001 - one variant failing must not lose the others
            rows.append({**rec, "status": f"failed compile: {type(e).__name__}: {str(e)[:300]}"})
            continue
        rec["config"] = cfg

        def launch(t: dict, module=module, kernels=kernels, cfg=cfg) -> None:
            module.launch(t, cfg, kernels=kernels)

        res = verifier.check(launch)
        rec["error"] = res.error
        if not res.ok:
            rows.append({**rec, "status": f"failed verification: {res.message}"})
            continue
        launches[spec] = (lambda launch=launch: launch(tensors))
        rows.append({**rec, "status": "ok"})
    found = vendor_fn(graph) if vendor else None
    if found is not None:
        name, fn = found
        rec = {"workload": graph_name, "dtype": dtype, "variant": f"vendor:{name}", "status": "ok",
               "error": verifier.check_fn(fn)}

        def call(fn=fn) -> object:
            return fn(**verifier.inputs)

        try:
            rec["kernels"] = vendor_kernels(call)
        except Exception as e:  # noqa: BLE001 - the names are a help, not the measurement
            rec["kernels"] = [f"profiler failed: {type(e).__name__}"]
        launches[rec["variant"]] = call
        rows.append(rec)
    if launches:
        times, method, per_round = side_by_side_us(launches, rounds=rounds)
        for r in rows:
            if r["variant"] in times:
                r.update(us=times[r["variant"]], method=method[r["variant"]], rounds=per_round[r["variant"]])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", action="append", default=[],
                    help="catalog name (NAME:axis=N;axis=N) or graph JSON; repeatable (default RMSNorm)")
    ap.add_argument("--dtypes", default="bfloat16")
    ap.add_argument("--variant", action="append", default=[], help="repeatable; see the module docstring")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--vendor", action="store_true", help="time the vendor baseline (cuBLAS, SDPA) beside")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--warm", nargs=3, metavar=("WORKLOAD", "DTYPE", "VARIANT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    work = Path("/tmp/superopt_variants")
    work.mkdir(parents=True, exist_ok=True)
    if args.warm:  # fills TileLang's kernel cache, so the measuring process compiles in seconds
        compile_variant(*args.warm, work)
        return 0
    specs = args.variant or ["base"]
    for s in specs:
        parse_variant(s)
    end = time.monotonic() + args.budget_s - 10
    workloads = args.workload or ["RMSNorm"]
    cases = [(w, dt, s) for w in workloads for dt in args.dtypes.split(",") for s in specs]

    t0 = time.monotonic()
    warm_cases(__file__, cases, end, args.jobs)
    print(f"warm-up: {len(cases)} variant(s) compiled in {time.monotonic() - t0:.0f} s", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(out / "variants.jsonl", "a") as log:
        for wl, dt in [(w, dt) for w in workloads for dt in args.dtypes.split(",")]:
            if time.monotonic() > end - 30:
                print(f"budget: {wl} {dt} not measured", flush=True)
                continue
            got = measure(wl, dt, specs, work, args.rounds, vendor=args.vendor)
            for r in got:
                print(json.dumps(r, default=str), flush=True)
                log.write(json.dumps(r, default=str) + "\n")
            rows += got
    print("\n| workload | dtype | variant | us | status |")
    print("|---|---|---|---|---|")
    for r in rows:
        us = f"{r['us']:.1f}" if "us" in r else "-"
        print(f"| {r['workload']} | {r['dtype']} | {r['variant']} | {us} | {r['status'][:60]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
