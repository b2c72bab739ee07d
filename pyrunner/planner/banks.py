"""Shared-memory bank conflicts of maps that read a shared tile across its rows.

A map's ``T.Parallel`` loop runs over its destination fragment's axes with the last one fastest
across a warp's threads. Where it reads a shared tile whose contiguous axis is another one
(``B_s[n_i, m_i]`` in a loop over ``(m, n)``), consecutive threads read addresses one shared row
apart, and 32 banks of 4 bytes serve them in ``gcd(row words, 32)`` passes instead of one. The
Hopper measured this directly (run 82, ``h200-run82-transposed-probe.jsonl``): the transposed add
over 2048 x 1024 took 4.2, 5.5, 7.3 and 11.5 us on shared rows of 16, 32, 64 and 256 bytes (4, 8,
16 and 32 passes), 3.1 us plus one pass per warp read at 1.75 GHz; the batched decode's
``Q_s[b, h, d] * K_s[b, h, t, d]`` in a loop over ``(b, h, d, t)`` (256-byte rows, 32 passes)
took 3.0 ms where its bytes take 0.6 (run 84). The passes replay the load pipe and stall the
warps issuing them, so the cost model adds their time to the kernel's (``cost.estimate``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from pyrunner.plan.schema import Buffer, Call, Map, Ref
from pyrunner.planner.lower import Lowered
from pyrunner.target.device import DTYPE_BYTES

BANKS = 32
BANK_BYTES = 4


def _refs(expr) -> Iterator[str]:
    if isinstance(expr, Ref):
        yield expr.buf
    elif isinstance(expr, Call):
        for a in expr.args:
            yield from _refs(a)


def conflict_ways(src: Buffer, fast: str, blocks: dict[str, int]) -> int:
    """Passes one warp read of ``src`` takes when consecutive threads step along axis ``fast``
    (1: conflict-free, or ``src`` does not carry ``fast`` and the threads read one address)."""
    if fast not in src.axes or src.axes[-1] == fast:
        return 1
    inner = src.axes[src.axes.index(fast) + 1:]
    row_bytes = math.prod(blocks.get(a, 1) for a in inner) * DTYPE_BYTES[src.dtype]
    words = row_bytes // BANK_BYTES
    if words < 2:  # neighbours share a word or sit in adjacent banks
        return 1
    return min(math.gcd(words, BANKS), max(1, blocks.get(fast, 1)))


SharedReads = list[tuple[bool, tuple[str, ...], list[Buffer]]]
"""Per map into a fragment that reads shared tiles: (once per loop step?, its fragment's axes, the
shared tiles it reads)."""


def shared_reads(low: Lowered) -> SharedReads:
    """The maps of a lowering that read shared tiles (no config changes them: computed once per
    config search, ``cost.LoweringFacts``)."""
    buffers = {b.name: b for b in low.buffers}
    out: SharedReads = []
    for section, ops in (("body", low.body), ("prologue", low.prologue), ("epilogue", low.epilogue)):
        for op in ops:
            if not isinstance(op, Map):
                continue
            dst = buffers.get(op.dst)
            if dst is None or dst.scope != "fragment" or not dst.axes:
                continue
            srcs = [buffers[n] for n in dict.fromkeys(_refs(op.expr))
                    if n in buffers and buffers[n].scope == "shared"]
            if srcs:
                out.append((section == "body" and low.stream is not None, tuple(dst.axes), srcs))
    return out


def extra_wavefronts(low: Lowered, blocks: dict[str, int], reads: SharedReads | None = None) -> tuple[float, float]:
    """Shared-memory passes beyond one per warp read, per block: (per loop step, once per block).
    ``reads``: ``shared_reads(low)`` where the caller prices many configs."""
    per_step = once = 0.0
    for step, axes, srcs in shared_reads(low) if reads is None else reads:
        fast = axes[-1]
        n = math.prod(blocks.get(a, 1) for a in axes) / BANKS  # warp reads of each operand
        for src in srcs:
            extra = n * (conflict_ways(src, fast, blocks) - 1)
            if step:
                per_step += extra
            else:
                once += extra
    return per_step, once
