"""Analytic cost model: roofline per kernel with tile, wave and pipeline effects.

Device numbers come from ``pyrunner.target`` (one ``Device`` per GPU); ``Machine`` adds the
model's own calibrated efficiencies and per-structure scales, which ``planner.calibration`` fits
from measured results (the JSON Lines results log), so the planner ranks by what was seen. Which
configs fit the device is the target's fit check (``pyrunner.target.fit``), never decided here.

Why one module: ``estimate`` and the config searches that call it (``best_config``, ``ranked_configs``)
share the per-lowering facts and the per-tile-extents terms they cache (``LoweringFacts``,
``_BlockTerms``); split, the cache would cross a module boundary on the planner's hottest path.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from pyrunner.backend.tilelang.targets import target_for
from pyrunner.plan import masks
from pyrunner.plan.analysis import STAGES_PARAM, THREADS_PARAM, block_param, resolve, thread_reads_staged
from pyrunner.planner.banks import SharedReads, extra_wavefronts, shared_reads
from pyrunner.planner.lower import Lowered
from pyrunner.planner.space import long_rows_whole, param_space, short_reduction_grid, synchronous_loop
from pyrunner.planner.traffic import moved_tensors, sectored_bytes
from pyrunner.target.cost_terms import CostTerms
from pyrunner.target.device import DEFAULT_TARGET, DTYPE_BYTES, Device
from pyrunner.target.fit import FitModel, fitting_space, staged_tiles_fit

__all__ = ["DEFAULT_MACHINE", "DTYPE_BYTES", "Machine", "best_config", "estimate", "fitting_space", "grid_blocks",
           "machine_for", "param_space", "ranked_configs", "structure_class"]


UNFITTED = "unfitted_terms"
"""Key of a plan's ``cost.model`` set where the backend's terms are not fitted to any run on its device
(``CostTerms.fitted_on``): every time in the plan is modelled from the device description."""


@dataclass(frozen=True)
class Machine:
    """A device (``pyrunner.target``), the backend's cost terms (``target.cost_terms``: what its code
    achieves there, the values in the backend module) and calibrated per-structure scales."""

    device: Device
    terms: CostTerms
    structure_scale: tuple[tuple[str, float], ...] = ()  # structure class -> measured/predicted (calibration)

    @property
    def compute_efficiency(self) -> float:
        return self.terms.compute_efficiency

    @property
    def memory_efficiency(self) -> float:
        return self.terms.memory_efficiency

    @property
    def loop_reduce_s(self) -> float:
        return self.terms.loop_reduce_s

    @property
    def launch_us(self) -> float:
        """What one kernel costs beyond its work (the backend's, under CUDA-graph replay)."""
        return self.terms.launch_us

    def as_dict(self) -> dict[str, float]:
        """Every constant the model used (device throughputs and the backend's terms), for the plan."""
        d = self.device
        out = {"tc_flops": d.tc_flops, "cc_flops": d.cc_flops, "sfu_ops": d.sfu_ops, "hbm_bw": d.hbm_bw,
               "l2_bw": d.l2_bw, "launch_us": self.launch_us,
               "smem_wavefronts_per_s": d.smem_wavefronts_per_s, "sms": d.sms, "smem_per_sm": d.smem_per_sm}
        out.update({f.name: getattr(self.terms, f.name) for f in fields(self.terms)
                    if type(getattr(self.terms, f.name)) in (int, float)})
        out.update({f"scale[{c}]": v for c, v in self.structure_scale})
        if not self.fitted:  # no run of this backend on this device: the plan's times are modelled only
            out[UNFITTED] = 1.0
        return {k: float(v) for k, v in out.items()}

    @property
    def fitted(self) -> bool:
        """Whether the backend's terms are fitted to runs on this device (``CostTerms.fitted_on``)."""
        return self.device.name in self.terms.fitted_on

    def scale_for(self, cls: str) -> float:
        """Calibrated measured/predicted ratio of a kernel structure class (1 when uncalibrated; the
        backend's ``no_ws_scale`` for a tensor-core loop without warp specialisation, ``long_rows_scale``
        for a kernel holding long rows whole)."""
        t = self.terms
        default = t.no_ws_scale if cls.endswith("-nows") else t.long_rows_scale if cls.endswith("-rows") else 1.0
        return dict(self.structure_scale).get(cls, default)


def machine_for(device: Device) -> Machine:
    """The uncalibrated cost model of ``device``: its numbers and the terms of the backend rendering for it."""
    return Machine(device, target_for(device).terms)


DEFAULT_MACHINE = machine_for(DEFAULT_TARGET)

PHASED_BLOCKS = True
"""Whether blocks no other block hides are priced by their phases (``phased_time``). On since runs 171-174:
every case it changes GPU-verified with it on (155 forward, 180 backward), and attention's training
step timed both ways in one call (run 173: 1624.9 us off, 1144.0 on; causal 1518.5 and 718.2). Off, the HBM3e
device's model plans attention's backward as a loop-less kernel storing dS (run 122: 771 us measured, 325 modelled
then, 696 with phases); on, FlashAttention-2's fused form. Also on, the median error over run 122's kernel
rows falls from 24% to 18% and the five seeds keep their plans at their catalog shapes
(``benchmarks/snapshot_compare.py`` lists the snapshot cases whose top plan it moves)."""
"""The cost model of the default target device, uncalibrated (``planner.calibration`` fits one from a log)."""


@dataclass(frozen=True)
class Estimate:
    time_us: float
    flops: float
    bytes: float
    bound: str
    smem: int
    config: dict[str, int]


def _blocks(low: Lowered, cfg: dict[str, int], sizes: dict[str, int]) -> dict[str, int]:
    """Block of every grid and loop axis of the lowering under ``cfg``."""
    out = {g.axis: resolve(g.block, cfg) for g in low.grid}
    if low.stream is not None:
        out[low.stream] = cfg[block_param(low.stream)]
    return out


def grid_blocks(low: Lowered, cfg: Mapping[str, int], sizes: Mapping[str, int]) -> int:
    """Blocks of a lowering's grid under ``cfg``."""
    return math.prod(-(-sizes[g.axis] // resolve(g.block, cfg)) for g in low.grid)


def _buf_elems(axes: list[str], blocks: dict[str, int]) -> int:
    return math.prod(blocks[a] for a in axes)


def mma_width_efficiency(n: int, m: Machine | None = None) -> float:
    """Tensor-core efficiency of an MMA instruction ``n`` wide (the backend's table)."""
    table = (m or DEFAULT_MACHINE).terms.mma_width_efficiency
    for width, eff in table:
        if n >= width:
            return eff
    return table[-1][1]


def merged_gemms(low: Lowered) -> bool:
    """Whether two loop GEMMs share their A operand and contracted axis (issued as one, twice as wide)."""
    gemm_ops = [op for op in low.body if getattr(op, "op", "") == "gemm"]
    return any((a.a, a.contract) == (b.a, b.contract)
               for i, a in enumerate(gemm_ops) for b in gemm_ops[i + 1:])


def mma_widths(low: Lowered, blocks: dict[str, int], threads: int, merged: bool | None = None) -> list[int]:
    """Instruction width N of each GEMM as the renderer emits it.

    FullRow (each warpgroup 64 rows x the whole tile) where the rows split among the warps, else
    TileLang's Square split halves N per extra warpgroup column; two loop GEMMs with the same A
    operand and contracted axis issue as one GEMM twice as wide (up to 256). ``merged``:
    ``merged_gemms(low)`` where the caller has it.
    """
    warps = max(1, threads // 32)
    if merged is None:
        merged = merged_gemms(low)
    out = []
    for g in low.gemms:
        bm, bn = blocks[g.m_axis], blocks[g.n_axis]
        n = bn if bm % (16 * warps) == 0 else max(8, bn * 4 * max(1, bm // 64) // warps)
        if g.streamed and merged and 2 * bn <= 256:
            n = 2 * bn
        out.append(min(256, n))
    return out


def warp_specialized(low: Lowered) -> bool:
    """TileLang 0.1.15 splits a pipelined loop into a TMA producer + consumers: 384-thread launch bounds,
    one CTA per SM; not where the loop reads its loaded tiles with thread code (rendered without)."""
    return low.stream is not None and any(ld.in_loop for ld in low.loads) and not thread_reads_staged(low.body)


def structure_class(low: Lowered) -> str:
    """Coarse kernel structure for per-structure calibration: GEMMs, loop, reductions in the loop."""
    n_gemm = len(low.gemms)
    loop_red = sum(1 for op in low.body if getattr(op, "op", "") == "reduce"
                   and not (op.fn == "sum" and op.accumulate))  # linear sums are deferred by the renderer
    reg_a = any(g.a_in_registers for g in low.gemms)
    kind = "gemm" if n_gemm else "ew"
    no_ws = "-nows" if n_gemm and low.stream is not None and thread_reads_staged(low.body) else ""
    rows = "-rows" if long_rows_whole(low) else ""
    return f"{kind}{n_gemm}-{'loop' if low.stream else 'flat'}-r{loop_red}{'-regA' if reg_a else ''}{no_ws}{rows}"
def visible_fraction(low: Lowered, blocks: dict[str, int], sizes: dict[str, int]) -> float:
    """Fraction of loop steps a kernel runs once tiles its mask hides entirely are skipped."""
    if low.stream is None or low.visible is None:
        return 1.0
    grid = {g.axis: (blocks[g.axis], sizes[g.axis]) for g in low.grid}
    return masks.visible_fraction(masks.predicate(low.visible), low.stream, blocks[low.stream],
                                  sizes[low.stream], grid)


@dataclass(frozen=True)
class LoweringFacts:
    """What ``estimate`` reads of a lowering that no config changes: computed once per config search."""

    warp_specialized: bool
    structure_scale: float
    synchronous: bool
    loop_loads: bool
    merged_gemms: bool
    loop_reductions: int
    linear_sums: int
    unique_bytes: float
    written_bytes: float
    long_rows: bool
    shared_reads: SharedReads | None = None
    moved: list[tuple[str, tuple[str, ...]]] | None = None
    blocks_seen: dict = field(default_factory=dict, compare=False, repr=False)
    """``_BlockTerms`` by tile extents: one config search prices many configs of the same tiles."""
    shared_terms: dict | None = field(default=None, compare=False, repr=False)
    """``_BlockTerms`` by tile extents (their elementwise work aside) shared with every lowering of the
    same ``tile_terms_key`` (``planner.memo``: kernels that differ only in elementwise work)."""

    @staticmethod
    def of(low: Lowered, tensor_bytes: dict[str, int], m: Machine) -> LoweringFacts:
        reduces = [op for op in low.body if getattr(op, "op", "") == "reduce"]
        return LoweringFacts(
            warp_specialized=warp_specialized(low), structure_scale=m.scale_for(structure_class(low)),
            synchronous=synchronous_loop(low), loop_loads=any(ld.in_loop for ld in low.loads),
            merged_gemms=merged_gemms(low), loop_reductions=len(reduces) if low.gemms else 0,
            linear_sums=sum(1 for op in reduces if op.fn == "sum" and op.accumulate),
            unique_bytes=float(sum(tensor_bytes[ld.tensor] for ld in low.loads)),
            written_bytes=float(sum(tensor_bytes[w] for w in low.writes)), long_rows=long_rows_whole(low),
            shared_reads=shared_reads(low), moved=moved_tensors(low))


@dataclass(frozen=True)
class _BlockTerms:
    """What ``estimate`` derives from a config's tile extents alone (threads and stages aside):
    shared by every config with the same tiles (``LoweringFacts.blocks_seen``)."""

    blocks: dict[str, int]
    n_blocks: int
    n_iter: int
    run: float
    reread: float
    dram: float
    flops: float
    gemm_terms: list[tuple[float, float, float]]  # per GEMM: work, k efficiency, m efficiency
    ew: float
    trans: float
    loop_elements: int  # elements of the tiles the loop loads (``staged_loads_fit``)
    step_passes: float
    once_passes: float
    ew_once: float = 0.0  # of ``ew`` and ``trans``, the work on values without the loop's axis (before or
    trans_once: float = 0.0  # after the loop, not per step: ``phased_time``)


def tile_terms_key(low: Lowered, facts: LoweringFacts, tensor_bytes: dict[str, int]) -> tuple:
    """Everything ``_block_terms`` reads of a lowering besides its elementwise work (``ew_by_axes``),
    with the bytes of the tensors it moves: lowerings with equal keys (and equal axis extents) share
    those terms per tile extents."""
    return (tuple((g.axis, g.block) for g in low.grid), low.stream, repr(low.visible),
            tuple((ld.tensor, tuple(ld.axes), ld.in_loop, tensor_bytes[ld.tensor]) for ld in low.loads),
            tuple((g.m_axis, g.n_axis, g.k_axis, g.streamed, g.flops) for g in low.gemms),
            tuple((n, axes, tensor_bytes[n]) for n, axes in facts.moved or ()), repr(facts.shared_reads))


def _block_terms(low: Lowered, cfg: dict[str, int], sizes: dict[str, int], tensor_bytes: dict[str, int],
                 facts: LoweringFacts, terms: CostTerms) -> _BlockTerms:
    blocks = _blocks(low, cfg, sizes)
    key = tuple(blocks.values())
    seen = facts.blocks_seen.get(key)
    if seen is not None:
        return seen
    base = _shared_tile_terms(low, blocks, key, cfg, sizes, tensor_bytes, facts, terms)
    # a value is computed once per block of each grid axis it lacks
    split = {g.axis: -(-sizes[g.axis] // blocks[g.axis]) for g in low.grid}
    again = [math.prod(n for a, n in split.items() if a not in axes) for axes, _, _ in low.ew_by_axes]
    ew = sum(e * r for (_, e, _), r in zip(low.ew_by_axes, again, strict=True))
    trans = sum(x * r for (_, _, x), r in zip(low.ew_by_axes, again, strict=True))
    once = [(e * r, x * r) for (axes, e, x), r in zip(low.ew_by_axes, again, strict=True)
            if low.stream is not None and low.stream not in axes]
    out = _BlockTerms(base.blocks, base.n_blocks, base.n_iter, base.run, base.reread, base.dram, base.flops,
                      base.gemm_terms, ew, trans, base.loop_elements, base.step_passes, base.once_passes,
                      sum(e for e, _ in once), sum(x for _, x in once))
    facts.blocks_seen[key] = out
    return out


def _shared_tile_terms(low: Lowered, blocks: dict[str, int], key: tuple, cfg: dict[str, int], sizes: dict[str, int],
                       tensor_bytes: dict[str, int], facts: LoweringFacts, terms: CostTerms) -> _BlockTerms:
    """``_tile_terms`` of these tile extents (``key``: their values), shared with the lowerings of the
    same ``tile_terms_key`` (``LoweringFacts.shared_terms``)."""
    base = facts.shared_terms.get(key) if facts.shared_terms is not None else None
    if base is None:
        base = _tile_terms(low, blocks, cfg, sizes, tensor_bytes, facts, terms)
        if facts.shared_terms is not None:
            facts.shared_terms[key] = base
    return base


def _tile_terms(low: Lowered, blocks: dict[str, int], cfg: dict[str, int], sizes: dict[str, int],
                tensor_bytes: dict[str, int], facts: LoweringFacts, terms: CostTerms) -> _BlockTerms:
    """``_BlockTerms`` of one set of tile extents, its elementwise work left at 0 (``_block_terms``)."""
    n_blocks = grid_blocks(low, cfg, sizes)
    n_iter = -(-sizes[low.stream] // blocks[low.stream]) if low.stream else 1
    run = visible_fraction(low, blocks, sizes)  # loop steps left after masked tiles are skipped

    # bytes: each tensor once from HBM, re-reads of tiles from L2
    reread = 0.0
    for ld in low.loads:
        whole = tensor_bytes[ld.tensor]
        tile = whole
        for a in ld.axes:
            tile = tile / sizes[a] * blocks.get(a, 1)
        total = tile * n_blocks * (n_iter * run if ld.in_loop else 1)
        reread += max(0.0, total - whole)
    dram = sectored_bytes(low, blocks, sizes, tensor_bytes, facts.moved)

    def padded(a: str) -> float:  # work on a partial last tile is done in full
        return -(-sizes[a] // blocks[a]) * blocks[a] / sizes[a] if a in blocks else 1.0

    flops = sum(g.flops * (run if g.streamed else 1.0) * padded(g.m_axis) * padded(g.n_axis) * padded(g.k_axis)
                for g in low.gemms)
    gemm_terms = []
    for g in low.gemms:
        bm = blocks[g.m_axis]
        base, depth = terms.k_depth_efficiency
        k_eff = min(1.0, base + blocks[g.k_axis] / depth) if g.k_axis in blocks else 1.0
        m_eff = min(1.0, bm / terms.m_full_rows) ** 0.5
        work = g.flops * (run if g.streamed else 1.0) * padded(g.m_axis) * padded(g.n_axis)
        gemm_terms.append((work, k_eff, m_eff))
    loop_elements = sum(math.prod(blocks.get(a, 1) for a in ld.axes) for ld in low.loads if ld.in_loop)
    # maps that read a shared tile across its rows replay each warp read once per bank conflict
    # (``planner.banks``); the replays stall the warps that issue the loads, so they add
    step_passes, once_passes = extra_wavefronts(low, blocks, facts.shared_reads)
    return _BlockTerms(blocks, n_blocks, n_iter, run, reread, dram, flops, gemm_terms, 0.0, 0.0, loop_elements,
                       step_passes, once_passes)


def estimate(low: Lowered, cfg: dict[str, int], sizes: dict[str, int], tensor_bytes: dict[str, int],
             smem: int, m: Machine = DEFAULT_MACHINE, facts: LoweringFacts | None = None, regs: int = 0) -> Estimate:
    """Predicted time of one kernel under ``cfg`` (``_estimated``, as an ``Estimate``)."""
    time_us, flops, nbytes, bound = _estimated(low, cfg, sizes, tensor_bytes, smem, m, facts, regs)
    return Estimate(time_us=time_us, flops=flops, bytes=nbytes, bound=bound, smem=smem, config=cfg)


def _estimated(low: Lowered, cfg: dict[str, int], sizes: dict[str, int], tensor_bytes: dict[str, int],
               smem: int, m: Machine = DEFAULT_MACHINE, facts: LoweringFacts | None = None,
               regs: int = 0) -> tuple[float, float, float, str]:
    """Predicted time of one kernel under ``cfg``; ``smem`` is its shared memory per block and ``regs``
    its registers per thread (occupancy; registers are counted only for a kernel holding long rows
    whole, whose blocks each load, reduce and store once, with a register-heavy tile: run 64); ``facts``:
    ``LoweringFacts.of(low, tensor_bytes, m)`` where the caller prices many configs (the terms that
    depend on tile extents alone are then computed once per set of extents)."""
    dev = m.device
    facts = facts or LoweringFacts.of(low, tensor_bytes, m)
    bt = _block_terms(low, cfg, sizes, tensor_bytes, facts, m.terms)
    terms = m.terms
    blocks, n_blocks, n_iter, run = bt.blocks, bt.n_blocks, bt.n_iter, bt.run
    reread, dram = bt.reread, bt.dram

    threads = cfg[THREADS_PARAM]
    per_sm = max(1, min(dev.smem_per_sm // max(smem, 1), terms.resident_threads // threads, terms.resident_blocks))
    if regs and facts.long_rows:
        per_sm = max(1, min(per_sm, dev.regs_per_sm // (regs * threads)))
    if facts.warp_specialized and terms.specialised_one_block:
        per_sm = 1
    slots = dev.sms * per_sm
    waves = math.ceil(n_blocks / slots)
    wave_eff = n_blocks / (waves * slots)
    # a grid smaller than the machine leaves SMs idle regardless of occupancy
    util = min(1.0, n_blocks / dev.sms) if n_blocks < dev.sms else wave_eff

    flops = bt.flops
    t_tc = 0.0
    for (work, k_eff, m_eff), n_inst in zip(bt.gemm_terms, mma_widths(low, blocks, threads, facts.merged_gemms),
                                            strict=True):
        t_tc += work / (dev.tc_flops * m.compute_efficiency * mma_width_efficiency(n_inst, m) * k_eff * m_eff)
    staged = staged_tiles_fit(bt.loop_elements, threads)
    pipe = 1.0
    if low.stream is not None:
        pipe = dict(terms.pipe_by_stages).get(cfg.get(STAGES_PARAM, 1), 1.0)
        if facts.synchronous and low.gemms:
            pipe = terms.sync_staged_pipe if staged else terms.sync_gemm_pipe
    t_tc /= max(util, 1e-3) * pipe
    ew, trans = bt.ew, bt.trans
    t_cc = run * (ew / dev.cc_flops + trans / dev.sfu_ops) / max(util, 1e-3)
    # fewer blocks than SMs: each draws the backend's flat or streamed block reach in SM shares of bandwidth
    flat = low.stream is None and not low.gemms and n_blocks < dev.sms
    reach = terms.flat_block_reach if flat else terms.stream_block_reach
    t_mem = (dram / first_read_bw(facts, m) + reread / dev.l2_bw) / max(min(1.0, util * reach), 1e-3)
    if low.stream is not None:
        t_mem /= pipe
    # CUDA-core work of a GEMM kernel overlaps its MMAs as far as the backend's ``cc_overlap`` says
    # (one warpgroup's softmax under another's wgmma). A cross-thread reduction still inside the loop
    # (a max, a rescaled sum) adds a fixed latency per block and step; linear sums are deferred.
    per_step = max(0, facts.loop_reductions - facts.linear_sums) * m.loop_reduce_s
    t_sync = per_step * n_blocks * n_iter * run / (slots * max(wave_eff, 1e-3)) if n_iter else 0.0
    t_compute = (overlapped(t_tc, t_cc, terms.cc_overlap) if low.gemms else 0.5 * t_cc) + t_sync
    # A loop without tensor cores has ``stages`` tiles in flight per block, so each block streams
    # one tile per latency / stages at best (Little's law): a short grid of narrow steps is bound
    # by load latency, not bandwidth (run 45: logsumexp's 125 steps of 256 took 28 us for 65 MB).
    t_lat = 0.0
    if low.stream is not None and not low.gemms and facts.loop_loads:
        # synchronous loads wait out a full latency each step: run 50 measured 0.9 us per step of
        # 8 x 512 (vocabulary 50257, 51 MB: within L2's reach, yet slower than its latency); staged
        # in registers one step ahead, two steps' loads are in flight
        sync = facts.synchronous
        latency = dev.l2_latency_s if l2_resident(facts, m) else dev.hbm_latency_s
        in_flight = (2 if staged else 1) if sync else max(1, cfg.get(STAGES_PARAM, 1))
        t_lat = waves * n_iter * run * latency / in_flight
    t_mem = max(t_mem, t_lat)
    step_passes, once_passes = bt.step_passes, bt.once_passes
    t_bank = ((step_passes * n_iter * run + once_passes) * n_blocks
              / (dev.sms * dev.smem_wavefronts_per_s * max(util, 1e-3)))
    # few blocks on an SM to hide each other's phases: one, or a loop-less GEMM kernel's few large blocks (a
    # loop-less elementwise kernel's many small ones keep the fitted flat-block terms: runs 51 and 73)
    # (the switch read last, only where it decides: benchmarks/switch_cases.py relies on that)
    if (per_sm == 1 or (low.stream is None and low.gemms)) and PHASED_BLOCKS:
        t_once = run * (bt.ew_once / dev.cc_flops + bt.trans_once / dev.sfu_ops) / max(util, 1e-3)
        latency = dev.l2_latency_s if l2_resident(facts, m) else dev.hbm_latency_s
        t_one = phased_time(low.stream is not None, bool(low.gemms), t_tc, t_cc, t_once, t_sync, t_mem, per_sm,
                            waves * latency, terms.cc_overlap)
        body = (t_one + t_bank) * facts.structure_scale
    else:
        body = (max(t_compute, t_mem) + t_bank) * facts.structure_scale
    time_us = body * 1e6 + m.launch_us
    bound = "compute" if t_compute >= t_mem else "memory"
    if m.launch_us > body * 1e6:
        bound = "latency"
    return time_us, flops + ew, dram + reread, bound


def phased_time(loop: bool, gemms: bool, t_tc: float, t_cc: float, t_once: float, t_sync: float, t_mem: float,
                per_sm: int, wave_latency: float, cc_overlap: float) -> float:
    """Time of a kernel whose blocks' phases (load, compute, store) are not all hidden by other blocks.

    A kernel without a loop is one step per block: it loads its tiles, runs its MMAs and then its
    exponentials (its warpgroups in turn, no ping-pong), stores, each after the other; with ``per_sm``
    blocks resident, the others hide ``1 - 1 / per_sm`` of the shorter of compute and memory and of the
    load latency each wave waits out first (``wave_latency``: one latency per wave). A loop of which one
    block fits an SM overlaps its steps' loads with the MMAs as before, but the CUDA-core work on values
    without the loop's axis (``t_once``: a softmax of scores accumulated over the loop) runs after the
    loop, under nothing. (A loop's pipeline fill, one step of the shorter side, is left out: without a
    per-step cost it would send every GEMM to the narrowest steps, which the measured GEMM rows of runs
    122 and 124, met within a few per cent, do not ask for.)

    Run 122 (the default device): attention's backward scores dS (16 x 4096 x 4096, 16384 blocks of 128 x 128 on
    129 KB of shared memory, one per SM, 125 waves, no loop) took 771 us where the longer of compute
    and memory gave 325 (MMAs 188, exponentials 95, memory 324; added, with 125 latencies: 696); its
    one-block-per-SM pre-pass 10.6 against 9.6 (now 11.1)."""
    if not loop:
        t_compute = (t_tc + t_cc if gemms else 0.5 * t_cc) + t_sync
        return max(t_compute, t_mem) + (min(t_compute, t_mem) + wave_latency) / max(1, per_sm)
    per_step = t_cc - t_once
    t_loop = (overlapped(t_tc, per_step, cc_overlap) if gemms else 0.5 * per_step) + t_sync
    t_after = t_once if gemms else 0.5 * t_once
    return max(t_loop, t_mem) + t_after


def overlapped(a: float, b: float, overlap: float) -> float:
    """Two kinds of work on one SM, ``overlap`` of the shorter hidden under the longer (0: they add)."""
    return max(a, b) + (1.0 - overlap) * min(a, b)


def first_read_bw(facts: LoweringFacts, m: Machine = DEFAULT_MACHINE) -> float:
    """Bandwidth a kernel's first reads of each tensor see: HBM's achieved rate, or, where the kernel's
    data stays in L2 between calls (``l2_resident``), the backend's share of L2's when that is higher."""
    hbm = m.device.hbm_bw * m.memory_efficiency
    if m.terms.l2_bw_share > 0 and l2_resident(facts, m):
        return max(hbm, m.device.l2_bw * m.terms.l2_bw_share)
    return hbm


def staged_loads_fit(low: Lowered, blocks: Mapping[str, int], threads: int) -> bool:
    """Whether a synchronous GEMM loop's tiles take the register-staged form under these blocks
    (the renderer's guard, ``target.fit.staged_tiles_fit``, over the loop's loaded tiles)."""
    elements = sum(math.prod(blocks.get(a, 1) for a in ld.axes) for ld in low.loads if ld.in_loop)
    return staged_tiles_fit(elements, threads)


def l2_resident(facts: LoweringFacts, m: Machine = DEFAULT_MACHINE) -> bool:
    """Whether a kernel's loads come from L2 across calls: its data fits in half of L2, so it stays
    there beside the plan's other kernels. Data that fills most of L2 does not (run 70: the LM head's
    softmax statistics read 33 MB of float32 logits after a GEMM streamed 65 MB of weights; 72.9 us
    at steps of 512, 63.0 at 2048, as HBM's latency predicts); nor do synchronous loads."""
    return 2 * (facts.unique_bytes + facts.written_bytes) <= m.device.l2_bytes and not facts.synchronous


def wide_steps(low: Lowered, sizes: dict[str, int], facts: LoweringFacts, m: Machine = DEFAULT_MACHINE) -> bool:
    """Whether ties between a kernel's configs go to the widest step (``_rank_key``): a short
    reduction grid over data that streams from HBM."""
    return short_reduction_grid(low, sizes, m.device.sms) and not l2_resident(facts, m)


Verdict = tuple[int, int, bool] | None
"""One config's fit verdict for the config search: None where it does not fit the device, else its
shared bytes per block, registers per thread and whether it is a chain config that does not render
asynchronously (``_rank_key``'s first term)."""


def config_verdicts(space: Mapping[str, list[int]], fit: FitModel) -> list[Verdict]:
    """The fit verdict of every config of ``space``, in the order ``best_config`` walks them (sorted
    parameter names, ``itertools.product``). They depend on the fit model alone, so kernels whose fit
    models agree share them (``planner.memo``)."""
    names = sorted(space)
    configs = list(itertools.product(*(space[n] for n in names)))
    return [None if got is None else
            (got[0], got[1], fit.chain and not fit.renders_async(dict(zip(names, values))))
            for values, got in zip(configs, fit.fitting(names, configs), strict=True)]


def best_config(low: Lowered, space: Mapping[str, list[int]], sizes: dict[str, int],
                tensor_bytes: dict[str, int], fit: FitModel, m: Machine = DEFAULT_MACHINE,
                verdicts: list[Verdict] | None = None, facts: LoweringFacts | None = None) -> Estimate | None:
    """The cheapest config of ``space`` that fits the device (``fit``), or None. ``verdicts``:
    ``config_verdicts(space, fit)``, ``facts``: ``LoweringFacts.of(low, tensor_bytes, m)``, where the
    caller has them.

    The winner is the config of least rank key, the first in walk order among equals. Configs are
    priced by tile extents, the extents of least ``_TimeFloor`` first; once that floor (rounded as
    the key rounds) exceeds the best time found, no later config can win and none is priced."""
    names = sorted(space)
    facts = facts or LoweringFacts.of(low, tensor_bytes, m)
    wide = wide_steps(low, sizes, facts, m)
    if verdicts is None:
        verdicts = config_verdicts(space, fit)
    # configs whose rank key loses on a term known before pricing are not priced (the first term
    # decides: a chain config that renders asynchronously beats every one that does not; with
    # ``small_first``, the smallest tiles and threads come first): the same config wins
    fast_chain = any(v is not None and not v[2] for v in verdicts)
    slow_out = fast_chain and not facts.long_rows
    # by tile extents (the values of every parameter but threads and stages; the rank key's first term
    # is the same for every config left here, unless ``small_first``, whose key puts the tile sizes
    # before time: those are priced in walk order)
    extents = [j for j, n in enumerate(names) if n not in (THREADS_PARAM, STAGES_PARAM)]
    groups: dict[tuple, list[tuple[int, tuple, tuple[int, int, bool]]]] = {}
    for i, (values, v) in enumerate(zip(itertools.product(*(space[n] for n in names)), verdicts, strict=True)):
        if v is not None and not (slow_out and v[2]):
            groups.setdefault(tuple([values[j] for j in extents]), []).append((i, values, v))
    if facts.long_rows:
        smallest = min((_size(dict(zip(names, c[1])), low.stream) for g in groups.values() for c in g), default=0)
        order = [(0.0, [c for c in g if _size(dict(zip(names, c[1])), low.stream) <= smallest])
                 for g in groups.values()]
    else:
        floor = _TimeFloor.of(m)
        order = sorted(((floor(low, dict(zip(names, g[0][1])), sizes, tensor_bytes, facts), g)
                        for g in groups.values()), key=lambda x: (x[0], x[1][0][0]))
    # (rank key, walk index, the estimate's numbers, config, shared bytes): an ``Estimate`` for the winner only
    best: tuple[tuple, int, tuple[float, float, float, str], dict[str, int], int] | None = None
    for floor_us, group in order:
        if best is not None and not facts.long_rows and round(floor_us, 3) > best[0][1]:
            break
        for i, values, (smem, regs, slow_chain) in group:
            cfg = dict(zip(names, values))
            got = _estimated(low, cfg, sizes, tensor_bytes, smem, m, facts, regs)
            key = _rank_key(fit, cfg, got[0], low.stream, facts.long_rows, wide, slow_chain)
            if best is None or (key, i) < best[:2]:
                best = key, i, got, cfg, smem
    if best is None:
        return None
    _, _, (time_us, flops, nbytes, bound), cfg, smem = best
    return Estimate(time_us=time_us, flops=flops, bytes=nbytes, bound=bound, smem=smem, config=cfg)


FLOOR_SLACK = 1e-9
"""Relative margin ``_TimeFloor`` leaves below the time it bounds: far more than the few roundings
by which its float arithmetic may part from ``_estimated``'s."""


@dataclass(frozen=True)
class _TimeFloor:
    """A time no config with given tile extents is priced below by ``_estimated`` (threads, stages,
    shared memory and registers aside): its tensor-core and memory terms with full occupancy where
    that depends on them, the best pipeline factor and MMA width, and nothing added (CUDA-core work,
    bank replays, sync, latency, phases). Only terms of the tile extents alone (shared between
    lowerings, ``_shared_tile_terms``) are read: the elementwise work is worked out only for the
    extents priced."""

    m: Machine
    pipe: float  # the largest pipeline factor (at least 1)
    width: float  # the best MMA width efficiency
    sound: bool  # whether the terms keep each time term monotone (else the floor is 0)

    @staticmethod
    def of(m: Machine) -> _TimeFloor:
        t = m.terms
        pipes = (t.sync_staged_pipe, t.sync_gemm_pipe, *(f for _, f in t.pipe_by_stages))
        return _TimeFloor(m, max(1.0, *pipes), max(eff for _, eff in t.mma_width_efficiency),
                          0.0 <= t.cc_overlap <= 1.0 and min(pipes) > 0 and t.launch_us >= 0)

    def __call__(self, low: Lowered, cfg: dict[str, int], sizes: dict[str, int], tensor_bytes: dict[str, int],
                 facts: LoweringFacts) -> float:
        m = self.m
        dev, terms = m.device, m.terms
        blocks = _blocks(low, cfg, sizes)  # the terms of the tile extents alone: no elementwise work
        bt = _shared_tile_terms(low, blocks, tuple(blocks.values()), cfg, sizes, tensor_bytes, facts, terms)
        if not self.sound or facts.structure_scale <= 0:
            return 0.0
        util = min(1.0, bt.n_blocks / dev.sms) if bt.n_blocks < dev.sms else 1.0
        t_tc = 0.0
        for work, k_eff, m_eff in bt.gemm_terms:
            t_tc += work / (dev.tc_flops * m.compute_efficiency * self.width * k_eff * m_eff)
        t_tc /= max(util, 1e-3) * self.pipe
        flat = low.stream is None and not low.gemms and bt.n_blocks < dev.sms
        reach = terms.flat_block_reach if flat else terms.stream_block_reach
        t_mem = (bt.dram / first_read_bw(facts, m) + bt.reread / dev.l2_bw) / max(min(1.0, util * reach), 1e-3)
        if low.stream is not None:
            t_mem /= self.pipe
        body = max(t_tc, t_mem) * facts.structure_scale
        floor = (body * 1e6 + m.launch_us) * (1.0 - FLOOR_SLACK)
        return floor if floor == floor else 0.0  # not a number: no floor (the order above needs one)


def _rank_key(fit: FitModel, cfg: dict[str, int], time_us: float, stream: str | None = None,
              small_first: bool = False, wide_steps: bool = False, slow_chain: bool | None = None) -> tuple:
    """How configs rank: a flash-style chain's configs that render asynchronously first (measured:
    attention 241 us under T.Pipelined, 208-219 asynchronously, a gap this model does not price),
    then predicted time, then larger tiles, a step counted up to 256 (wider steps hold more
    registers per thread, which the model does not price: run 35 measured row softmax 27 -> 40 us
    at 1024), then narrower steps. With ``small_first`` (``long_rows_whole``) smaller tiles and
    fewer threads rank first, before predicted time: such a block loads, reduces across its threads and stores in turn,
    so several small blocks per SM overlap those phases where one large block cannot (run 64:
    add + RMSNorm over 4096 at 2 rows x 128 threads 34.2 us, at 4 x 512 42.3; L1 rows 17.3
    against 20.2), which the bandwidth model does not see. With ``wide_steps``
    (``short_reduction_grid`` over data that streams from HBM, ``l2_resident``) ties go to the widest
    step instead: each block then needs more bytes in flight than a long grid's (run 70: the LM
    head's softmax statistics over 32000 on 128 blocks, 72.0 us at steps of 1024, 63.0 at 2048, both
    modelled alike at the bandwidth bound)."""
    step = cfg.get(block_param(stream), 0) if stream else 0
    size = _size(cfg, stream)
    if small_first:  # the bandwidth model gives these configs near-equal times: the measured order decides
        return (False, size, round(time_us, 3), step)
    if slow_chain is None:
        slow_chain = fit.chain and not fit.renders_async(cfg)
    return (slow_chain, round(time_us, 3), -size, -step if wide_steps else step)


def _size(cfg: Mapping[str, int], stream: str | None) -> int:
    """How large a config's tiles are for ``_rank_key``: its values summed, a step counted up to 256."""
    step = cfg.get(block_param(stream), 0) if stream else 0
    return sum(cfg.values()) - step + min(step, 256)


def ranked_configs(low: Lowered, space: Mapping[str, list[int]], sizes: dict[str, int],
                   tensor_bytes: dict[str, int], fit: FitModel, n: int,
                   m: Machine = DEFAULT_MACHINE) -> list[dict[str, int]]:
    """The ``n`` cheapest configs of ``space`` that fit the device, best first (autotuning's list)."""
    names = sorted(space)
    facts = LoweringFacts.of(low, tensor_bytes, m)
    wide = wide_steps(low, sizes, facts, m)
    scored = []
    for values in itertools.product(*(space[k] for k in names)):
        cfg = dict(zip(names, values, strict=True))
        why, fp = fit.check(cfg)
        if why is None:
            est = estimate(low, cfg, sizes, tensor_bytes, fp.smem_bytes, m, facts, fp.regs_per_thread)
            scored.append((_rank_key(fit, cfg, est.time_us, low.stream, facts.long_rows, wide), cfg))
    scored.sort(key=lambda x: x[0])
    return [cfg for _, cfg in scored[:n]]
