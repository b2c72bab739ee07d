"""Replay a plan's certificate: its derivation from its graph, step by step, and its kernels' terms.

From the plan's own graph (with its unit axes and merges, ``plan.views``) each algebraic step is
replayed at its recorded position with its recorded instantiation (``replay.replay``: the rule's
shape and side conditions checked), and must give the recorded term; every occurrence of the
rewritten sub-term is replaced, as the planner did. The plan's axis split applies at its
``split_reduction`` step. The result must be the certificate's derived graph, and the kernels'
terms, each over the tensors its kernel reads, must compose (in kernel order) to the derived
outputs, every intermediate a term of it. A plan whose derivation was edited (a step moved,
swapped, dropped, re-instantiated) or whose kernels claim other terms fails with one line naming
the step or kernel. What this does not check: that a kernel's ops compute its terms (beyond the
bufferless expressions ``kernel_match`` compares); the renderer and executor own that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyrunner.errors import GraphError, PlanError
from pyrunner.ir.axes import axes_of
from pyrunner.ir.brief import brief
from pyrunner.ir.graph import Graph, Term, subterms
from pyrunner.ir.split_axes import apply_split
from pyrunner.plan.schema import GlobalTensor, Plan, Step
from pyrunner.plan.views import merged_graph, splits_of, units_of
from pyrunner.rules.kernel_match import check_kernel_exprs
from pyrunner.rules.registry import RULES, replace_in_graph
from pyrunner.rules.replay import RULE_REPLAYS, Inst, ReplayError, replay
from pyrunner.rules.terms_table import decode_nodes, node_term

VIEW_RULES = ("unit_axis", "merge_axes", "split_reduction")


def check_certificate(plan: Plan, tensors: Mapping[str, GlobalTensor]) -> int:
    """Replay the plan's certificate (PlanError at the first step or kernel that does not); the number
    of algebraic steps replayed. A plan without a certificate must have no derivation steps."""
    cert = plan.certificate
    if cert is None:
        if plan.derivation:
            raise PlanError(f"derivation: {len(plan.derivation)} step(s) but no certificate to replay them "
                            f"(plans from before certificates must be re-planned)")
        return 0
    terms = decode_nodes(cert.nodes)
    algebraic, rest = _split_steps(plan)
    g = merged_graph(plan)
    for i, st in algebraic:
        g = _replay_step(g, i, st, terms)
    for i, sp in enumerate(splits_of(plan)):
        try:
            g = apply_split(g, sp)
        except GraphError as e:
            raise PlanError(f"axis_splits[{i}]: {e}") from None
    _check_derived(g, [node_term(terms, k, f"certificate.derived[{j}]") for j, k in enumerate(cert.derived)])
    _check_schedule_steps(plan, rest)
    _check_kernels(plan, g, terms, tensors)
    return len(algebraic)


def _split_steps(plan: Plan) -> tuple[list[tuple[int, Step]], list[tuple[int, Step]]]:
    """The derivation as: unit and merge steps (one per listed view, in order), algebraic steps, the
    split step (one per listed split), schedule steps; PlanError where it is not in that order."""
    views = ([("unit_axis", u.describe()) for u in units_of(plan)]
             + [("merge_axes", f"{m.parts[0]}, {m.parts[1]} -> {m.axis}") for m in plan.axis_merges])
    splits = [("split_reduction", f"{s.axis} -> {s.parts[0]}, {s.parts[1]}") for s in plan.axis_splits]
    steps = list(enumerate(plan.derivation))
    for k, (rule, at) in enumerate(views):
        if k >= len(steps) or (steps[k][1].rule, steps[k][1].at) != (rule, at):
            raise PlanError(f"derivation[{k}]: expected the step {rule} at {at!r} (the plan's axis views come "
                            f"first, in order)")
    steps = steps[len(views):]
    n = 0
    while n < len(steps) and steps[n][1].rule in RULE_REPLAYS:
        n += 1
    algebraic, steps = steps[:n], steps[n:]
    for k, (rule, at) in enumerate(splits):
        if k >= len(steps) or (steps[k][1].rule, steps[k][1].at) != (rule, at):
            where = steps[k][0] if k < len(steps) else len(plan.derivation)
            raise PlanError(f"derivation[{where}]: expected the step {rule} at {at!r} after the algebraic steps")
    rest = steps[len(splits):]
    for i, st in rest:
        if st.rule in RULE_REPLAYS or st.rule in VIEW_RULES:
            raise PlanError(f"derivation[{i}]: {st.rule} is out of place (order: axis views, algebraic steps, "
                            f"the split, schedule rules)")
    return algebraic, rest


def _instance(i: int, st: Step, terms: Sequence[Term]) -> Inst:
    x = st.instance
    if x is None or st.position is None or st.term is None:
        raise PlanError(f"derivation[{i}]: the {st.rule} step has no position, instance or term to replay")
    scale = None if x.scale is None else node_term(terms, x.scale, f"derivation[{i}].instance.scale")
    return Inst(axis=x.axis, fn=x.fn, scale=scale, constant=x.constant, choice=tuple(x.choice),
                factors=tuple(tuple(p) for p in x.factors))


def _at(g: Graph, i: int, st: Step) -> Term:
    pos = st.position
    assert pos is not None
    if pos.output >= len(g.outputs):
        raise PlanError(f"derivation[{i}].position: output {pos.output}, but the graph has {len(g.outputs)}")
    t = g.outputs[pos.output][1]
    for depth, k in enumerate(pos.path):
        if k >= len(t.args):
            raise PlanError(f"derivation[{i}].position: path {pos.path} leaves the term at step {depth} "
                            f"({brief(t, 60)} has {len(t.args)} operand(s))")
        t = t.args[k]
    return t


def _replay_step(g: Graph, i: int, st: Step, terms: Sequence[Term]) -> Graph:
    inst = _instance(i, st, terms)
    t = _at(g, i, st)
    try:
        new = replay(st.rule, t, inst)
    except ReplayError as e:
        raise PlanError(f"derivation[{i}]: {st.rule} does not apply at output {st.position.output} path "
                        f"{st.position.path} ({brief(t, 80)}): {e}") from None
    want = node_term(terms, st.term, f"derivation[{i}].term")
    if new != want:
        raise PlanError(f"derivation[{i}]: {st.rule} gives {brief(new, 80)}, the step records {brief(want, 80)}")
    return replace_in_graph(g, t, new)


def _check_derived(g: Graph, derived: list[Term]) -> None:
    if len(derived) != len(g.outputs):
        raise PlanError(f"certificate.derived: {len(derived)} term(s) for {len(g.outputs)} graph output(s)")
    for j, ((name, t), d) in enumerate(zip(g.outputs, derived, strict=True)):
        if t != d:
            raise PlanError(f"certificate.derived[{j}]: the replayed derivation gives output {name!r} as "
                            f"{brief(t, 80)}, the certificate says {brief(d, 80)}")


def _check_schedule_steps(plan: Plan, rest: list[tuple[int, Step]]) -> None:
    """The schedule steps are the kernels' fused rules, kernel by kernel, each a schedule rule."""
    want = [(r, k.name) for k in plan.kernels for r in k.fused_rules]
    got = [(st.rule, st.at) for _, st in rest]
    if got != want:
        where = next((rest[k][0] for k in range(min(len(got), len(want))) if got[k] != want[k]),
                     rest[len(want)][0] if len(got) > len(want) else len(plan.derivation))
        raise PlanError(f"derivation[{where}]: the schedule steps must cite each kernel's fused_rules in kernel "
                        f"order ({len(want)} step(s)), got {len(got)}")
    for i, st in rest:
        if st.rule not in RULES or RULES[st.rule].kind != "schedule":
            raise PlanError(f"derivation[{i}]: {st.rule!r} is not a schedule rule")


def _compose(t: Term, composed: Mapping[str, Term], where: str, reads: set[str], canon: Mapping[Term, Term]) -> Term:
    """t with each input node replaced by the term of the tensor it names; each rebuilt node is taken as
    the derived graph's own object where it is one of its terms (``canon``), so comparing and looking up
    the composed terms stops at shared operands (rebuilt copies compared whole, node by node: quadratic
    on a 300-matmul chain)."""
    memo: dict[Term, Term] = {}
    for u in subterms([t]):
        if u.op == "input":
            if u.name not in reads or u.name not in composed:
                raise PlanError(f"{where}: reads {u.name!r}, which the kernel does not read or no earlier "
                                f"kernel wrote")
            if axes_of(composed[u.name]) != u.axes:
                raise PlanError(f"{where}: reads {u.name!r} with axes {list(u.axes)}, but it holds "
                                f"{list(axes_of(composed[u.name]))}")
            memo[u] = composed[u.name]
        else:
            new = u.replace_args(tuple(memo[a] for a in u.args))
            memo[u] = canon.get(new, new)
    return memo[t]


def _check_kernels(plan: Plan, g: Graph, terms: Sequence[Term], tensors: Mapping[str, GlobalTensor]) -> None:
    cert = plan.certificate
    assert cert is not None
    if [k.kernel for k in cert.kernels] != [k.name for k in plan.kernels]:
        raise PlanError("certificate.kernels: must list the plan's kernels, in order")
    composed: dict[str, Term] = {t.name: t for t in g.inputs()}
    known = {t: t for t in subterms([t for _, t in g.outputs])}
    outputs = dict(g.outputs)
    for ki, (k, kt) in enumerate(zip(plan.kernels, cert.kernels, strict=True)):
        if len(kt.writes) != len(k.writes):
            raise PlanError(f"certificate.kernels[{ki}]: {len(kt.writes)} term(s) for {len(k.writes)} write(s)")
        for j, (name, ix) in enumerate(zip(k.writes, kt.writes, strict=True)):
            where = f"certificate.kernels[{ki}].writes[{j}]"
            value = _compose(node_term(terms, ix, where), composed, where, set(k.reads), known)
            if name in outputs and value != outputs[name]:
                raise PlanError(f"{where}: kernel {k.name!r} computes output {name!r} as {brief(value, 80)}, the "
                                f"derivation gives {brief(outputs[name], 80)}")
            if value not in known:
                raise PlanError(f"{where}: kernel {k.name!r} computes {name!r} as {brief(value, 80)}, which is not "
                                f"a term of the derived graph")
            t = tensors.get(name)
            if t is not None and sorted(t.axes) != sorted(axes_of(value)):
                raise PlanError(f"{where}: tensor {name!r} has axes {t.axes}, its term {list(axes_of(value))}")
            composed[name] = value
        check_kernel_exprs(ki, k, [node_term(terms, ix, f"certificate.kernels[{ki}]") for ix in kt.writes], g.sizes)
