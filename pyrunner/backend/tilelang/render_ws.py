"""The explicitly warp-specialised prim_func of an asynchronous loop (``plan.schedule`` says when and why).

One producer warpgroup TMA-loads each step's tiles into a ring of ``stages`` slots and signals a
full mbarrier per slot; the consumer warpgroups wait on it, issue wgmma asynchronously
(``T.wgmma_gemm``), and free the slot on its empty mbarrier only after the wgmma that reads it has
been waited on (``T.wait_wgmma``). The slot is never released before its last reader finished,
which is what TileLang's own ``wg_wait`` annotation gets wrong. Two consumer warpgroups take turns
issuing their GEMMs through two named barriers (FlashAttention-3's ping-pong). A mainloop (loads
and accumulating GEMMs only) keeps one step's wgmma in flight while the next step's are issued.

The build function renders this prim_func under a guard on its tile parameters (two warpgroup
counts, 64-row wgmma slabs, loaded tiles without tails unless ``target.fit.ASYNC_PARTIAL_TILES``) and
falls back to the ``T.Pipelined`` form;
``ws_forms`` decides which kernels get it, the guard, and where the persistent form applies;
``ring`` holds the mbarrier protocol of the slots.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyrunner.backend.tilelang import emit as R
from pyrunner.backend.tilelang import ws_forms
from pyrunner.backend.tilelang.ring import Ring
from pyrunner.plan.analysis import op_reads_writes
from pyrunner.plan.schedule import AsyncSchedule, ChainSchedule, MainloopSchedule

PRODUCER_THREADS = 128
"""One warpgroup issues the TMA loads."""
PRODUCER_REGS, CONSUMER_REGS = 24, 240
"""setmaxnreg budgets: the producer only issues TMA; 24 * 128 + 240 * 256 fits the 64K registers."""
PINGPONG_BARRIER = 8
"""First of the two named barriers of the ping-pong (TileLang's own lowering uses ids below 8)."""
CONSUMER_BARRIER = PINGPONG_BARRIER + 2
"""Named barrier of the consumer warpgroups alone (the producer never joins it)."""


def _declare(w: R._Writer, ctx: R._Ctx, func_name: str, threads: str, ring: Ring,
             persistent: bool = False) -> str | None:
    """The prim_func's signature, launch, buffers (the loaded ones as rings of slots) and mbarriers;
    returns the block index of a persistent launch."""
    block = R._signature_and_launch(w, ctx, func_name, f"{R._paren(threads)} + {PRODUCER_THREADS}", persistent)
    R._declare_buffers(w, ctx, rings=frozenset(ring.staged))
    for b in ring.staged:
        w.line(f"{ring.full[b]} = T.alloc_barrier([{PRODUCER_THREADS}] * {ring.stages})  # slot of {b!r} loaded")
        w.line(f"{ring.empty[b]} = T.alloc_barrier([{threads}] * {ring.stages})  # slot of {b!r} free again")
    for b in ring.once:
        w.line(f"{ring.full[b]} = T.alloc_barrier([{PRODUCER_THREADS}])  # {b!r} loaded for this tile")
        if persistent:
            w.line(f"{ring.empty[b]} = T.alloc_barrier([{threads}])  # {b!r} free for the next tile")
    return block


@dataclass
class _Form:
    """One asynchronous prim_func being written: its schedule, ring, step bounds and (persistent) tiles."""

    w: R._Writer
    ctx: R._Ctx
    sched: AsyncSchedule
    ring: Ring
    threads: str
    first: str  # the loop's first step ("0", or a block's masked lower bound)
    end: str
    last: str
    pre: tuple[int, ...]  # prologue loads the producer issues
    swizzle: str | None
    tiles: str | None = None  # persistent: the build function's tile count
    block: str | None = None
    tile_it: str | None = None
    tile: str | None = None

    def tile_loop(self, note: str) -> None:
        """A persistent block's loop over its tiles (indents into it), the tile's coordinates bound."""
        w = self.w
        w.line(f"for {self.tile_it} in T.serial(T.ceildiv({self.tiles} - {self.block}, SM_COUNT)):  # {note}")
        w.indent()
        w.line(f"{self.tile} = {self.block} + {self.tile_it} * SM_COUNT")
        R.bind_tile_coords(self.ctx, w, self.tile, panel=self.swizzle is not None)
        self.ring.offset = f"{self.tile_it} * {R._paren(self.end)}"
        self.ring.tile = self.tile_it


def render_async_prim_func(w: R._Writer, ctx: R._Ctx, func_name: str, threads: str, swizzle: str | None,
                           sched: AsyncSchedule, tiles: str | None = None) -> None:
    """``@T.prim_func`` of the kernel with a producer warpgroup and asynchronous consumers; ``tiles``
    (the build function's tile count, see ``persistent_tiles``): the persistent form over them."""
    kernel = ctx.kernel
    lp = kernel.loop
    fresh = ctx.local.fresh
    masked = lp.visible is not None  # steps [lo, hi) per block: masked_tile_skip drops the rest
    assert tiles is None or not masked
    first, end = (fresh(f"{lp.axis}_lo"), fresh(f"{lp.axis}_hi")) if masked else ("0", R._tiles(ctx, lp.axis))
    pre = ws_forms.producer_prologue(ctx)
    ring = Ring(w, ctx, [kernel.body[i].dst for i in sched.loads], first,
                 once=tuple(kernel.prologue[i].dst for i in pre))
    tx, wg, last = fresh("tx"), fresh("wg"), fresh("last_step")
    pp = fresh("pingpong") if isinstance(sched, ChainSchedule) else None
    if pp is not None:
        w.line(f"{pp} = {threads} == 256  # two consumer warpgroups take turns at the tensor cores")
    if not masked:
        w.line(f"{last} = {end} - 1")
    form = _Form(w, ctx, sched, ring, threads, first, end, last, pre, swizzle, tiles)
    form.block = _declare(w, ctx, func_name, threads, ring, persistent=tiles is not None)
    if tiles is not None:
        form.tile_it, form.tile = fresh("tile_it"), fresh("tile")
    if masked:
        R._bind_loop_bounds(w, ctx, first, end)
        w.line(f"{last} = {end} - 1")
    w.line(f"{tx} = T.get_thread_binding()")
    if swizzle is not None and tiles is None:
        w.line(f"T.use_swizzle(panel_size=10, enable={swizzle})  # block order that keeps GEMM operand panels in L2")
    R._launch_chain_top(w, ctx, sync=False)  # each role waits where it first needs the kernels ahead
    w.line(f"if {tx} >= {threads}:  # producer warpgroup: TMA loads into the ring, a slot once it is free")
    w.indent()
    _producer(form)
    w.dedent()
    w.line("else:  # consumer warpgroups")
    w.indent()
    w.line(f"T.set_max_nreg({CONSUMER_REGS}, 1)")
    w.line(f"{wg} = {tx} // 128")
    late_wait = _consumer_prologue(form)
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
    ring.release_once([b for b in ring.once if b not in ring.freed], "every GEMM of this tile waited on")
    if kernel.epilogue:
        w.line("# epilogue")
    for i, op in enumerate(kernel.epilogue):
        if i == late_wait:
            R.pdl_sync(w, "the kernels ahead finished; the loop ran alongside them")
        R._render_op(w, ctx, op, "epilogue", i)
    if tiles is not None:
        w.dedent()
    w.dedent()
    w.dedent()
    w.dedent()


def _producer(form: _Form) -> None:
    """The producer warpgroup: the prologue tiles it owns once per tile, then every step's loads into
    the ring, each slot once the consumers freed it."""
    w, ctx, ring, kernel = form.w, form.ctx, form.ring, form.ctx.kernel
    body, loop_var = kernel.body, ctx.loop_var
    w.line(f"T.set_max_nreg({PRODUCER_REGS}, 0)")
    loads = [*(body[i] for i in form.sched.loads), *(kernel.prologue[i] for i in form.pre)]
    if ctx.launch.first_wait(loads) is not None:
        R.pdl_sync(w, "the loop loads a tensor the kernels ahead write")
    if form.tiles is not None:
        form.tile_loop("the ring runs on into the next tile's steps while the consumers finish this one")
    for i in form.pre:  # prologue tiles only the GEMMs read: loaded once per tile, beside the ring
        op = kernel.prologue[i]
        b = op.dst
        if form.tiles is not None:
            w.line(f"T.barrier_wait({ring.empty[b]}[0], {ring.once_parity(True)})")
        w.line(f"T.tma_copy({R._region(ctx, ctx.tensors[op.src])}, {ctx.names[b]}, barrier={ring.full[b]}[0])")
        w.line(f"T.barrier_arrive({ring.full[b]}[0])")
    w.line(f"for {loop_var} in T.serial({_span(form.first, form.end)}):")
    w.indent()
    for i in form.sched.loads:
        op = body[i]
        b = op.dst
        nd = len(ctx.buffers[b].axes)
        slot = ring.slot(loop_var)
        w.line(f"T.barrier_wait({ring.empty[b]}[{slot}], 1 - {ring.parity(loop_var)})")
        w.line(f"T.tma_copy({R._region(ctx, ctx.tensors[op.src])}, {ring.names[b]}[{slot}, "
               f"{', '.join([':'] * nd)}], barrier={ring.full[b]}[{slot}])")
        w.line(f"T.barrier_arrive({ring.full[b]}[{slot}])")
    w.dedent()
    if form.tiles is not None:
        w.dedent()


def _consumer_prologue(form: _Form) -> int | None:
    """The consumers' prologue (a persistent block's tile loop opened first), with the dependent-launch
    wait where the consumers first need the kernels ahead; returns the epilogue op to wait before."""
    w, ctx, ring, kernel = form.w, form.ctx, form.ring, form.ctx.kernel
    consumer_body = [op for i, op in enumerate(kernel.body) if i not in form.sched.loads]
    own_prologue = [op for i, op in enumerate(kernel.prologue) if i not in form.pre]  # what the consumers run
    wait_at = ctx.launch.first_wait(own_prologue)
    if form.tiles is not None:
        if any(ctx.launch.first_wait(ops) is not None for ops in (own_prologue, consumer_body, kernel.epilogue)):
            R.pdl_sync(w, "the kernels ahead finished (the producer's loads of the plan's inputs went ahead)")
        wait_at = None
        form.tile_loop("the same tiles as the producer, in the same order")
        w.line(f"T.sync_threads({CONSUMER_BARRIER}, {form.threads})  # the last tile's reads of shared tiles and "
               "its epilogue store are done")
    if kernel.prologue:
        w.line("# prologue")
    own = 0
    for i, op in enumerate(kernel.prologue):
        if i in form.pre:
            w.line(f"T.barrier_wait({ring.full[op.dst]}[0], {ring.once_parity(False)})  # {op.dst!r}: "
                   "the producer's TMA load")
            continue
        if own == wait_at:
            R.pdl_sync(w, "the kernels ahead finished (the producer's loads of the plan's inputs went ahead)")
        own += 1
        R._render_op(w, ctx, op, "prologue", i)
    if any(ctx.buffers[x].scope == "shared" for op in own_prologue for x in op_reads_writes(op)[1]):
        w.line("T.fence_proxy_async()  # the prologue's shared-memory writes, visible to wgmma")
        w.line(f"T.sync_threads({CONSUMER_BARRIER}, {form.threads})  # ... and finished by every consumer thread")
    if form.tiles is not None:
        return None
    if wait_at is None and ctx.launch.first_wait(consumer_body) is not None:
        R.pdl_sync(w, "the kernels ahead finished: the loop's thread code touches global memory")
        return None
    return ctx.launch.first_wait(kernel.epilogue) if wait_at is None else None


def _span(first: str, end: str, skip: int = 0) -> str:
    """``T.serial`` arguments for steps ``[first + skip, end)`` (the unmasked loop's text when first is 0)."""
    start = str(skip) if first == "0" else (f"{first} + {skip}" if skip else first)
    return end if start == "0" else f"{start}, {end}"


def _mainloop_consumers(w: R._Writer, ctx: R._Ctx, sched: MainloopSchedule, ring: Ring, first: str, end: str,
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


def _chain_consumers(w: R._Writer, ctx: R._Ctx, sched: ChainSchedule, ring: Ring, first: str, end: str,
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
    g2 = body[sched.g2]
    ring.release_once([b for b in ring.once if b not in (g2.a, g2.b)], "every G1 of this tile waited on")
    w.line("# G2 of the last step")
    waits("g2", last)
    my_turn()
    gemm(sched.g2, last)
    your_turn(only="0")  # warpgroup 1 has no turn left to hand over: every arrive meets a sync
    w.line("T.wait_wgmma(0)")
    releases("g2", last)
