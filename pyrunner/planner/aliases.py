"""Graph outputs that compute the same value: planned once, stored once per name.

Terms are hash-consed, so two outputs written as the same expression (``relu(X)`` under two names)
are one term, and the planner, which keys outputs by term, would compute the value for one name
only: the other output stayed unwritten (found by the random-graph test). The graph is planned
with each value under its first name; the kernel that stores the value then stores the same tile
to every other name as well.
"""

from __future__ import annotations

import hashlib

from pyrunner.ir.graph import Graph, Term
from pyrunner.ir.graph_json import graph_to_json
from pyrunner.plan.certificate import Certificate
from pyrunner.plan.schema import Kernel, Plan, Store, canonical_json, with_hash


def distinct_outputs(graph: Graph) -> tuple[Graph, dict[str, str]]:
    """The graph with one output per distinct value, and each dropped name -> the name kept for its value."""
    first: dict[Term, str] = {}
    kept: list[tuple[str, Term]] = []
    aliases: dict[str, str] = {}
    for name, term in graph.outputs:
        if term in first:
            aliases[name] = first[term]
        else:
            first[term] = name
            kept.append((name, term))
    if not aliases:
        return graph, aliases
    labels = {t: first.get(t, name) for t, name in graph.labels.items()}  # the dropped names name nothing
    kept_names = {n for n, _ in kept} | {t.name for t in graph.inputs()}
    return Graph(graph.name, dict(graph.sizes), tuple(kept), labels,
                 float32_io=graph.float32_io & kept_names), aliases


def graph_hash(g: Graph) -> str:
    """The hash a plan's provenance records for the graph it was planned from."""
    return hashlib.sha256(canonical_json(graph_to_json(g)).encode()).hexdigest()[:16]


def with_aliases(plan: Plan, graph: Graph, aliases: dict[str, str]) -> Plan:
    """``plan`` (of ``distinct_outputs(graph)``) as a plan of ``graph``: an output tensor per alias,
    stored by the kernel that stores its value, right after each store of that value."""
    tensors = []
    for t in plan.tensors:
        tensors.append(t)
        tensors += [t.model_copy(update={"name": a}) for a, kept in aliases.items() if kept == t.name]
    kernels = [_store_aliases(k, aliases) for k in plan.kernels]
    provenance = plan.provenance.model_copy(update={"graph_hash": graph_hash(graph), "plan_hash": ""})
    return with_hash(plan.model_copy(update={"graph": graph_to_json(graph), "tensors": tensors, "kernels": kernels,
                                             "provenance": provenance,
                                             "certificate": _certificate_aliases(plan, graph, aliases)}))


def _certificate_aliases(plan: Plan, graph: Graph, aliases: dict[str, str]) -> Certificate | None:
    """The certificate of the plan of ``graph``: a derived term per graph output (an alias has the term
    of the name kept for its value) and, in each kernel, the kept value's term for each alias it stores,
    in the order ``_store_aliases`` appends them to the kernel's writes."""
    cert = plan.certificate
    if cert is None:
        return None
    kept_names = [name for name, _ in graph.outputs if name not in aliases]
    term_of = dict(zip(kept_names, cert.derived, strict=True))
    derived = [term_of[aliases.get(name, name)] for name, _ in graph.outputs]
    writes = {k.name: k.writes for k in plan.kernels}
    kernels = []
    for kt in cert.kernels:
        own = dict(zip(writes[kt.kernel], kt.writes, strict=True))
        extra = [own[kept] for a, kept in aliases.items() if kept in own]
        kernels.append(kt.model_copy(update={"writes": [*kt.writes, *extra]}))
    return cert.model_copy(update={"derived": derived, "kernels": kernels})


def _store_aliases(kernel: Kernel, aliases: dict[str, str]) -> Kernel:
    extra = [a for a, kept in aliases.items() if kept in kernel.writes]
    if not extra:
        return kernel

    def section(ops: list) -> list:
        out = []
        for op in ops:
            out.append(op)
            if isinstance(op, Store):
                out += [op.model_copy(update={"dst": a}) for a, kept in aliases.items() if kept == op.dst]
        return out

    return kernel.model_copy(update={"prologue": section(kernel.prologue), "body": section(kernel.body),
                                     "epilogue": section(kernel.epilogue), "writes": [*kernel.writes, *extra]})
