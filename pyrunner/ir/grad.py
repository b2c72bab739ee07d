"""Reverse-mode differentiation of the graph IR: the backward graph of a graph, as graph ops.

Each op's vector-Jacobian product is its entry in ``ir.vjp`` (one per op of the op table); this
module sweeps a graph in reverse, summing contributions, so a backward graph is an ordinary graph:
the rules, fusions and the float64 reference apply unchanged. A plan of a backward graph records the
derivation (``Backward.source``, ``outputs``, ``wrt``, ``kept``) as ``provenance.backward_of``
(``plan.backward_of``), which the validator replays.

Named axes make broadcasting explicit: a contribution carrying axes its operand lacks is summed
over them (``_unbroadcast``). A cotangent may lack axes of its term (the gradient of a sum is
constant along the summed axis): it broadcasts by name wherever it is used, and is widened only
where it becomes an input's gradient.

Saved tensors (``Backward.saved``): the forward outputs (written anyway) and, per softmax ``P =
softmax_a(x)``, its row log-sum-exp ``LSE`` (an extra forward output), so the backward recomputes
``P = exp(x - LSE)`` with no reduction; everything else is recomputed from the inputs. The softmax
VJP is ``P * (dP - sum_a(dP * P))``; where P's one use is a contraction ``Y = P @_a V`` (attention's
``O = P V``), ``sum_a(dP * P) = sum_R(dY * Y)`` over Y's axes from V (the ``D = rowsum(dO * O)``
identity), and Y is saved too. For attention the backward thus reads Q, K, V, O, LSE and dO only,
as FlashAttention-2's does; the identity is a structural fact of softmax-then-contract, not an
attention-specific branch.

A saved tensor that is a statistic (``statistic``: an elementwise function of reductions, such as the
log-sum-exp) is stored in float32 whatever the plan dtype (``Graph.float32_io`` of both graphs), as
FlashAttention stores its LSE: the backward reads it inside an exponent, where its rounding error
(about 2^-8 of a value near log t_kv in bf16) becomes that much relative error in every P. So is any
saved tensor the backward feeds, through elementwise ops only, into an exponential or a logarithm
(``amplified``): a saved pre-softmax score ``S0`` of ``P = softmax(S0 / tau)`` enters ``exp(S0 / tau -
LSE)``, where bf16 rounding of ``S0`` is scaled by ``1 / tau`` before the exponent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pyrunner.errors import GraphError
from pyrunner.ir.graph import (
    Graph,
    Term,
    binary,
    check,
    const,
    inp,
    iota,
    positive_scalings,
    reduce,
    result_axes,
    scaled_by,
    softmax_source,
    subterms,
    unary,
    with_unit_axis,
)
from pyrunner.ir.names import fresh_name
from pyrunner.ir.vjp import KIND_VJP, Shapes


def log_sum_exp(x: Term, axis: str) -> Term:
    """``log(sum_a exp(x - m)) + m`` with ``m = max_a x``: a softmax's row statistic, as the forward that
    saves it computes it. For scaled scores ``x = y * c`` (``c`` a positive constant, attention's
    ``rsqrt(|d|)``) the shift is taken of ``y`` and scaled: ``log(sum_a exp((y - max_a y) c)) + max_a(y) c``,
    the same value in the terms ``softmax_scaled_max_shift`` gives the softmax itself, so one kernel
    shares them; otherwise the saving forward's max of ``y * c`` pins the softmax to the plain shift and
    every score is scaled in a pass of its own (the H100 tuning database: that forward 259.8 us, the
    unscaled attention 206.5, timed in different runs)."""
    for y, c, y_first in positive_scalings(x, axis)[:1]:
        m = reduce("max", y, axis)
        arg = scaled_by(binary("sub", y, m), c, y_first)
        return binary("add", unary("log", reduce("sum", unary("exp", arg), axis)), scaled_by(m, c, y_first))
    m = reduce("max", x, axis)
    return binary("add", unary("log", reduce("sum", unary("exp", binary("sub", x, m)), axis)), m)


# --- the backward graph --------------------------------------------------------------------------------

def statistic(t: Term) -> bool:
    """Whether ``t`` is a statistic of reductions: an elementwise function of ``reduce`` results (and
    constants) only, so every path from it to an input passes through a reduction (a row maximum, a
    log-sum-exp; not a contraction, an input or anything elementwise of one)."""
    memo: dict[Term, bool | None] = {}

    def walk(u: Term) -> bool | None:  # True: a statistic; None: constant (neutral); False: neither
        if u not in memo:
            if u.op == "reduce":
                memo[u] = True
            elif u.op in ("const", "axis_size"):
                memo[u] = None
            elif u.op in ("unary", "binary", "ternary"):
                got = [walk(a) for a in u.args]
                memo[u] = None if all(g is None for g in got) else all(g is not False for g in got)
            else:  # an input, an index, a contraction
                memo[u] = False
        return memo[u]

    return walk(t) is True


AMPLIFYING = frozenset({"exp", "exp2", "log"})
"""Unary ops whose output's relative error is the absolute error of their argument (or the reverse):
a bf16-rounded operand's 2^-8 relative error, times its magnitude (and any scale on the way), becomes
the output's error."""


def amplified(roots: Iterable[Term]) -> frozenset[str]:
    """Inputs of the terms ``roots`` (a backward graph's outputs) that reach the argument of an
    ``AMPLIFYING`` op through elementwise ops only (a reduction or contraction in between averages the
    rounding out rather than scaling it)."""
    seeds = [t.args[0] for t in subterms(roots) if t.op == "unary" and t.fn in AMPLIFYING]
    seen: set[Term] = set()
    found: set[str] = set()
    while seeds:
        u = seeds.pop()
        if u in seen:
            continue
        seen.add(u)
        if u.op == "input":
            found.add(u.name)
        elif u.op in ("unary", "binary", "ternary"):
            seeds.extend(u.args)
    return frozenset(found)


@dataclass(frozen=True)
class Backward:
    """A derived backward graph and how it connects to its forward.

    ``graph``'s inputs are forward inputs (recomputation reads them), the saved tensors (outputs of
    ``forward``, same names) and the output cotangents; its outputs are the input gradients. An
    input whose gradient is identically zero (read only through comparisons or predicates, or not
    at all by the differentiated outputs) has no gradient output.
    """

    graph: Graph
    forward: Graph
    """The forward graph with the saved tensors it must also write (e.g. a softmax's log-sum-exp)."""
    saved: tuple[str, ...]
    """Backward inputs that are outputs of ``forward``."""
    cotangents: dict[str, str] = field(default_factory=dict)
    """Backward input name -> the forward output it is the gradient of."""
    gradients: dict[str, str] = field(default_factory=dict)
    """Backward output name -> the forward input it is the gradient of."""
    wrt: tuple[str, ...] = ()
    """The forward inputs differentiated (an input left out has no gradient output, zero or not)."""
    recomputed: tuple[Term, ...] = ()
    """Forward contractions the backward recomputes from the inputs: each could be saved instead."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Gradients that equal a cotangent (``Y = X + R``: ``d_R`` is ``d_Y``): gradient name -> the
    backward input it is; not outputs of ``graph`` (a plan computes nothing for them)."""
    source: Graph | None = None
    """The graph differentiated (``forward`` without the saves it adds)."""
    outputs: tuple[str, ...] = ()
    """The outputs of ``source`` differentiated, in ``source``'s output order."""
    kept: tuple[Term, ...] = ()
    """The terms ``derive`` was asked to save besides the default ones (its ``save``), in the order given."""


class _Deriver:
    """One reverse sweep over a forward graph (see ``derive``)."""

    def __init__(self, graph: Graph, outputs: tuple[str, ...], wrt: frozenset[str], keep: tuple[Term, ...]) -> None:
        self.g = graph
        self.keep = keep
        self.roots = [t for n, t in graph.outputs if n in outputs]
        self.diff_outputs = [(n, t) for n, t in graph.outputs if n in outputs]
        self.wrt = wrt
        self.memo: dict[Term, tuple[str, ...]] = {}
        self.taken: set[str] = set(graph.sizes) | {t.name for t in graph.inputs()} | {n for n, _ in graph.outputs}
        self.softmax = {t: sm for t in subterms(self.roots, self._fwd_deps) if (sm := softmax_source(t)) is not None}

    def axes(self, t: Term) -> tuple[str, ...]:
        return result_axes(t, self.memo)

    def _fwd_deps(self, t: Term) -> tuple[Term, ...]:
        sm = softmax_source(t)
        return (sm[0],) if sm is not None else t.args

    def _fresh(self, base: str, fallback: str) -> str:
        name = fresh_name(base, self.taken, fallback)
        self.taken.add(name)
        return name

    # -- which forward values the backward reads, and how -------------------------------------------

    def plan_saves(self, order: list[Term], live: set[Term]) -> None:
        """Saved tensors: outputs, per live softmax its LSE (unless P is an output) and, where the
        D identity applies, the contraction that consumes P."""
        self.saved: dict[Term, str] = {t: n for n, t in self.g.outputs if t.op != "input"}
        self.extra: list[tuple[str, Term]] = []
        self.lse: dict[Term, Term] = {}  # softmax term -> its forward LSE term
        self.d_of: dict[Term, Term] = {}  # softmax term -> the contraction Y of the D identity
        users: dict[Term, list[Term]] = {}
        for t in order:
            for a in self._fwd_deps(t):
                users.setdefault(a, []).append(t)
        outs = {t for _, t in self.diff_outputs}
        for t in self.keep:
            if t.op != "input":
                self._save(t, self.g.labels.get(t, "saved"), "saved")
        for p, (x, axis) in self.softmax.items():
            if p not in live:
                continue
            label = self.g.labels.get(p, "P")
            if p not in self.saved:
                lse = log_sum_exp(x, axis)
                self.lse[p] = lse
                self._save(lse, f"LSE_{label}", "LSE")
            (y, *more) = users.get(p, [None])
            if (not more and p not in outs and y is not None and y.op == "matmul" and y.axis == axis
                    and list(y.args).count(p) == 1):
                self.d_of[p] = y
                self._save(y, self.g.labels.get(y, "Y"), "Y")

    def _save(self, t: Term, base: str, fallback: str) -> None:
        if t not in self.saved:
            name = self._fresh(base, fallback)
            self.saved[t] = name
            self.extra.append((name, t))

    def values(self, order: list[Term]) -> dict[Term, Term]:
        """Each forward term as the backward computes it: saved ones read, a softmax with a saved LSE
        as exp(x - LSE), the rest recomputed."""
        val: dict[Term, Term] = {}

        def deps(t: Term) -> tuple[Term, ...]:
            if t in self.saved:
                return ()
            if t in self.lse:
                return (self.softmax[t][0], self.lse[t])
            return t.args

        for t in subterms(order, deps):
            if t in self.saved:
                val[t] = inp(self.saved[t], self.axes(t))
            elif t in self.lse:
                val[t] = unary("exp", binary("sub", val[self.softmax[t][0]], val[self.lse[t]]))
            else:
                val[t] = t.replace_args(tuple(val[a] for a in t.args))
        return val

    # -- the sweep -------------------------------------------------------------------------------------

    def _unbroadcast(self, c: Term, target: Term) -> Term:
        want = set(self.axes(target))
        for a in [a for a in self.axes(c) if a not in want]:
            c = reduce("sum", c, a)
        return c

    def _softmax_vjp(self, p: Term, pv: Term, g: Term, cot: Mapping[Term, Term], val: Mapping[Term, Term]) -> Term:
        x, axis = self.softmax[p]
        y = self.d_of.get(p)
        if y is not None:  # D = sum_a(dP * P) = sum_R(dY * Y), R: Y's axes from the other operand
            row = binary("mul", cot[y], val[y])
            for r in [r for r in self.axes(y) if r not in self.axes(p)]:
                row = reduce("sum", row, r)
        else:
            row = reduce("sum", binary("mul", g, pv), axis)
        return binary("mul", pv, binary("sub", g, row))

    def sweep(self) -> tuple[dict[str, Term], dict[str, str]]:
        order = subterms(self.roots, self._fwd_deps)
        live: set[Term] = set()
        for t in order:
            if (t.op == "input" and t.name in self.wrt) or any(a in live for a in self._fwd_deps(t)):
                live.add(t)
        self.plan_saves(order, live)
        self.order = order
        self.val = val = self.values(order)
        contribs: dict[Term, list[Term]] = {}
        cot_inputs: dict[str, str] = {}
        for n, t in self.diff_outputs:
            if t in live:
                name = self._fresh(f"d_{n}", "d_out")
                cot_inputs[name] = n
                contribs.setdefault(t, []).append(inp(name, self.axes(t)))
        cot: dict[Term, Term] = {}
        shapes = Shapes(self.axes, self.g.sizes)
        grads: dict[str, Term] = {}
        for t in reversed(order):
            parts = contribs.pop(t, None)
            if t not in live or not parts:
                continue
            g = parts[0]
            for c in parts[1:]:
                g = binary("add", g, c)
            cot[t] = g
            if t.op == "input":
                grads[t.name] = g
                continue
            if t in self.softmax:
                got: tuple[Term | None, ...] = (self._softmax_vjp(t, val[t], g, cot, val),)
                targets: tuple[Term, ...] = (self.softmax[t][0],)
            else:
                got = KIND_VJP[t.op](t, tuple(val[a] for a in t.args), val[t], g, shapes)
                targets = t.args
            for a, c in zip(targets, got, strict=True):
                if c is not None and a in live:
                    contribs.setdefault(a, []).append(self._unbroadcast(c, a))
        return grads, cot_inputs

    def widen(self, g: Term, x: Term) -> Term:
        """g given every axis of input x (a cotangent constant along an axis lacks it): g + 0 * index."""
        for a in [a for a in self.axes(x) if a not in self.axes(g)]:
            g = binary("add", g, binary("mul", iota(a), const(0.0)))
        return g


def derive(graph: Graph, outputs: Iterable[str] | None = None, wrt: Iterable[str] | None = None,
           save: Iterable[Term] = ()) -> Backward:
    """The backward graph of ``graph`` for the outputs named (default: all) with respect to the inputs
    named (default: all), with the forward graph extended by the tensors the backward reads.

    ``save``: forward terms to save besides the default ones (``Backward.recomputed`` lists the
    candidates; ``planner.saves`` picks among them by the cost model)."""
    names = [n for n, _ in graph.outputs]
    outs = tuple(names if outputs is None else outputs)
    for n in outs:
        if n not in names:
            raise GraphError(f"backward: graph {graph.name!r} has no output {n!r}; its outputs are {names}")
    in_names = sorted({t.name for t in graph.inputs()})
    targets = frozenset(in_names if wrt is None else wrt)
    for n in targets:
        if n not in in_names:
            raise GraphError(f"backward: graph {graph.name!r} has no input {n!r}; its inputs are {in_names}")
    terms = set(subterms(t for _, t in graph.outputs))
    keep = tuple(dict.fromkeys(save))
    if any(t not in terms for t in keep):
        raise GraphError(f"backward: a term to save is not a term of graph {graph.name!r}")
    d = _Deriver(graph, outs, targets, keep)
    grads, cot_inputs = d.sweep()
    by_name = {t.name: t for t in graph.inputs()}
    out_terms: list[tuple[str, Term]] = []
    gradients: dict[str, str] = {}
    aliases: dict[str, str] = {}
    for n in in_names:
        if n in grads:
            name = d._fresh(f"d_{n}", "d_in")
            gradients[name] = n
            g = d.widen(grads[n], by_name[n])
            if g.op == "input":  # an output's gradient passed through unchanged: nothing to compute
                aliases[name] = g.name
            else:
                out_terms.append((name, g))
    if not out_terms and not aliases:
        raise GraphError(f"backward: no output of graph {graph.name!r} depends smoothly on the inputs "
                         f"{sorted(targets)}; every gradient is zero")
    if not out_terms:
        raise GraphError(f"backward: every gradient of graph {graph.name!r} is an output's gradient passed "
                         f"through unchanged; there is no backward to compute")
    labels = {t: n for n, t in out_terms}
    read = {t.name for t in subterms(t for _, t in out_terms) if t.op == "input"}
    extra = tuple((n, t) for n, t in d.extra if n in read)
    hot = amplified(t for _, t in out_terms)
    wide = frozenset(n for n, t in extra if statistic(t) or n in hot)  # float32 on both sides (module doc)
    bwd = with_unit_axis(Graph(f"{graph.name}Backward", dict(graph.sizes), tuple(out_terms), labels,
                               float32_io=wide))
    check(bwd)
    cotangents = {k: v for k, v in cot_inputs.items() if k in read or k in aliases.values()}
    forward = graph
    if extra:
        forward = Graph(graph.name, dict(graph.sizes), graph.outputs + extra,
                        {**graph.labels, **{t: n for n, t in extra}}, float32_io=graph.float32_io | wide)
        check(forward)
    saved = tuple(n for n, _ in forward.outputs if n in read)
    in_bwd = set(bwd.terms())
    recomputed = tuple(t for t in d.order if t.op == "matmul" and t not in d.saved and d.val[t] in in_bwd)
    return Backward(bwd, forward, saved, cotangents, gradients, tuple(sorted(targets)), recomputed, aliases,
                    graph, tuple(n for n in names if n in outs), keep)


def backward_graph(graph: Graph, outputs: Iterable[str] | None = None) -> Graph:
    """The backward graph of ``graph`` (see ``derive``): inputs are forward inputs, saved forward
    outputs and ``d_<output>`` cotangents; outputs are ``d_<input>`` gradients."""
    return derive(graph, outputs).graph
