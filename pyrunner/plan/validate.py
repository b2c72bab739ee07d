"""Plan validation: the schema (pydantic), then the semantics of plan_semantics.

A plan that passes ``validate_plan`` can be rendered and executed without the
renderer or executor having to re-check anything: every name resolves, every
tile shape agrees with the ops that use it, and the kernels together compute
the graph's outputs from its inputs. Each failure is one ``PlanError`` line
naming the field path (``kernels[0].body[2].dst``) or the kernel and op.

Tuning parameters change tile shapes, so the value-dependent checks run for
the defaults in ``validate_plan`` and again for a user's ``--config`` in
``check_config``.

Why one module: every rule of a plan's meaning is checked here, once, with the field path of its
error; ``_check_kernel`` is still to be split per op (issue 7, owned by the plan-validation work).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path

import pydantic

from pyrunner.errors import GraphError, PlanError
from pyrunner.ir.graph import Graph, result_axes
from pyrunner.ir.graph_json import graph_from_json, read_json_file
from pyrunner.ir.names import MAX_GRAPH_NAME, MAX_PLAN_NAME, hash_problem, name_problem
from pyrunner.plan import masks
from pyrunner.plan.analysis import expr_refs, numbered_ops, op_reads_writes, resolve, walk
from pyrunner.plan.schema import (
    EXPR_FUNCTIONS,
    SCHEMA_VERSION,
    AxisSize,
    Block,
    Buffer,
    Call,
    Const,
    Fill,
    Gemm,
    GlobalTensor,
    Index,
    Kernel,
    Load,
    Map,
    Plan,
    Reduce,
    Ref,
    Store,
    plan_hash,
)

SUPPORTED_SCHEMA_VERSIONS = (SCHEMA_VERSION,)


# --- structure ------------------------------------------------------------------

def load_plan(path: str | Path) -> Plan:
    """Read, parse and fully validate a plan file."""
    return validate_plan(read_json_file(path, "plan", PlanError))


def validate_plan(data: object) -> Plan:
    """A parsed JSON document (or a Plan) -> a Plan that passed the schema and every semantic check.

    The plan's hash is recomputed: a plan whose stored hash differs (an edited plan posing as
    the original in the results log) is rejected; one without a hash is known by the recomputed one.
    """
    plan = parse_plan(data)
    check_plan(plan)
    return plan


def parse_plan(data: object) -> Plan:
    """Schema-level validation only (fields, types, schema_version); a Plan passes through."""
    if isinstance(data, Plan):
        return data
    if not isinstance(data, dict):
        raise PlanError(f"a plan must be a JSON object, got {_json_type(data)}")
    if "schema_version" in data:
        v = data["schema_version"]
        if isinstance(v, bool) or v not in SUPPORTED_SCHEMA_VERSIONS:
            supported = ", ".join(str(s) for s in SUPPORTED_SCHEMA_VERSIONS)
            raise PlanError(f"schema_version: {_short(v)} is not supported; this runner reads "
                            f"schema_version {supported}")
    try:
        return Plan.model_validate(data)
    except pydantic.ValidationError as e:
        raise PlanError(format_validation_error(e, data)) from None
    except RecursionError:
        raise PlanError("plan is nested too deeply") from None


def _json_type(x: object) -> str:
    names = {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string",
             list: "list", dict: "object"}
    return names.get(type(x), type(x).__name__)


def _short(x: object, limit: int = 60) -> str:
    s = repr(x)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _clean_loc(loc: tuple, data: object, kind: str) -> str:
    """pydantic's loc -> a field path, dropping union-member tags by walking the document."""
    path = ""
    node = data
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(part, int) and isinstance(node, list) and 0 <= part < len(node):
            path += f"[{part}]"
            node = node[part]
        elif isinstance(part, str) and isinstance(node, dict):
            tag = not last and part in (node.get("op"), node.get("kind"))
            if part in node and not tag or last and kind == "missing":
                path += f".{part}" if path else part
                node = node.get(part)
            # else: a union member's tag such as 'gemm' or 'constrained-int'
    return path or "(plan)"


def _message(err: dict, with_input: bool = True) -> str:
    kind = err.get("type", "")
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return "unknown field (not part of the schema)"
    msg = " ".join(str(err.get("msg", "invalid")).split())
    msg = msg.removeprefix("Value error, ")
    if with_input and kind not in ("union_tag_not_found", "union_tag_invalid", "value_error") and "input" in err:
        msg += f" (got {_short(err['input'])})"
    return msg


def format_validation_error(e: pydantic.ValidationError, data: object) -> str:
    """One line: the first problem's field path and message, plus how many more there are."""
    groups: dict[str, list[dict]] = {}
    for err in e.errors():
        groups.setdefault(_clean_loc(tuple(err.get("loc", ())), data, err.get("type", "")), []).append(err)
    path, errs = next(iter(groups.items()))
    if len(errs) == 1:
        text = _message(errs[0])
    else:  # one value matched none of a union's members
        alts = " or ".join(dict.fromkeys(_message(x, with_input=False) for x in errs))
        got = f" (got {_short(errs[0]['input'])})" if "input" in errs[0] else ""
        text = f"matches no allowed form: {alts}{got}"
    more = len(groups) - 1
    tail = f" [and {more} other error{'s' if more != 1 else ''}]" if more else ""
    return f"invalid plan: {path}: {text}{tail}"


# --- semantics ------------------------------------------------------------------

def plan_graph(plan: Plan) -> Graph:
    """The plan's source graph (PlanError if it does not parse)."""
    try:
        return graph_from_json(plan.graph)
    except GraphError as e:
        raise PlanError(f"graph: {e}") from None


def check_plan(plan: Plan) -> None:
    """Every rule of plan_semantics for the defaults of each kernel's parameters, then the hash."""
    check_plan_names(plan)
    graph = plan_graph(plan)
    tensors = _check_tensors(plan, graph)
    kernel_names: dict[str, int] = {}
    for ki, k in enumerate(plan.kernels):
        if k.name in kernel_names:
            raise PlanError(f"kernels[{ki}]: kernel name {k.name!r} is already used by kernels[{kernel_names[k.name]}]")
        kernel_names[k.name] = ki
        _check_kernel_static(ki, k)
        _check_kernel(plan, ki, k, dict(k.defaults), graph.sizes, tensors)
    _check_dataflow(plan, tensors)
    checked_hash(plan)


def plan_names(plan: Plan) -> Iterator[tuple[str, object, int]]:
    """Every identifier of a plan: (field path, value, length limit). Free text (derivation
    ``at``, provenance planner/version) is not here: it never reaches generated code or a path."""
    g, p = MAX_GRAPH_NAME, MAX_PLAN_NAME
    yield "workload", plan.workload, g
    for i, s in enumerate(plan.derivation):
        yield f"derivation[{i}].rule", s.rule, p
    for i, t in enumerate(plan.tensors):
        yield f"tensors[{i}].name", t.name, p
        for j, a in enumerate(t.axes):
            yield f"tensors[{i}].axes[{j}]", a, g
    for ki, k in enumerate(plan.kernels):
        kw = f"kernels[{ki}]"
        yield f"{kw}.name", k.name, p
        for j, ga in enumerate(k.grid):
            yield f"{kw}.grid[{j}].axis", ga.axis, g
        if k.loop is not None:
            yield f"{kw}.loop.axis", k.loop.axis, g
        for j, b in enumerate(k.buffers):
            yield f"{kw}.buffers[{j}].name", b.name, p
            for jj, a in enumerate(b.axes):
                yield f"{kw}.buffers[{j}].axes[{jj}]", a, g
        for field in ("params", "defaults"):
            for name in getattr(k, field):
                yield f"{kw}.{field}", name, p
        for j, r in enumerate(k.fused_rules):
            yield f"{kw}.fused_rules[{j}]", r, p
        for field in ("reads", "writes"):
            for j, name in enumerate(getattr(k, field)):
                yield f"{kw}.{field}[{j}]", name, p
        for section, oi, op in numbered_ops(k):
            ow = f"{kw}.{section}[{oi}]"
            for attr in ("src", "dst", "a", "b", "c", "contract", "axis"):
                v = getattr(op, attr, None)
                if v is not None:
                    yield f"{ow}.{attr}", v, p
            if isinstance(op, Map):
                for e in walk(op.expr):
                    if isinstance(e, Ref):
                        yield f"{ow}.expr", e.buf, p
                    elif isinstance(e, AxisSize):
                        yield f"{ow}.expr", e.axis, g
    for i, kc in enumerate(plan.cost.kernels):
        yield f"cost.kernels[{i}].kernel", kc.kernel, p


def check_plan_names(plan: Plan) -> None:
    """Every identifier of the plan passes pyrunner.ir.names (the renderer relies on it)."""
    for path, value, limit in plan_names(plan):
        problem = name_problem(value, limit)
        if problem is not None:
            raise PlanError(f"{path}: {problem}")
    stored = plan.provenance.plan_hash
    if stored and hash_problem(stored):
        raise PlanError(f"provenance.plan_hash: {hash_problem(stored)}")


def checked_hash(plan: Plan) -> str:
    """The plan's hash recomputed from its content; PlanError if the stored one differs."""
    actual = plan_hash(plan)
    stored = plan.provenance.plan_hash
    if stored and stored != actual:
        raise PlanError(f"provenance.plan_hash: the plan says {stored!r}, but its content hashes to {actual!r} "
                        f"(the plan was edited after hashing; re-plan it, or remove the stored hash)")
    return actual


def check_config(plan: Plan, config: Mapping[str, object]) -> dict[str, dict[str, int]]:
    """Apply a user tile config; returns each kernel's parameter values.

    A key ``PARAM`` sets that parameter in every kernel that has it, ``KERNEL.PARAM`` in one kernel
    (the more specific key wins). Each value must be in the parameter's space and the resulting tiles
    must satisfy the same rules as the defaults.
    """
    values = {k.name: dict(k.defaults) for k in plan.kernels}
    by_name = {k.name: k for k in plan.kernels}
    unscoped: dict[tuple[str, str], object] = {}
    scoped: dict[tuple[str, str], object] = {}
    for key, v in config.items():
        if not isinstance(key, str) or not key:
            raise PlanError(f"config: bad key {_short(key)}")
        kname, _, param = key.rpartition(".")
        if kname and kname in by_name:
            if param not in by_name[kname].params:
                raise PlanError(f"config {key}: kernel {kname!r} has no parameter {param!r}; it has "
                                f"{sorted(by_name[kname].params) or 'none'}")
            scoped[(kname, param)] = v
            continue
        owners = [k.name for k in plan.kernels if key in k.params]
        if not owners:
            known = sorted({p for k in plan.kernels for p in k.params})
            raise PlanError(f"config {key}: no kernel has a parameter {key!r}; parameters: "
                            f"{', '.join(known) or 'none'} (or KERNEL.PARAM)")
        unscoped.update({(o, key): v for o in owners})
    for (kname, param), v in {**unscoped, **scoped}.items():
        space = by_name[kname].params[param]
        if isinstance(v, bool) or not isinstance(v, int) or v not in space:
            raise PlanError(f"config {param}={_short(v)} for kernel {kname!r}: allowed values are {space}")
        values[kname][param] = v
    check_values(plan, values)
    return values


def check_values(plan: Plan, values: Mapping[str, Mapping[str, int]]) -> None:
    """The value-dependent rules (blocks divide, no racing stores, ...) for each kernel's parameter values.

    ``values`` maps every kernel to all its parameters, each already in its space
    (``plan.analysis.resolve_config`` builds that from a partial config).
    """
    graph = plan_graph(plan)
    tensors = {t.name: t for t in plan.tensors}
    for ki, k in enumerate(plan.kernels):
        if values[k.name] != k.defaults:
            _check_kernel(plan, ki, k, values[k.name], graph.sizes, tensors, config=True)


def _check_tensors(plan: Plan, graph: Graph) -> dict[str, GlobalTensor]:
    sizes = graph.sizes
    tensors: dict[str, GlobalTensor] = {}
    for i, t in enumerate(plan.tensors):
        where = f"tensors[{i}] {t.name!r}"
        if t.name in tensors:
            raise PlanError(f"{where}: a tensor named {t.name!r} is already listed")
        tensors[t.name] = t
        if len(set(t.axes)) != len(t.axes):
            raise PlanError(f"{where}: repeats an axis: {t.axes}")
        for a, n in zip(t.axes, t.shape, strict=True):
            if a not in sizes:
                raise PlanError(f"{where}: unknown axis {a!r}; graph axes are {sorted(sizes)}")
            if n != sizes[a]:
                raise PlanError(f"{where}: axis {a!r} has extent {n}, but the graph says {sizes[a]}")
        want = "float32" if t.role == "intermediate" else plan.dtype
        if t.dtype != want:
            raise PlanError(f"{where}: a tensor of role {t.role} must have dtype {want} "
                            f"(plan dtype {plan.dtype}), got {t.dtype}")
    ins = {x.name: x.axes for x in graph.inputs()}
    outs = {n: result_axes(x) for n, x in graph.outputs}
    for role, want in (("input", ins), ("output", outs)):
        have = {t.name: t for t in plan.tensors if t.role == role}
        for name, axes in want.items():
            if name not in have:
                raise PlanError(f"tensors: graph {role} {name!r} has no tensor of role {role}")
            if tuple(have[name].axes) != tuple(axes):
                raise PlanError(f"tensors: {role} {name!r} has axes {have[name].axes}, but the graph's "
                                f"{role} has axes {list(axes)}")
        for name in have:
            if name not in want:
                raise PlanError(f"tensors: {name!r} has role {role}, but the graph's {role}s are "
                                f"{sorted(want)}")
    return tensors


def _check_kernel_static(ki: int, k: Kernel) -> None:
    """Name-level rules that do not depend on parameter values."""
    kw = f"kernels[{ki}] {k.name!r}"
    blocks: list[tuple[str, Block]] = [(f"grid[{i}].block", g.block) for i, g in enumerate(k.grid)]
    if k.loop is not None:
        blocks += [("loop.block", k.loop.block), ("loop.stages", k.loop.stages)]
    blocks.append(("threads", k.threads))
    for field, b in blocks:
        if isinstance(b, str) and b not in k.params:
            raise PlanError(f"{kw}: {field} names parameter {b!r}, which is not in params "
                            f"({sorted(k.params) or 'none'})")


def _masks_tail(k: Kernel, axis: str) -> bool:
    """Whether a partial last tile of ``axis`` is safe: the loop body masks values past the end (a
    predicate comparing the index along it with its extent, as the planner emits before each
    accumulator), or only tiles loaded from memory (zeros past the end) feed sums and products."""
    if any(isinstance(op, Map) and any(isinstance(e, AxisSize) and e.axis == axis for e in walk(op.expr))
           and any(isinstance(e, Index) and e.axis == axis for e in walk(op.expr)) for op in k.body):
        return True
    # without masks, only zeros loaded past the end may reach the accumulators (sums and products)
    loaded = {op.dst for op in k.body if isinstance(op, Load)}
    return all(op.src in loaded and op.fn == "sum" for op in k.body if isinstance(op, Reduce) and op.axis == axis) \
        and all(op.a in loaded and op.b in loaded for op in k.body if isinstance(op, Gemm) and op.contract == axis)


def _check_kernel(plan: Plan, ki: int, k: Kernel, values: Mapping[str, int], sizes: Mapping[str, int],
                  tensors: Mapping[str, GlobalTensor], config: bool = False) -> None:
    kw = f"kernels[{ki}] {k.name!r}"
    setting = "with the given config" if config else "with the default parameters"

    # iteration space
    block: dict[str, int] = {}
    grid_axes: list[str] = []
    for i, g in enumerate(k.grid):
        if g.axis not in sizes:
            raise PlanError(f"{kw}: grid[{i}] names unknown axis {g.axis!r}; graph axes are {sorted(sizes)}")
        if g.axis in block:
            raise PlanError(f"{kw}: grid[{i}] repeats grid axis {g.axis!r}")
        b = resolve(g.block, values)
        block[g.axis] = b
        grid_axes.append(g.axis)
    loop_axis = ""
    if k.loop is not None:
        loop_axis = k.loop.axis
        if loop_axis not in sizes:
            raise PlanError(f"{kw}: loop names unknown axis {loop_axis!r}; graph axes are {sorted(sizes)}")
        if loop_axis in block:
            raise PlanError(f"{kw}: axis {loop_axis!r} is both a grid axis and the loop axis")
        b = resolve(k.loop.block, values)
        if sizes[loop_axis] % b and not _masks_tail(k, loop_axis):
            raise PlanError(f"{kw}: loop block {b} of axis {loop_axis!r} does not divide its size "
                            f"{sizes[loop_axis]} ({setting}), and the loop body masks nothing past the end: "
                            "the partial last tile would feed padding into the loop's accumulators")
        block[loop_axis] = b
    indexed = {a for a in grid_axes if block[a] == 1}
    held = {a for a in grid_axes if block[a] != 1} | ({loop_axis} if loop_axis else set())
    tiles = {a: -(-sizes[a] // block[a]) for a in grid_axes}
    if k.loop is not None and k.loop.visible is not None:
        if not masks.is_index_predicate(k.loop.visible):
            raise PlanError(f"{kw}: loop.visible must be an index predicate (comparisons of affine forms in "
                            "index values, combined by min/max/mul), so loop bounds can be derived from it")
        for e in walk(k.loop.visible):
            if isinstance(e, Index) and e.axis not in block:
                raise PlanError(f"{kw}: loop.visible uses the index of axis {e.axis!r}, which is not an axis "
                                f"the kernel iterates ({sorted(block)})")

    # buffers
    bufs: dict[str, Buffer] = {}
    for i, buf in enumerate(k.buffers):
        bw = f"{kw}: buffers[{i}] {buf.name!r}"
        if buf.name in bufs:
            raise PlanError(f"{bw}: a buffer named {buf.name!r} is already declared")
        if len(set(buf.axes)) != len(buf.axes):
            raise PlanError(f"{bw}: repeats an axis: {buf.axes}")
        for a in buf.axes:
            if a not in held:
                why = "an indexed grid axis (block 1)" if a in indexed else "not an axis of this kernel"
                raise PlanError(f"{bw}: axis {a!r} is {why}; a buffer axis must be a grid axis with "
                                f"block != 1 or the loop axis ({sorted(held) or 'none here'}) ({setting})")
        bufs[buf.name] = buf

    def tile_axes(t: GlobalTensor, where: str) -> list[str]:
        for a in t.axes:
            if a not in block:
                raise PlanError(f"{where}: tensor {t.name!r} has axis {a!r}, which is neither a grid axis nor "
                                f"the loop axis of this kernel")
        return [a for a in t.axes if a not in indexed]

    # ops
    loaded: list[str] = []
    stored: list[str] = []
    written: set[str] = set()
    written_in_body: set[str] = set()
    body_writes = {w for op in k.body for w in op_reads_writes(op)[1]}
    for section, oi, op in numbered_ops(k):
        ow = f"{kw} {section}[{oi}] ({getattr(op, 'op', '?')})"
        reads, writes = op_reads_writes(op)
        for name in reads + writes:
            if name not in bufs:
                known = ", ".join(bufs) or "none"
                raise PlanError(f"{ow}: unknown buffer {name!r}; this kernel's buffers: {known}")
        for name in reads:
            if name not in written:
                raise PlanError(f"{ow}: reads buffer {name!r} before anything writes it")
            if section == "body" and name in body_writes and name not in written_in_body \
                    and not bufs[name].state and k.loop is not None:
                raise PlanError(f"{ow}: buffer {name!r} carries its value across loop iterations "
                                f"(read here before the body writes it); declare it with state=true")
        if isinstance(op, (Load, Store)):
            gname = op.src if isinstance(op, Load) else op.dst
            bname = op.dst if isinstance(op, Load) else op.src
            if gname not in tensors:
                raise PlanError(f"{ow}: unknown global tensor {gname!r}; tensors: {', '.join(tensors)}")
            t = tensors[gname]
            want = tile_axes(t, ow)
            if bufs[bname].axes != want:
                side = "dst" if isinstance(op, Load) else "src"
                raise PlanError(f"{ow}: {side} buffer {bname!r} has axes {bufs[bname].axes}, but the tile of "
                                f"{gname!r} has axes {want} (its axes without indexed grid axes, same order) "
                                f"({setting})")
            if loop_axis and loop_axis in t.axes and section != "body":
                raise PlanError(f"{ow}: tensor {gname!r} has the loop axis {loop_axis!r}, so it can only be "
                                f"accessed in the loop body, not in the {section}")
            if isinstance(op, Load):
                loaded.append(gname)
            else:
                if t.role == "input":
                    raise PlanError(f"{ow}: stores into {gname!r}, which is a graph input")
                racing = [a for a in grid_axes if tiles[a] > 1 and a not in t.axes]
                if racing:
                    raise PlanError(f"{ow}: blocks race on {gname!r}: grid axis {racing[0]!r} has "
                                    f"{tiles[racing[0]]} tiles but is not an axis of the tensor ({setting})")
                if gname in stored:
                    raise PlanError(f"{ow}: stores {gname!r} a second time; a global tensor has one writer "
                                    f"(one store in one kernel)")
                stored.append(gname)
        elif isinstance(op, Gemm):
            _check_gemm(ow, op, bufs, plan.dtype)
        elif isinstance(op, Map):
            dst = bufs[op.dst]
            for r in expr_refs(op.expr):
                extra = [a for a in bufs[r].axes if a not in dst.axes]
                if extra:
                    raise PlanError(f"{ow}: operand {r!r} has axes {bufs[r].axes}, which are not a "
                                    f"subset of dst {op.dst!r}'s axes {dst.axes} (axis {extra[0]!r})")
            for e in walk(op.expr):
                if isinstance(e, Const) and math.isnan(e.number()):
                    raise PlanError(f"{ow}: a constant is NaN")
                if isinstance(e, AxisSize) and e.axis not in sizes:
                    raise PlanError(f"{ow}: size of unknown axis {e.axis!r}; graph axes are {sorted(sizes)}")
                if isinstance(e, Index) and e.axis not in dst.axes and e.axis not in indexed:
                    raise PlanError(f"{ow}: index along axis {e.axis!r}, which is neither an axis of dst "
                                    f"{op.dst!r} {dst.axes} nor an indexed grid axis of the kernel")
            for c in (e for e in walk(op.expr) if isinstance(e, Call)):
                if len(c.args) != EXPR_FUNCTIONS[c.fn]:  # the schema admits only known names
                    raise PlanError(f"{ow}: function {c.fn!r} takes {EXPR_FUNCTIONS[c.fn]} argument(s), "
                                    f"got {len(c.args)}")
        elif isinstance(op, Fill):
            if isinstance(op.value, float) and math.isnan(op.value):
                raise PlanError(f"{ow}: fill value is NaN; use a number, -inf or inf")
        elif isinstance(op, Reduce):
            src, dst = bufs[op.src], bufs[op.dst]
            if op.axis not in src.axes:
                raise PlanError(f"{ow}: reduces over axis {op.axis!r}, but src {op.src!r} has axes {src.axes}")
            want = [a for a in src.axes if a != op.axis]
            if dst.axes != want:
                raise PlanError(f"{ow}: dst {op.dst!r} has axes {dst.axes}; reducing {op.src!r} over "
                                f"{op.axis!r} gives axes {want}")
        written.update(writes)
        if section == "body":
            written_in_body.update(writes)

    if k.loop is not None:
        init = {w for op in k.prologue for w in op_reads_writes(op)[1]}
        for buf in k.buffers:
            if buf.state and buf.name not in init:
                raise PlanError(f"{kw}: state buffer {buf.name!r} is not initialised in the prologue "
                                f"(add a fill)")
    for field, listed, done in (("reads", k.reads, loaded), ("writes", k.writes, stored)):
        verb = "loads" if field == "reads" else "stores"
        for name in listed:
            if name not in tensors:
                raise PlanError(f"{kw}: {field} lists unknown tensor {name!r}")
            if name not in done:
                raise PlanError(f"{kw}: {field} lists {name!r}, but the kernel never {verb} it")
        for name in done:
            if name not in listed:
                raise PlanError(f"{kw}: {verb} {name!r}, but {field} does not list it")


def _check_gemm(ow: str, op: Gemm, bufs: Mapping[str, Buffer], dtype: str) -> None:
    a, b, c = bufs[op.a], bufs[op.b], bufs[op.c]
    free: list[str] = []
    for role, buf in (("a", a), ("b", b)):
        if len(buf.axes) != 2 or op.contract not in buf.axes:
            raise PlanError(f"{ow}: operand {role} {buf.name!r} must be 2-D holding the contracted axis "
                            f"{op.contract!r} and one free axis; it has axes {buf.axes}")
        free.append(next(x for x in buf.axes if x != op.contract))
        if buf.dtype != dtype:
            raise PlanError(f"{ow}: operand {role} {buf.name!r} has dtype {buf.dtype}; gemm operands have the "
                            f"compute dtype {dtype}")
    if b.scope != "shared":
        raise PlanError(f"{ow}: operand b {b.name!r} must be in shared memory, it is {b.scope}")
    if c.axes != free:
        raise PlanError(f"{ow}: accumulator c {c.name!r} has axes {c.axes}; it must be [free axis of a, free "
                        f"axis of b] = {free}")
    if c.dtype != "float32" or c.scope != "fragment":
        raise PlanError(f"{ow}: accumulator c {c.name!r} must be a float32 fragment, it is a {c.dtype} {c.scope}")


def _check_dataflow(plan: Plan, tensors: Mapping[str, GlobalTensor]) -> None:
    """Kernels run in order: a tensor is read only once it exists; every output gets written."""
    written: dict[str, int] = {}
    for ki, k in enumerate(plan.kernels):
        for name in k.reads:
            t = tensors[name]
            if t.role != "input" and name not in written:
                raise PlanError(f"kernels[{ki}] {k.name!r}: reads {name!r} (role {t.role}) before any earlier "
                                f"kernel writes it")
        for name in k.writes:
            if name in written:  # single writer: a second kernel (or a repeated store) would race or overwrite
                other = written[name]
                who = "this kernel already" if other == ki else f"kernels[{other}] {plan.kernels[other].name!r}"
                raise PlanError(f"kernels[{ki}] {k.name!r}: writes {name!r}, which {who} writes; every global "
                                f"tensor has exactly one writer")
            written[name] = ki
    for t in plan.tensors:
        if t.role == "output" and t.name not in written:
            raise PlanError(f"tensors: output {t.name!r} is never written by any kernel")
