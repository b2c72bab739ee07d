"""Each kernel of a plan timed alone on the GPU, beside the cost model's prediction for it.

A plan that loses to inductor or a vendor kernel says so as one number; this says which of its kernels
lose the time and whether the cost model saw it coming. Each plan is compiled and checked against
float64 first (``LoadedPlan.check``; a backward plan that records its derivation is checked and timed on
saved tensors its forward computes from the inputs, ``run.backward_draws``), then replayed ``--iters``
times under ``torch.profiler`` (CUDA activity only); each CUDA kernel's device time is matched to the plan
kernel of its name. A kernel launched early (programmatic dependent launch) waits inside its span for the
kernel ahead, so spans overlap: the measured time is each kernel's share of the critical path
(``exclusive_us``), the span is kept beside it.
One JSON line per kernel goes to ``--out`` (model, measured and span µs, FLOPs, bytes, bound) and a table
is printed last.

Plans come as files (``python -m pyrunner superopt ... -o P.json``; ``benchmarks/hf_regions.py --out DIR``
writes a layer's region plans). On the GPU machine, with the plans in a carried folder:

    SCRIPT=benchmarks/kernel_profile.py TOTAL_S=300 bash benchmarks/gpu_run.sh --plan P.json --plans-dir DIR

``--list`` reads the plans and prints the model's side only (CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def plan_files(args: argparse.Namespace) -> list[Path]:
    """The ``--plan`` files, then every ``*_plan.json`` / ``*.plan.json`` under each ``--plans-dir``, sorted."""
    files = [Path(p) for p in args.plan]
    for d in args.plans_dir:
        files += sorted(Path(d).glob("*_plan.json")) + sorted(Path(d).glob("*.plan.json"))
    return list(dict.fromkeys(files))


def kernel_of(event_name: str, kernels: list[str]) -> str | None:
    """The plan kernel a CUDA kernel's name belongs to: TileLang names it after the plan kernel, with an optional
    ``_kernel`` suffix; the longest match wins (``k1_tmp10`` before ``k1_tmp1``)."""
    base = event_name.split("(")[0].strip()
    for k in sorted(kernels, key=len, reverse=True):
        if base == k or base.startswith(k + "_kernel"):
            return k
    return None


def exclusive_us(spans: list[tuple[str, float, float]]) -> dict[str, float]:
    """Each name's time on the critical path, from (name, start, end) spans of kernels on one stream: a kernel
    launched early (programmatic dependent launch) waits inside its own span for the kernel ahead, so its span
    overlaps that kernel's; counting only what runs past the latest end so far gives times that add up to the
    busy time of the whole launch instead of more."""
    got: dict[str, float] = {}
    last = float("-inf")
    for name, start, end in sorted(spans, key=lambda s: (s[1], s[2])):
        got[name] = got.get(name, 0.0) + max(0.0, end - max(start, last))
        last = max(last, end)
    return got


def model_side(plan) -> dict[str, dict]:
    """Per kernel: the cost model's predicted µs, FLOPs, bytes and bound, from the plan's cost block."""
    cost = plan.cost.model_dump() if hasattr(plan.cost, "model_dump") else dict(plan.cost or {})
    return {k["kernel"]: k for k in cost.get("kernels", [])}


def profile(plan, iters: int) -> tuple[dict[str, float], dict[str, float], list[str], float]:
    """Per plan kernel its mean device µs over ``iters`` replays (its whole span, and its ``exclusive_us``
    share), the CUDA kernels no plan kernel claims, and the whole launch's mean µs by CUDA events."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from pyrunner.frontend.load import LoadedPlan

    lp = LoadedPlan(plan, verify=True)
    launch = lp.compile()
    lp.check()
    if plan.provenance.backward_of is not None:  # a backward: saved tensors that belong to its inputs
        from pyrunner.run.draws import NORMAL
        from pyrunner.run.verify import GpuVerifier

        # the first draw's tensors only (run.backward_draws): no outlier or planted draw is made for nothing
        tensors = GpuVerifier(plan, lp.graph, seed=3, device="cuda", draws=(NORMAL,)).tensors()
    else:
        gen = torch.Generator(device="cpu").manual_seed(3)
        tensors = {}
        for gt in plan.tensors:
            dt = getattr(torch, gt.dtype)
            if gt.role == "input":
                tensors[gt.name] = (torch.randn(*gt.shape, generator=gen) * 0.5).to("cuda", dt)
            else:
                tensors[gt.name] = torch.empty(gt.shape, dtype=dt, device="cuda")
    for _ in range(5):
        launch(tensors)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        launch(tensors)
    end.record()
    torch.cuda.synchronize()
    whole = start.elapsed_time(end) * 1e3 / iters
    names = [k.name for k in plan.kernels]
    total: dict[str, float] = {}
    other: list[str] = []
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            launch(tensors)
        torch.cuda.synchronize()
    spans: list[tuple[str, float, float]] = []
    for ev in prof.events():
        if "CUDA" not in str(getattr(ev, "device_type", "")):
            continue
        k = kernel_of(ev.name, names)
        if k is None:
            other.append(ev.name)
            continue
        start, end = ev.time_range.start, ev.time_range.end
        spans.append((k, start, end))
        total[k] = total.get(k, 0.0) + (end - start) / iters
    excl = {k: v / iters for k, v in exclusive_us(spans).items()}
    return total, excl, sorted(set(other)), whole


def rows_of(path: Path, plan, span: dict[str, float] | None = None, excl: dict[str, float] | None = None) -> list[dict]:
    model = model_side(plan)
    rows = []
    for k in plan.kernels:
        m = model.get(k.name, {})
        rows.append({"plan": path.name, "workload": plan.workload, "kernel": k.name, "model_us": m.get("time_us"),
                     "measured_us": None if excl is None else excl.get(k.name),
                     "span_us": None if span is None else span.get(k.name),
                     "flops": m.get("flops"), "bytes": m.get("bytes"), "bound": m.get("bound"),
                     "grid": [str(g) for g in k.grid]})
    return rows


def _f(x: float | None, spec: str) -> str:
    """``x`` formatted by ``spec``, or a dash as wide as the spec's width."""
    width = int("".join(c for c in spec.split(".")[0] if c.isdigit()) or 0)
    return "-".rjust(width) if x is None else format(x, spec)


def table(rows: list[dict]) -> str:
    out = [f"{'plan':32s} {'kernel':12s} {'bound':8s} {'model us':>9s} {'meas. us':>9s} {'span us':>8s} "
           f"{'meas/model':>10s} {'TFLOP/s':>8s} {'GB/s':>7s}"]
    for r in rows:
        us, mod = r["measured_us"], r["model_us"]
        ratio = us / mod if us and mod else None
        tf = r["flops"] / us / 1e6 if us and r["flops"] else None
        gb = r["bytes"] / us / 1e3 if us and r["bytes"] else None
        out.append(f"{r['plan'][:32]:32s} {r['kernel'][:12]:12s} {str(r['bound'])[:8]:8s} {_f(mod, '9.1f')} "
                   f"{_f(us, '9.1f')} {_f(r['span_us'], '8.1f')} {_f(ratio, '10.2f')} {_f(tf, '8.1f')} "
                   f"{_f(gb, '7.0f')}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", action="append", default=[], help="a plan JSON file (repeat)")
    ap.add_argument("--plans-dir", action="append", default=[], help="a folder of *_plan.json files (repeat)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--list", action="store_true", help="the model's side only (no GPU)")
    ap.add_argument("--out", default=None, help="a .jsonl file to append to, or a folder (FOLDER/kernel-profile.jsonl)")
    ap.add_argument("--budget-s", type=float, default=0.0, help="skip plans once this many seconds have passed")
    args = ap.parse_args()

    from pyrunner.errors import UserError
    from pyrunner.plan.validate import load_plan

    files = plan_files(args)
    if not files:
        print("kernel_profile: name plans with --plan FILE or --plans-dir DIR", file=sys.stderr)
        return 2
    out = None
    if args.out:
        out = Path(args.out)
        if out.is_dir() or not out.suffix:
            out.mkdir(parents=True, exist_ok=True)
            out = out / "kernel-profile.jsonl"
    if not args.list:
        import torch

        if not torch.cuda.is_available():
            print("kernel_profile: no CUDA GPU here; --list prints the model's side", file=sys.stderr)
            return 2
        device = torch.cuda.get_device_name()
    t0 = time.monotonic()
    rows: list[dict] = []
    for path in files:
        try:
            plan = load_plan(path)
        except UserError as e:
            print(f"[{path.name}] {e}", file=sys.stderr)
            continue
        if args.list:
            rows += rows_of(path, plan)
            continue
        if args.budget_s and time.monotonic() - t0 > args.budget_s:
            print(f"[{path.name}] SKIPPED: past the {args.budget_s:.0f} s budget", flush=True)
            continue
        try:
            span, excl, other, whole = profile(plan, args.iters)
        except Exception as e:  # noqa: BLE001 - one failed plan is a line, not the end of the run
            print(f"[{path.name}] FAIL {type(e).__name__}: {' '.join(str(e).split())[:300]}", flush=True)
            continue
        got = rows_of(path, plan, span, excl)
        for r in got:
            r.update(device=device, whole_us=whole, iters=args.iters)
        rows += got
        each = ", ".join(f"{r['kernel']} {_f(r['measured_us'], '.1f')}" for r in got)
        modelled = sum(r["model_us"] or 0 for r in got)
        print(f"[{path.name}] whole launch {whole:.1f} us (model {modelled:.1f}); kernels: {each}"
              + (f"; unmatched CUDA kernels: {', '.join(other[:4])}" if other else ""), flush=True)
        if out is not None:
            with out.open("a") as f:
                for r in got:
                    f.write(json.dumps(r) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
