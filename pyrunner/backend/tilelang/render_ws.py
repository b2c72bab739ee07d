"""The explicitly warp-specialised prim_func of an asynchronous loop (``plan.schedule`` says when and why).

One producer warpgroup TMA-loads each step's tiles into a ring of ``stages`` slots and signals a
full mbarrier per slot; the consumer warpgroups wait on it, issue wgmma asynchronously
(``T.wgmma_gemm``), and free the slot on its empty mbarrier only after the wgmma that reads it has
been waited on (``T.wait_wgmma``). The slot is never released before its last reader finished,
which is what TileLang's own ``wg_wait`` annotation gets wrong. Two consumer warpgroups take turns
issuing their GEMMs through two named barriers (FlashAttention-3's ping-pong). A mainloop (loads
and accumulating GEMMs only) keeps one step's wgmma in flight while the next step's are issued.

The build function renders this prim_func under a guard on its tile parameters (two warpgroup
counts, 64-row wgmma slabs, tiles without tails) and falls back to the ``T.Pipelined`` form.
"""

from __future__ import annotations

from pyrunner.backend.tilelang import emit as R
from pyrunner.plan import schedule
from pyrunner.plan.analysis import op_reads_writes
from pyrunner.plan.schedule import AsyncSchedule, ChainSchedule, MainloopSchedule
from pyrunner.target.device import H200
from pyrunner.target.fit import ASYNC_SMEM_SLACK

PRODUCER_THREADS = 128
"""One warpgroup issues the TMA loads."""
PRODUCER_REGS, CONSUMER_REGS = 24, 240
"""setmaxnreg budgets: the producer only issues TMA; 24 * 128 + 240 * 256 fits the 64K registers."""
PINGPONG_BARRIER = 8
"""First of the two named barriers of the ping-pong (TileLang's own lowering uses ids below 8)."""
CONSUMER_BARRIER = PINGPONG_BARRIER + 2
"""Named barrier of the consumer warpgroups alone (the producer never joins it)."""


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
    for i in sched.loads:  # TMA: 16-byte aligned rows of a tensor with at least two axes
        t = ctx.tensors[kernel.body[i].src]
        if len(t.axes) < 2 or t.shape[-1] * H200.dtype_bytes[t.dtype] % 16:
            return None
        if any(ctx.roles[a].kind == "indexed" for a in ctx.buffers[kernel.body[i].dst].axes):
            return None
    return sched


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
            size = " * ".join([*(R._paren(e) for e in R._extent(ctx, b)), str(H200.dtype_bytes[b.dtype])])
            terms.append(f"{R._paren(stages)} * {size}" if b.name in staged else size)
    for src, dst in ctx.staging:
        terms.append(" * ".join([*(R._paren(e) for e in R._extent(ctx, ctx.buffers[src])),
                                 str(H200.dtype_bytes[dtypes[dst]])]))
    return f"({' + '.join(terms)})"


def guard(ctx: R._Ctx, sched: AsyncSchedule, threads: str) -> str:
    """Python condition on the tile parameters under which the asynchronous form is rendered."""
    body = ctx.kernel.body
    conds = [f"{threads} in (128, 256)"]
    for g in (body[i] for i in sched.gemms):
        rows, cols = (ctx.block_expr[a] for a in ctx.buffers[g.c].axes)
        conds.append(f"{R._paren(rows)} % (64 * ({threads} // 128)) == 0")
        conds.append(f"{R._paren(cols)} <= 256")
    conds.append(f"{shared_bytes(ctx, sched)} <= {H200.smem_per_block - ASYNC_SMEM_SLACK}")
    axes = {a for i in sched.loads for a in ctx.buffers[body[i].dst].axes}
    for a in sorted(axes):
        if R.has_tail(ctx.kernel, a, ctx.roles[a].block, ctx.roles[a].size):
            conds.append(f"{ctx.size_const[a]} % {ctx.block_expr[a]} == 0")
    return " and ".join(dict.fromkeys(conds))


def _declare(w: R._Writer, ctx: R._Ctx, func_name: str, threads: str, ring: _Ring) -> None:
    """The prim_func's signature, launch, buffers (the loaded ones as rings of slots) and mbarriers."""
    R._signature_and_launch(w, ctx, func_name, f"{R._paren(threads)} + {PRODUCER_THREADS}")
    R._declare_buffers(w, ctx, rings=frozenset(ring.staged))
    for b in ring.staged:
        w.line(f"{ring.full[b]} = T.alloc_barrier([{PRODUCER_THREADS}] * {ring.stages})  # slot of {b!r} loaded")
        w.line(f"{ring.empty[b]} = T.alloc_barrier([{threads}] * {ring.stages})  # slot of {b!r} free again")


class _Ring:
    """The ring of slots the producer fills and the consumers drain: slot and phase of a step, the
    mbarrier waits and arrives, and the staged buffers' names bound to one step's slot."""

    def __init__(self, w: R._Writer, ctx: R._Ctx, staged: list[str], first: str = "0") -> None:
        self.w, self.ctx, self.staged = w, ctx, staged
        self.first = first  # the loop's first step: slots and phases count from it (masked bounds start later)
        self.stages = R._paren(R._stages(ctx.kernel))
        fresh = ctx.local.fresh
        self.full = {b: fresh(f"{b}_full") for b in staged}
        self.empty = {b: fresh(f"{b}_empty") for b in staged}
        self.names = {b: ctx.names[b] for b in staged}

    def _count(self, step: str) -> str:
        return R._paren(step) if self.first == "0" else f"({step} - {self.first})"

    def slot(self, step: str) -> str:
        return f"{self._count(step)} % {self.stages}"

    def parity(self, step: str) -> str:
        return f"({self._count(step)} // {self.stages}) % 2"

    def bind(self, step: str) -> None:
        """Point the staged buffers' names at ``step``'s slot (``unbind`` restores them)."""
        for b in self.staged:
            nd = len(self.ctx.buffers[b].axes)
            self.ctx.names[b] = f"{self.names[b]}[{self.slot(step)}, {', '.join([':'] * nd)}]"

    def bind_elements(self, step: str) -> None:
        """Element reads of the staged buffers (a Map's operands) index ``step``'s slot first."""
        self.unbind()
        self.ctx.slots = {b: self.slot(step) for b in self.staged}

    def unbind(self) -> None:
        self.ctx.names.update(self.names)
        self.ctx.slots = None

    def wait_full(self, bufs: list[str], step: str) -> None:
        for b in bufs:
            self.w.line(f"T.barrier_wait({self.full[b]}[{self.slot(step)}], {self.parity(step)})")

    def release(self, bufs: list[str], step: str) -> None:
        for b in bufs:
            self.w.line(f"T.barrier_arrive({self.empty[b]}[{self.slot(step)}])")


def render_async_prim_func(w: R._Writer, ctx: R._Ctx, func_name: str, threads: str, swizzle: str | None,
                           sched: AsyncSchedule) -> None:
    """``@T.prim_func`` of the kernel with a producer warpgroup and asynchronous consumers."""
    kernel, buffers = ctx.kernel, ctx.buffers
    body = kernel.body
    lp = kernel.loop
    staged = [body[i].dst for i in sched.loads]
    loop_var = ctx.loop_var
    fresh = ctx.local.fresh
    masked = lp.visible is not None  # steps [lo, hi) per block: masked_tile_skip drops the rest
    first, end = (fresh(f"{lp.axis}_lo"), fresh(f"{lp.axis}_hi")) if masked else ("0", R._tiles(ctx, lp.axis))
    ring = _Ring(w, ctx, staged, first)
    tx, wg, last = fresh("tx"), fresh("wg"), fresh("last_step")
    pp = fresh("pingpong") if isinstance(sched, ChainSchedule) else None
    if pp is not None:
        w.line(f"{pp} = {threads} == 256  # two consumer warpgroups take turns at the tensor cores")
    if not masked:
        w.line(f"{last} = {end} - 1")
    _declare(w, ctx, func_name, threads, ring)
    if masked:
        R._bind_loop_bounds(w, ctx, first, end)
        w.line(f"{last} = {end} - 1")
    w.line(f"{tx} = T.get_thread_binding()")
    if swizzle is not None:
        w.line(f"T.use_swizzle(panel_size=10, enable={swizzle})  # block order that keeps GEMM operand panels in L2")
    R._launch_chain_top(w, ctx, sync=False)  # each role waits where it first needs the kernels ahead
    w.line(f"if {tx} >= {threads}:  # producer warpgroup: TMA loads into the ring, a slot once it is free")
    w.indent()
    w.line(f"T.set_max_nreg({PRODUCER_REGS}, 0)")
    if ctx.launch.first_wait([body[i] for i in sched.loads]) is not None:
        R.pdl_sync(w, "the loop loads a tensor the kernels ahead write")
    w.line(f"for {loop_var} in T.serial({_span(first, end)}):")
    w.indent()
    for i in sched.loads:
        op = body[i]
        b = op.dst
        nd = len(buffers[b].axes)
        slot = ring.slot(loop_var)
        w.line(f"T.barrier_wait({ring.empty[b]}[{slot}], 1 - {ring.parity(loop_var)})")
        w.line(f"T.tma_copy({R._region(ctx, ctx.tensors[op.src])}, {ring.names[b]}[{slot}, "
               f"{', '.join([':'] * nd)}], barrier={ring.full[b]}[{slot}])")
        w.line(f"T.barrier_arrive({ring.full[b]}[{slot}])")
    w.dedent()
    w.dedent()
    w.line("else:  # consumer warpgroups")
    w.indent()
    w.line(f"T.set_max_nreg({CONSUMER_REGS}, 1)")
    w.line(f"{wg} = {tx} // 128")
    wait_at = ctx.launch.first_wait(kernel.prologue)
    if kernel.prologue:
        w.line("# prologue")
    for i, op in enumerate(kernel.prologue):
        if i == wait_at:
            R.pdl_sync(w, "the kernels ahead finished (the producer's loads of the plan's inputs went ahead)")
        R._render_op(w, ctx, op, "prologue", i)
    if any(buffers[x].scope == "shared" for op in kernel.prologue for x in op_reads_writes(op)[1]):
        w.line("T.fence_proxy_async()  # the prologue's shared-memory writes, visible to wgmma")
        w.line(f"T.sync_threads({CONSUMER_BARRIER}, {threads})  # ... and finished by every consumer thread")
    consumer_body = [op for i, op in enumerate(body) if i not in sched.loads]
    if wait_at is None and ctx.launch.first_wait(consumer_body) is not None:
        wait_at = len(kernel.prologue)
        R.pdl_sync(w, "the kernels ahead finished: the loop's thread code touches global memory")
    if masked:  # a block whose mask hides every step runs none (its rows come out as the T.Pipelined form's)
        w.line(f"if {end} > {first}:")
        w.indent()
    if isinstance(sched, MainloopSchedule):
        _mainloop_consumers(w, ctx, sched, ring, first, end, last)
    else:
        _chain_consumers(w, ctx, sched, ring, first, end, last, wg, pp)
    if masked:
        w.dedent()
    ring.unbind()
    if kernel.epilogue:
        w.line("# epilogue")
    late_wait = ctx.launch.first_wait(kernel.epilogue) if wait_at is None else None
    for i, op in enumerate(kernel.epilogue):
        if i == late_wait:
            R.pdl_sync(w, "the kernels ahead finished; the loop ran alongside them")
        R._render_op(w, ctx, op, "epilogue", i)
    w.dedent()
    w.dedent()
    w.dedent()


def _span(first: str, end: str, skip: int = 0) -> str:
    """``T.serial`` arguments for steps ``[first + skip, end)`` (the unmasked loop's text when first is 0)."""
    start = str(skip) if first == "0" else (f"{first} + {skip}" if skip else first)
    return end if start == "0" else f"{start}, {end}"


def _mainloop_consumers(w: R._Writer, ctx: R._Ctx, sched: MainloopSchedule, ring: _Ring, first: str, end: str,
                        last: str) -> None:
    """Each step: wait for its tiles, issue its GEMMs, run its thread ops under them, wait until only
    they are in flight, and free the previous step's slots (their wgmma and thread reads are done)."""
    loop_var = ctx.loop_var
    n = len(sched.gemms)
    w.line(f"# streamed loop over {ctx.kernel.loop.axis!r}: one step's wgmma in flight while the next is issued")
    w.line(f"for {loop_var} in T.serial({_span(first, end)}):")
    w.indent()
    ring.wait_full(ring.staged, loop_var)
    ring.bind(loop_var)
    for i in sched.gemms:
        R._render_gemm(w, ctx, ctx.kernel.body[i], fn="T.wgmma_gemm", full_row=True)
    ring.bind_elements(loop_var)
    for i in sched.ops:  # thread work under the MMAs: it leaves their operands and accumulators alone
        R._render_op(w, ctx, ctx.kernel.body[i], "body", i)
    ring.unbind()
    w.line(f"T.wait_wgmma({n})  # the previous step's wgmma done; this step's may still run")
    w.line(f"if {loop_var} > {first}:")
    w.indent()
    ring.release(ring.staged, f"{loop_var} - 1")
    w.dedent()
    w.dedent()
    w.line("T.wait_wgmma(0)")
    ring.release(ring.staged, last)


def _chain_consumers(w: R._Writer, ctx: R._Ctx, sched: ChainSchedule, ring: _Ring, first: str, end: str,
                     last: str, wg: str, pp: str) -> None:
    """G1 of step k and G2 of step k-1 issued back to back, the ops between them split around the
    wait for G2, and two warpgroups taking turns at the tensor cores (FlashAttention-3)."""
    body = ctx.kernel.body
    loop_var = ctx.loop_var

    def waits(part: str, step: str) -> None:
        ring.wait_full([b for b in ring.staged if sched.acquire[b] == part], step)

    def releases(part: str, step: str) -> None:
        ring.release([b for b in ring.staged if sched.release[b] == part], step)

    def gemm(i: int, step: str) -> None:
        ring.bind(step)
        R._render_gemm(w, ctx, body[i], fn="T.wgmma_gemm", full_row=True)

    def thread_ops(part: str, idx: tuple[int, ...], step: str) -> None:
        waits(part, step)
        ring.bind(step)
        for i in idx:
            R._render_op(w, ctx, body[i], "body", i)
        releases(part, step)

    def my_turn() -> None:  # ping-pong: wait until the other warpgroup has issued its GEMMs
        w.line(f"if {pp}:")
        w.line(f"    T.sync_threads({PINGPONG_BARRIER} + {wg}, 256)")

    def your_turn(only: str = "") -> None:  # ... and hand the tensor cores over after issuing ours
        w.line(f"if {pp}:")
        if only:
            w.line(f"    if {wg} == {only}:")
            w.line(f"        T.named_barrier_arrive({PINGPONG_BARRIER + 1 - int(only)}, 256)")
        else:
            w.line(f"    T.named_barrier_arrive({PINGPONG_BARRIER + 1} - {wg}, 256)")

    prev = f"{loop_var} - 1"
    w.line(f"# step 0 of the streamed loop over {ctx.kernel.loop.axis!r}: G1 alone")
    w.line(f"for {loop_var} in T.serial({'1' if first == '0' else f'{first}, {first} + 1'}):")
    w.indent()
    waits("g1", loop_var)
    w.line(f"if {pp}:")
    w.line(f"    if {wg} == 1:")
    w.line(f"        T.named_barrier_arrive({PINGPONG_BARRIER}, 256)  # warpgroup 0 goes first")
    w.line(f"    T.sync_threads({PINGPONG_BARRIER} + {wg}, 256)")
    gemm(sched.g1, loop_var)
    your_turn()
    w.line("T.wait_wgmma(0)")
    releases("g1", loop_var)
    thread_ops("early", sched.early, loop_var)
    thread_ops("late", sched.late, loop_var)
    w.dedent()
    w.line("# steps 1..: G1 of this step and G2 of the previous one in flight together")
    w.line(f"for {loop_var} in T.serial({_span(first, end, 1)}):")
    w.indent()
    waits("g1", loop_var)
    my_turn()
    gemm(sched.g1, loop_var)
    waits("g2", prev)
    gemm(sched.g2, prev)
    your_turn()
    w.line("T.wait_wgmma(1)  # G1 done; G2 of the previous step may still run")
    releases("g1", loop_var)
    thread_ops("early", sched.early, loop_var)
    w.line("T.wait_wgmma(0)")
    releases("g2", prev)
    thread_ops("late", sched.late, loop_var)
    w.dedent()
    w.line("# G2 of the last step")
    waits("g2", last)
    my_turn()
    gemm(sched.g2, last)
    your_turn(only="0")  # warpgroup 1 has no turn left to hand over: every arrive meets a sync
    w.line("T.wait_wgmma(0)")
    releases("g2", last)
