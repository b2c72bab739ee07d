"""Time chosen tile configs of one graph's best plan on the GPU, verified first: what the cost model
ranks low never reaches the autotuner, so this measures it directly. On the GPU machine:

    SCRIPT=benchmarks/probes/config_probe.py TOTAL_S=200 bash benchmarks/gpu_run.sh \\
        --graph benchmarks/graphs/softmax_vocab_50257.json \\
        --configs '[{"k0_tmp0": {"block_m": 1, "block_v": 4096}}, {"k0_tmp0": {"block_m": 2, "block_v": 2048}}]'

Each entry overrides the plan's default config; the default is timed first. The table goes to stdout,
the run's record to ``$OUT/results.jsonl`` and the best config to ``$OUT/tuning_<device>.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", required=True, type=Path)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--configs", required=True, help="JSON list of partial configs: kernel -> param -> value")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=300.0)
    args = ap.parse_args(argv)

    from pyrunner.ir.graph_json import load_graph_file
    from pyrunner.pipeline import best_plan
    from pyrunner.plan.schema import with_hash
    from pyrunner.run.runner import RunOptions, default_config, run_plan
    from pyrunner.target.tuning import committed_tuning, widened

    args.out.mkdir(parents=True, exist_ok=True)
    (plan,) = best_plan(load_graph_file(args.graph), args.dtype, tuning=committed_tuning())
    partials = json.loads(args.configs)
    # the planner's space leaves out values its fit check prunes with other parameters: widen it
    # by the values asked for (the runner's fit check still refuses a config that does not fit)
    for partial in partials:
        plan = widened(plan, partial)
    plan = with_hash(plan)
    base = default_config(plan)
    wanted = []
    for partial in partials:
        cfg = {k: dict(v) for k, v in base.items()}
        for kernel, values in partial.items():
            cfg[kernel].update(values)
        wanted.append(cfg)
    opts = RunOptions(results=args.out / "results.jsonl", out_dir=args.out, autotune=len(wanted) + 1,
                      candidates=wanted, baselines=("eager",), use_tuned=False,
                      tuning_out=args.out / "tuning_probe.json", deadline=time.monotonic() + args.budget_s)
    rec = run_plan(plan, opts)
    rows = rec.extra.get("autotune", []) if isinstance(rec.extra, dict) else []
    print(f"{plan.workload} {plan.dtype}: {rec.status}; {rec.message}")
    for row in sorted(rows, key=lambda r: r.get("time_us", float("inf"))):
        t = f"{row['time_us']:9.1f} us" if "time_us" in row else f"{row.get('status', '?')[:60]}"
        print(f"{t}  {json.dumps(row['config'], sort_keys=True)}")
    return 0 if rec.status == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
