"""Terms as a table of nodes, the form a plan's certificate carries them in (``schema.TermNode``).

A table is hash-consed and operands-first: each distinct term is one node, its operands earlier
nodes, so shared sub-graphs cost one entry and a table of any DAG is linear in its size. Decoding
is for untrusted plans: every node is checked (known op and function, operands earlier, a constant
a number) and the result is a ``graph.Term``, compared structurally by the replay.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from pyrunner.errors import PlanError
from pyrunner.ir.graph import Term, subterms
from pyrunner.ir.ops import BINARY_OPS, REDUCE_OPS, TERNARY_OPS, UNARY_OPS
from pyrunner.plan.certificate import TermNode

_ARITY = {"input": 0, "const": 0, "axis_size": 0, "iota": 0, "unary": 1, "binary": 2, "ternary": 3,
          "reduce": 1, "matmul": 2}
_FNS = {"unary": UNARY_OPS, "binary": BINARY_OPS, "ternary": TERNARY_OPS, "reduce": REDUCE_OPS}


def _value(v: float) -> float | str:
    return ("-inf" if v < 0 else "inf") if math.isinf(v) else v


class TermTable:
    """Builds a node table: ``index(t)`` adds t (and its operands) once and returns its node index."""

    def __init__(self) -> None:
        self.nodes: list[TermNode] = []
        self._index: dict[Term, int] = {}

    def index(self, t: Term) -> int:
        if t not in self._index:
            for u in subterms([t], lambda x: [a for a in x.args if a not in self._index]):
                if u not in self._index:
                    self._add(u)
        return self._index[t]

    def indices(self, ts: Iterable[Term]) -> list[int]:
        return [self.index(t) for t in ts]

    def _add(self, u: Term) -> None:
        fields: dict = {"op": u.op, "args": [self._index[a] for a in u.args]}
        if u.op in _FNS:
            fields["fn"] = u.fn
        if u.op in ("reduce", "matmul", "axis_size", "iota"):
            fields["axis"] = u.axis
        if u.op == "input":
            fields["name"], fields["axes"] = u.name, list(u.axes)
        if u.op == "const":
            fields["value"] = _value(u.value)
        self._index[u] = len(self.nodes)
        self.nodes.append(TermNode(**fields))


def _number(v: float | str) -> float:
    return {"-inf": -math.inf, "inf": math.inf}[v] if isinstance(v, str) else float(v)


def decode_nodes(nodes: Sequence[TermNode], where: str = "certificate.nodes") -> list[Term]:
    """The terms of a node table, in order; PlanError naming the first malformed node."""
    out: list[Term] = []
    for i, n in enumerate(nodes):
        at = f"{where}[{i}]"
        if len(n.args) != _ARITY[n.op]:
            raise PlanError(f"{at}: a {n.op} node has {_ARITY[n.op]} operand(s), got {len(n.args)}")
        if any(a >= i for a in n.args):
            raise PlanError(f"{at}: an operand must be an earlier node, got {n.args}")
        if n.op in _FNS and n.fn not in _FNS[n.op]:
            raise PlanError(f"{at}: unknown {n.op} function {n.fn!r}")
        if n.op in ("reduce", "matmul", "axis_size", "iota") and not n.axis:
            raise PlanError(f"{at}: a {n.op} node needs an axis")
        if n.op == "const" and isinstance(n.value, float) and math.isnan(n.value):
            raise PlanError(f"{at}: a constant must be a number or +-inf")
        args = tuple(out[a] for a in n.args)
        axis = n.axis if n.op in ("reduce", "matmul", "axis_size", "iota") else ""
        fn = n.fn if n.op in _FNS else ""
        value = _number(n.value) if n.op == "const" else 0.0
        name, axes = (n.name, tuple(n.axes)) if n.op == "input" else ("", ())
        out.append(Term(n.op, args, fn=fn, axis=axis, name=name, axes=axes, value=value))
    return out


def node_term(terms: Sequence[Term], index: int, where: str) -> Term:
    """The term of node ``index``; PlanError naming ``where`` when there is no such node."""
    if not 0 <= index < len(terms):
        raise PlanError(f"{where}: node {index} is not in certificate.nodes ({len(terms)} nodes)")
    return terms[index]
