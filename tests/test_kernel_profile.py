"""The per-kernel profiler (benchmarks/kernel_profile.py): CUDA kernel names map to the plan's kernels, and
overlapping spans (a kernel launched early waits inside its span) are attributed so they add up to the busy
time of the launch rather than double-counting the wait."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import kernel_profile  # noqa: E402
from plan_cache import search  # noqa: E402

from pyrunner.ir import catalog  # noqa: E402
from pyrunner.plan.schema import plan_document  # noqa: E402


def test_a_kernel_name_maps_to_the_longest_plan_kernel_it_names() -> None:
    names = ["k1_tmp1", "k1_tmp10", "k0_out0"]
    assert kernel_profile.kernel_of("k1_tmp10_kernel", names) == "k1_tmp10"
    assert kernel_profile.kernel_of("k1_tmp1_kernel(float*, int)", names) == "k1_tmp1"
    assert kernel_profile.kernel_of("k0_out0", names) == "k0_out0"
    assert kernel_profile.kernel_of("ampere_bf16_gemm", names) is None
    assert kernel_profile.kernel_of("k1_tmp100_kernel", names) is None


def test_overlapping_spans_count_only_past_the_kernel_ahead() -> None:
    # b launches at 5 while a runs to 10 (it waits), then runs to 14; c starts after a gap
    spans = [("a", 0.0, 10.0), ("b", 5.0, 14.0), ("c", 20.0, 23.0), ("a", 30.0, 40.0)]
    got = kernel_profile.exclusive_us(spans)
    assert got == {"a": 20.0, "b": 4.0, "c": 3.0}
    assert sum(got.values()) == 27.0  # busy time: [0, 14] + [20, 23] + [30, 40]


def test_a_kernel_inside_anothers_span_gets_nothing() -> None:
    assert kernel_profile.exclusive_us([("a", 0.0, 10.0), ("b", 2.0, 8.0)]) == {"a": 10.0, "b": 0.0}


def test_list_prints_the_models_side_of_every_kernel(tmp_path: Path) -> None:
    (plan,) = search(catalog.get("RMSNormMLP"), "bf16", top=1, tuning=False)
    path = tmp_path / "rmsnorm_mlp_plan.json"
    path.write_text(json.dumps(plan_document(plan)))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernel_profile.py"), "--list",
                        "--plans-dir", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("rmsnorm_mlp_plan.json")]
    assert [ln.split()[1] for ln in lines] == [k.name for k in plan.kernels]
    for ln, kc in zip(lines, plan.cost.kernels, strict=True):
        assert float(ln.split()[3]) == pytest.approx(kc.time_us, abs=0.05)


def test_no_plans_is_one_error_line() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernel_profile.py"), "--list"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "kernel_profile:" in r.stderr
