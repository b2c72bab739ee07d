"""The cost model's per-backend constants: how close one backend's generated code gets to its GPU.

Why apart from ``target.device``: a ``Device`` holds the hardware's numbers (SMs, bandwidth, FLOP/s,
limits); these are what one renderer's kernels achieve there (efficiencies, pipeline factors, scales
measured on its kernels, its launch cost under CUDA-graph replay), so a second backend on the same GPU
has its own. Each backend module holds its values (``backend.tilelang.hopper.HOPPER_TERMS``,
``backend.tilelang.ampere.AMPERE_TERMS``) on its compile target (``CompileTarget.terms``);
``planner.cost.Machine`` carries them, and calibrations and tuning entries are filed under ``backend``.
No value is stated here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostTerms:
    """One backend's cost-model constants (values: the backend module's, with the runs they come from)."""

    backend: str
    """The name calibrations and tuning entries are keyed by (``tilelang-hopper``)."""
    fitted_on: tuple[str, ...]
    """The devices (``Device.name``) whose runs of this backend the values are fitted to. On any other device
    (every one for a backend never run; for the Hopper terms, a Hopper GPU they were not fitted on) they are
    modelled from the device description alone, so every time the planner gives there is a model's
    (``superopt --explain`` says so): the terms are per backend, whether a run backs them is per device."""
    compute_efficiency: float
    """Generated-code efficiency on tensor cores."""
    memory_efficiency: float
    """Achieved fraction of the device's copy bandwidth from HBM."""
    loop_reduce_s: float
    """One cross-thread tile reduction left inside a tensor-core loop (shuffles and a barrier)."""
    mma_width_efficiency: tuple[tuple[int, float], ...]
    """Tensor-core efficiency by MMA instruction width N, widest first."""
    k_depth_efficiency: tuple[float, float]
    """(base, depth): a loop step of ``bk`` contracted elements runs at ``min(1, base + bk / depth)``."""
    m_full_rows: int
    """Tile rows that keep every MMA unit of an SM busy (fewer run at ``sqrt(rows / m_full_rows)``)."""
    pipe_by_stages: tuple[tuple[int, float], ...]
    """Overlap of a streamed loop by pipeline depth (stages, factor); deeper loops overlap fully."""
    sync_gemm_pipe: float
    """A GEMM loop whose loads are synchronous (not 16-byte aligned) and not staged."""
    sync_staged_pipe: float
    """The same with its loads staged in registers one step ahead."""
    no_ws_scale: float
    """Measured/predicted of a tensor-core loop rendered without warp specialisation."""
    long_rows_scale: float
    """Measured/predicted of a kernel holding long rows whole."""
    stream_block_reach: float
    """Bandwidth one block of a grid smaller than the SM count draws, in SM shares (a streamed loop)."""
    flat_block_reach: float
    """The same for a kernel without a loop or GEMMs."""
    resident_threads: int
    """Threads one SM holds at once (occupancy)."""
    resident_blocks: int
    """Blocks one SM holds at once."""
    specialised_one_block: bool
    """Whether a warp-specialised loop holds one block per SM (the renderer's launch bounds)."""
    launch_us: float
    """What one kernel of a plan costs beyond its work under CUDA-graph replay (launch, ramp, drain)."""
    cc_overlap: float
    """Fraction of the shorter of a GEMM kernel's tensor-core and CUDA-core times hidden under the longer
    (one warpgroup's exponentials and rescales run while another's MMAs are in flight): 0 adds them."""
    l2_bw_share: float
    """Fraction of the L2 bandwidth a kernel's first reads get where the plan's data stays in L2 between
    calls (the bandwidth between HBM's and L2's that such reads see)."""
