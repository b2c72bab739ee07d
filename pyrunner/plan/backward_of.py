"""A backward plan's record of what it was derived from (``Provenance.backward_of``): written, and replayed.

Why: a derived backward graph (``ir.grad``) reads forward inputs, cotangents and saved tensors that belong
to those inputs (a softmax's log-sum-exp). A check that draws every input of such a plan on its own feeds
it an LSE that does not match the scores, ``exp(S - LSE)`` leaves the dtype, and a correct plan fails
(issue 44). So a backward plan records its derivation: the forward graph as written, the outputs and
inputs differentiated, and the extra saves. A plan file is untrusted: the record is replayed here (the
backward derived again from the embedded forward graph) and the plan refused, with one line, unless its
graph is exactly that derivation. The checks then draw the forward's inputs and compute the saved tensors
from them (``run.backward_draws``).
"""

from __future__ import annotations

from pyrunner.errors import GraphError, PlanError
from pyrunner.ir.grad import Backward, derive
from pyrunner.ir.graph import Graph
from pyrunner.ir.graph_json import graph_from_json, graph_to_json
from pyrunner.plan.analysis import safe_repr
from pyrunner.plan.schema import BackwardOf, Plan, with_hash
from pyrunner.plan.views import plan_graph

WHERE = "provenance.backward_of"


def record(bwd: Backward) -> BackwardOf:
    """The record of ``bwd``: its source graph as JSON, the outputs and inputs differentiated, and each extra
    save as its index among the terms of the graph that JSON reads back as (operands before users)."""
    if bwd.source is None:
        raise GraphError("backward: this derivation does not name the graph it was derived from")
    forward = graph_to_json(bwd.source)
    index = {t: i for i, t in enumerate(graph_from_json(forward).terms())}
    if any(t not in index for t in bwd.kept):
        raise GraphError(f"backward: a term saved is not a term of graph {bwd.source.name!r} as JSON reads it back")
    return BackwardOf(forward=forward, outputs=list(bwd.outputs), wrt=list(bwd.wrt), save=[index[t] for t in bwd.kept])


def with_backward_of(plan: Plan, bwd: Backward) -> Plan:
    """``plan`` (of ``bwd.graph``) carrying the record of ``bwd``, hashed again. The record is replayed at
    once: a derivation its record does not reproduce is refused here, never written out."""
    prov = plan.provenance.model_copy(update={"backward_of": record(bwd), "plan_hash": ""})
    out = with_hash(plan.model_copy(update={"provenance": prov}))
    derivation_of(out)
    return out


def _names(field: str, names: list[str], have: list[str], what: str, graph: str) -> None:
    seen: set[str] = set()
    for i, n in enumerate(names):
        if n not in have:
            raise PlanError(f"{WHERE}.{field}[{i}]: {safe_repr(n)} is not {what} of the forward graph {graph!r}; "
                            f"it has {', '.join(have)}")
        if n in seen:
            raise PlanError(f"{WHERE}.{field}[{i}]: {n!r} is listed twice")
        seen.add(n)


def _difference(want: Graph, got: Graph) -> str:
    """The first way ``got`` (the plan's graph) differs from ``want`` (the derivation), in words."""
    if want.name != got.name:
        return f"the derivation is named {want.name!r}, the plan's graph {got.name!r}"
    if want.sizes != got.sizes:
        want_axes, got_axes = dict(sorted(want.sizes.items())), dict(sorted(got.sizes.items()))
        return f"the derivation's axes are {want_axes}, the graph's {got_axes}"
    names, have = [n for n, _ in want.outputs], [n for n, _ in got.outputs]
    if names != have:
        return f"the derivation's outputs are {names}, the graph's {have}"
    ours = dict(got.outputs)
    bad = next((n for n, t in want.outputs if ours[n] != t), None)
    return f"output {bad!r} is computed differently" if bad else "they differ"


def derivation_of(plan: Plan) -> Backward | None:
    """The derivation a plan's ``backward_of`` records, replayed (None for a plan without one). PlanError
    (one line) when the record does not parse or the plan's graph is not the backward it derives."""
    rec = plan.provenance.backward_of
    if rec is None:
        return None
    bwd = replay(rec)
    got = plan_graph(plan)
    if (bwd.graph.name, bwd.graph.sizes, bwd.graph.outputs) != (got.name, got.sizes, got.outputs):
        source = bwd.source.name if bwd.source is not None else "?"
        raise PlanError(f"{WHERE}: the plan's graph is not the backward its forward graph {source!r} derives "
                        f"({_difference(bwd.graph, got)}); plan it again with `superopt --backward`")
    return bwd


def replay(rec: BackwardOf) -> Backward:
    """The derivation a record names, derived again from its forward graph; PlanError (one line) when the
    record does not parse (an untrusted file's: a plan's, or the plan store's)."""
    try:
        forward = graph_from_json(rec.forward)
    except GraphError as e:
        raise PlanError(f"{WHERE}.forward: {e}") from None
    _names("outputs", rec.outputs, [n for n, _ in forward.outputs], "an output", forward.name)
    _names("wrt", rec.wrt, sorted({t.name for t in forward.inputs()}), "an input", forward.name)
    terms = forward.terms()
    for i, k in enumerate(rec.save):
        if k >= len(terms):
            raise PlanError(f"{WHERE}.save[{i}]: term {k} does not exist; the forward graph has {len(terms)} terms")
        if k in rec.save[:i]:
            raise PlanError(f"{WHERE}.save[{i}]: term {k} is listed twice")
    try:
        bwd = derive(forward, rec.outputs, rec.wrt, [terms[k] for k in rec.save])
    except GraphError as e:
        raise PlanError(f"{WHERE}: the forward graph derives no backward: {e}") from None
    return bwd
