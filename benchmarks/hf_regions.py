"""The regions the superopt backend cuts a Hugging Face layer into at its real shape, and each one's plan: CPU only.

What ``torch.compile(backend="superopt")`` plans for ``benchmarks/hf_layers.py``'s prefill layers, without a GPU
and without computing the layer: the layer is built from its config (random weights, no downloads), moved to
the ``meta`` device in bf16, captured by dynamo and handed to the backend's own plan mode (partition, shape
buckets, ``pipeline.best_plan`` with the committed tuning database). One table row per region: its ops, kernels,
modelled time, and per kernel the modelled time, bound and fused loop rules. ``--out DIR`` also writes each
region's planned graph (``<region>.json``) and plan (``<region>_plan.json``), to run with ``python -m pyrunner
superopt --graph`` / ``run``. ``--check`` CPU-checks every plan at reduced shapes (as the no-GPU backend does).
``--training`` plans the training step's regions instead (parameters require gradients: each region's
forward with its saves and its derived backward, ``<region>_bwd_plan.json``), for the GPU ``--device``
names, to profile with ``kernel_profile.py``.

    python benchmarks/hf_regions.py --layers llama3-8b --out /tmp/regions
    python benchmarks/hf_regions.py --layers llama3-8b --training --device h100 --lower-check --out .device/prof
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests", ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

PREFILL = ("llama3-8b", "gpt2-medium", "gemma2-2b")
"""``hf_layers.LAYERS`` that take one input tensor (the decode step needs a cache on a real device)."""


def meta_layer(name: str, small: bool):
    """The layer and its inputs (masks, rotary tables) on the ``meta`` device in bf16."""
    import torch
    from frontend_models import HF_BLOCKS
    from hf_layers import LAYERS, SMALL

    kind, shape = LAYERS[name]
    m, (x,), kw = HF_BLOCKS[kind](**(SMALL[name] if small else shape))  # builds; runs nothing

    def to_meta(v):
        if isinstance(v, torch.Tensor):
            return v.to("meta", torch.bfloat16)
        if isinstance(v, tuple):
            return tuple(to_meta(a) for a in v)
        return v

    return m.to("meta", torch.bfloat16).requires_grad_(False), (to_meta(x),), {k: to_meta(v) for k, v in kw.items()}


def plan_layer(name: str, small: bool, check: bool, out: Path | None, training: bool = False,
               device: str | None = None) -> None:
    import contextlib

    import torch

    from pyrunner.frontend.backend import LAST_REPORTS, compile_fx_graph
    from pyrunner.frontend.optimize import capture_graph
    from pyrunner.ir.graph_json import graph_to_json
    from pyrunner.plan.schema import plan_document

    t0 = time.perf_counter()
    m, args, kw = meta_layer(name, small)
    gm, ex = capture_graph(m.requires_grad_(training), *args, **kw)
    with contextlib.nullcontext() if training else torch.no_grad():
        compile_fx_graph(gm, ex, fallback="eager", executor="plan", verify=check, name=name.replace("-", "_"),
                         device=device)
    rep = LAST_REPORTS[-1]
    print(f"[{name}] {time.perf_counter() - t0:.1f} s\n{rep}")
    for c in rep.regions:
        print(f"  {c.region.label}: {', '.join(n.name for n in c.region.nodes)}")
        halves = [("", c.plan), ("_bwd", c.backward)]
        for half, plan in halves:
            if plan is None:
                continue
            for kc, k in zip(plan.cost.kernels, plan.kernels, strict=True):
                rules = ", ".join(k.fused_rules) or "-"
                print(f"    {half[1:] or 'fwd'} {kc.kernel:12s} {kc.time_us:9.2f} us  {kc.bound:8s} "
                      f"{kc.flops / 1e9:9.2f} GFLOP {kc.bytes / 1e6:9.1f} MB  grid {[g.axis for g in k.grid]}  "
                      f"rules: {rules}")
            if out is not None:
                (out / f"{c.region.label}{half}_plan.json").write_text(json.dumps(plan_document(plan), indent=1)
                                                                       + "\n")
        if out is not None and c.plan is not None:
            (out / f"{c.region.label}.json").write_text(json.dumps(graph_to_json(c.planned or c.region.graph),
                                                                   indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", nargs="*", default=["llama3-8b"], choices=PREFILL)
    ap.add_argument("--small", action="store_true", help="hf_layers' tiny shapes (seconds)")
    ap.add_argument("--check", action="store_true", help="CPU-check each plan at reduced shapes")
    ap.add_argument("--out", help="folder for each region's graph and plan JSON")
    ap.add_argument("--training", action="store_true",
                    help="the training step's regions (parameters require gradients): each region's forward "
                         "with its saves and its derived backward (<region>_bwd_plan.json) planned")
    ap.add_argument("--device", help="the GPU to plan for (h200, h100; default: the one here, else h200)")
    ap.add_argument("--lower-check", action="store_true",
                    help="plan through TileLang's lowering gate, as the GPU host does (seconds a plan), so the "
                         "plans written are the ones it would build")
    args = ap.parse_args()
    out = None
    if args.out:
        from pyrunner.errors import UserError
        from pyrunner.files import output_dir

        try:
            out = output_dir(args.out, "--out folder")
        except UserError as e:
            print(f"hf_regions: {e}", file=sys.stderr)
            return 2
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.lower_check:
        from pyrunner.frontend import region_plans

        region_plans.LOWER_CHECK = True
    for name in args.layers:
        plan_layer(name, args.small, args.check, out, args.training, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
