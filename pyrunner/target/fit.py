"""Does a kernel fit the device under given tile parameters? The one fit check.

The planner uses it to choose tile configs and to prune the tuning space it emits (every config
of a plan's space fits); the runner uses it before compiling. A ``FitModel`` does the
config-independent analysis of one kernel once (which shared buffers are pipelined, which
fragments are live together, which GEMMs read a register A operand), so checking each of a
tuning space's configs is arithmetic.

Estimates: shared memory counts every shared buffer (buffers loaded in the loop body once per
pipeline stage) plus the layout-bridge copies the renderer adds; registers per thread are
``REG_OVERHEAD`` plus the peak total of fragments live at once, spread over the block's threads.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from pyrunner.plan.analysis import KernelGeometry, kernel_axes, kernel_ops, op_reads_writes
from pyrunner.plan.passes import rendered_kernel
from pyrunner.plan.schedule import ChainSchedule, async_schedule
from pyrunner.plan.schema import Gemm, Kernel, Load, Map, Reduce, Store
from pyrunner.target.device import DEFAULT_TARGET, Device
from pyrunner.target.layout import layout_bridges, layout_groups, reduced_tile_problem
from pyrunner.target.wgmma import tile_problem as wgmma_tile_problem

REG_OVERHEAD = 32
"""Registers per thread assumed for addresses, loop counters and temporaries on top of the fragments."""


STAGED_ELEMENTS_PER_THREAD = 96
"""Most elements of a loop's loaded tiles one thread may hold in registers beside its accumulators
when a loop of synchronous loads is staged one step ahead (``target.layout.staged_loop_loads``):
a 128 x 256 float32 accumulator over 256 threads takes 128 registers, and the A and B tiles of a
64-deep step (128 x 64 and 64 x 256, 96 16-bit elements a thread) still leave room for addresses
under 255. Larger tiles build the unstaged loop."""


def staged_tiles_fit(tile_elements: int, threads: int) -> bool:
    """Whether loop tiles of ``tile_elements`` in all take the register-staged form over ``threads``."""
    return tile_elements <= STAGED_ELEMENTS_PER_THREAD * threads


MAX_GEMM_N = 256
"""Widest tile a Hopper warpgroup MMA (wgmma) produces in one instruction."""

ASYNC_SMEM_SLACK = 1024
"""Bytes of shared memory the explicitly warp-specialised form leaves for its mbarriers and
TileLang's own scratch (``backend.tilelang.render_ws`` guards its form with it)."""


ASYNC_PARTIAL_TILES = True
"""Whether the explicitly warp-specialised forms (``backend.tilelang.render_ws``) take loaded axes that
end in a partial last tile (attention over 4000 keys in 128-wide steps; a GEMM over K = 1000).

Off, such configs render ``T.Pipelined``, so the rank key (``planner.cost._rank_key``) prefers a
chain config that divides the axis, however narrow (t = 4000 streams 32-wide steps). The forms carry
what a partial tile needs: TMA fills rows past a tensor's end with zeros and drops stores past it, the
step count is a ceiling division, and the mask runs only on the step it does not show whole. On since
runs 132-133 (H100, ``benchmarks/results/h100-runs132-151-switches.jsonl``): the GPU sweep of every case
it re-renders (``benchmarks/cases/fit.ASYNC_PARTIAL_TILES.txt``, 78) passed 77; the 78th fails its
outlier draw on two seeds with the switch off too (the max shift's FMA, docs/gpu.md). Measured in one
A/B call: attention over 2000 keys 552.0 -> 112.9 us, over 4000 347.8 -> 219.2, causal over 4000
219.6 -> 135.8. ``--switch fit.ASYNC_PARTIAL_TILES=0`` on a benchmark turns it off."""


def _shared_bytes(once: int, staged: int, stages: int) -> int:
    """Shared bytes per block: the tiles held once, and one copy of each staged tile per pipeline stage
    (``FitModel._footprint`` and ``FitModel.fitting`` agree through this)."""
    return once + staged * max(1, stages)


@dataclass(frozen=True)
class Footprint:
    """Estimated resources of one kernel under one config."""

    kernel: str
    smem_bytes: int
    regs_per_thread: int
    threads: int


def _live_sets(kernel: Kernel, frags: set[str]) -> list[frozenset[str]]:
    """Fragments counted at each op, by a linear liveness scan.

    A fragment lives from its first to its last mention; state buffers, and values made before the loop
    and read in it, span the whole loop body.
    At a Map the operands read for the last time do not count (elementwise: the result can reuse
    their registers); at a Gemm or Reduce they do.
    """
    ops = kernel_ops(kernel)
    body = range(len(kernel.prologue), len(kernel.prologue) + len(kernel.body))
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, op in enumerate(ops):
        r, w = op_reads_writes(op)
        for b in (*r, *w):
            first.setdefault(b, i)
            last[b] = i
    for b in kernel.buffers:
        # loop state, and a value made before the loop and read in it (read again every step), live through the body
        if b.name in first and kernel.loop is not None and len(body) and (
                b.state or first[b.name] < body.start <= last[b.name]):
            first[b.name] = min(first[b.name], body.start)
            last[b.name] = max(last[b.name], body.stop - 1)
    out: set[frozenset[str]] = set()
    for i, op in enumerate(ops):
        r, w = op_reads_writes(op)
        live = {b for b in frags if first.get(b, -1) <= i < last.get(b, -1)} | (set(w) & frags)
        if not isinstance(op, Map):
            live |= set(r) & frags
        out.add(frozenset(live))
    return sorted(out, key=sorted)


class FitModel:
    """The config-independent part of the fit check for one kernel over fixed axis extents."""

    def __init__(self, kernel: Kernel, sizes: Mapping[str, int], device: Device = DEFAULT_TARGET) -> None:
        kernel = rendered_kernel(kernel)  # as rendered: loop reductions kept as per-thread partials
        self.kernel, self.sizes, self.device = kernel, dict(sizes), device
        self.roles = kernel_axes(kernel, self.sizes)
        staged = {op.dst for op in kernel.body if isinstance(op, Load)} if kernel.loop else set()
        bridges = layout_bridges(kernel)
        bridged = {b for bs in bridges.values() for b in bs}
        nbytes = device.dtype_bytes
        # (axes, bytes per element, copies per stage?) of every shared allocation
        self.shared = [(tuple(b.axes), nbytes[b.dtype], b.name in staged)
                       for b in kernel.buffers if b.scope == "shared"]
        self.shared += [(tuple(b.axes), nbytes[b.dtype], False) for b in kernel.buffers if b.name in bridged]
        frags = {b.name: (tuple(b.axes), nbytes[b.dtype]) for b in kernel.buffers if b.scope == "fragment"}
        self._frag_names = list(frags)
        self._frag_specs = list(frags.values())
        """(axes, bytes per element) of every fragment: per-config arithmetic."""
        self._tiles_seen: dict[tuple, tuple[int, int, list[int]]] = {}
        self._regs_seen: dict[tuple, int] = {}
        self._gemm_seen: dict[tuple, str | None] = {}
        self._role_blocks = [(a, r.block) for a, r in self.roles.items()]
        self._stages = kernel.loop.stages if kernel.loop is not None else 1
        bufs = {b.name: b for b in kernel.buffers}
        group = layout_groups(kernel)
        gemms = [op for op in kernel_ops(kernel) if isinstance(op, Gemm)]
        acc_groups = {group[op.c] for op in gemms if op.c in group}
        # (accumulator, its axes, A operand, whether A is laid out like an accumulator, whether A is in registers)
        self.gemms = [(op.c, tuple(bufs[op.c].axes), op.a, op.a in group and group[op.a] in acc_groups,
                       bufs[op.a].scope == "fragment") for op in gemms]
        acc_rows = {group[op.c]: bufs[op.c].axes[0] for op in gemms if op.c in group}
        self.reductions = [(op.src, op.axis) for op in kernel_ops(kernel) if isinstance(op, Reduce)]
        """(source, axis) of every reduction."""
        self.acc_row_reductions = [(src, axis) for src, axis in self.reductions
                                   if acc_rows.get(group.get(src, "")) == axis]
        """(fragment, row axis) of reductions of accumulator-laid-out tiles over their rows."""
        sched = async_schedule(kernel)
        shared_a = sched is not None and not isinstance(sched, ChainSchedule) and (
            len({kernel.body[i].a for i in sched.gemms}) < len(sched.gemms))
        self.asynchronous = sched is not None and not shared_a and not any(
            section == "body" for section, _ in bridges)
        """Scheduled for the explicitly warp-specialised form (a chain, or a GEMM mainloop whose GEMMs
        read distinct A operands, so none merge into one wide MMA, and whose steps need no layout
        bridge: ``backend.tilelang.ws_forms.async_schedule`` renders those under ``T.Pipelined``)."""
        self.chain = isinstance(sched, ChainSchedule)
        """A flash-style two-GEMM chain: its asynchronous form is preferred where a config fits it."""
        if sched is not None:
            body = kernel.body
            self.chain_gemms = [tuple(bufs[body[i].c].axes)
                                for i in ((sched.g1, sched.g2) if self.chain else sched.gemms)]
            self.loaded_axes = sorted({a for i in sched.loads for a in bufs[body[i].dst].axes})
            # epilogue stores of 2-D fragments go through a shared tile (counted as 16-bit: never less)
            self.store_tiles = [tuple(bufs[op.src].axes) for op in kernel.epilogue if isinstance(op, Store)
                                and bufs[op.src].scope == "fragment" and len(bufs[op.src].axes) == 2]

    @cached_property
    def _peak_sets(self) -> list[tuple[int, ...]]:
        """The fragments live together (``_live_sets``) as indices into ``_frag_specs``, without sets
        contained in another (never the peak). Only register counts read them, so a fit model asked
        about shared memory alone (``renders_async``) never scans the kernel's liveness."""
        live = _live_sets(self.kernel, set(self._frag_names))
        order = {name: i for i, name in enumerate(self._frag_names)}
        # as sorted indices, in sorted order: kernels equal up to names get equal lists (``planner.memo``
        # shares config verdicts by them), whatever the names' order in a set or the alphabet
        return sorted(tuple(sorted(order[b] for b in s)) for s in live if not any(s < other for other in live))

    def geometry(self, values: Mapping[str, int]) -> KernelGeometry:
        """``kernel_geometry`` of this kernel under ``values`` (its roles resolved once)."""
        sizes = self.sizes
        blocks = {a: b if isinstance(b, int) else values[b] for a, b in self._role_blocks}
        tiles = {a: -(-sizes[a] // b) for a, b in blocks.items()}  # a last, partial tile where b does not divide
        threads, stages = self.kernel.threads, self._stages
        return KernelGeometry(self.roles, blocks, tiles, threads if isinstance(threads, int) else values[threads],
                              stages if isinstance(stages, int) else values[stages])

    def footprint(self, values: Mapping[str, int]) -> Footprint:
        """Shared bytes per block and registers per thread under parameter ``values``."""
        geo = self.geometry(values)
        return self._footprint(geo)

    def _per_tiles(self, blocks: dict[str, int]) -> tuple[int, int, list[int]]:
        """(shared bytes not staged, staged per stage, elements of each fragment) under these tile
        extents: shared bytes hang on tiles and stages, registers on tiles and threads."""
        tiles = tuple(blocks.values())
        per_tiles = self._tiles_seen.get(tiles)
        if per_tiles is None:
            per_tiles = self._tiles_seen[tiles] = (
                sum(math.prod(blocks[a] for a in axes) * size for axes, size, staged in self.shared if not staged),
                sum(math.prod(blocks[a] for a in axes) * size for axes, size, staged in self.shared if staged),
                [math.prod(blocks[a] for a in axes) for axes, _ in self._frag_specs])
        return per_tiles

    def _footprint(self, geo: KernelGeometry) -> Footprint:
        tiles = tuple(geo.blocks.values())
        once, staged, elems = self._per_tiles(geo.blocks)
        smem = _shared_bytes(once, staged, geo.stages)
        regs = self._regs_seen.get((tiles, geo.threads))
        if regs is None:
            # spread over the block's threads; small (replicated) fragments still take a register each
            threads = geo.threads
            per_thread = [max(4, -(-n * size // threads)) for n, (_, size) in zip(elems, self._frag_specs, strict=True)]
            peak = max((sum(per_thread[i] for i in live) for live in self._peak_sets), default=0)
            regs = self._regs_seen[(tiles, geo.threads)] = REG_OVERHEAD + -(-peak // 4)
        return Footprint(self.kernel.name, smem, regs, geo.threads)

    def renders_async(self, values: Mapping[str, int]) -> bool:
        """Whether a chain or GEMM-mainloop kernel renders in its asynchronous form under ``values``:
        the tile guard of ``render_ws`` (two warpgroup counts, 64-row slabs per consumer warpgroup,
        N <= 256, no tails along the loaded axes unless ``ASYNC_PARTIAL_TILES``, the rings and epilogue
        tiles in shared memory),
        with shared memory estimated from above. False for every other kernel, and on a device without
        TMA and wgmma (``Device.tma_wgmma``: those forms are not rendered for it)."""
        if not self.asynchronous or not self.device.tma_wgmma:
            return False
        geo = self.geometry(values)
        if geo.threads not in (128, 256):
            return False
        for rows, cols in ((geo.blocks[r], geo.blocks[c]) for r, c in self.chain_gemms):
            if rows % (64 * (geo.threads // 128)) or cols > MAX_GEMM_N:
                return False
        # the switch is read last, only where it decides (benchmarks/switch_cases.py skips the second search
        # of a case that never reached this)
        if any(self.sizes[a] % geo.blocks[a] for a in self.loaded_axes) and not ASYNC_PARTIAL_TILES:
            return False
        once, staged, _ = self._per_tiles(geo.blocks)
        smem = _shared_bytes(once, staged, geo.stages) + sum(2 * math.prod(geo.blocks[a] for a in axes)
                                                              for axes in self.store_tiles)
        return smem <= self.device.smem_per_block - ASYNC_SMEM_SLACK

    def fitting(self, names: Sequence[str], configs: Iterable[Sequence[int]]) -> list[tuple[int, int] | None]:
        """(shared bytes per block, registers per thread) of each config (its values in the order of
        ``names``) that fits, else None: ``check`` over a tuning space. Only the shared-memory bound
        reads the pipeline depth, so the rest is judged once per tile extents and thread count."""
        threads_p, stages_p = self.kernel.threads, self._stages
        t_at = names.index(threads_p) if isinstance(threads_p, str) else None
        s_at = names.index(stages_p) if isinstance(stages_p, str) else None
        ext_at = [j for j in range(len(names)) if j != t_at and j != s_at]
        limit = self.device.smem_per_block
        judged: dict[tuple, tuple[bool, int, int, int]] = {}  # (extents, threads) -> fits but for smem, bytes
        out: list[tuple[int, int] | None] = []
        for values in configs:
            key = (tuple([values[j] for j in ext_at]), threads_p if t_at is None else values[t_at])
            got = judged.get(key)
            if got is None:
                geo = self.geometry(dict(zip(names, values)))
                fp = self._footprint(geo)
                once, staged, _ = self._tiles_seen[tuple(geo.blocks.values())]
                rest = self._why_not(geo, Footprint(fp.kernel, 0, fp.regs_per_thread, fp.threads))
                got = judged[key] = (rest is None, once, staged, fp.regs_per_thread)
            ok, once, staged, regs = got
            smem = _shared_bytes(once, staged, stages_p if s_at is None else values[s_at])
            out.append((smem, regs) if ok and smem <= limit else None)
        return out

    def why_not(self, values: Mapping[str, int]) -> str | None:
        """None when the kernel fits the device under ``values``, else the first reason it does not."""
        return self.check(values)[0]

    def check(self, values: Mapping[str, int]) -> tuple[str | None, Footprint]:
        """``why_not`` and ``footprint`` of one config from one geometry (the config search's inner loop)."""
        geo = self.geometry(values)
        fp = self._footprint(geo)
        return self._why_not(geo, fp), fp

    def _why_not(self, geo: KernelGeometry, fp: Footprint) -> str | None:
        dev = self.device
        for src, axis in self.reductions:
            extent = geo.blocks.get(axis, 1)
            problem = reduced_tile_problem(extent, extent == self.sizes.get(axis), fp.threads)
            if problem:
                return f"it reduces {src!r} along {axis!r}: {problem}"
        for src, axis in self.acc_row_reductions:
            if geo.blocks[axis] > 64 or fp.threads > 128:
                return (f"it reduces {src!r}, laid out like a GEMM accumulator, over its {geo.blocks[axis]} rows "
                        f"with {fp.threads} threads: TileLang 0.1.15 lowers that reduction only within one "
                        f"64-row wgmma slab of one warpgroup (ReduceOp: thread-owned reduce segment)")
        if fp.threads > dev.max_threads or fp.threads % dev.warp:
            return f"{fp.threads} threads per block; {dev.name} needs a multiple of {dev.warp} up to {dev.max_threads}"
        if fp.smem_bytes > dev.smem_per_block:
            return (f"needs about {fp.smem_bytes / 1024:.1f} KiB of shared memory per block, "
                    f"{dev.name} allows {dev.smem_per_block / 1024:.0f} KiB")
        if fp.regs_per_thread > dev.regs_per_thread:
            return (f"needs about {fp.regs_per_thread} registers per thread for its fragments, "
                    f"{dev.name} allows {dev.regs_per_thread}")
        if fp.regs_per_thread * fp.threads > dev.regs_per_sm:
            return (f"needs about {fp.regs_per_thread * fp.threads} registers per block ({fp.regs_per_thread} x "
                    f"{fp.threads} threads), {dev.name} has {dev.regs_per_sm} per SM")
        if self.gemms:
            key = (tuple(geo.blocks[x] for _, axes, _, _, _ in self.gemms for x in axes), geo.threads)
            why = self._gemm_seen.get(key, "")
            if why == "":
                why = self._gemm_seen[key] = self._gemm_warps(geo)
            if why:
                return why
        return None

    def _gemm_warps(self, geo: KernelGeometry) -> str | None:
        """Each tile GEMM must split among the block's warps: m_w * n_w = warps, 16 rows x 8 columns per warp.

        (384 threads cannot split a 128-wide tile, say.) A GEMM whose A operand is a fragment laid
        out like another GEMM's accumulator (P = softmax(S) feeding P @ V) needs every warp on its own
        rows, else TileLang cannot reconcile the two layouts: rows must be a multiple of 16 x warps.
        """
        warps = geo.threads // self.device.warp
        for c, axes, a, a_like_acc, a_in_regs in self.gemms:
            rows, cols = (geo.blocks[x] for x in axes)
            if cols > MAX_GEMM_N:
                return f"the {rows}x{cols} tile GEMM into {c!r} is wider than wgmma's N limit of {MAX_GEMM_N}"
            if a_like_acc and rows % (16 * warps):
                return (f"the tile GEMM into {c!r} reads its A operand {a!r} from registers, so each of the "
                        f"{warps} warps ({geo.threads} threads) needs 16 whole rows of it, "
                        f"but the tile has {rows} rows")
            if a_in_regs and rows > 64 * (warps // 4):
                return (f"the tile GEMM into {c!r} reads its A operand {a!r} from registers: TileLang lays "
                        f"out two GEMMs' fragments alike only with one 64-row slab per warpgroup, and "
                        f"{rows} rows on {warps // 4} warpgroup(s) give more (layout infer conflict)")
            if not any(warps % mw == 0 and rows % (16 * mw) == 0 and cols % (8 * (warps // mw)) == 0
                       for mw in range(1, warps + 1)):
                return (f"the {rows}x{cols} tile GEMM into {c!r} cannot be split among {warps} warps "
                        f"({geo.threads} threads): each warp needs a 16x8 multiple")
            problem = wgmma_tile_problem(rows, cols, geo.threads)
            if problem:
                return f"{problem} (TileLang: 'Not a canonical GMMA_MN layout')"
        return None


def fits(kernel: Kernel, values: Mapping[str, int], sizes: Mapping[str, int],
         device: Device = DEFAULT_TARGET) -> str | None:
    """None when ``kernel`` fits ``device`` under parameter ``values``, else why not (one line)."""
    return FitModel(kernel, sizes, device).why_not(values)


def fitting_space(space: Mapping[str, list[int]], keep: Mapping[str, int],
                  ok: Callable[[dict[str, int]], bool]) -> dict[str, list[int]]:
    """A large sub-space (one value list per parameter) in which every config is ``ok``.

    A tuning space is a product of value lists, so a config that does not fit can only be left out
    by dropping one of its values. Greedily drop the value (never one of ``keep``, which must be
    ``ok``) with the most failing configs per passing config it takes along, until none fail. On
    the catalog this keeps exactly as many configs as an exhaustive search over sub-products.
    """
    names = sorted(space)
    verdict = {vals: ok(dict(zip(names, vals))) for vals in itertools.product(*(space[n] for n in names))}
    lists = {n: list(space[n]) for n in names}
    while True:
        failing: dict[tuple[str, int], int] = {}
        passing: dict[tuple[str, int], int] = {}
        for vals in itertools.product(*(lists[n] for n in names)):
            counts = passing if verdict[vals] else failing
            for n, x in zip(names, vals):
                counts[(n, x)] = counts.get((n, x), 0) + 1
        if not failing:
            return {n: lists[n] for n in space}
        droppable = [k for k in failing if k[1] != keep[k[0]]]
        n, x = max(droppable, key=lambda k: (failing[k] / (passing.get(k, 0) + 1), failing[k], k))
        lists[n].remove(x)
