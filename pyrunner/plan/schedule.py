"""When and how a streamed loop runs its GEMMs as asynchronous wgmma: a two-GEMM chain
(FlashAttention-3's schedule) and a plain accumulation mainloop (CUTLASS's).

TileLang's automatic warp specialisation waits on every wgmma as soon as it is issued, so the
softmax (or the activation of a fused MLP) between a loop's two GEMMs never overlaps the tensor
cores. For a loop body of the shape

    loads;  G1: S = A1 @ B1 (cleared);  ops between;  G2: acc += A2 @ B2;  ops after

the renderer instead writes an explicit producer warpgroup (TMA loads into a ring of stages, with
full/empty mbarriers) and consumer warpgroups that issue G1 of step k and G2 of step k-1 back to
back, wait for G1 only, run the ops between that do not touch G2's operands ("early"), then wait
for G2 and run the rest ("late"). Two consumer warpgroups also take turns at the tensor cores
(ping-pong), so one's softmax runs under the other's GEMMs.

Moving G2 of step k into step k+1 is legal when it commutes with everything it moves past:
the ops after it in its own step, G1 of the next step and the early ops of the next step. This
module decides that from the plan alone (``chain_schedule``), and says which loaded tile each
stage release waits for; ``backend.tilelang.render_ws`` writes the code and ``emulate`` replays
its barrier protocol; the tuning database records which form each kernel was timed under.

A loop whose body is its loads, GEMMs accumulating into loop state, and thread work that leaves
the GEMMs' operands and accumulators alone (a matmul; a norm-fed GEMM summing squares of the tile
it multiplies) gets the mainloop schedule (``mainloop_schedule``): the consumers issue step k's
wgmma, run the thread work under them, wait until only step k's are in flight, and free step
k-1's slots. The tensor cores never drain between steps, which TileLang's ``wait<0>`` after every
GEMM makes them do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyrunner.plan import masks
from pyrunner.plan.analysis import block_box, kernel_axes, op_reads_writes, resolve
from pyrunner.plan.schema import Gemm, Kernel, Load, Map, Op


@dataclass(frozen=True)
class ChainSchedule:
    """Positions in ``kernel.body`` of the ops of one step, in the order the consumers run them.

    ``early`` run while G2 of the previous step is in flight, ``late`` after it has been waited
    on. For each loaded buffer, ``acquire`` names the part of a step that reads it first (its full
    barrier is waited on there) and ``release`` the part that reads it last (its slot is free again
    after it): ``"g1"``, ``"early"``, ``"late"`` or ``"g2"`` (G2 of a step runs in the next one,
    so a tile G2 reads is released a step later, once G2 has been waited on).
    """

    loads: tuple[int, ...]
    g1: int
    g2: int
    early: tuple[int, ...]
    late: tuple[int, ...]
    acquire: dict[str, str]
    release: dict[str, str]

    @property
    def gemms(self) -> tuple[int, ...]:
        return (self.g1, self.g2)


@dataclass(frozen=True)
class MainloopSchedule:
    """Positions in ``kernel.body`` of a loop that loads, accumulates GEMMs and runs thread ``ops``
    beside them: every loaded tile is acquired before the step's GEMMs and released one step
    later, once they have been waited on (the step's thread ops have run by then)."""

    loads: tuple[int, ...]
    gemms: tuple[int, ...]
    ops: tuple[int, ...] = ()


AsyncSchedule = ChainSchedule | MainloopSchedule


def _conflict(a: Op, b: Op) -> bool:
    """Whether two ops must keep their order (a write of one meets a read or write of the other)."""
    ra, wa = op_reads_writes(a)
    rb, wb = op_reads_writes(b)
    return bool(set(wa) & (set(rb) | set(wb)) or set(ra) & set(wb))


def _shared(kernel: Kernel) -> set[str]:
    """The kernel's shared-memory buffers (wgmma reads B, and may read A, there)."""
    return {b.name for b in kernel.buffers if b.scope == "shared"}


def chain_schedule(kernel: Kernel) -> ChainSchedule | None:
    """The asynchronous two-GEMM schedule of a pipelined kernel, or None where it does not apply.

    Applies when the body is its loads followed by compute ops with exactly two GEMMs: the first
    (G1) right after the loads, clearing its accumulator; the second (G2) accumulating into loop
    state with a B operand in shared memory. Loaded tiles are read by GEMMs only (the consumers
    never index a staged tile). A loop with masked bounds runs its steps [lo, hi) per block.
    """
    if kernel.loop is None:
        return None
    body, shared = kernel.body, _shared(kernel)
    loads = tuple(i for i, op in enumerate(body) if isinstance(op, Load))
    if not loads or loads != tuple(range(len(loads))):
        return None
    gemms = [i for i, op in enumerate(body) if isinstance(op, Gemm)]
    if len(gemms) != 2 or gemms[0] != len(loads):
        return None
    g1, g2 = gemms
    op1, op2 = body[g1], body[g2]
    state = {b.name for b in kernel.buffers if b.state}
    staged = {body[i].dst for i in loads}
    if not op1.clear or op2.clear or op2.c not in state or op1.c in state:
        return None
    if op1.b not in shared or op2.b not in shared or op1.c == op2.c:
        return None
    if len(staged) != len(loads) or staged & state:
        return None
    for i, op in enumerate(body):
        if i not in gemms and not isinstance(op, Load) and staged & set(op_reads_writes(op)[0]):
            return None  # thread code reading a staged tile
    if op1.c in (op2.a, op2.b) or op2.c in (op1.a, op1.b):
        return None
    written = {w for i, op in enumerate(body) if i not in loads for w in op_reads_writes(op)[1]}
    if (shared & {op1.a, op2.a}) & written or {op1.b, op2.b} & written:
        return None  # thread writes of a wgmma's shared operand would need a consumer barrier every step
    touches_g2 = {op2.a, op2.c}
    early: list[int] = []
    late: list[int] = []
    for i in range(g1 + 1, g2):  # ops between: early unless they touch G2's operands or follow a late op
        op = body[i]
        r, w = op_reads_writes(op)
        if touches_g2 & (set(r) | set(w)) or any(_conflict(body[j], op) for j in late):
            late.append(i)
        else:
            early.append(i)
    after: list[int] = []
    for i in range(g2 + 1, len(body)):  # G2 moves past these: they must leave its operands alone
        op = body[i]
        r, w = op_reads_writes(op)
        if touches_g2 & (set(r) | set(w)) or op2.b in w:
            return None
        if any(_conflict(body[j], op) for j in late + after):
            after.append(i)
            continue
        early.append(i)
    late += after
    acquire: dict[str, str] = {}
    release: dict[str, str] = {}
    parts = (("g1", (g1,)), ("early", early), ("late", late), ("g2", (g2,)))
    for buf in staged:
        readers = [part for part, idx in parts if any(buf in op_reads_writes(body[j])[0] for j in idx)]
        if not readers:
            return None
        acquire[buf], release[buf] = readers[0], readers[-1]
    return ChainSchedule(loads, g1, g2, tuple(early), tuple(late), acquire, release)


def mainloop_schedule(kernel: Kernel) -> MainloopSchedule | None:
    """The asynchronous mainloop of a pipelined kernel (masked bounds allowed) whose body is its loads,
    then GEMMs each accumulating into loop state from operands in shared memory, and thread ops that
    commute with every GEMM (they neither write a GEMM's operands nor touch its accumulator) and
    read loaded tiles element by element only; None where that does not hold."""
    if kernel.loop is None:
        return None
    body, buffers, shared = kernel.body, kernel.buffers, _shared(kernel)
    loads = tuple(i for i, op in enumerate(body) if isinstance(op, Load))
    if not loads or loads != tuple(range(len(loads))):
        return None
    rest = range(len(loads), len(body))
    gemms = tuple(i for i in rest if isinstance(body[i], Gemm))
    ops = tuple(i for i in rest if not isinstance(body[i], Gemm))
    if not gemms:
        return None
    state = {b.name for b in buffers if b.state}
    staged = {body[i].dst for i in loads}
    if len(staged) != len(loads) or staged & state:
        return None
    accs = {body[i].c for i in gemms}  # two GEMMs may share one (shared_accumulator): wgmma orders them
    for i in gemms:
        g = body[i]
        if g.clear or g.c not in state or g.a not in shared or g.b not in shared or {g.a, g.b} & accs:
            return None
        if any(_conflict(g, body[j]) for j in ops):
            return None  # the thread op would have to wait for the wgmma
    for j in ops:  # thread code reads a staged tile element by element (a Map), never as a whole tile
        reads, writes = op_reads_writes(body[j])
        if staged & set(writes) or (not isinstance(body[j], Map) and staged & set(reads)):
            return None  # and never writes one: the slot belongs to the producer's TMA
    if staged - {x for i in rest for x in op_reads_writes(body[i])[0]}:
        return None  # a tile loaded for nothing
    return MainloopSchedule(loads, gemms, ops)


def gemm_operand_loads(kernel: Kernel) -> tuple[int, ...]:
    """Positions in ``kernel.prologue`` of loads into shared tiles that only the loop's GEMMs read
    (attention's Q): the producer warpgroup can TMA-load such a tile beside the loop's first steps
    and, in a persistent block, the next tile's while the consumers finish this one, where the
    consumers would load it with thread copies and a barrier before their first GEMM.

    A tile qualifies when no op of the kernel but its load and the GEMMs reading it touches it, so
    the consumers may wait for it where the load stood."""
    shared = _shared(kernel)
    gemm_reads = {x for op in kernel.body if isinstance(op, Gemm) for x in (op.a, op.b)}
    out = []
    for i, op in enumerate(kernel.prologue):
        if not isinstance(op, Load) or op.dst not in shared or op.dst not in gemm_reads:
            continue
        others = [o for j, o in enumerate(kernel.prologue) if j != i] + list(kernel.epilogue) \
            + [o for o in kernel.body if not isinstance(o, Gemm)]
        if any(op.dst in set(r) | set(w) for r, w in map(op_reads_writes, others)):
            continue
        if any(g.c == op.dst for g in kernel.body if isinstance(g, Gemm)):
            continue
        out.append(i)
    return tuple(out)


def async_schedule(kernel: Kernel) -> AsyncSchedule | None:
    """The asynchronous schedule a pipelined kernel's loop can run under, if any."""
    return chain_schedule(kernel) or mainloop_schedule(kernel)


def issue_order(sched: AsyncSchedule, steps: int) -> list[tuple[int, int]]:
    """(step, body position) of every non-load op in the order the consumers issue them."""
    if isinstance(sched, MainloopSchedule):
        return [(k, i) for k in range(steps) for i in (*sched.gemms, *sched.ops)]
    out = [(0, sched.g1), *((0, i) for i in sched.early), *((0, i) for i in sched.late)]
    for k in range(1, steps):
        out += [(k, sched.g1), (k - 1, sched.g2), *((k, i) for i in sched.early), *((k, i) for i in sched.late)]
    out.append((steps - 1, sched.g2))
    return out


def longest_first_axes(kernel: Kernel, sizes: Mapping[str, int]) -> frozenset[str]:
    """Grid axes whose later blocks run more steps of a masked loop (causal attention's query blocks).

    The renderer launches such an axis in reverse, so the longest blocks start first and the short
    ones fill the tail of the last wave (the longest-processing-time-first order FlashAttention-3
    uses for causal attention); in launch order the axis would otherwise end on its longest blocks.
    Decided at the kernel's default tiles; the order is only an order, so any config stays correct.
    """
    lp = kernel.loop
    if lp is None or lp.visible is None:
        return frozenset()
    roles = kernel_axes(kernel, sizes)
    blocks = {a: resolve(r.block, kernel.defaults) for a, r in roles.items()}
    steps = -(-sizes[lp.axis] // blocks[lp.axis])
    pred = masks.predicate(lp.visible)
    first = {a: 0 for a in roles if a != lp.axis}

    def runs(coord: dict[str, int]) -> int:
        return len(masks.visible_steps(pred, lp.axis, blocks[lp.axis], steps, block_box(coord, blocks, sizes)))

    out = set()
    for a, r in roles.items():
        tiles = -(-sizes[a] // blocks[a])
        if r.kind == "grid" and tiles > 1 and runs({**first, a: tiles - 1}) > runs(first):
            out.add(a)
    return frozenset(out)


FORM_VERSIONS = {"flat": 1, "pipelined": 1, "chain": 1, "mainloop": 1}
"""Version of the code each loop form renders to. The tuning database stores the forms a time was
measured under and ignores it once they differ, so bump a form's version when its rendering
changes and only that form's times are retired."""


def kernel_form(kernel: Kernel) -> str:
    """The loop form the plan schedules a kernel for: ``flat`` (no loop), ``chain`` or ``mainloop``
    (asynchronous), else ``pipelined``. A label that stays the same while the plan-level decision
    does: the renderer may still write ``T.Pipelined`` (tile guard, merged B tiles, rows TMA
    cannot load)."""
    if kernel.loop is None:
        return "flat"
    sched = async_schedule(kernel)
    return "pipelined" if sched is None else "chain" if isinstance(sched, ChainSchedule) else "mainloop"


def plan_forms(kernels: list[Kernel], staged: frozenset[str] = frozenset()) -> str:
    """Each kernel's form and its version, e.g. ``k0_tmp2:pipelined.1,k1_Y:mainloop.1+late``.

    ``+late``: the kernel reads what the kernels ahead write only after its loop
    (``passes.sink_late_inputs``), so it waits for them there. That is other code, and it gives
    the kernel ahead another best config (``planner.coschedule``): times measured without it are
    not this plan's. ``+staged``: a kernel named in ``staged`` stages its synchronous loop loads in
    registers one step ahead (``target.layout.staged_loop_loads``, which knows the device's row
    alignment; ``target.tuning.measured_forms`` passes it)."""
    from pyrunner.plan.passes import sink_late_inputs

    out, written = [], set()
    for k in kernels:
        f = kernel_form(k)
        late = "+late" if written and sink_late_inputs(k, frozenset(written)) is not k else ""
        out.append(f"{k.name}:{f}.{FORM_VERSIONS[f]}{late}{'+staged' if k.name in staged else ''}")
        written |= set(k.writes)
    return ",".join(out)
