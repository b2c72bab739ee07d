"""Tile extents the planner may give an axis: one rule for the lowering and the tuning space.

The lowering picks a streamed loop's steps here once (``Lowered.steps``): it masks what enters the
loop's accumulators where one of them leaves a partial last tile, and the cost model's tuning
space offers exactly those steps, so a step the space offers is never one the kernel cannot take.
"""

from __future__ import annotations

POWERS = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


TAIL_WORTHWHILE = 64
"""Where the widest dividing power of two is narrower than this (and than the axis), tiles that
leave a partial last tile are offered beside it: 1000 = 8 x 125 and 3000 = 8 x 375 got 8-wide
tiles only, and a 1000 x 3000 elementwise kernel on 8 x 8 tiles (64 elements for 256 threads,
46875 blocks) measured 32.7 us against torch.compile's 5.4 (run 50)."""


SYNC_STEP_MAX = 8192
"""Widest step of a loop without tensor cores whose loads are synchronous (see ``stream_steps``)."""


def block_candidates(size: int, lo: int = 16, hi: int = 256) -> list[int]:
    """Tile extents for an axis: the powers of two from ``lo`` that divide it; where none does, or
    only narrow ones do (``TAIL_WORTHWHILE``), also every power of two up to the first that covers
    the axis (the last tile is partial: a tail)."""
    pows = [b for b in POWERS if lo <= b <= hi]
    cands = [b for b in pows if b <= size and size % b == 0]
    if not cands or (max(cands) < TAIL_WORTHWHILE and max(cands) < size):
        cands = [b for b in pows if b < size] + [b for b in pows if b >= size][:1]  # every divisor is below size
    return cands or [min(max(lo, 16), hi)]


def stream_steps(size: int, tensor_cores: bool, synchronous: bool = False) -> list[int]:
    """Steps of a streamed loop over an axis of ``size``. A loop with tensor cores steps at most
    128 (a K step its shared stages hold); one without may step up to 2048: it has one tile in flight
    per stage, and wide steps keep a short grid streaming (``planner.cost.estimate``'s latency
    bound), with a partial last step where no wide power of two divides (32000 = 125 x 256: 16
    steps of 2048, the last masked; the LM head's softmax statistics over 32000 on 128 blocks of
    2 rows: 72.9 us at steps of 512, 72.0 at 1024, 63.0 at 2048, run 70). A loop whose loads are
    ``synchronous`` (rows not 16-byte aligned: no cp.async) waits out one load latency per step
    whatever its stages, so it may step up to ``SYNC_STEP_MAX``: fewer, wider steps are its only
    way to keep bytes in flight."""
    steps = block_candidates(size, lo=16, hi=128 if tensor_cores else 1024)
    if not tensor_cores:
        wide = (512, 1024, 2048, *((4096, SYNC_STEP_MAX) if synchronous else ()))
        steps += [b for b in wide if max(steps) < b <= size // 2]
    return steps

