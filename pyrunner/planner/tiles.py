"""Tile extents the planner may give an axis: one rule for the lowering and the tuning space.

The lowering picks a streamed loop's steps here once (``Lowered.steps``): it masks what enters the
loop's accumulators where one of them leaves a partial last tile, and the cost model's tuning
space offers exactly those steps, so a step the space offers is never one the kernel cannot take.
"""

from __future__ import annotations

POWERS = (8, 16, 32, 64, 128, 256, 512, 1024)


def block_candidates(size: int, lo: int = 16, hi: int = 256) -> list[int]:
    """Tile extents for an axis: the powers of two from ``lo`` that divide it; where none does,
    every power of two up to the first that covers the axis (the last tile is partial: a tail)."""
    pows = [b for b in POWERS if lo <= b <= hi]
    cands = [b for b in pows if b <= size and size % b == 0]
    if not cands:
        cands = [b for b in pows if b < size] + [b for b in pows if b >= size][:1]
    return sorted(cands) or [min(max(lo, 16), hi)]


def stream_steps(size: int, tensor_cores: bool) -> list[int]:
    """Steps of a streamed loop over an axis of ``size``. A loop with tensor cores steps at most
    128 (a K step its shared stages hold); one without may step up to 1024: it has one tile in flight
    per stage, and wide steps keep a short grid streaming (``planner.cost.estimate``'s latency
    bound), with a partial last step where no wide power of two divides (32000 = 125 x 256: 32
    steps of 1024, the last masked)."""
    steps = block_candidates(size, lo=16, hi=128 if tensor_cores else 1024)
    if not tensor_cores:
        steps += [b for b in (512, 1024) if max(steps) < b <= size // 2]
    return steps

