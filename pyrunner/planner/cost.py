"""Analytic cost model: roofline per kernel with tile, wave and pipeline effects.

All machine constants live in ``H200``; ``calibrate`` scales them from measured
results (the JSON Lines results log), so the planner ranks by what was seen.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from pyrunner.planner.lower import Lowered

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


@dataclass(frozen=True)
class Machine:
    """Device constants (H200 SXM, measured where DESIGN gives a measurement)."""

    tc_flops: float = 790e12          # dense fp16/bf16 tensor-core FLOP/s (measured cuBLAS ceiling)
    cc_flops: float = 60e12           # fp32 CUDA-core element ops/s
    sfu_ops: float = 4.0e12           # transcendental evaluations/s
    hbm_bw: float = 4.27e12           # bytes/s, measured copy bandwidth
    l2_bw: float = 12e12              # bytes/s for re-reads that hit L2
    launch_us: float = 4.0            # per-kernel launch + tail latency
    sms: int = 132
    smem_per_block: int = 200 * 1024  # of 227 KiB: TileLang adds reduction and layout scratch
    smem_per_sm: int = 228 * 1024
    regs_per_sm: int = 65536
    frag_regs_per_thread: int = 192   # budget for fragment tiles (fp32 words) per thread
    loop_reduce_s: float = 0.35e-6    # one tile reduction inside a tensor-core loop: shuffles + barrier
                                      # (measured: fused RMSNorm 100 us vs its bare GEMM 54 us, H200 run 1)
    loop_map_s: float = 0.08e-6       # one elementwise tile pass inside a tensor-core loop
    compute_efficiency: float = 0.80  # generated-code efficiency on tensor cores (calibrated)
    memory_efficiency: float = 0.85   # achieved fraction of copy bandwidth (calibrated)

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.__dict__.items()}


H200 = Machine()


@dataclass(frozen=True)
class Estimate:
    time_us: float
    flops: float
    bytes: float
    bound: str
    smem: int
    config: dict[str, int]


def block_candidates(size: int, lo: int = 16, hi: int = 256) -> list[int]:
    """Tile extents for an axis: powers of two that divide it, else its small divisors."""
    cands = [b for b in (16, 32, 64, 128, 256) if lo <= b <= hi and b <= size and size % b == 0]
    if not cands:
        # a block of 1 would make the axis indexed, not held: never offer it for a tiled axis
        cands = [d for d in range(min(size, hi), 1, -1) if size % d == 0][:3] or [size]
    return sorted(cands)


def param_space(low: Lowered, sizes: dict[str, int]) -> dict[str, list[int]]:
    space: dict[str, list[int]] = {}
    m_axes = {g.m_axis for g in low.gemms}
    for a in low.tiled:
        lo = min(64, sizes[a]) if a in m_axes else 16
        space[f"block_{a}"] = block_candidates(sizes[a], lo=lo)
    if low.stream is not None:
        space[f"block_{low.stream}"] = block_candidates(sizes[low.stream], lo=16, hi=128 if low.gemms else 256)
        space["stages"] = [1, 2, 3]
    space["threads"] = [128, 256]
    return space


def _blocks(low: Lowered, cfg: dict[str, int], sizes: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for g in low.grid:
        out[g.axis] = cfg[g.block] if isinstance(g.block, str) else g.block
    if low.stream is not None:
        out[low.stream] = cfg[f"block_{low.stream}"]
    return out


def _buf_elems(axes: list[str], blocks: dict[str, int]) -> int:
    return math.prod(blocks[a] for a in axes)


def smem_bytes(low: Lowered, cfg: dict[str, int], sizes: dict[str, int]) -> int:
    blocks = _blocks(low, cfg, sizes)
    stages = cfg.get("stages", 1)
    looped = {op.dst for op in low.body if getattr(op, "op", "") == "load"}
    total = 0
    for b in low.buffers:
        if b.scope != "shared":
            continue
        n = _buf_elems(b.axes, blocks) * DTYPE_BYTES[b.dtype]
        total += n * (stages if b.name in looped else 1)
    return total


def frag_words_per_thread(low: Lowered, cfg: dict[str, int], sizes: dict[str, int]) -> float:
    blocks = _blocks(low, cfg, sizes)
    words = sum(_buf_elems(b.axes, blocks) * DTYPE_BYTES[b.dtype] / 4 for b in low.buffers if b.scope == "fragment")
    return words / cfg["threads"]


def fits(low: Lowered, cfg: dict[str, int], sizes: dict[str, int], m: Machine = H200) -> str | None:
    """None if the config fits the device, else why not."""
    smem = smem_bytes(low, cfg, sizes)
    if smem > m.smem_per_block:
        return f"shared memory {smem} B > {m.smem_per_block} B per block"
    regs = frag_words_per_thread(low, cfg, sizes)
    if regs > m.frag_regs_per_thread:
        return f"fragments need {regs:.0f} registers/thread > {m.frag_regs_per_thread}"
    blocks = _blocks(low, cfg, sizes)
    warps = cfg["threads"] // 32
    for g in low.gemms:
        bm, bn = blocks[g.m_axis], blocks[g.n_axis]
        if bm % 16 or bn % 8:
            return f"GEMM tile {bm}x{bn} is not a multiple of the 16x8 MMA shape"
        if g.a_in_registers and bm < 16 * warps:
            return f"a register A operand needs {16 * warps} rows for {warps} warps, the tile has {bm}"
        if (bm // 16) * (bn // 8) < warps:
            return f"GEMM tile {bm}x{bn} cannot be split among {warps} warps"
        if bn > 256:
            return "GEMM tile N > 256"
    return None


def estimate(low: Lowered, cfg: dict[str, int], sizes: dict[str, int], tensor_bytes: dict[str, int],
             m: Machine = H200) -> Estimate:
    blocks = _blocks(low, cfg, sizes)
    n_blocks = 1
    for g in low.grid:
        n_blocks *= sizes[g.axis] // blocks[g.axis]
    n_iter = sizes[low.stream] // blocks[low.stream] if low.stream else 1

    # bytes: each tensor once from HBM, re-reads of tiles from L2
    unique = 0.0
    reread = 0.0
    for ld in low.loads:
        whole = tensor_bytes[ld.tensor]
        tile = whole
        for a in ld.axes:
            tile = tile / sizes[a] * blocks.get(a, 1)
        total = tile * n_blocks * (n_iter if ld.in_loop else 1)
        unique += whole
        reread += max(0.0, total - whole)
    written = sum(tensor_bytes[w] for w in low.writes)
    dram = unique + written

    smem = smem_bytes(low, cfg, sizes)
    threads = cfg["threads"]
    per_sm = max(1, min(m.smem_per_sm // max(smem, 1), 2048 // threads, 32))
    slots = m.sms * per_sm
    waves = math.ceil(n_blocks / slots)
    wave_eff = n_blocks / (waves * slots)
    # a grid smaller than the machine leaves SMs idle regardless of occupancy
    util = min(1.0, n_blocks / m.sms) if n_blocks < m.sms else wave_eff

    flops = sum(g.flops for g in low.gemms)
    tile_eff = 1.0
    for g in low.gemms:
        bm, bn = blocks[g.m_axis], blocks[g.n_axis]
        harm = bm * bn / (bm + bn)
        k_eff = min(1.0, 0.55 + blocks[g.k_axis] / 128) if g.k_axis in blocks else 1.0
        tile_eff = min(tile_eff, min(1.0, harm / 64.0) * k_eff)
    pipe = 1.0
    if low.stream is not None:
        pipe = {1: 0.75, 2: 0.92}.get(cfg.get("stages", 1), 1.0)
    t_tc = flops / (m.tc_flops * m.compute_efficiency * tile_eff * max(util, 1e-3) * pipe) if flops else 0.0
    t_cc = (low.ew_elems / m.cc_flops + low.trans_elems / m.sfu_ops) / max(util, 1e-3)
    t_mem = (dram / (m.hbm_bw * m.memory_efficiency) + reread / m.l2_bw) / max(min(1.0, util * 1.5), 1e-3)
    if low.stream is not None:
        t_mem /= pipe
    # reductions inside a GEMM loop serialise with the MMAs: a fixed cost per block and step
    per_step = 0.0
    if low.gemms:
        per_step = sum(m.loop_reduce_s if op.op == "reduce" else m.loop_map_s
                       for op in low.body if op.op in ("reduce", "map"))
    t_sync = per_step * n_blocks * n_iter / (slots * max(wave_eff, 1e-3)) if n_iter else 0.0
    t_compute = t_tc + 0.5 * t_cc + t_sync
    body = max(t_compute, t_mem)
    time_us = body * 1e6 + m.launch_us
    bound = "compute" if t_compute >= t_mem else "memory"
    if m.launch_us > body * 1e6:
        bound = "latency"
    return Estimate(time_us=time_us, flops=flops + low.ew_elems, bytes=dram + reread, bound=bound, smem=smem,
                    config=cfg)


def best_config(low: Lowered, sizes: dict[str, int], tensor_bytes: dict[str, int],
                m: Machine = H200) -> tuple[dict[str, list[int]], Estimate] | None:
    """Search the kernel's tile space; the cheapest config that fits, or None."""
    space = param_space(low, sizes)
    names = sorted(space)
    best: Estimate | None = None
    for values in itertools.product(*(space[n] for n in names)):
        cfg = dict(zip(names, values))
        if fits(low, cfg, sizes, m) is not None:
            continue
        est = estimate(low, cfg, sizes, tensor_bytes, m)
        key = (round(est.time_us, 3), -sum(values))
        if best is None or key < (round(best.time_us, 3), -sum(best.config[n] for n in names)):
            best = est
    if best is None:
        return None
    return space, best


def calibrate(log: Path | None, m: Machine = H200) -> Machine:
    """Scale efficiencies by measured/predicted ratios in the results log.

    Records with a predicted time and a measured plan time on a GPU adjust
    ``compute_efficiency`` (compute-bound plans) and ``memory_efficiency``
    (memory-bound ones) by the geometric mean of predicted/measured.
    """
    if log is None or not Path(log).exists():
        return m
    ratios: dict[str, list[float]] = {"compute": [], "memory": []}
    for line in Path(log).read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        pred, meas, bound = rec.get("predicted_us"), rec.get("plan_us"), rec.get("bound")
        if rec.get("status") == "ok" and pred and meas and bound in ratios:
            ratios[bound].append(pred / meas)
    out = m
    for bound, field_name in (("compute", "compute_efficiency"), ("memory", "memory_efficiency")):
        rs = ratios[bound]
        if rs:
            g = math.exp(sum(math.log(r) for r in rs) / len(rs))
            out = replace(out, **{field_name: min(1.0, max(0.05, getattr(out, field_name) * g))})
    return out
