"""Ampere as the TileLang renderer targets it (compute capability 8.x, ``sm_80``).

What differs from Hopper is what the renderer leaves out, not what it writes: a tile GEMM is still
``T.gemm`` (TileLang lowers it to ``mma.sync`` m16n8k16 warp MMAs on sm_80, operands through
``ldmatrix``), a streamed loop is still ``T.Pipelined`` (TileLang turns its global-to-shared copies
into ``cp.async`` groups, ``num_stages`` deep), and everything else is plain thread code. Left out:
the explicitly warp-specialised forms (TMA rings, mbarriers, wgmma, async-proxy fences, persistent
kernels) and programmatic dependent launch (griddepcontrol needs sm_90); and a loop of run-time length
(a causal mask's visible steps) is ``T.serial``, since TileLang's cp.async pipeline drains such a loop
with a group count that is not a constant, which has no CUDA form. The fit check is the shared
one over the A100's limits (164 KiB of shared memory per SM, 64K registers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pyrunner.backend.tilelang.compile_target import CompileTarget
from pyrunner.target.cost_terms import CostTerms
from pyrunner.target.device import A100

__all__ = ["AMPERE", "AMPERE_TERMS", "Ampere"]


AMPERE_TERMS = CostTerms(
    backend="tilelang-ampere",
    fitted_on=(),  # no A100 run exists: the values below are modelled (see each line)
    # None of these is measured on an A100 (no A100 run exists): each is the Hopper figure's physical
    # counterpart for the code this path renders, so every A100 time the planner gives is modelled.
    # A100's ``tc_flops`` is the vendor peak (312 TFLOP/s), not a measured ceiling as the Hopper device's is:
    # cuBLAS/CUTLASS bf16 GEMMs on mma.sync reach about 85-90% of it at large shapes (~270-280).
    compute_efficiency=0.88,
    # a copy reaches about 0.88 of A100's 1.56 TB/s peak; cp.async loads are issued by the computing
    # threads (no TMA engine), about 0.93 of that again
    memory_efficiency=0.82,
    # Hopper's shuffles + barrier (0.06 us at 1.98 GHz) at A100's 1.41 GHz boost clock
    loop_reduce_s=0.085e-6,
    # mma.sync m16n8k16: every instruction is 8 wide; a narrow warp tile reuses its A fragment over
    # fewer n8 MMAs (more ldmatrix per FLOP), a milder loss than wgmma's re-read of A from shared memory
    mma_width_efficiency=((64, 1.0), (32, 0.9), (16, 0.75), (8, 0.6)),
    # each step's cp.async wait and __syncthreads stall the computing warps themselves (no producer
    # warp), so a shallow step loses a little more than on Hopper
    k_depth_efficiency=(0.5, 128.0),
    # CUTLASS's sm80 GEMMs keep 4 warps busy on 128-row tiles (2 x 2 warp tiles of 64 x 64)
    m_full_rows=128,
    # cp.async multi-stage pipelines (CUTLASS sm80 uses 3-5 stages): fewer stages expose the load
    # latency more than TMA's producer warp does
    pipe_by_stages=((1, 0.65), (2, 0.85), (3, 0.95)),
    # synchronous (unaligned) loads are the same thread code as on Hopper: its fitted factors carried over
    sync_gemm_pipe=0.34,
    sync_staged_pipe=0.40,
    # neutral: nothing is warp specialised on this path, so there is no specialised form to scale from
    no_ws_scale=1.0,
    # a kernel holding long rows whole reads each row once at the full copy rate (0.88 of peak) where
    # the pipelined path gets 0.82
    long_rows_scale=0.93,
    # the per-SM bandwidth-share argument is the same (streamed blocks keep ``stages`` tiles in flight);
    # Hopper's figures carried over
    stream_block_reach=1.5,
    flat_block_reach=1.0,
    # sm_80: 2048 resident threads and 32 resident blocks per SM
    resident_threads=2048,
    resident_blocks=32,
    # off: no producer/consumer split, so no 384-thread launch bounds holding one block per SM
    specialised_one_block=False,
    # Hopper's 1.25 us per kernel under CUDA-graph replay, plus the ramp that programmatic dependent
    # launch (sm_90 only) no longer overlaps with the previous kernel's drain
    launch_us=1.5,
    # mma.sync is synchronous per warp: CUDA-core work overlaps MMAs only across warps of one SM's four
    # schedulers, not within one as under async wgmma (Hopper's 0.9); about half is hidden
    cc_overlap=0.5,
    # off, as on Hopper: no L2-residency gain measured (the term stays for where one shows)
    l2_bw_share=0.0,
)
"""The cost model's constants for TileLang's Ampere code (``target.cost_terms``): modelled, not fitted."""


@dataclass(frozen=True)
class Ampere(CompileTarget):
    """An Ampere GPU (``sm_80``: mma.sync and cp.async, no TMA or wgmma) as a TileLang compile target."""

    family: ClassVar[str] = "ampere"
    async_forms: ClassVar[bool] = False
    tma_pipelines: ClassVar[bool] = False
    dependent_launch: ClassVar[bool] = False
    archs: ClassVar[tuple[str, ...]] = ("sm_80", "sm_86", "sm_87", "sm_89")
    terms: ClassVar[CostTerms] = AMPERE_TERMS


AMPERE = Ampere(A100)
"""The Ampere target ``--device a100`` renders for."""
