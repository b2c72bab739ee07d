"""Compile a workload's best plan and launch it a few times on random inputs, for a profiler to
capture (nothing is timed or checked here: gpu_run.py does that). On the GPU machine, in
gpu_run.sh's environment (TileLang unpacked, PYTHONPATH set):

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats -k regex:k0 \\
        --launch-skip 2 --launch-count 1 python3 benchmarks/probes/launch_plan.py Attention

``NAME:axis=N;axis=N`` overrides shapes; a path ending in .json is a graph file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--launches", type=int, default=4)
    args = ap.parse_args(argv)

    import torch

    from pyrunner.backend.tilelang.compile import load_module
    from pyrunner.backend.tilelang.render import render
    from pyrunner.ir import catalog
    from pyrunner.ir.graph_json import load_graph_file
    from pyrunner.pipeline import best_plan
    from pyrunner.plan.analysis import resolve_config
    from pyrunner.run.draws import NORMAL
    from pyrunner.run.verify import GpuVerifier
    from pyrunner.target.tuning import committed_tuning

    if args.workload.endswith(".json"):
        graph = load_graph_file(Path(args.workload))
    else:
        name, _, shape = args.workload.partition(":")
        sizes = {a: int(n) for a, n in (kv.split("=") for kv in shape.split(";") if kv)} or None
        graph = catalog.get(name, sizes)
    (plan,) = best_plan(graph, args.dtype, tuning=committed_tuning())
    cfg = resolve_config(plan)
    module = load_module(render(plan), Path("/tmp/superopt_launch") / "plan.py")
    kernels = module.compile_kernels(cfg)
    tensors = GpuVerifier(plan, graph, device="cuda", draws=(NORMAL,)).tensors()  # the first draw's only
    for _ in range(args.launches):
        module.launch(tensors, cfg, kernels=kernels)
    torch.cuda.synchronize()
    print(f"{plan.workload} {plan.dtype}: {len(plan.kernels)} kernel(s) launched {args.launches} times, config {cfg}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
