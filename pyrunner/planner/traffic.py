"""HBM traffic of a kernel's tiles: bytes priced per contiguous run, and the bandwidth a short grid draws.

A tile whose rows are narrow moves its bytes in many short runs, each paying whole sectors and a
fixed overhead; the cost model (``planner.cost.estimate``) takes its HBM bytes from here, so the
tile search sees what narrow rows cost (run 72's probe on Hopper, below), and its bandwidth share per
block of a grid smaller than the device.
"""

from __future__ import annotations

import math

from pyrunner.ir.axes import axes_of
from pyrunner.planner.lower import Lowered

SECTOR_BYTES = 32
"""Global memory moves in 32-byte sectors: a tile row of fewer contiguous bytes pays for whole sectors."""

RUN_OVERHEAD_BYTES = 16
"""What each contiguous run of a tile costs beyond its bytes, in a kernel whose threads load and store
(no tensor cores, no TMA): run 72's probe of ``where`` over two 3000 x 1000 inputs took, per tile row
of 16 / 32 / 64 / 128 / 256 bytes, about 2 / 1.6 / 1.15 / 1.05 / 1 times the time of the widest, as
``(run + 16) / run`` predicts (10.6 us at 16 bytes, 5.5 at 256, for 18 MB). Runs of ``FULL_RUN_BYTES``
or more pay nothing extra: the probe has no wider reference, and wider steps of a bandwidth-bound
loop measured no faster (run 35), so they must tie with it."""

FULL_RUN_BYTES = 256


def contiguous_bytes(axes: tuple[str, ...] | list[str], sizes: dict[str, int], blocks: dict[str, int],
                     elem_bytes: float) -> float:
    """Bytes one tile of a tensor laid out as ``axes`` (the last contiguous) holds in one run: its
    innermost block, times the next while the blocks inside are whole axes."""
    run = elem_bytes
    for a in reversed(axes):
        b = min(blocks.get(a, 1), sizes[a])
        run *= b
        if b < sizes[a]:
            break
    return run


def run_cost(run: float, overhead: float) -> float:
    """Bytes a contiguous run of ``run`` bytes costs: whole sectors, and at least ``run + overhead``
    below ``FULL_RUN_BYTES``."""
    sectors = SECTOR_BYTES * math.ceil(run / SECTOR_BYTES)
    return sectors if run >= FULL_RUN_BYTES else max(sectors, run + overhead)


def moved_tensors(low: Lowered) -> list[tuple[str, tuple[str, ...]]]:
    """(name, axes) of every tensor a kernel loads or stores (computed once per config search)."""
    tensors = [(ld.tensor, tuple(ld.axes)) for ld in low.loads]
    tensors += [(name, tuple(axes_of(t))) for name, t in zip(low.writes, low.roots or (low.root,), strict=False)]
    return tensors


def sectored_bytes(low: Lowered, blocks: dict[str, int], sizes: dict[str, int],
                   tensor_bytes: dict[str, int], tensors: list[tuple[str, tuple[str, ...]]] | None = None) -> float:
    """HBM bytes of a kernel's loads and stores, each tensor once, priced per contiguous run of its
    tiles (``run_cost``): whole sectors everywhere, the per-run overhead where threads move the data
    (a tensor-core kernel's operands go by TMA, whose boxes the measurement above does not cover).
    ``tensors``: ``moved_tensors(low)`` where the caller prices many configs."""
    overhead = 0.0 if low.gemms else RUN_OVERHEAD_BYTES
    tensors = moved_tensors(low) if tensors is None else tensors
    total = 0.0
    for name, axes in tensors:
        whole = tensor_bytes[name]
        run = contiguous_bytes(axes, sizes, blocks, whole / max(1, math.prod(sizes[a] for a in axes)))
        total += whole * run_cost(run, overhead) / run if run > 0 else whole
    return total
