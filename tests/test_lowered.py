"""The lowered-CUDA hazard check: it finds the TMA race of sweep run 4, and no planned kernel has one."""

from __future__ import annotations

import pytest
from plan_cache import search
from test_corpus import TOP

from pyrunner.backend.tilelang.lowered import (
    MAX_LOCAL_WORDS,
    local_words,
    oversized_fragments,
    tma_races,
    warp_specialised_thread_reads,
)

RACY = """\
  if (tl::tl_shuffle_elect<256>()) {
    mbarrier[8].arrive_and_expect_tx(16384);
    tl::tma_load(Q_desc, mbarrier[8], (&(((bfloat16_t*)Q_s)[(i * 4096)])), (i * 64), 0, 0);
  }
  __syncthreads();
  *(uint4*)(Q_s_local_cast + 0) = *(uint4*)(((bfloat16_t*)Q_s) + (((int)threadIdx.x) * 8));
  mbarrier[8].wait(0);
"""

WAITED = """\
    tl::tma_load(K_desc, mbarrier[0], (&(((bfloat16_t*)K_s)[0])), 0, 0, 0);
  mbarrier[0].wait(0);
  tl::initialize_wgmma_descriptor<1, 1, 64>(desc_b, (&(((bfloat16_t*)K_s)[0])));
  float2 v = *(float2*)(((bfloat16_t*)K_s) + 4);
"""


def test_finds_a_read_before_the_wait() -> None:
    (race,) = tma_races(RACY)
    assert (race.buffer, race.barrier, race.load_line, race.read_line) == ("Q_s", 8, 3, 6)
    assert "'Q_s'" in str(race) and "mbarrier[8]" in str(race)


def test_a_read_after_the_wait_is_fine() -> None:
    assert tma_races(WAITED) == []


WS_READ = """\
    tl::warpgroup_reg_alloc<240>();
        tl::tma_load(H_desc, mbarrier[(f_step % 3)], (&(((float*)H_s)[((f_step % 3) * 8192)])), 0, 0);
      float2 v_ = *(float2*)(((float*)H_s) + ((f_step_1 % 3) * 8192));
"""


def test_finds_thread_reads_of_a_warp_specialised_stage() -> None:
    assert warp_specialised_thread_reads(WS_READ) == ["H_s"]
    assert warp_specialised_thread_reads(WS_READ.replace("warpgroup_reg_alloc", "x")) == []


REPLICATED = """extern "C" __global__ void __launch_bounds__(256, 1) k2_t4_kernel(float* t4) {
  float max_t_kv_in[8];
  bfloat16_t p_bf16[32];
  float t_5[2048];
  float t4_tile[2048];
  #pragma unroll
  for (int i = 0; i < 16; ++i) {
    float local_sum[4];
  }
}"""


def test_finds_per_thread_arrays_no_register_file_holds() -> None:
    """Sweep 29: a [16, 4, 256] tile reduced over its middle axis lowered to 2048 floats per thread in
    two arrays; nvcc took ten minutes on it. Halves count half; arrays in inner blocks count too."""
    assert local_words(REPLICATED) == (8 + 16 + 2048 + 2048 + 4, "t_5")
    why = oversized_fragments(REPLICATED)
    assert why is not None and "4124" in why and "'t_5'" in why
    fits = REPLICATED.replace("[2048]", "[128]")
    assert local_words(fits)[0] <= MAX_LOCAL_WORDS and oversized_fragments(fits) is None


@pytest.mark.slow
@pytest.mark.parametrize("graph", ["attention_qk_norm", "norm_rmsnorm_weight_matmul", "mlp_relu_squared"])
def test_rendered_kernels_have_no_tma_hazards(graph: str) -> None:
    """A prologue tile that thread code reads (Q's RMS statistics) is loaded without the racing TMA path,
    and a loop that reads its pipelined tiles with thread code (relu(H)^2 of a loaded H) is not warp
    specialised (sweep run 4's wrong kernels; diagnosis run 6)."""
    pytest.importorskip("tilelang")
    from pathlib import Path

    from pyrunner.backend.tilelang.compile import lower_to_cuda
    from pyrunner.errors import GraphError
    from pyrunner.ir.graph_json import graph_from_json, read_json_file

    doc = read_json_file(Path(__file__).parent / "data" / f"{graph}.json", "graph file", GraphError)
    plan = search(graph_from_json(doc), "bf16", top=TOP)[0]  # the best plan: the plan cache's entry of test_corpus
    for name, src in lower_to_cuda(plan).items():
        assert tma_races(src) == [], name
        assert warp_specialised_thread_reads(src) == [], name
        assert oversized_fragments(src) is None, name


@pytest.mark.slow
def test_superopt_skips_a_plan_whose_kernel_keeps_oversized_arrays(monkeypatch) -> None:
    pytest.importorskip("tilelang")
    from pyrunner.backend.tilelang import compile as tl_compile
    from pyrunner.backend.tilelang.buildable import lowering_problem
    from pyrunner.ir import catalog
    from pyrunner.planner import search

    (plan,) = search(catalog.get("Matmul"), "bf16", tuning=False)
    monkeypatch.setattr(tl_compile, "lower_to_cuda", lambda p, **kw: {"k2_t4": REPLICATED})
    why = lowering_problem(plan)
    assert why is not None and why.startswith("kernel 'k2_t4': its per-thread arrays take 4124")
