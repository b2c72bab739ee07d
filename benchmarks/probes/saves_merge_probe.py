"""Probe (issue 44): the forwards that also save both GEMM halves (SwiGLU, RMSNormMLP) failed their float64
check on the GPU in run 157 (``Y``, normalised error 1.0 and 1.1) when their GEMM pair was merged with ``Y``
mapped into a fragment of its own; ``emit.gemm_merges`` now leaves such pairs unmerged. This checks each
saving forward as planned now, at its default tile config and at narrower ``block_n``:

    SCRIPT=benchmarks/probes/saves_merge_probe.py TOTAL_S=200 bash benchmarks/gpu_run.sh
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--budget-s", type=float, default=200)
    args = ap.parse_args()
    from pyrunner.backend.tilelang import compile as tc
    from pyrunner.frontend.training import plan_training
    from pyrunner.ir import catalog
    from pyrunner.plan.analysis import resolve_config
    from pyrunner.plan.validate import plan_graph
    from pyrunner.run.verify import GpuVerifier

    t0 = time.time()
    for name in ("SwiGLU", "RMSNormMLP"):
        plan = plan_training(catalog.get(name), "bf16", cpu_check=False).forward
        base = resolve_config(plan, None)
        print(name, plan.provenance.plan_hash, [k.name for k in plan.kernels], base, flush=True)
        gemm = next(k.name for k in plan.kernels if "block_n" in base[k.name])
        for bn in dict.fromkeys((base[gemm]["block_n"], 64, 32)):
            if time.time() - t0 > args.budget_s:
                return 0
            cfg = {k: dict(v) for k, v in base.items()}
            cfg[gemm]["block_n"] = bn
            try:
                res = GpuVerifier(plan, plan_graph(plan), device="cuda").check(tc.compile_for_gpu(plan, cfg))
                print(f"  block_n {bn}: ok={res.ok} {res.message[:200]}", flush=True)
            except Exception as e:  # noqa: BLE001 - a probe row
                print(f"  block_n {bn}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
