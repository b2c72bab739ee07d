"""The tuning space of a lowered kernel: which tile extents, stages and thread counts the cost
model ranks and the autotuner may time, and the structural facts that shape it (a loop of
synchronous loads, a short reduction grid, rows held whole, rows of a strided stream)."""

from __future__ import annotations

from pyrunner.plan.analysis import STAGES_PARAM, THREADS_PARAM, block_param, thread_reads_staged
from pyrunner.planner.lower import MAX_FULL_EXTENT, Lowered, long_row_threads
from pyrunner.planner.tiles import block_candidates
from pyrunner.target.device import DEFAULT_TARGET


def param_space(low: Lowered, sizes: dict[str, int], sms: int = DEFAULT_TARGET.sms) -> dict[str, list[int]]:
    """The kernel's tuning space on a device of ``sms`` SMs (a short reduction grid gets narrower row tiles)."""
    space: dict[str, list[int]] = {}
    m_axes = {g.m_axis for g in low.gemms}
    long_rows = long_rows_whole(low)
    for a in low.tiled:
        # one WGMMA needs 64 rows (a shorter axis gets one padded tile); without GEMMs a row tile of 8
        # doubles the blocks of a short reduction grid (1024 rows: 128 blocks, not 64 on 132 SMs);
        # a loop of synchronous loads, or one whose 8-row tiles leave SMs idle, may go down to two
        # rows (its wide steps then fit in registers; 256 rows: 128 blocks, not 32); a block of 1
        # would make the axis an indexed one, which no buffer may keep (plan.validate)
        narrow = (synchronous_loop(low) or short_reduction_grid(low, sizes, sms) or long_rows
                  or a in strided_rows(low))
        lo = 64 if a in m_axes else 16 if low.gemms else 2 if narrow else 8
        space[block_param(a)] = block_candidates(sizes[a], lo=lo)
    if low.stream is not None:
        space[block_param(low.stream)] = list(low.steps)  # the steps the lowering masked for
        # a masked loop (run-time length) that threads read tiles of renders as a one-stage cp.async
        # pipeline (see backend.tilelang.render): deeper configs would only repeat it
        # and a loop of synchronous loads waits for each step's loads whatever its stages
        one_stage = synchronous_loop(low) or (low.visible is not None and thread_reads_staged(low.body))
        space[STAGES_PARAM] = [1] if one_stage else [1, 2, 3]
    space[THREADS_PARAM] = long_row_threads(low.full) if long_rows else [128, 256]
    return space


def strided_rows(low: Lowered) -> set[str]:
    """The row axes of a loop without GEMMs that streams a strided axis while its tiles span the
    contiguous one (a mean over the middle axis of X[b, t, d]): they may go down to two rows, so
    the contiguous axis takes wide tiles at the same block size (run 78: mean-pool over t of
    64 x 256 x 1024 at 8 x 64 columns 18.5 us, at 2 x 256 11.2: rows of 512 bytes, not 128)."""
    if low.stream is None or low.gemms:
        return set()
    inner = {ld.axes[-1] for ld in low.loads if ld.axes}
    if low.stream in inner or not inner & set(low.tiled):
        return set()
    return set(low.tiled) - inner


def long_rows_whole(low: Lowered) -> bool:
    """A kernel that holds a long reduced row whole (no loop: read once, reduced, then used): its
    fragments hold ``rows x length / threads`` values each, so it needs short row tiles and may
    spread a row over more threads (a 4096-wide row at 8 rows and 256 threads is 128 registers a
    fragment)."""
    return any(n > MAX_FULL_EXTENT for n in low.full.values()) and not low.gemms


def synchronous_loop(low: Lowered) -> bool:
    """A streamed loop that loads a tensor whose rows are not 16-byte aligned: no cp.async, so each
    step waits for its own loads and pipeline stages hide nothing (``target.device.rows_async``)."""
    return low.stream is not None and any(ld.in_loop and not ld.asynchronous for ld in low.loads)


def short_reduction_grid(low: Lowered, sizes: dict[str, int], sms: int = DEFAULT_TARGET.sms) -> bool:
    """A streamed loop without GEMMs whose grid at 8-row tiles has fewer blocks than the device has
    SMs (run 52: a 256 x 32000 softmax's statistics on 32 blocks, 36 us for 16 MB)."""
    if low.stream is None or low.gemms:
        return False
    blocks = 1
    for g in low.grid:
        block = 8 if g.axis in low.tiled else g.block if isinstance(g.block, int) else 1
        blocks *= -(-sizes[g.axis] // block)
    return blocks < sms
