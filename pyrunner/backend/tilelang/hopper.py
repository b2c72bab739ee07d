"""Hopper as the TileLang renderer targets it: the device, the compile target and its instruction set.

The Hopper forms (wgmma GEMMs, TMA loads, warp-specialised producer/consumer loops, persistent kernels
over ``SM_COUNT`` blocks, programmatic dependent launch) are rendered for this target only; this module
is where they get the GPU's numbers, so they name no device themselves. A leaf (``target.device`` and
``compile_target``): ``backend.tilelang.backend`` pairs it with the lowering check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pyrunner.backend.tilelang.compile_target import NVCC_FLAGS, CompileTarget
from pyrunner.target.cost_terms import CostTerms
from pyrunner.target.device import H200

__all__ = ["HOPPER", "HOPPER_TERMS", "NVCC_FLAGS", "Hopper"]


HOPPER_TERMS = CostTerms(
    backend="tilelang-hopper",
    fitted_on=(H200.name,),  # H200 runs (below); none on the H100
    # Fitted (issue 41) over every committed H200 side-by-side record and tuning entry, 531 plans, each
    # re-predicted at its timed config (``planner.model_error``); they were 0.80, 0.85, 0.12 us, 4.0 us,
    # 0.75 and no overlap, which over-predicted 83% of the plans (median error 35%, mean 48%).
    # The tensor-core ceiling is the measured cuBLAS one (790 TFLOP/s); what the generated code loses
    # to it is in the instruction width, step depth, tile rows and pipeline factors below, so no
    # further factor (the 1024 x 4096 x 4096 GEMM measured 49.5 us: 694 TFLOP/s).
    compute_efficiency=1.0,
    # 4.06 TB/s of the 4.27 a copy reaches
    memory_efficiency=0.95,
    # one cross-thread tile reduction left inside a tensor-core loop: shuffles + a barrier (linear sums
    # are deferred to the epilogue); attention's running max and sum per step
    loop_reduce_s=0.06e-6,
    # wgmma m64nNk16: a narrow N re-reads A from shared memory per output column more often and issues
    # more instructions per FLOP
    mma_width_efficiency=((256, 1.0), (128, 0.93), (64, 0.80), (32, 0.62), (16, 0.45), (8, 0.35)),
    k_depth_efficiency=(0.55, 128.0),
    m_full_rows=128,  # a 64-row tile keeps one warpgroup busy, not two
    pipe_by_stages=((1, 0.75), (2, 0.92)),
    # Fitted to run 102 (``h200-ab-runs94-102.jsonl``): the 1000 x 1024 x 50257 LM head at 128 x 256 x 64
    # tiles took 501 us unstaged where the MMAs alone are modelled at 172; staged in registers one step
    # ahead, 429 us at the same config (the two-byte loads and their shared-memory stores still take the
    # load/store pipe for most of a step)
    sync_gemm_pipe=0.34,
    sync_staged_pipe=0.40,
    # H200 run 7: the fused RMSNorm kernel without warp specialisation 81.7 us against 60.3 predicted
    # for the overlapped form
    no_ws_scale=1.35,
    # H200 runs 64-65, at their best configs: add + RMSNorm over 4096 34.0 us against 42.4, L1 rows
    # 17.0 against 22.5, layernorm over 1024 9.8 against 14.6: such a kernel reads each row once and
    # streams at about 4.2 TB/s, where the model's bandwidth is 3.6
    # (0.85 once the bandwidth above is 0.95 of the copy rate: the same 4.2 TB/s)
    long_rows_scale=0.85,
    # a streamed block keeps ``stages`` tiles in flight, so 88 blocks draw all the bandwidth; a loop-free
    # kernel loads, computes, stores (run 73: 1000 x 3000 elementwise on 96 blocks of 128 x 256, 5.4 us;
    # on 752 of 64 x 64, 4.2 in run 51)
    stream_block_reach=1.5,
    flat_block_reach=1.0,
    resident_threads=2048,
    resident_blocks=32,
    specialised_one_block=True,  # TileLang 0.1.15's producer/consumer split: 384-thread launch bounds
    # a kernel of a CUDA graph (how every plan and baseline is timed) costs about 1.25 us beyond its work:
    # a one-kernel plan of 7 elements measured 1.4 us (run 77), a three-element softmax over 5000 rows
    # 1.6 (run 81); ``Device.launch_us`` (4 us) is a stream launch's
    launch_us=1.25,
    # two consumer warpgroups per block: one's exponentials and rescales run while the other's wgmma is
    # in flight, so attention costs about the longer of its MMA and special-function times (h 16,
    # t 4096, d 128: 211 us measured; its MMAs 187 us at N = 128, its 268M exponentials 67 us; the model
    # that added them predicted 389). 0.9, not 1: fully hidden, CUDA-core work would be free, and the
    # search would stop preferring the derivations that save it (exp2, scales folded into constants)
    cc_overlap=0.9,
    # no gain from L2 residency was found over the records (fitted: 0); the term stays for a backend
    # or device where it shows
    l2_bw_share=0.0,
)
"""The cost model's constants for TileLang's Hopper code (``target.cost_terms``), with the runs they
come from."""


@dataclass(frozen=True)
class Hopper(CompileTarget):
    """A Hopper GPU (compute capability 9.0, ``sm_90a``: wgmma and TMA) as a TileLang compile target."""

    family: ClassVar[str] = "hopper"
    async_forms: ClassVar[bool] = True
    tma_pipelines: ClassVar[bool] = True
    dependent_launch: ClassVar[bool] = True
    archs: ClassVar[tuple[str, ...]] = ("sm_90a",)
    terms: ClassVar[CostTerms] = HOPPER_TERMS


HOPPER = Hopper(H200)
"""The Hopper target plans are rendered for by default."""

