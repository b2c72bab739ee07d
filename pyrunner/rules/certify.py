"""The planner's side of the certificate: each rewrite it made, located and instantiated.

While searching, a step carries only the rewrite (``Rewrite``: the matched term, its replacement
and, for a product rebuilt, the factors' paths and order). ``certify`` walks the chosen derivation
once, from the graph it started at: each rewrite's position (an output and a path of operand
indices to the first occurrence), its instantiation (``replay.instantiate``, checked by replaying
it), its result in the term table; then the derived graph and, for each kernel, the terms it
computes over the tensors it reads. A rewrite that does not replay is a planner bug (an
AssertionError), never a plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyrunner.ir.axes import axes_of
from pyrunner.ir.brief import brief
from pyrunner.ir.graph import Graph, Term, inp, subterms
from pyrunner.plan.certificate import Certificate, Instance, KernelTerms, Position
from pyrunner.plan.schema import Step
from pyrunner.rules.registry import replace_in_graph
from pyrunner.rules.replay import Inst, instantiate, replay
from pyrunner.rules.terms_table import TermTable


@dataclass(frozen=True)
class Rewrite:
    old: Term
    new: Term
    inst: Inst | None = None
    """Given for the product rules (factors and order); found by ``instantiate`` for the others."""


def rewrite_step(rule: str, old: Term, new: Term, inst: Inst | None = None, at: str | None = None) -> Step:
    """A derivation step for the rewrite old -> new, to be certified by ``certify``."""
    step = Step(rule=rule, at=brief(old) if at is None else at)
    step._rewrite = Rewrite(old, new, inst)
    return step


def find_position(g: Graph, t: Term) -> Position:
    """The first occurrence of t in g's outputs (depth first, operands left to right)."""
    seen: set[Term] = set()
    for o, (_, root) in enumerate(g.outputs):
        stack: list[tuple[Term, tuple[int, ...]]] = [(root, ())]
        while stack:
            cur, path = stack.pop()
            if cur == t:
                return Position(output=o, path=list(path))
            if cur in seen:
                continue
            seen.add(cur)
            stack.extend((a, path + (k,)) for k, a in reversed(list(enumerate(cur.args))))
    raise AssertionError(f"certify: the rewritten term {brief(t)} is not in the graph")


def instance_model(inst: Inst, table: TermTable) -> Instance:
    return Instance(axis=inst.axis, fn=inst.fn, scale=None if inst.scale is None else table.index(inst.scale),
                    constant=inst.constant, choice=list(inst.choice), factors=[list(p) for p in inst.factors])


def certify_steps(start: Graph, steps: Sequence[Step], split: Callable[[Graph], Graph] | None,
                  table: TermTable) -> tuple[list[Step], Graph]:
    """The steps with their certificate fields, and the graph they derive (``split``: applies the plan's
    axis split at its ``split_reduction`` step)."""
    cur = start
    out: list[Step] = []
    for i, st in enumerate(steps):
        rw = st._rewrite
        if st.rule == "split_reduction" and split is not None:
            cur = split(cur)
        if not isinstance(rw, Rewrite):
            out.append(Step(rule=st.rule, at=st.at, result=st.result))
            continue
        pos = find_position(cur, rw.old)
        inst = rw.inst or instantiate(st.rule, rw.old, rw.new)
        if inst is None or replay(st.rule, rw.old, inst) != rw.new:
            raise AssertionError(f"certify: step {i} ({st.rule} at {st.at}) does not replay")
        out.append(Step(rule=st.rule, at=st.at, result=st.result, position=pos,
                        instance=instance_model(inst, table), term=table.index(rw.new)))
        cur = replace_in_graph(cur, rw.old, rw.new)
    return out, cur


INLINED_LEAVES = ("iota", "const", "axis_size")
"""Leaves the lowering writes as expressions wherever they are used (``lower.Lowering.expr``), even where
another kernel stores them (a naive plan's index kernels): a kernel computes them, never reads them."""


def kernel_terms(roots: Sequence[Term], boundary: dict[Term, str]) -> list[Term]:
    """What a kernel storing ``roots`` computes: each root with every other tensor it reads (a term in
    ``boundary``, not one of its roots, nor an index, size or constant, which it computes) as an input
    named as that tensor."""
    own = set(roots)

    def read(x: Term) -> bool:
        return x in boundary and x not in own and x.op not in INLINED_LEAVES

    memo: dict[Term, Term] = {}
    for u in subterms(roots, lambda x: () if read(x) else x.args):
        memo[u] = inp(boundary[u], axes_of(u)) if read(u) else u.replace_args(tuple(memo[a] for a in u.args))
    return [memo[r] for r in roots]


def certificate(derived: Graph, kernels: Sequence[tuple[str, Sequence[Term], Sequence[str]]],
                table: TermTable) -> Certificate:
    """The certificate of a plan whose derivation gives ``derived``; ``kernels``: each kernel's name,
    the terms it stores and their tensor names (in its ``writes`` order)."""
    boundary = {t: t.name for t in derived.inputs()}
    for _, roots, writes in kernels:
        boundary.update(zip(roots, writes, strict=True))
    derived_ix = table.indices(t for _, t in derived.outputs)
    ks = [KernelTerms(kernel=name, writes=table.indices(kernel_terms(roots, boundary)))
          for name, roots, _ in kernels]
    return Certificate(nodes=list(table.nodes), derived=derived_ix, kernels=ks)
