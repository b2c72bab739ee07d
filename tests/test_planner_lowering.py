"""Every plan the planner emits for the catalog renders, lowers to CUDA for sm_90a
and compiles to a cubin with nvcc, on a machine without a GPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from plan_cache import search
from test_corpus import TOP

from pyrunner.backend.tilelang.compile import check_fits, compile_cubin, lower_to_cuda
from pyrunner.backend.tilelang.lowered import releases_in_flight, tma_races, warp_specialised_thread_reads
from pyrunner.backend.tilelang.render import render
from pyrunner.ir import catalog as workloads
from pyrunner.ir.graph_json import load_graph_file

ROOT = Path(__file__).resolve().parent.parent
HELD_BACK = ROOT / "benchmarks" / "graphs" / "rmsnorm_gelu_up.json"

CASES = [(name, "fp16", 3) for name in workloads.SEED_WORKLOADS]
CASES += [(name, "bf16", 1) for name in workloads.CATALOG]


def _graph(name: str):
    return load_graph_file(HELD_BACK) if name == "held-back" else workloads.get(name)


@pytest.mark.slow
@pytest.mark.parametrize("name,dtype,top", CASES + [("held-back", "bf16", 2)])
def test_plans_lower_and_compile(name: str, dtype: str, top: int, tmp_path: Path) -> None:
    # the first ``top`` of the plan cache's TOP: the entries test_corpus.py and test_render_emulated.py plan
    for plan in search(_graph(name), dtype, top=max(top, TOP))[:top]:
        check_fits(plan)
        assert render(plan) == render(plan)
        sources = lower_to_cuda(plan)
        assert set(sources) == {k.name for k in plan.kernels}
        assert all("__global__" in src for src in sources.values())
        assert {k: tma_races(src) for k, src in sources.items() if tma_races(src)} == {}
        assert {k: warp_specialised_thread_reads(src) for k, src in sources.items()
                if warp_specialised_thread_reads(src)} == {}
        assert {k: releases_in_flight(src) for k, src in sources.items() if releases_in_flight(src)} == {}
        if shutil.which("nvcc") is None:
            pytest.skip("nvcc not on PATH: CUDA source checked, cubin not built")
        result = compile_cubin(sources, tmp_path / plan.provenance.plan_hash)
        assert len(list(result)) == len(plan.kernels)
        assert all(p.stat().st_size > 0 for p in result)
