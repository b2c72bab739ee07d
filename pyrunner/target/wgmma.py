"""Which GEMM tiles TileLang can lower to Hopper WGMMA: its warp partition, and the shapes it rejects.

TileLang splits a tile GEMM among warpgroups (4 warps each) by the GEMM's warp policy
(``ComputeWgmmaWarpPartition`` in TileLang's ``src/cuda/op/gemm.cc``, mirrored here). Every
warpgroup then issues m64nNk16 instructions on its share of the tile. A shared operand in
MN-major order (a weight stored (k, n), say) must give each warpgroup at least 32 bytes of
columns (16 half-precision elements): with 8 columns TileLang fails with "Not a canonical
GMMA_MN layout" (issue 8 item 7, a 16-wide tile over 256 threads). We do not know here whether
B is MN-major, so the rule is applied to every GEMM: it costs only a few tiny tiles.
"""

from __future__ import annotations

WARPGROUP = 4
M_PER_WARP = 16
N_PER_WARP = 8
MIN_WARPGROUP_N = 16
"""Fewest columns of a 16-bit MN-major operand one warpgroup can take (32 bytes)."""


def warp_partition(policy: str, m: int, n: int, warps: int) -> tuple[int, int] | None:
    """(warps along m, warps along n) TileLang picks for an m x n tile, or None when none is valid.

    ``policy`` is "FullRow" (as many warps along m as possible) or "Square" (TileLang's default:
    per-warp extents closest to the tile's aspect ratio).
    """
    if warps % WARPGROUP or m % M_PER_WARP or n % N_PER_WARP:
        return None

    def valid(mw: int, nw: int) -> bool:
        return mw * nw == warps and mw % WARPGROUP == 0 and m % (mw * M_PER_WARP) == 0 \
            and n % (nw * N_PER_WARP) == 0

    cands = [(mw, warps // mw) for mw in range(warps, WARPGROUP - 1, -WARPGROUP)
             if warps % mw == 0 and valid(mw, warps // mw)]
    if not cands:
        return None
    if policy == "FullRow":
        return cands[0]
    ideal = m / n

    def score(c: tuple[int, int]) -> float:
        return abs((m / (c[0] * M_PER_WARP)) / (n / (c[1] * N_PER_WARP)) - ideal)

    best = min(score(c) for c in cands)
    return next(c for c in sorted(cands) if score(c) == best)  # TileLang scans m upward, keeps the first best


def tile_problem(m: int, n: int, threads: int) -> str | None:
    """Why TileLang may not lower an m x n tile GEMM on ``threads`` threads to WGMMA, or None if it can.

    Judged under the Square policy whatever the renderer picks: FullRow puts at least as many
    warps along m, so it never leaves a warpgroup fewer columns than Square does.
    """
    warps = threads // 32
    policy = "Square"
    part = warp_partition(policy, m, n, warps)
    if part is None:
        return f"the {m}x{n} tile GEMM has no {policy} split among {warps} warps in warpgroups of {WARPGROUP}"
    if n // part[1] < MIN_WARPGROUP_N:
        return (f"the {m}x{n} tile GEMM splits its {n} columns among {part[1]} warpgroups ({policy}): "
                f"{n // part[1]} each, fewer than the {MIN_WARPGROUP_N} an MN-major operand needs")
    return None
