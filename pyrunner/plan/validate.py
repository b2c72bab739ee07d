"""Plan validation: the schema (pydantic), then the semantics of plan_semantics.

A plan that passes ``validate_plan`` can be rendered and executed without the
renderer or executor having to re-check anything: every name resolves, every
tile shape agrees with the ops that use it, and the kernels together compute
the graph's outputs from its inputs. Each failure is one ``PlanError`` line
naming the field path (``kernels[0].body[2].dst``) or the kernel and op.

Tuning parameters change tile shapes, so the value-dependent checks run for
the defaults in ``validate_plan`` and again for a user's ``--config`` in
``check_config``. The rules of one kernel (its iteration space, buffers and
ops) live in ``plan.kernel_checks``; this module checks the plan as a whole.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pydantic

from pyrunner.errors import PlanError
from pyrunner.ir.graph import Graph, result_axes
from pyrunner.ir.graph_json import read_json_file
from pyrunner.ir.names import MAX_GRAPH_NAME, MAX_PLAN_NAME, hash_problem, name_problem
from pyrunner.plan.analysis import numbered_ops, walk
from pyrunner.plan.backward_of import derivation_of
from pyrunner.plan.claims import check_bounds, check_costs, check_provenance
from pyrunner.plan.kernel_checks import check_kernel, check_kernel_static
from pyrunner.plan.schedule_rules import check_schedule_rules
from pyrunner.plan.schema import SCHEMA_VERSION, AxisSize, GlobalTensor, Kernel, Map, Op, Plan, Ref, plan_hash
from pyrunner.plan.views import kernel_graph, plan_graph  # noqa: F401 - plan_graph re-exported
from pyrunner.rules.replay_plan import check_certificate

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
    """Schema-level validation only (fields, types, schema_version); a Plan passes through.

    Strict: a JSON plan's numbers must be JSON numbers and its strings JSON strings ("1_0", true,
    " 2.5 " or a string shape are errors, not 10.0, 1.0, 2.5 or a list), and no number is infinite
    (``1e400`` parses to inf; the schema forbids it)."""
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
        return Plan.model_validate(data, strict=True)  # numbers are numbers, strings strings: no coercion
    except pydantic.ValidationError as e:
        raise PlanError(format_validation_error(e, data)) from None
    except RecursionError:
        raise PlanError("plan is nested too deeply") from None


def _json_type(x: object) -> str:
    names = {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string",
             list: "list", dict: "object"}
    return names.get(type(x), type(x).__name__)


def _short(x: object, limit: int = 60) -> str:
    from pyrunner.plan.analysis import safe_repr

    return safe_repr(x, limit)


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

def check_plan(plan: Plan) -> None:
    """Every rule of plan_semantics for the defaults of each kernel's parameters, the hash, a backward plan's
    derivation record (``plan.backward_of``), then the derivation's certificate replayed
    (``rules.replay_plan``)."""
    check_plan_names(plan)
    check_bounds(plan)
    graph = kernel_graph(plan)
    tensors = _check_tensors(plan, graph)
    kernel_names: dict[str, int] = {}
    for ki, k in enumerate(plan.kernels):
        if k.name in kernel_names:
            raise PlanError(f"kernels[{ki}]: kernel name {k.name!r} is already used by kernels[{kernel_names[k.name]}]")
        kernel_names[k.name] = ki
        check_kernel_static(ki, k)
        check_kernel(plan, ki, k, dict(k.defaults), graph.sizes, tensors)
    _check_dataflow(plan, tensors)
    check_costs(plan)
    check_provenance(plan)
    checked_hash(plan)
    derivation_of(plan)  # a backward plan's record replayed: its graph must be the derivation it names
    check_certificate(plan, tensors)  # after the hash: an edited plan that keeps its hash is told so first
    check_schedule_rules(plan)  # the loops' forms against their cited rules, as Superopt/Schedule.lean


def plan_names(plan: Plan) -> Iterator[tuple[str, object, int]]:
    """Every identifier of a plan: (field path, value, length limit). Free text (derivation
    ``at``, provenance planner/version) is not here: it never reaches generated code or a path."""
    g, p = MAX_GRAPH_NAME, MAX_PLAN_NAME
    yield "workload", plan.workload, g
    for i, s in enumerate(plan.derivation):
        yield f"derivation[{i}].rule", s.rule, p
    for i, m in enumerate(plan.axis_merges):
        yield f"axis_merges[{i}].axis", m.axis, g
        for j, a in enumerate(m.parts):
            yield f"axis_merges[{i}].parts[{j}]", a, g
    for i, sp in enumerate(plan.axis_splits):
        yield f"axis_splits[{i}].axis", sp.axis, g
        for j, a in enumerate(sp.parts):
            yield f"axis_splits[{i}].parts[{j}]", a, g
    for i, u in enumerate(plan.axis_units):
        yield f"axis_units[{i}].axis", u.axis, g
        for j, a in enumerate(u.inputs):
            yield f"axis_units[{i}].inputs[{j}]", a, g
    for i, t in enumerate(plan.tensors):
        yield f"tensors[{i}].name", t.name, p
        for j, a in enumerate(t.axes):
            yield f"tensors[{i}].axes[{j}]", a, g
    for ki, k in enumerate(plan.kernels):
        yield from _kernel_names(f"kernels[{ki}]", k)
    for i, kc in enumerate(plan.cost.kernels):
        yield f"cost.kernels[{i}].kernel", kc.kernel, p


def _kernel_names(kw: str, k: Kernel) -> Iterator[tuple[str, object, int]]:
    """``plan_names`` of one kernel (``kw``: its field path)."""
    g, p = MAX_GRAPH_NAME, MAX_PLAN_NAME
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
        yield from _op_names(f"{kw}.{section}[{oi}]", op)


def _op_names(ow: str, op: Op) -> Iterator[tuple[str, object, int]]:
    """``plan_names`` of one op (``ow``: its field path)."""
    g, p = MAX_GRAPH_NAME, MAX_PLAN_NAME
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
    graph = kernel_graph(plan)
    tensors = {t.name: t for t in plan.tensors}
    for ki, k in enumerate(plan.kernels):
        if values[k.name] != k.defaults:
            check_kernel(plan, ki, k, values[k.name], graph.sizes, tensors, config=True)


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
        if t.dtype not in ("float32", plan.dtype):
            what = " or ".join(("float32", plan.dtype)) if t.role == "intermediate" else \
                f"{plan.dtype} (or float32 for a statistic a backward reads)"  # ``Graph.float32_io``
            raise PlanError(f"{where}: a tensor of role {t.role} must have dtype {what} "
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
