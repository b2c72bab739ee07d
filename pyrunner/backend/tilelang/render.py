"""Render a kernel plan as one readable TileLang Python module.

The renderer is generic: it maps the plan's tile ops one-to-one onto TileLang
primitives and knows nothing about the workload. The module it returns looks
like TileLang's own examples: a ``build_<kernel>(<tile params>=<default>)``
per kernel returning a ``@T.prim_func``, ``CONFIG_SPACE``/``DEFAULT_CONFIG``,
and ``launch(tensors, config)`` that runs the kernels in order on
preallocated global tensors. Shapes are baked in as module constants.

Tile parameters stay symbolic in the source (keyword arguments), so the
structure of the code must not depend on their values: a grid axis whose
block is a parameter always gets a launch dimension, even if some config
gives it a single tile.

The renderer trusts a plan that passed ``pyrunner.plan.validate`` (and a config
that passed ``check_config``/``check_values``): it re-checks nothing validation
guarantees. Plan meaning (roles of axes, buffers an op touches) comes from
``pyrunner.plan.analysis``; op emission from the op table ``pyrunner.ir.ops``.

One thing is added that the plan does not say: where a Map combines
fragments whose register layouts TileLang cannot reconcile, the renderer
routes the odd one through a small shared buffer (``layout_bridges``).

Why one module: the source writer, identifier naming and the per-op emitters share one
rendering context (names, block coordinates, helpers) and read as one map from plan ops to TileLang;
plan meaning and TileLang layout rules live in ``plan.analysis`` and ``target.layout``.
"""

from __future__ import annotations

import keyword

from pyrunner.backend.tilelang import render_ws, ws_forms
from pyrunner.backend.tilelang.compile_target import CompileTarget
from pyrunner.backend.tilelang.emit import (
    GemmMerge,
    _bind_loop_bounds,
    _Ctx,
    _declare_buffers,
    _extent,
    _launch_chain_top,
    _merge_legal,
    _Names,
    _paren,
    _region,
    _render_op,
    _signature_and_launch,
    _stages,
    _tiles,
    _tuple,
    _Writer,
    gemm_merges,
    gemm_policy_names,
    kernel_pass_configs,
    loop_invariant_bridges,
)
from pyrunner.backend.tilelang.targets import default_target
from pyrunner.errors import PlanError
from pyrunner.ir.ops import ELEMENTWISE
from pyrunner.plan.analysis import kernel_args, kernel_axes, op_reads_writes
from pyrunner.plan.dependent_launch import DependentLaunch, dependent_launches
from pyrunner.plan.passes import optimize
from pyrunner.plan.schedule import ChainSchedule
from pyrunner.plan.schema import (
    Gemm,
    Kernel,
    Load,
    Plan,
    Store,
    axis_sizes,
    plan_hash,
)
from pyrunner.plan.validate import check_plan_names, checked_hash
from pyrunner.target.device import rows_async
from pyrunner.target.fit import STAGED_ELEMENTS_PER_THREAD
from pyrunner.target.layout import launch_axes, layout_bridges, staged_loop_loads, synchronous_loop_loads

NO_DEPENDENT_LAUNCH = DependentLaunch(trigger=False, waits=False, earlier=frozenset())
"""A kernel's part in the launch chain on a target without programmatic dependent launch: none."""
PASS_CONFIGS = {"tl.enable_fast_math": True}
"""TileLang pass configs of every kernel: fast math (``--use_fast_math``: ex2.approx, rcp.approx)."""
MMA_POLICY_HELPER = (
    "mma_policy", "rows, cols, threads",
    "FullRow where each warpgroup can take 64-row slabs of the whole width: one m64nN wgmma, N = cols.",
    "return T.GemmWarpPolicy.FullRow if rows % (16 * (threads // 32)) == 0 and cols <= 256 "
    "else T.GemmWarpPolicy.Square",
)

_RESERVED_MODULE = {
    "T", "tilelang", "SM_COUNT", "PASS_CONFIGS", "KERNEL_PASS_CONFIGS", "mma_policy", "PLAN_HASH", "WORKLOAD",
    "DTYPE", "ACCUM_DTYPE",
    "TARGET", "TENSORS", "CONFIG_SPACE",
    "DEFAULT_CONFIG", "KERNELS", "merge_config", "build_kernels", "compile_kernels", "launch", "_COMPILED",
    "tensors", "config", "kernels", "target", "name", "build", "args", "cfg", "key",
    *(op.name for op in ELEMENTWISE.values() if op.helper),
}



def _render_kernel(w: _Writer, plan: Plan, kernel: Kernel, module_names: set[str], size_const: dict[str, str],
                   tensor_ident: dict[str, str], helpers: set[str], build_name: str, func_name: str,
                   target: CompileTarget) -> None:
    roles = kernel_axes(kernel, axis_sizes(plan))
    buffers = {b.name: b for b in kernel.buffers}
    tensors = {t.name: t for t in plan.tensors}
    local = _Names(module_names)
    names = {t: tensor_ident[t] for t in tensor_ident}
    for b in kernel.buffers:
        names[b.name] = local.fresh(b.name)
    block_expr = {a: (r.block if isinstance(r.block, str) else str(r.block)) for a, r in roles.items()}
    loop_var = local.fresh(f"{kernel.loop.axis}_step") if kernel.loop else ""
    bridges = layout_bridges(kernel)
    bridged = sorted({b for bs in bridges.values() for b in bs}, key=[x.name for x in kernel.buffers].index)
    bridge_names = {b: local.fresh(f"{b}_bridge") for b in bridged}
    ctx = _Ctx(plan, kernel, roles, buffers, tensors, names, size_const, block_expr, {}, loop_var, local, helpers, {},
               bridges, bridge_names, {}, {}, sizes=axis_sizes(plan),
               launch=dependent_launches(plan)[kernel.name] if target.dependent_launch else NO_DEPENDENT_LAUNCH,
               tma_pipelines=target.tma_pipelines)

    defaults = ", ".join(f"{p}={kernel.defaults[p]}" for p in kernel.params)
    w.line(f"def {build_name}({defaults}):")
    w.indent()
    w.line(f'"""Kernel {kernel.name!r}: {_describe(kernel)}."""')
    threads = kernel.threads if isinstance(kernel.threads, str) else str(kernel.threads)
    for acc, policy in gemm_policy_names(kernel, buffers).items():
        if policy == "mma":
            ctx.policy_vars[acc] = local.fresh(f"policy_{acc}")
            rows, cols = (block_expr[a] for a in buffers[acc].axes)
            helpers.add("mma_policy")
            w.line(f"{ctx.policy_vars[acc]} = mma_policy({rows}, {cols}, {threads})")
    swizzle = None
    if kernel.loop is not None and any(isinstance(op, Gemm) for op in kernel.body) \
            and len(launch_axes(kernel, roles)) == 2:
        swizzle = local.fresh("swizzle")
        blocks = " * ".join(f"({size_const[a]} // {block_expr[a]})" for d in launch_axes(kernel, roles) for a in d)
        w.line(f"{swizzle} = {blocks} > SM_COUNT  # block reordering only matters past one wave")
    merges = gemm_merges(kernel)
    variants: list[list[GemmMerge]] = [[]]
    if merges:
        for m in merges:
            acc = buffers[m.first.c]
            rows, cols = (block_expr[a] for a in acc.axes)
            ctx.policy_vars[m.first.c + " wide"] = local.fresh(f"policy_{m.first.c}_{m.second.c}")
            helpers.add("mma_policy")
            w.line(f"{ctx.policy_vars[m.first.c + ' wide']} = mma_policy({rows}, 2 * {_paren(cols)}, {threads})")
        wide = " and ".join(_merge_legal(block_expr[buffers[m.first.c].axes[1]], buffers[m.first.b].dtype,
                                         _row_merged_inner(buffers[m.first.b].axes, buffers[m.first.c].axes,
                                                           block_expr)) for m in merges)
        variants = [merges, []]
    ctx.staging = {pair: local.fresh(f"{pair[1]}_out") for pair in store_staging(plan, kernel)}
    ctx.staging.update({pair: names[shared] for pair, shared in unaligned_store_staging(plan, kernel).items()})
    sched = ws_forms.async_schedule(ctx) if target.async_forms else None
    if sched is not None:
        ctx.halves, ctx.merged_first, ctx.merged_second = {}, {}, {}
        w.line()
        form = "two-GEMM chain" if isinstance(sched, ChainSchedule) else "GEMM mainloop"
        tiles = ws_forms.persistent_tiles(ctx, sched, target.sm_count)
        w.line(f"if {ws_forms.guard(ctx, sched, threads, target.device.smem_per_block)}:  # asynchronous {form} "
               "(render_ws)")
        w.indent()
        if tiles is not None:
            n_tiles = local.fresh("tiles")
            w.line(f"{n_tiles} = {tiles}")
            w.line(f"if {n_tiles} > SM_COUNT:  # past one wave: persistent, SM_COUNT blocks loop over the tiles")
            w.indent()
            saved, taken_before = dict(ctx.coord), set(local.taken)
            render_ws.render_async_prim_func(w, ctx, func_name, threads, swizzle, sched, tiles=n_tiles)
            ctx.coord.clear()
            ctx.coord.update(saved)
            local.taken = taken_before | set(ctx.par_vars.values())  # the one-wave form keeps its names
            w.line()
            w.line(f"return {func_name}")
            w.dedent()
            w.line()
        render_ws.render_async_prim_func(w, ctx, func_name, threads, swizzle, sched)
        w.line()
        w.line(f"return {func_name}")
        w.dedent()
    taken = set(local.taken)
    staged = staged_loop_loads(kernel, tensors)
    if staged:  # merged GEMMs never stage: one variant
        ctx.halves, ctx.merged_first, ctx.merged_second = {}, {}, {}
        ctx.staged = {op.dst: local.fresh(f"{op.dst}_next") for op in staged}
        held = " + ".join(" * ".join(_extent(ctx, buffers[op.dst])) for op in staged)
        w.line()
        w.line(f"if {held} <= {STAGED_ELEMENTS_PER_THREAD} * {threads}:  # loop loads staged in registers, "
               "one step ahead (their tiles fit beside the accumulators)")
        w.indent()
        _render_prim_func(w, ctx, func_name, threads, swizzle)
        w.line()
        w.line(f"return {func_name}")
        w.dedent()
        ctx.staged = {}
    for v, chosen in enumerate(variants):
        local.taken = taken | set(ctx.par_vars.values())
        ctx.halves = {}
        ctx.merged_first = {id(m.first): m for m in chosen}
        ctx.merged_second = {id(m.second): m for m in chosen}
        for m in chosen:
            ctx.halves.update({m.first.b: (m.first.b, 0), m.second.b: (m.first.b, 1), m.first.c: (m.first.c, 0)})
        w.line()
        if len(variants) > 1 and v == 0:
            names_m = ", ".join(f"{m.first.c!r} + {m.second.c!r}" for m in chosen)
            w.line(f"if {wide}:  # merged GEMMs ({names_m}) one wgmma each (N <= 256), halves of whole swizzle atoms")
            w.indent()
        _render_prim_func(w, ctx, func_name, threads, swizzle)
        w.line()
        w.line(f"return {func_name}")
        if len(variants) > 1 and v == 0:
            w.dedent()
    w.dedent()


def _row_merged_inner(b_axes: list[str], c_axes: list[str], block_expr: dict[str, str]) -> str | None:
    """The contracted tile extent of a B tile stored output-axis-major (merged by rows), else None."""
    return block_expr[b_axes[1]] if b_axes[1] != c_axes[1] else None


def _render_prim_func(w: _Writer, ctx: _Ctx, func_name: str, threads: str, swizzle: str | None) -> None:
    """The ``@T.prim_func`` of one kernel (with the GEMM merges recorded in ``ctx``)."""
    kernel, names, buffers, block_expr, loop_var = ctx.kernel, ctx.names, ctx.buffers, ctx.block_expr, ctx.loop_var
    _signature_and_launch(w, ctx, func_name, threads)
    _declare_buffers(w, ctx)
    for dst, regs in (ctx.staged or {}).items():
        buf = buffers[dst]
        w.line(f'{regs} = T.alloc_fragment({_tuple(_extent(ctx, buf))}, "{buf.dtype}")'
               f"  # the next step's tile of {dst!r}, loaded into registers under this step's GEMMs")
    if swizzle is not None:
        w.line(f"T.use_swizzle(panel_size=10, enable={swizzle})  # block order that keeps GEMM operand panels in L2")
    # TileLang's own warp specialisation decides which threads run what: wait at the top, in every thread
    _launch_chain_top(w, ctx, sync=True)
    sections = [("prologue", kernel.prologue), ("body", kernel.body), ("epilogue", kernel.epilogue)]
    if kernel.loop is None:
        for section, ops in sections:
            if ops:
                w.line(f"# {section}")
            for i, op in enumerate(ops):
                _render_op(w, ctx, op, section, i)
    else:
        lp = kernel.loop
        stages = _stages(kernel)
        if kernel.prologue:
            w.line("# prologue")
        for i, op in enumerate(kernel.prologue):
            _render_op(w, ctx, op, "prologue", i)
        ctx.hoisted = loop_invariant_bridges(kernel, ctx.bridges)
        for r in ctx.hoisted:
            w.line(f"T.copy({names[r]}, {ctx.bridge_names[r]})  # layout bridge of loop-invariant {r!r}, "
                   "issued before the loop")
        w.line(f"# streamed loop over {lp.axis!r}, {block_expr[lp.axis]} at a time")
        bounds = _tiles(ctx, lp.axis)
        if lp.visible is not None:
            lo_name, hi_name = ctx.local.fresh(f"{lp.axis}_lo"), ctx.local.fresh(f"{lp.axis}_hi")
            _bind_loop_bounds(w, ctx, lo_name, hi_name)
            bounds = f"{lo_name}, {hi_name}"
        lo, hi = (lo_name, hi_name) if lp.visible is not None else ("0", bounds)
        if ctx.staged:
            w.line("# the first step's loads, into the registers the loop stores from")
            _staged_loads(w, ctx, lo)
            w.line(f"for {loop_var} in T.serial({bounds}):  # synchronous loads, staged in registers one step ahead")
        elif synchronous_loop_loads(kernel, ctx.tensors):
            # rows TMA and cp.async cannot fetch: every step waits for its own loads, so a pipeline
            # only adds stages of shared memory (and TileLang 0.1.15 may still emit a 2-byte cp.async)
            w.line(f"for {loop_var} in T.serial({bounds}):  # synchronous loads: rows not 16-byte aligned")
        elif lp.visible is None:
            w.line(f"for {loop_var} in T.Pipelined({bounds}, num_stages={stages}):")
        elif kernel_pass_configs(kernel, ctx.tensors) or not ctx.tma_pipelines:
            # without warp specialisation TileLang pipelines with cp.async: its drain of a loop of
            # run-time length waits on a group count that is not a constant (no CUDA for it), and
            # even one stage peels the last step and runs the rest to the bound's maximum (a query
            # block with one visible step ran two: wild graph 120, run 91), so the loop is serial
            w.line(f"for {loop_var} in T.serial({bounds}):  # run-time bounds: no cp.async pipeline")
        else:
            w.line(f"for {loop_var} in T.Pipelined({bounds}, num_stages={stages}):")
        w.indent()
        if ctx.staged:
            for dst, regs in ctx.staged.items():
                w.line(f"T.copy({regs}, {names[dst]})  # this step's tile, loaded during the last step")
            w.line(f"if {loop_var} + 1 < {hi}:  # the next step's loads, in flight under this step's GEMMs")
            w.indent()
            _staged_loads(w, ctx, f"{loop_var} + 1")
            w.dedent()
        for i, op in enumerate(kernel.body):
            if ctx.staged and isinstance(op, Load) and op.dst in ctx.staged:
                continue
            _render_op(w, ctx, op, "body", i)
        if not kernel.body:
            w.line("pass")
        w.dedent()
        if kernel.epilogue or ctx.merged_first:
            w.line("# epilogue")
        for m in ctx.merged_first.values():  # the upper half of a merged accumulator into its own fragment
            c1, c2 = buffers[m.first.c], buffers[m.second.c]
            idx = [ctx.par_var(a) for a in c2.axes]
            bn = block_expr[c1.axes[1]]
            w.line(f"for {', '.join(idx)} in T.Parallel({', '.join(_extent(ctx, c2))}):")
            w.line(f"    {names[c2.name]}[{idx[0]}, {idx[1]}] = {names[c1.name]}[{idx[0]}, {idx[1]} + {bn}]")
        for i, op in enumerate(kernel.epilogue):
            _render_op(w, ctx, op, "epilogue", i)
    w.dedent()
    w.dedent()


def _staged_loads(w: _Writer, ctx: _Ctx, step: str) -> None:
    """The staged loop loads (``target.layout.staged_loop_loads``) of loop step ``step``, into registers."""
    loop_var = ctx.loop_var
    ctx.loop_var = _paren(step)
    try:
        for op in ctx.kernel.body:
            if isinstance(op, Load) and op.dst in ctx.staged:
                w.line(f"T.copy({_region(ctx, ctx.tensors[op.src])}, {ctx.staged[op.dst]})")
    finally:
        ctx.loop_var = loop_var


def store_staging(plan: Plan, kernel: Kernel) -> list[tuple[str, str]]:
    """(fragment, global tensor) of the epilogue stores that go through a shared tile and a TMA store.

    A 2-D fragment stored to a 16-bit global tensor after a streamed loop: TileLang writes it to
    shared memory with stmatrix and issues one bulk tensor store, instead of 4-byte stores from
    every thread; the shared tile reuses the loop's dead pipeline buffers.
    """
    if kernel.loop is None:
        return []
    bufs = {b.name: b for b in kernel.buffers}
    dtypes = {t.name: t.dtype for t in plan.tensors}
    out = []
    for op in kernel.epilogue:
        if isinstance(op, Store) and op.src in bufs and bufs[op.src].scope == "fragment" \
                and len(bufs[op.src].axes) == 2 and dtypes.get(op.dst) in ("float16", "bfloat16") \
                and (op.src, op.dst) not in out:
            out.append((op.src, op.dst))
    return out


def unaligned_store_staging(plan: Plan, kernel: Kernel) -> dict[tuple[str, str], str]:
    """(fragment, global tensor) -> dead shared tile, for the stores of a kernel without a loop to a
    tensor whose rows are not 16-byte aligned.

    Such a store cannot be vectorised, and a fragment laid out for 16-byte shared reads gives each
    thread 8 adjacent elements: its 2-byte stores stride 16 bytes apart across the warp (run 50:
    a 512 x 50257 softmax's normalise kernel, 103 MB, 121 us). Copied into shared memory first,
    the tile leaves it row by row with consecutive threads on consecutive elements. The shared
    tile is one the kernel already holds, with the same axes and dtype, that nothing reads from the
    store on (the loaded input the result was computed from), so no shared memory is added.
    """
    if kernel.loop is not None:
        return {}
    bufs = {b.name: b for b in kernel.buffers}
    tensors = {t.name: t for t in plan.tensors}
    out: dict[tuple[str, str], str] = {}
    for i, op in enumerate(kernel.epilogue):
        if not isinstance(op, Store) or op.src not in bufs or bufs[op.src].scope != "fragment":
            continue
        dst = tensors[op.dst]
        if not dst.shape or rows_async(dst.shape[-1], dst.dtype):
            continue
        later = kernel.epilogue[i:]
        for b in kernel.buffers:
            if b.scope == "shared" and b.axes == bufs[op.src].axes and b.dtype == dst.dtype \
                    and b.name not in out.values() and not any(b.name in op_reads_writes(x)[0] for x in later):
                out[(op.src, op.dst)] = b.name
                break
    return out


def _describe(kernel: Kernel) -> str:
    grid = ", ".join(f"{g.axis}/{g.block}" for g in kernel.grid) or "none"
    text = f"grid [{grid}]"
    if kernel.loop:
        text += f", loop {kernel.loop.axis}/{kernel.loop.block} (stages {kernel.loop.stages})"
    if kernel.fused_rules:
        text += f"; fused by {', '.join(kernel.fused_rules)}"
    return text


# --- the module --------------------------------------------------------------

def render(plan: Plan, target: CompileTarget | None = None) -> str:
    """Source of one Python module running every kernel of ``plan`` with TileLang on ``target`` (default:
    ``targets.default_target()``): its forms are those the target's instruction set has."""
    target = target or default_target()
    names_k = [k.name for k in plan.kernels]
    if len(set(names_k)) != len(names_k):  # validation does not compare kernel names
        raise PlanError(f"plan repeats a kernel name: {names_k}")
    # Every user string below reaches the source only as a name that passed pyrunner.ir.names
    # (identifiers, docstrings, comments) or as the recomputed hex hash.
    check_plan_names(plan)
    phash = plan_hash(plan)  # recomputed; the stored one is compared once the plan has rendered
    given = plan
    plan = optimize(plan)
    sizes = axis_sizes(plan)

    params = sorted({p for k in plan.kernels for p in k.params})
    for k in plan.kernels:
        for p in k.params:
            if not p.isidentifier() or keyword.iskeyword(p) or p in _RESERVED_MODULE:  # TileLang-specific
                raise PlanError(f"kernel {k.name!r}: parameter name {p!r} cannot be a Python keyword argument of "
                                f"the build function (not an identifier, or one of {sorted(_RESERVED_MODULE)})")
    module = _Names(_RESERVED_MODULE | set(params))
    size_const = {a: module.fresh(f"SIZE_{a}".upper()) for a in sorted(sizes)}
    build_names = {k.name: module.fresh(f"build_{k.name}") for k in plan.kernels}
    # global tensors become prim_func arguments; they must not shadow module names
    tensor_ident = {t.name: module.fresh(t.name) for t in plan.tensors}
    func_names = {k.name: module.fresh(k.name) for k in plan.kernels}
    module_names = set(module.taken)

    body = _Writer()
    helpers: set[str] = set()
    for k in plan.kernels:
        body.line()
        body.line()
        body.line(f"# --- kernel {k.name!r} (plan {phash}) " + "-" * max(0, 60 - len(k.name)))
        _render_kernel(body, plan, k, module_names, size_const, tensor_ident, helpers,
                       build_names[k.name], func_names[k.name], target)

    w = _Writer()
    w.line(f'"""TileLang kernels for plan {phash} (workload {plan.workload!r}, {plan.dtype}).')
    w.line()
    w.line("Rendered by pyrunner.backend.tilelang.render from the plan's kernel IR; do not edit by hand.")
    w.line("Kernels, in launch order:")
    for k in plan.kernels:
        w.line(f"  {k.name}: {_describe(k)}")
    w.line()
    w.line("Reference check: this module only computes. pyrunner's runner allocates every global tensor,")
    w.line("poisons the outputs, calls launch(), and compares the outputs with the float64 reference")
    w.line("(pyrunner.ir.reference.evaluate) on fresh random inputs.")
    w.line('"""')
    w.line()
    w.line("import tilelang")
    w.line("import tilelang.language as T")
    w.line()
    w.line(f"PLAN_HASH = {phash!r}")
    w.line(f"WORKLOAD = {plan.workload!r}")
    w.line(f"DTYPE = {plan.dtype!r}")
    w.line(f"ACCUM_DTYPE = {plan.accum_dtype!r}")
    w.line(f"TARGET = {target.target!r}")
    w.line(f"SM_COUNT = {target.sm_count!r}")
    w.line(f"PASS_CONFIGS = {PASS_CONFIGS!r}")
    tensors = {t.name: t for t in plan.tensors}
    per_kernel = {k.name: cfg for k in plan.kernels if (cfg := kernel_pass_configs(k, tensors))}
    w.line(f"KERNEL_PASS_CONFIGS = {per_kernel!r}  # loops TileLang cannot warp-specialise safely "
           "(thread reads of a pipelined tile, or rows TMA cannot load)")
    w.line()
    w.line("# axis extents")
    for a in sorted(sizes):
        w.line(f"{size_const[a]} = {sizes[a]}")
    w.line()
    w.line("# global tensors: name -> (shape, dtype, role); the caller allocates all of them")
    w.line("TENSORS = {")
    for t in plan.tensors:
        w.line(f"    {t.name!r}: ({_tuple(size_const[a] for a in t.axes)}, {t.dtype!r}, {t.role!r}),")
    w.line("}")
    w.line()
    w.line("# tuning space: kernel -> parameter -> allowed values")
    w.line("CONFIG_SPACE = {")
    for k in plan.kernels:
        w.line(f"    {k.name!r}: {{{', '.join(f'{p!r}: {v!r}' for p, v in k.params.items())}}},")
    w.line("}")
    w.line("DEFAULT_CONFIG = {")
    for k in plan.kernels:
        w.line(f"    {k.name!r}: {{{', '.join(f'{p!r}: {k.defaults[p]!r}' for p in k.params)}}},")
    w.line("}")
    for h in sorted(helpers):
        if h == MMA_POLICY_HELPER[0]:
            name, args, doc, body_line = MMA_POLICY_HELPER
        else:
            op = ELEMENTWISE[h]
            name, args, doc, body_line = h, "x", op.doc, op.tilelang
        w.line()
        w.line()
        w.line(f"def {name}({args}):")
        w.indent()
        w.line(f'"""{doc}"""')
        w.line(body_line)
        w.dedent()
    w.lines.extend(body.lines)
    _render_runtime(w, plan, build_names)
    checked_hash(given)
    return w.text()


def _render_runtime(w: _Writer, plan: Plan, build_names: dict[str, str]) -> None:
    w.line()
    w.line()
    w.line("# launch order: (kernel, build function, global tensors it takes)")
    w.line("KERNELS = [")
    for k in plan.kernels:
        w.line(f"    ({k.name!r}, {build_names[k.name]}, {tuple(kernel_args(plan, k))!r}),")
    w.line("]")
    w.line()
    w.line()
    w.line("def merge_config(config=None):")
    w.indent()
    w.line('"""DEFAULT_CONFIG overlaid by a partial config (kernel -> parameter -> value)."""')
    w.line("cfg = {name: dict(values) for name, values in DEFAULT_CONFIG.items()}")
    w.line("for name, values in (config or {}).items():")
    w.indent()
    w.line("unknown = set(values) - set(cfg[name])")
    w.line("if unknown:")
    w.indent()
    w.line('raise KeyError(f"kernel {name!r} has no parameter(s) {sorted(unknown)}")')
    w.dedent()
    w.line("cfg[name].update(values)")
    w.dedent()
    w.line("return cfg")
    w.dedent()
    w.line()
    w.line()
    w.line("def build_kernels(config=None):")
    w.indent()
    w.line('"""The prim_func of every kernel under config."""')
    w.line("cfg = merge_config(config)")
    w.line("return {name: build(**cfg[name]) for name, build, _ in KERNELS}")
    w.dedent()
    w.line()
    w.line()
    w.line("def compile_kernels(config=None, target=TARGET):")
    w.indent()
    w.line('"""JIT-compile every kernel for the GPU (needs CUDA)."""')
    w.line("return {name: tilelang.compile(func, target=target,")
    w.line("                               pass_configs={**PASS_CONFIGS, **KERNEL_PASS_CONFIGS.get(name, {})})")
    w.line("        for name, func in build_kernels(config).items()}")
    w.dedent()
    w.line()
    w.line()
    w.line("_COMPILED = {}")
    w.line()
    w.line()
    w.line("def launch(tensors, config=None, *, kernels=None):")
    w.indent()
    w.line('"""Run the kernels in order on preallocated tensors (name -> torch.Tensor on the GPU)."""')
    w.line("if kernels is None:")
    w.indent()
    w.line("key = repr(sorted((name, sorted(values.items())) for name, values in merge_config(config).items()))")
    w.line("if key not in _COMPILED:")
    w.indent()
    w.line("_COMPILED[key] = compile_kernels(config)")
    w.dedent()
    w.line("kernels = _COMPILED[key]")
    w.dedent()
    w.line("for name, _, args in KERNELS:")
    w.indent()
    w.line("kernels[name](*(tensors[a] for a in args))")
    w.dedent()
    w.dedent()
