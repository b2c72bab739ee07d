"""Forward + backward on one GPU: Superopt's planned halves (``pyrunner.load(plan, backward=True)``) against
SDPA, FlexAttention and torch.compile, each verified against float64 autograd before it is timed (issue 44).

Cases (bf16):

* ``attention``: softmax(Q K^T / sqrt(d)) V, h16 t4096 d128, against SDPA (FlashAttention-2 / cuDNN backward);
* ``causal`` and ``sliding`` (window 1024): against FlexAttention (compiled, block mask) and, for causal, SDPA;
* ``softcap``: tanh score capping at 30 (``tests/data/attention_softcap.json``, Gemma-2's), h16 t4096 d128, against
  FlexAttention (compiled, the cap as its score modification);
* ``swiglu`` and ``rmsnorm_mlp`` (catalog shapes): against torch.compile of the same PyTorch code;
* ``llama_step``: one training step (forward, backward, no optimizer) of the Llama-3-8B-shaped Hugging Face
  layer (2048 tokens) through the superopt backend against torch.compile, parameter gradients against the
  float64 layer.

Each variant's input gradients (random bf16 cotangents) are compared with float64 autograd of the graph on the
same rounded inputs: Superopt's against ``gradient_bound`` of its two plans, conditioned on what rounding the
saved tensors alone does to the float64 backward (as ``run.grad_check.composed_error`` does on the CPU);
a baseline's error is recorded beside it. Only a verified variant is timed (``run.timing.side_by_side_us``,
interleaved rounds, medians). One JSON line per case and variant goes to ``--out``.

On the GPU machine::

    SCRIPT=benchmarks/grad_bench.py TOTAL_S=500 bash benchmarks/gpu_run.sh

Planner switches (``benchmarks/switches.py``): ``--switch cost.PHASED_BLOCKS=0`` plans every case with it set;
``--ab-switch merge.SHARED_INTERMEDIATES`` adds a variant ``superopt+SHARED_INTERMEDIATES`` planned (and
compiled) with that switch on beside ``superopt`` (the switches as set), both verified and timed side by side in
the same rounds::

    SCRIPT=benchmarks/grad_bench.py TOTAL_S=420 bash benchmarks/gpu_run.sh --cases attention causal \
        --ab-switch merge.SHARED_INTERMEDIATES

``--plan-store DIR`` keeps plans and derivations across processes (``pyrunner.frontend.plan_store``); with
``--plan-only`` this machine plans every case's variants into it, no GPU needed, so a GPU call of the same tree
spends its minutes compiling, checking and timing (run 173 spent 48-77 s a variant before timing it); the Llama
step's regions are traced on the ``meta`` device and planned by the backend's plan mode. Plans are filed per
device: ``--plan-device h100`` plans for an H100 (default: the GPU here, else h200)::

    python benchmarks/grad_bench.py --plan-only --plan-store .device/plan-store --cases attention causal
    python benchmarks/grad_bench.py --plan-only --plan-store .device/plan-store --cases llama_step --plan-device h100
    SCRIPT=benchmarks/grad_bench.py TOTAL_S=420 bash benchmarks/gpu_run.sh --cases attention causal \
        --plan-store .device/plan-store

``--small`` is the CPU smoke test of the script: tiny shapes, Superopt's halves in the float64 interpreter
(``Trainable(executor="reference")``), eager baselines, wall-clock times that mean nothing.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import switches  # noqa: E402 - benchmarks/switches.py

ATTN = {"h": 16, "t_q": 4096, "t_kv": 4096, "d": 128}
CASES: dict[str, tuple[str, dict[str, int], tuple[str, ...]]] = {
    "attention": ("ScaledAttention", ATTN, ("sdpa",)),
    "causal": ("CausalAttention", ATTN, ("flex", "sdpa")),
    "sliding": ("SlidingWindowAttention", ATTN, ("flex",)),
    "softcap": ("tests/data/attention_softcap.json", ATTN, ("flex",)),
    "swiglu": ("SwiGLU", {}, ("torch.compile",)),
    "rmsnorm_mlp": ("RMSNormMLP", {}, ("torch.compile",)),
}
SMALL = {"h": 2, "t_q": 64, "t_kv": 64, "d": 32, "m": 32, "n": 48}
BASELINE_BOUND = 5e-2
"""A baseline whose gradients are further than this from float64 is reported and not timed."""


def graph_of(case: str, small: bool):
    """The case's graph (a catalog name, or a graph file under the repository) at its timed sizes."""
    from pyrunner.ir import catalog
    from pyrunner.ir.graph_json import load_graph_file

    name, sizes, _ = CASES[case]
    g = load_graph_file(ROOT / name) if name.endswith(".json") else catalog.get(name)
    want = {a: n for a, n in (SMALL if small else sizes).items() if a in g.sizes}
    return g.with_sizes(want) if want else g


def inputs(graph, device: str, seed: int = 0) -> dict:
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    return {t.name: (torch.randn(*[graph.sizes[a] for a in t.axes], generator=gen) * 0.5)
            .to(device=device, dtype=torch.bfloat16) for t in sorted(graph.inputs(), key=lambda t: t.name)}


def baselines(graph, wanted: tuple[str, ...], small: bool) -> dict:
    """Name -> fn(**inputs) -> {output: tensor}, differentiable PyTorch (compiled lazily on first call)."""
    import torch

    from pyrunner.run.baselines import torch_fn, vendor_fn
    from pyrunner.run.flex import flex_fn

    out = {}
    for b in wanted:
        if b == "sdpa":
            v = vendor_fn(graph)
            if v is not None and v[0] == "sdpa":
                out["sdpa"] = v[1]
        elif b == "flex" and not small:
            f = flex_fn(graph)
            if f is not None:
                out["flex"] = f
        elif b == "torch.compile":
            out["eager" if small else "torch.compile"] = torch_fn(graph) if small else torch.compile(torch_fn(graph))
    return out


def float64_grads(graph, xs: dict, cot: dict) -> dict:
    """Float64 autograd of the graph's PyTorch form on the (rounded) inputs and cotangents."""
    import torch

    from pyrunner.run.grad_check import float64_torch

    leaves = {n: x.detach().double().requires_grad_() for n, x in xs.items()}
    outs = float64_torch(graph)(**leaves)
    names = [n for n, _ in graph.outputs]
    grads = torch.autograd.grad([outs[n] for n in names], list(leaves.values()), [cot[n].double() for n in names],
                                allow_unused=True)
    return {n: g for n, g in zip(leaves, grads, strict=True) if g is not None}


def rel(a, b) -> float:
    return float((a.double() - b).abs().max() / b.abs().max())


def superopt(graph, small: bool, device: str):
    """The Trainable, its stated gradient bound (conditioned as ``composed_error``), and a note."""
    import torch

    from pyrunner.frontend.region_plans import cached_plan
    from pyrunner.frontend.trainable import Trainable
    from pyrunner.run.baselines import torch_fn
    from pyrunner.run.grad_check import gradient_bound
    from pyrunner.run.verify import conditioned_bound, storage_dtype

    plan = cached_plan(graph, "bfloat16")[0]
    if small:
        return Trainable(plan, executor="reference"), 1e-2, "float64 interpreter (--small)"
    f = Trainable(plan, verify=True)
    tp = f.plans
    bound = gradient_bound(tp.forward, tp.backward, tp.bwd)
    # what rounding the saved tensors to their stored dtype (and the computed operands) alone does
    x64 = {n: x.double() for n, x in inputs(graph, device, seed=7).items()}
    with torch.no_grad():
        fwd = torch_fn(tp.bwd.forward)(**x64)
        gen = torch.Generator(device="cpu").manual_seed(8)
        feed = {}
        for t in tp.bwd.graph.inputs():
            shape = [tp.bwd.graph.sizes[a] for a in t.axes]
            feed[t.name] = x64[t.name] if t.name in x64 else fwd[t.name] if t.name in tp.bwd.saved else \
                (torch.randn(*shape, generator=gen) * 0.5).to(device).bfloat16().double()
        ref = torch_fn(tp.bwd.graph)(**feed)
        rounded = {k: (v.bfloat16().double() if k in tp.bwd.saved else v) for k, v in feed.items()}
        moved = torch_fn(tp.bwd.graph, storage_dtype(tp.backward))(**rounded)
        cond = max(rel(moved[n], r) for n, r in ref.items())
    del fwd, ref, moved, feed, rounded
    note = (f"forward {len(tp.forward.kernels)} kernel(s), backward {len(tp.backward.kernels)} kernel(s), "
            f"saves {', '.join(tp.bwd.saved)}; bound {bound:.1e} conditioned on saved-tensor rounding {cond:.1e}")
    return f, conditioned_bound(bound, cond), note


def _outputs_of(f, names: list[str]):
    """fn(**inputs) -> {output: tensor} of a Trainable."""
    def so(**kw):
        o = f(**kw)
        return dict(zip(names, o if isinstance(o, tuple) else (o,), strict=True))
    return so


def variants_of(args: argparse.Namespace) -> list[tuple[str, dict[str, bool]]]:
    """Superopt's variants: ``superopt`` (the switches as set) and one per ``--ab-switch``, with its settings."""
    return [("superopt", {}), *((f"superopt+{k.split('.')[-1]}", {k: True}) for k in args.ab_switch)]


def plan_case(case: str, args: argparse.Namespace) -> None:
    """``--plan-only``: each variant's plans, as ``run_case`` asks for them, into the plan store (no GPU)."""
    from pyrunner.frontend.region_plans import cached_plan
    from pyrunner.frontend.training import training_plans

    graph = graph_of(case, args.small)
    for v, settings in variants_of(args):
        t0 = time.perf_counter()
        with switches.switched(settings):
            tp = training_plans(cached_plan(graph, "bfloat16", args.plan_device)[0], args.plan_device)
        print(f"[{case}] {v}: forward {tp.forward.provenance.plan_hash} ({len(tp.forward.kernels)} kernel(s)), "
              f"backward {tp.backward.provenance.plan_hash} ({len(tp.backward.kernels)}), saves "
              f"{', '.join(tp.bwd.saved)}; planned in {time.perf_counter() - t0:.1f} s", flush=True)


def plan_llama_step(args: argparse.Namespace) -> None:
    """``--plan-only`` for the Llama step: the layer built as ``run_llama_step`` builds it, on the ``meta`` device
    (nothing computed), captured by dynamo and handed to the backend's plan mode under autograd, so its regions,
    their cuts and both halves of each are planned into the store as the GPU host would plan them."""
    import torch

    from pyrunner.frontend.backend import LAST_REPORTS, compile_fx_graph
    from pyrunner.frontend.optimize import capture_graph

    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from frontend_models import llama_layer

    t0 = time.perf_counter()
    m, (x,), kw = llama_layer(**(LLAMA_SMALL if args.small else LLAMA))
    meta = {k: tuple(t.to("meta", torch.bfloat16) for t in v) if isinstance(v, tuple) else v for k, v in kw.items()}
    gm, ex = capture_graph(m.to("meta", torch.bfloat16).requires_grad_(True), x.to("meta", torch.bfloat16), **meta)
    compile_fx_graph(gm, ex, fallback="eager", executor="plan", verify=False, name="llama_step",
                     device=args.plan_device)
    print(f"[llama_step] planned in {time.perf_counter() - t0:.1f} s\n{LAST_REPORTS[-1]}", flush=True)


def run_case(case: str, args: argparse.Namespace, out) -> None:
    import torch


    device = "cpu" if args.small else "cuda"
    graph = graph_of(case, args.small)
    xs = {n: x.requires_grad_() for n, x in inputs(graph, device).items()}
    gen = torch.Generator(device="cpu").manual_seed(1)
    names = [n for n, _ in graph.outputs]
    cot = {n: (torch.randn(*graph.shape_of(t), generator=gen) * 0.5).to(device=device, dtype=torch.bfloat16)
           for n, t in graph.outputs}
    want = float64_grads(graph, xs, cot)
    variants: dict = {}
    bounds: dict[str, float] = {}
    notes: dict[str, str] = {}
    first = None
    for v, settings in variants_of(args):
        t0 = time.perf_counter()
        try:
            with switches.switched(settings):  # planned and compiled (the renderer reads a switch too) under it
                f, bounds[v], notes[v] = superopt(graph, args.small, device)
                if not args.small:
                    f.runs(torch.device(device))
            hashes = (f.plans.forward and f.plans.forward.provenance.plan_hash,
                      f.plans.backward and f.plans.backward.provenance.plan_hash)
            first = first or hashes
            same = "; the same plans as superopt" if v != "superopt" and hashes == first and any(hashes) else ""
            variants[v] = _outputs_of(f, names)
            notes[v] += f"; planned in {time.perf_counter() - t0:.1f} s{same}"
        except Exception as e:  # noqa: BLE001 - a failed variant is a row, not the end of the run
            traceback.print_exc()
            notes[v] = f"FAIL {type(e).__name__}: {' '.join(str(e).split())[:300]}"
    for b, fn in baselines(graph, CASES[case][2], args.small).items():
        variants[b], bounds[b] = fn, BASELINE_BOUND
    fns, errors = {}, {}
    for v, fn in variants.items():
        try:
            outs = fn(**xs)
            grads = torch.autograd.grad([outs[n] for n in names], [xs[n] for n in want], [cot[n] for n in names])
            errors[v] = max(rel(g, want[n]) for g, n in zip(grads, want, strict=True))
            del outs, grads  # a live graph keeps the leaves' gradient nodes, and their stream, to the capture
            if errors[v] <= bounds[v]:
                fns[v] = functools.partial(step_grads, fn, xs, names, list(want), cot)
            else:
                notes[v] = notes.get(v, "") + f"; NOT VERIFIED: gradient error {errors[v]:.2e} > {bounds[v]:.1e}"
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            notes[v] = f"FAIL {type(e).__name__}: {' '.join(str(e).split())[:300]}"
    write_timed(fns, list(variants), {"case": case, "graph": graph.name, "shapes": dict(graph.sizes)}, errors,
                bounds, notes, args, out)

def step_grads(fn, xs: dict, names: list[str], wrt: list[str], cot: dict):
    """One timed forward + backward: ``fn`` on fresh leaves (detached views of ``xs``, no copy) and the
    input gradients of ``cot``. Fresh leaves, because a leaf's gradient node remembers the stream of the
    call that made it: one made on the default stream (the check, a do_bench warm-up) and reused inside a
    CUDA-graph capture makes autograd wait on a stream outside the capture, and the capture fails
    (pytorch/pytorch#180090), as it did for every variant of run 152."""
    import torch

    leaves = {n: x.detach().requires_grad_(x.requires_grad) for n, x in xs.items()}
    outs = fn(**leaves)
    return torch.autograd.grad([outs[n] for n in names], [leaves[n] for n in wrt], [cot[n] for n in names])


def write_timed(fns: dict, variants: list[str], case: dict, errors: dict, bounds: dict, notes: dict,
                args: argparse.Namespace, out) -> None:
    """Time the verified variants side by side (one method for all) and write one record per variant,
    failed or unverified ones included, with the speedup of superopt over each."""
    from pyrunner.run.timing import device_name, kernel_times_us, side_by_side_us

    times, method, per_round = side_by_side_us(fns, rounds=args.rounds) if fns else ({}, {}, {})
    so_us = times.get("superopt")
    # each variant's CUDA kernels per step (torch.profiler over eager steps, apart from the CUDA-graph timing):
    # where a step spends time beyond its planned kernels (casts, copies, gradient accumulation)
    kernels = {v: sorted(kernel_times_us(fn, [], calls=5).items(), key=lambda kv: -kv[1])
               for v, fn in fns.items()} if args.profile and not args.small else {}
    for v in variants:
        us = times.get(v)
        rec = {**case, "variant": v, "fwd_bwd_us": us, "method": method.get(v), "rounds_us": per_round.get(v),
               "grad_err_vs_f64": errors.get(v), "bound": bounds.get(v),
               "superopt_speedup": (us / so_us) if us and so_us and v != "superopt" else None,
               "note": notes.get(v, ""), "device": "cpu" if args.small else device_name(), "small": args.small,
               "switches": switches.label({k: switches.get(k) for k in switches.SWITCHES}),
               "command": " ".join(sys.argv)}
        if v in kernels:
            rec["kernels_us"] = kernels[v]
            busy = sum(us for _, us in kernels[v])
            print(f"[{case['case']}] {v}: {busy:.1f} us of CUDA kernels per step (profiled apart): " + ", ".join(
                f"{name.split('(')[0][:40]} {us:.1f}" for name, us in kernels[v][:10]), flush=True)
        out.write(json.dumps(rec) + "\n")
        out.flush()
        print(f"[{case['case']}] {v:14s} {'-' if us is None else f'{us:10.1f} us'}  grad err {errors.get(v)}  "
              f"(bound {bounds.get(v)})  {'' if not rec['superopt_speedup'] else f'superopt {us / so_us:.2f}x'}  "
              f"{notes.get(v, '')}", flush=True)


LLAMA = {"seq": 2048, "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128, "ffn": 14336}
LLAMA_SMALL = {"seq": 32, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "ffn": 128}


def run_llama_step(args: argparse.Namespace, out) -> None:
    """One training step (forward and backward, no optimizer) of the Llama-3-8B-shaped decoder layer: the
    superopt backend (regions with their derived backward) against torch.compile, parameter gradients
    verified against the float64 layer first (``BASELINE_BOUND``, bf16 through a layer and its backward)."""
    import copy

    import torch

    import pyrunner.frontend  # noqa: F401 - registers the backend
    from pyrunner.frontend.backend import LAST_REPORTS

    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from frontend_models import llama_layer

    device = "cpu" if args.small else "cuda"
    m, (x,), kw = llama_layer(**(LLAMA_SMALL if args.small else LLAMA))

    def moved(dtype):
        mm = copy.deepcopy(m).to(device=device, dtype=dtype).requires_grad_(True)
        kk = {k: tuple(t.to(device=device, dtype=dtype) for t in v) if isinstance(v, tuple) else v
              for k, v in kw.items()}
        return mm, x.to(device=device, dtype=dtype), kk

    m64, x64, kw64 = moved(torch.float64)
    y = m64(x64, **kw64)
    y = y[0] if isinstance(y, tuple) else y
    cot = (torch.randn(y.shape, generator=torch.Generator().manual_seed(1)) * 0.5).to(device=device,
                                                                                      dtype=torch.bfloat16)
    y.backward(cot.double())
    want = {n: p.grad for n, p in m64.named_parameters()}
    del m64, y
    opts = {"executor": "reference", "fallback": "eager"} if args.small else {}
    variants, fns, errors, notes = {}, {}, {}, {}
    for v in ("eager" if args.small else "torch.compile", "superopt"):
        mm, xx, kk = moved(torch.bfloat16)
        torch._dynamo.reset()
        f = torch.compile(mm, backend="superopt", options=opts) if v == "superopt" else \
            (mm if args.small else torch.compile(mm))

        def step(f=f, xx=xx, kk=kk):
            r = f(xx, **kk)
            (r[0] if isinstance(r, tuple) else r).backward(cot)

        variants[v] = (mm, step)
    for v, (mm, step) in variants.items():
        t0 = time.perf_counter()
        try:
            step()
            errors[v] = max(rel(p.grad, want[n]) for n, p in mm.named_parameters())
            notes[v] = f"first step {time.perf_counter() - t0:.1f} s"
            if v == "superopt" and LAST_REPORTS:
                notes[v] += "\n" + str(LAST_REPORTS[-1])
            if errors[v] <= BASELINE_BOUND:
                fns[v] = step
            else:
                notes[v] += f"; NOT VERIFIED: gradient error {errors[v]:.2e} > {BASELINE_BOUND:.0e}"
        except Exception as e:  # noqa: BLE001 - a failed variant is a row
            traceback.print_exc()
            notes[v] = f"FAIL {type(e).__name__}: {' '.join(str(e).split())[:300]}"
    write_timed(fns, list(variants), {"case": "llama_step", "shapes": LLAMA_SMALL if args.small else LLAMA}, errors,
                dict.fromkeys(variants, BASELINE_BOUND), notes, args, out)

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="*", default=[*CASES, "llama_step"], choices=[*CASES, "llama_step"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", action="store_true",
                    help="also list each verified variant's CUDA kernels per step (torch.profiler, eager, apart)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "grad-bench.jsonl"),
                    help="a .jsonl file to append to, or a folder (then FOLDER/grad-bench.jsonl)")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="start no case that would end past this many seconds if it took as long as the longest "
                         "so far (0: no limit); gpu_run.sh passes it")
    ap.add_argument("--small", action="store_true", help="CPU smoke test of the script")
    ap.add_argument("--switch", action="append", metavar="NAME=0|1",
                    help=f"set a planner switch for every variant ({', '.join(switches.SWITCHES)}; repeatable)")
    ap.add_argument("--ab-switch", action="append", default=[], metavar="NAME",
                    help="add a variant superopt+NAME planned with that switch on, timed beside superopt")
    ap.add_argument("--plan-store", metavar="DIR",
                    help="keep plans and derivations in DIR across processes (pyrunner.frontend.plan_store)")
    ap.add_argument("--plan-only", action="store_true",
                    help="with --plan-store: plan every case's variants here (no GPU, the lowering gate on), so a "
                         "GPU run of the same tree finds them")
    ap.add_argument("--plan-device", metavar="NAME",
                    help="with --plan-only: the GPU the GPU run will have (h200, h100; default: the one here, else "
                         "h200): plans are filed per device")
    args = ap.parse_args(argv)
    if args.plan_only and not args.plan_store:
        ap.error("--plan-only needs --plan-store DIR")
    if args.plan_device and not args.plan_only:
        ap.error("--plan-device goes with --plan-only (a GPU run plans for the GPU it has)")
    if args.plan_store:
        from pyrunner.frontend import plan_store

        plan_store.use(Path(args.plan_store))
    try:
        switches.apply(switches.parse_all(args.switch))
        args.ab_switch = [switches.resolve(n) for spec in args.ab_switch for n in spec.split(",") if n.strip()]
    except ValueError as e:
        ap.error(str(e))
    if args.plan_only:
        from pyrunner.frontend import region_plans

        region_plans.LOWER_CHECK = True  # as on the GPU host, which runs the lowering gate
        for case in args.cases:
            plan_llama_step(args) if case == "llama_step" else plan_case(case, args)
        return 0
    if not args.small:
        import torch

        if not torch.cuda.is_available():
            print("grad_bench: no CUDA GPU here; use --small for the CPU smoke test", file=sys.stderr)
            return 2
    out_path = Path(args.out)
    if out_path.suffix != ".jsonl":
        out_path = out_path / "grad-bench.jsonl"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    longest = 0.0  # the longest case so far: a case is started only where one that long would still fit
    with open(out_path, "a") as out:
        for case in args.cases:
            used = time.monotonic() - start
            if args.budget_s and used + longest > args.budget_s:
                print(f"[{case}] SKIPPED: {used:.0f} s used of the {args.budget_s:.0f} s budget, and the longest "
                      f"case so far took {longest:.0f} s", flush=True)
                continue
            try:
                run_llama_step(args, out) if case == "llama_step" else run_case(case, args, out)
            except Exception:  # noqa: BLE001 - the next case still runs
                traceback.print_exc()
            longest = max(longest, time.monotonic() - start - used)
    return 0


if __name__ == "__main__":
    sys.exit(main())
