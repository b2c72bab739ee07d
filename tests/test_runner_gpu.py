"""The runner on a real GPU: compile with TileLang, verify, time beside the baselines (skipped without CUDA)."""

from __future__ import annotations

import pytest

from pyrunner.log.results import read_log
from pyrunner.run.runner import RunOptions, run_plan

pytestmark = pytest.mark.gpu


def test_timing_uses_the_gpu_clock() -> None:
    import torch

    from pyrunner.run.timing import kernel_times_us, median_us

    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    assert median_us(lambda: a @ a, 5, 20) > 0
    assert kernel_times_us(lambda: a @ a, []) != {}


def test_matmul_plan_end_to_end(tmp_path, matmul_plan) -> None:
    plan = matmul_plan(256, 256, 256)
    opts = RunOptions(results=tmp_path / "r.jsonl", out_dir=tmp_path / "o", autotune=2,
                      baselines=("eager", "torch_compile", "vendor"), warmup_ms=5, rep_ms=20, quiet=True)
    rec = run_plan(plan, opts)
    assert rec.status == "ok", rec.message
    assert rec.plan_us > 0 and rec.error <= rec.error_bound
    assert {"eager", "torch_compile", "cublas"} <= set(rec.baselines_us)
    assert read_log(opts.results, strict=True)[0].plan_hash == plan.provenance.plan_hash
