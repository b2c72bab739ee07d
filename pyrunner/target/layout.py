"""What TileLang makes of a plan: fragment register layouts, layout bridges, launch dimensions.

TileLang gives each fragment one register layout, fixed by the op that first shapes it, and maps
grid axes onto at most three launch dimensions. This is knowledge about the target toolchain,
not plan meaning (that is ``pyrunner.plan.analysis``), so it lives with the device model: the fit
check (``target.fit``) uses it to count bridge buffers, split GEMMs among warps and bound the
grid, and the renderer (``backend.tilelang.render``) to emit bridge copies and the launch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from pyrunner.plan.analysis import AxisRole, expr_refs, numbered_ops, op_reads_writes
from pyrunner.plan.schema import Buffer, Gemm, GlobalTensor, Kernel, Load, Map, Reduce
from pyrunner.target.device import rows_async

GENERATION = 2
"""Code-generator generation, stamped into results records and tuning keys: the same plan renders to
different code across generations, so calibration and tuned configs use only the current one's
measurements (2: MMA-shaped warp policy, merged B tiles, TMA-store epilogues, fast math)."""


def layout_groups(kernel: Kernel) -> dict[str, str]:
    """Fragment -> representative of its layout group: same-axes fragments one Map touches share a layout."""
    return fragment_groups(kernel.buffers, [op for _, _, op in numbered_ops(kernel)])


def fragment_groups(buffers: Iterable[Buffer], ops: Iterable) -> dict[str, str]:
    """``layout_groups`` over any list of buffers and ops (the planner asks before a kernel exists)."""
    bufs = {b.name: b for b in buffers}
    parent = {n: n for n, b in bufs.items() if b.scope == "fragment"}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for op in ops:
        if isinstance(op, Map) and op.dst in parent:
            for r in expr_refs(op.expr):
                if r in parent and set(bufs[r].axes) == set(bufs[op.dst].axes):
                    parent[find(r)] = find(op.dst)
    return {b: find(b) for b in parent}


def layout_bridges(kernel: Kernel) -> dict[tuple[str, int], list[str]]:
    """Fragments that a Map must read through shared memory, keyed by (section, op index).

    TileLang gives each fragment one register layout. A Gemm fixes the layout of its accumulator
    (and of a fragment A operand); a Map ties together the layouts of the fragments with the same
    axes that it writes and reads; a Reduce's result follows its source; a group of fragments with
    neither (computed from shared tiles only) gets a free layout of its own. GEMM layouts agree
    where their row axes do: a statistic of the scores' rows ``[t_q]`` scales an output accumulator
    ``[t_q, d]`` in place, but not one held ``[d, t_q]`` (TileLang: "Layout infer conflict").
    A Map that broadcasts
    a lower-rank fragment whose layout has another origin than its destination's -- a row
    statistic reduced from a freely laid out tile, scaling a GEMM accumulator, say -- cannot be laid
    out, so the renderer copies that fragment to a shared buffer and the Map reads the copy.
    A Map whose destination has no layout yet takes it from the fragments it reads: broadcasting
    a lower-rank one reduced straight from memory (a group statistic reduced from a shared tile,
    over a 3-D tile), whose layout TileLang chose for the reduction alone,
    makes every thread that holds one statistic compute every element it scales, replicated
    (1024 registers a thread, 694 us for a 33 MB group norm, run 50), so that fragment is
    bridged too and the destination gets a layout of its own.
    """
    bufs = {b.name: b for b in kernel.buffers}
    frag = {b.name for b in kernel.buffers if b.scope == "fragment"}
    ops = numbered_ops(kernel)
    group = layout_groups(kernel)

    def find(x: str) -> str:
        return group[x]

    origin: dict[str, str] = {}
    reduced = {find(op.src) for _, _, op in ops if isinstance(op, Reduce) and op.src in frag}  # groups reduced
    for _, _, op in ops:
        if isinstance(op, Gemm):
            for x in (op.c, op.a):
                if x in frag:  # accumulators lay out their rows alike: a row statistic of one scales another
                    origin[find(x)] = f"gemm rows {bufs[x].axes[0]}"
    for _, _, op in ops:  # reduced groups written only from memory (shared or global) pick their own layout
        if isinstance(op, (Map, Load)) and op.dst in frag and find(op.dst) not in origin:
            reads_frag = isinstance(op, Map) and any(r in frag and find(r) != find(op.dst) for r in expr_refs(op.expr))
            if (isinstance(op, Load) or (not reads_frag and bufs[op.dst].axes)) and find(op.dst) in reduced:
                origin[find(op.dst)] = f"free:{find(op.dst)}"
    changed = True
    while changed:  # reduce results follow their source (to a fixpoint: results can be reduced again)
        changed = False
        for _, _, op in ops:
            if isinstance(op, Reduce) and op.dst in frag and find(op.dst) not in origin:
                src = origin.get(find(op.src)) if op.src in frag else f"memory:{op.src}"
                if src:
                    origin[find(op.dst)] = src
                    changed = True
    out: dict[tuple[str, int], list[str]] = {}
    for section, i, op in ops:
        if not isinstance(op, Map) or op.dst not in frag:
            continue
        od = origin.get(find(op.dst))
        need = []
        for r in expr_refs(op.expr):
            if r not in frag or r in need or find(r) == find(op.dst):
                continue
            ro = origin.get(find(r))
            from_memory = bool(ro) and ro.startswith("memory:")  # reduced straight from a shared/global tile
            broadcast = len(bufs[r].axes) < len(bufs[op.dst].axes)
            if (od and ro not in (None, od)) or (od is None and from_memory and broadcast):
                need.append(r)
        if need:
            out[(section, i)] = need
    return out


CUDA_MAX_GRID_YZ = 65535
"""CUDA's limit on gridDim.y and gridDim.z on every device (gridDim.x allows 2**31 - 1)."""


def launch_axes(kernel: Kernel, roles: dict[str, AxisRole], max_yz: int | None = None) -> list[list[str]]:
    """Grid axes behind blockIdx.x, .y, .z (each list outermost first; more than one axis: folded).

    An axis gets a launch dimension when it has more than one tile or its block is a parameter
    (the source must not depend on parameter values). The last grid axis varies fastest. A .y or .z
    launch that could take more than ``max_yz`` (default ``CUDA_MAX_GRID_YZ``) blocks at some config of the
    kernel (a parameter block at its smallest value) folds into .x instead, outermost, so 32 heads x
    2048 rows of single-row blocks still launch.
    """
    limit = CUDA_MAX_GRID_YZ if max_yz is None else max_yz
    live = [g.axis for g in kernel.grid
            if isinstance(roles[g.axis].block, str) or roles[g.axis].size // roles[g.axis].block > 1]
    dims = [[a] for a in reversed(live)]
    if len(dims) > 3:
        dims = dims[:2] + [live[: len(live) - 2]]
    kept = dims[:1]
    for d in dims[1:]:
        if math.prod(_most_tiles(kernel, roles[a]) for a in d) > limit:
            kept[0] = d + kept[0]
        else:
            kept.append(d)
    return kept


def _most_tiles(kernel: Kernel, role: AxisRole) -> int:
    """Most blocks an axis launches at any config of the kernel: at its smallest block (partial tiles count)."""
    block = min(kernel.params.get(role.block) or [1]) if isinstance(role.block, str) else role.block
    return -(-role.size // block)


MAX_VECTOR = 8
"""Most elements one thread takes per step of a partitioned ``T.Parallel`` loop (16 bytes of a 16-bit
type); TileLang picks the widest that divides the loop."""


def reduced_tile_problem(extent: int, whole: bool, threads: int) -> str | None:
    """Why TileLang 0.1.15 cannot reduce a tile of ``extent`` along its reduced axis across ``threads``
    threads (None when it can). Its cross-thread reduction is an XOR butterfly over the threads that
    share one output, so those must be a power of two. A power-of-two extent always gives that. A
    row held whole (``whole``: the tile is the axis) whose length is a multiple of ``threads`` x
    ``MAX_VECTOR`` does too, whatever its factors: each round of the partitioned loop then covers
    ``threads x vector`` elements of one row, so every thread holds a share of every row and the
    butterfly spans all of them (a 5120-wide row at 128 threads: 5 rounds of 1024 per row)."""
    if extent & (extent - 1) == 0:
        return None
    if whole and extent % (threads * MAX_VECTOR) == 0:
        return None
    if whole:
        return (f"a {extent}-wide row held whole is reduced across {threads} threads: TileLang 0.1.15's XOR "
                f"butterfly needs a power-of-two extent, or one that {threads} threads x {MAX_VECTOR} "
                f"elements divide (every thread then shares every row)")
    return (f"a tile of {extent} is reduced across threads: TileLang 0.1.15's XOR butterfly needs a "
            f"power-of-two extent")


def whole_row_divisible(extent: int, thread_counts: Iterable[int]) -> bool:
    """Whether some block size of ``thread_counts`` lets a row of ``extent`` held whole be reduced
    (``reduced_tile_problem``); the lowering asks before any config exists."""
    return any(reduced_tile_problem(extent, True, t) is None for t in thread_counts)


def padded_row(n: int) -> int:
    """The tile of a row held whole that no block size divides (333, 768, 1000): the next power of
    two, whose positions past ``n`` are loaded as zeros and masked with each reduction's identity
    (``planner.lower._Builder.pad_mask``). Holding the row whole reads it once, where streaming it
    reads it once for the statistic and again to normalise it (a second kernel)."""
    return 1 << (n - 1).bit_length()


def synchronous_loop_loads(kernel: Kernel, tensors: Mapping[str, GlobalTensor]) -> bool:
    """Whether the kernel's loop loads a tensor whose rows are not 16-byte aligned (no TMA, no
    cp.async): the renderer steps such a loop with ``T.serial`` (``planner.cost.synchronous_loop``
    prices it so)."""
    return kernel.loop is not None and any(
        tensors[op.src].shape and not rows_async(tensors[op.src].shape[-1], tensors[op.src].dtype)
        for op in kernel.body if isinstance(op, Load))


def staged_loop_loads(kernel: Kernel, tensors: Mapping[str, GlobalTensor]) -> list[Load]:
    """The loop loads the renderer stages in registers one step ahead, in a loop of synchronous
    loads (``synchronous_loop_loads``): step k stores the registers loaded during step k - 1 into
    its shared tiles, issues step k + 1's loads, then runs the rest of its ops, so those loads are in
    flight under this step's MMAs or reductions instead of before them (a load is waited for only
    where its registers are stored, a step later): two steps in flight, not one.

    Every loop load of a tensor with axes into a shared tile is staged, or none: none where two
    GEMMs read one A (they may merge into one wide MMA over halves of one tile) or where a body op
    before a load touches the tile it fills (moving the copy to the top of the step would change
    what that op sees). The build function takes the staged form where the tiles fit
    (``target.fit.staged_tiles_fit``)."""
    if not synchronous_loop_loads(kernel, tensors):
        return []
    gemms = [op for op in kernel.body if isinstance(op, Gemm)]
    if len({op.a for op in gemms}) < len(gemms):
        return []
    shared = {b.name for b in kernel.buffers if b.scope == "shared"}
    loads = []
    for i, op in enumerate(kernel.body):
        if isinstance(op, Load) and tensors[op.src].axes:
            if op.dst not in shared or any(op.dst in (*r, *w) for r, w in map(op_reads_writes, kernel.body[:i])):
                return []
            loads.append(op)
    return loads
