"""Which kernels the explicitly warp-specialised renderer (``render_ws``) writes, and in which form:
the asynchronous schedule it can render (TMA-loadable rings), the tile-parameter guard and shared
memory of the form, the prologue tiles the producer loads, and the kernels that render persistent
past one wave. The build function evaluates the guard and the tile count; ``render_ws`` writes.
"""

from __future__ import annotations

from pyrunner.backend.tilelang import emit as R
from pyrunner.plan import schedule
from pyrunner.plan.schedule import AsyncSchedule, ChainSchedule
from pyrunner.target import fit
from pyrunner.target.device import DTYPE_BYTES


def async_schedule(ctx: R._Ctx) -> AsyncSchedule | None:
    """The chain schedule of the kernel being rendered, where this renderer can write it."""
    kernel = ctx.kernel
    if kernel.loop is None or R.gemm_merges(kernel):  # merged B tiles: T.Pipelined
        return None
    if any(section == "body" for section, _ in ctx.bridges):  # a layout bridge every step: T.Pipelined
        return None
    sched = schedule.async_schedule(kernel)
    if sched is None:
        return None
    if not all(_tma_loadable(ctx, kernel.body[i]) for i in sched.loads):
        return None
    return sched


def _tma_loadable(ctx: R._Ctx, op) -> bool:
    """TMA: 16-byte aligned rows of a tensor with at least two axes, into a tile without indexed axes."""
    t = ctx.tensors[op.src]
    if len(t.axes) < 2 or t.shape[-1] * DTYPE_BYTES[t.dtype] % 16:
        return False
    return not any(ctx.roles[a].kind == "indexed" for a in ctx.buffers[op.dst].axes)


def producer_prologue(ctx: R._Ctx) -> tuple[int, ...]:
    """Prologue loads the producer warpgroup issues by TMA (``schedule.gemm_operand_loads``)."""
    return tuple(i for i in schedule.gemm_operand_loads(ctx.kernel) if _tma_loadable(ctx, ctx.kernel.prologue[i]))


def shared_bytes(ctx: R._Ctx, sched: AsyncSchedule) -> str:
    """Expression for the shared memory of the asynchronous form: every shared buffer once, the loaded
    ones once per slot, plus the epilogue's TMA-store tiles (TileLang cannot fold those into the dead
    rings here, as it does for a ``T.Pipelined`` loop; sweep 17, ScaledAttention at 3 stages: 256 KiB)."""
    kernel = ctx.kernel
    stages = R._stages(kernel)
    staged = {kernel.body[i].dst for i in sched.loads}
    dtypes = {t.name: t.dtype for t in ctx.plan.tensors}
    terms = []
    for b in kernel.buffers:
        if b.scope == "shared":
            size = " * ".join([*(R._paren(e) for e in R._extent(ctx, b)), str(DTYPE_BYTES[b.dtype])])
            terms.append(f"{R._paren(stages)} * {size}" if b.name in staged else size)
    for src, dst in ctx.staging:
        terms.append(" * ".join([*(R._paren(e) for e in R._extent(ctx, ctx.buffers[src])),
                                 str(DTYPE_BYTES[dtypes[dst]])]))
    return f"({' + '.join(terms)})"


def guard(ctx: R._Ctx, sched: AsyncSchedule, threads: str, smem_per_block: int) -> str:
    """Python condition on the tile parameters under which the asynchronous form is rendered, on a device
    whose blocks may take ``smem_per_block`` bytes of shared memory."""
    body = ctx.kernel.body
    conds = [f"{threads} in (128, 256)"]
    for g in (body[i] for i in sched.gemms):
        rows, cols = (ctx.block_expr[a] for a in ctx.buffers[g.c].axes)
        conds.append(f"{R._paren(rows)} % (64 * ({threads} // 128)) == 0")
        conds.append(f"{R._paren(cols)} <= 256")
    conds.append(f"{shared_bytes(ctx, sched)} <= {smem_per_block - fit.ASYNC_SMEM_SLACK}")
    axes = {a for i in sched.loads for a in ctx.buffers[body[i].dst].axes}
    for a in sorted(axes) if not fit.ASYNC_PARTIAL_TILES else ():
        if R.has_tail(ctx.kernel, a, ctx.roles[a].block, ctx.roles[a].size):
            conds.append(f"{ctx.size_const[a]} % {ctx.block_expr[a]} == 0")
    return " and ".join(dict.fromkeys(conds))


def persistent_tiles(ctx: R._Ctx, sched: AsyncSchedule, sms: int) -> str | None:
    """The tile count expression of a kernel that may render persistent, else None.

    A persistent kernel launches one block per SM and each block loops over tiles
    ``block, block + SM_COUNT, ...``: the producer keeps filling the ring with the next tile's steps
    while the consumers finish this tile's last steps and its epilogue, so the tensor cores do not
    wait for a new block's launch, barrier set-up and first loads at every tile (FlashAttention-3's
    and CUTLASS's persistent schedulers). The build function picks this form only past one wave
    (``tiles > SM_COUNT``). Not for masked loops: their blocks run different step counts (ring
    phases would need a running count) and launch longest first.

    Two-GEMM chains only, as measured on Hopper (runs 93-94, ``benchmarks/gpu_ab.py --feature
    persistent``, interleaved rounds): attention 1.4-3.9% faster, grouped-query attention 2.8-2.9%,
    t = 8192 1.7%; the GEMM mainloop 1.1-4.8% slower (4096^3; 2048 x 4096 x 4096), with TileLang's
    panel order reproduced. A static tile order loses the hardware's dynamic block dispatch, and the
    GEMM's epilogue (a 64 KiB tile) does not overlap the next tile's mainloop either way.
    """
    if ctx.kernel.loop is None or ctx.kernel.loop.visible is not None or not isinstance(sched, ChainSchedule):
        return None
    counts = R.launch_counts(ctx)
    if not counts:
        return None
    most = 1
    for a, _ in counts:
        r = ctx.roles[a]
        blocks = ctx.kernel.params.get(r.block, [1]) if isinstance(r.block, str) else [r.block]
        most *= -(-r.size // (min(blocks) if r.kind != "indexed" else 1))
    if most <= sms:  # no config of the space passes one wave
        return None
    return " * ".join(R._paren(n) for _, n in counts)
