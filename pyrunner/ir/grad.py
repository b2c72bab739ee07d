"""Reverse-mode differentiation of the graph IR: the backward graph of a graph, as graph ops.

Every op of the op table (``ir.ops``) has its vector-Jacobian product here, one entry each and keyed
like the forward semantics: ``UNARY_VJP``/``BINARY_VJP``/``TERNARY_VJP``/``REDUCE_VJP`` by function
name, ``KIND_VJP`` by term kind. A VJP maps (operand values, result value, result cotangent ``g``)
to one cotangent contribution per operand (None: no gradient flows there), built from the same
terms the search plans, so a backward graph is an ordinary graph: the rules, fusions and the float64
reference apply unchanged.

Named axes make broadcasting explicit: a contribution carrying axes its operand lacks is summed
over them (``_unbroadcast``). A cotangent may lack axes of its term (the gradient of a sum is
constant along the summed axis): it broadcasts by name wherever it is used, and is widened only
where it becomes an input's gradient.

Non-smooth points follow PyTorch's autograd, so the float64 autograd check is exact there too:
``max``/``min`` of two tensors split the gradient evenly at ties (``torch.maximum``), against a
constant the tie goes to the tensor (``torch.clamp_min``/``clamp_max``, the baseline's form); the
``max`` reduction shares it evenly among tied maxima (``amax``); ``relu``/``abs`` have slope 0 at 0;
comparisons (``lt``/``le``) and ``where``'s predicate are piecewise constant (no gradient), so a
masked position (``where(keep, s, -inf)``) gets gradient 0.

Saved tensors (``Backward.saved``): the forward outputs (written anyway) and, per softmax ``P =
softmax_a(x)``, its row log-sum-exp ``LSE`` (an extra forward output), so the backward recomputes
``P = exp(x - LSE)`` with no reduction; everything else is recomputed from the inputs. The softmax
VJP is ``P * (dP - sum_a(dP * P))``; where P's one use is a contraction ``Y = P @_a V`` (attention's
``O = P V``), ``sum_a(dP * P) = sum_R(dY * Y)`` over Y's axes from V (the ``D = rowsum(dO * O)``
identity), and Y is saved too. For attention the backward thus reads Q, K, V, O, LSE and dO only,
as FlashAttention-2's does; the identity is a structural fact of softmax-then-contract, not an
attention-specific branch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from pyrunner.errors import GraphError
from pyrunner.ir.graph import (
    Graph,
    Term,
    axis_size,
    binary,
    check,
    const,
    inp,
    iota,
    matmul,
    reduce,
    result_axes,
    softmax_source,
    subterms,
    unary,
    where,
    with_unit_axis,
)
from pyrunner.ir.names import fresh_name

AxesOf = Callable[[Term], tuple[str, ...]]

_LN2 = math.log(2.0)
_GELU_C = math.sqrt(2.0 / math.pi)


# --- small term helpers --------------------------------------------------------------------------

def _add(a: Term, b: Term) -> Term:
    return binary("add", a, b)


def _sub(a: Term, b: Term) -> Term:
    return binary("sub", a, b)


def _mul(a: Term, b: Term) -> Term:
    return binary("mul", a, b)


def _div(a: Term, b: Term) -> Term:
    return binary("div", a, b)


def _c(v: float) -> Term:
    return const(v)


def _is_constant(t: Term) -> bool:
    """No input and no index in t: the baselines fold it to a Python number (``torch_scalar`` forms)."""
    return all(s.op not in ("input", "iota") for s in subterms([t]))


# --- the VJP tables ----------------------------------------------------------------------------------

UnaryVjp = Callable[[Term, Term, Term], Term]
"""(x, y = f(x), g = cotangent of y) -> cotangent contribution to x."""

UNARY_VJP: dict[str, UnaryVjp] = {
    "exp": lambda x, y, g: _mul(g, y),
    "exp2": lambda x, y, g: _mul(g, _mul(y, _c(_LN2))),
    "log": lambda x, y, g: _div(g, x),
    "neg": lambda x, y, g: unary("neg", g),
    "recip": lambda x, y, g: unary("neg", _mul(g, unary("square", y))),
    "sqrt": lambda x, y, g: _div(_mul(g, _c(0.5)), y),
    "rsqrt": lambda x, y, g: _mul(g, _mul(_c(-0.5), _mul(y, unary("square", y)))),
    "square": lambda x, y, g: _mul(g, _mul(_c(2.0), x)),
    # silu' = s (1 + x (1 - s)), s = sigmoid(x)
    "silu": lambda x, y, g: _mul(g, _mul(unary("sigmoid", x),
                                         _add(_c(1.0), _mul(x, _sub(_c(1.0), unary("sigmoid", x)))))),
    "sigmoid": lambda x, y, g: _mul(g, _mul(y, _sub(_c(1.0), y))),
    "tanh": lambda x, y, g: _mul(g, _sub(_c(1.0), unary("square", y))),
    "gelu": lambda x, y, g: _mul(g, _gelu_slope(x)),
    "relu": lambda x, y, g: _mul(g, binary("lt", _c(0.0), x)),  # torch: slope 0 at x = 0
    "abs": lambda x, y, g: _mul(g, _sub(binary("lt", _c(0.0), x), binary("lt", x, _c(0.0)))),
    "softplus": lambda x, y, g: _mul(g, unary("sigmoid", x)),
}


def _gelu_slope(x: Term) -> Term:
    """d/dx of 0.5 x (1 + tanh(u)), u = c (x + 0.044715 x^3): 0.5 (1 + t) + 0.5 x (1 - t^2) u'."""
    x2 = unary("square", x)
    t = unary("tanh", _mul(_c(_GELU_C), _add(x, _mul(_c(0.044715), _mul(x, x2)))))
    du = _mul(_c(_GELU_C), _add(_c(1.0), _mul(_c(3 * 0.044715), x2)))
    return _add(_mul(_c(0.5), _add(_c(1.0), t)),
                _mul(_mul(_c(0.5), x), _mul(_sub(_c(1.0), unary("square", t)), du)))


BinaryVjp = Callable[[Term, Term, Term, Term], tuple["Term | None", "Term | None"]]
"""(a, b, y = f(a, b), g) -> (contribution to a, contribution to b)."""


def _extremum(larger: bool) -> BinaryVjp:
    """torch.maximum/minimum: the gradient goes to the winner, split evenly at a tie; against a
    constant (clamp_min/clamp_max in the baseline) the tensor keeps it at a tie."""
    def wins(p: Term, q: Term) -> Term:  # 1 where p beats q, 0.5 at a tie, 0 where q wins
        strict, weak = (binary("lt", q, p), binary("le", q, p)) if larger else \
            (binary("lt", p, q), binary("le", p, q))
        if _is_constant(q):
            return weak
        return _mul(_c(0.5), _add(strict, weak))

    def vjp(a: Term, b: Term, y: Term, g: Term) -> tuple[Term | None, Term | None]:
        return _mul(g, wins(a, b)), _mul(g, wins(b, a))
    return vjp


BINARY_VJP: dict[str, BinaryVjp] = {
    "add": lambda a, b, y, g: (g, g),
    "sub": lambda a, b, y, g: (g, unary("neg", g)),
    "mul": lambda a, b, y, g: (_mul(g, b), _mul(g, a)),
    "div": lambda a, b, y, g: (_div(g, b), unary("neg", _div(_mul(g, y), b))),
    "max": _extremum(larger=True),
    "min": _extremum(larger=False),
    "lt": lambda a, b, y, g: (None, None),  # piecewise constant
    "le": lambda a, b, y, g: (None, None),
}

TernaryVjp = Callable[[Term, Term, Term, Term, Term], tuple["Term | None", "Term | None", "Term | None"]]
"""(c, x, y, result, g) -> contributions to (c, x, y)."""

TERNARY_VJP: dict[str, TernaryVjp] = {
    # the predicate is piecewise constant; a masked position (x not selected) gets 0
    "where": lambda c, x, y, r, g: (None, where(c, g, _c(0.0)), where(c, _c(0.0), g)),
}

ReduceVjp = Callable[[Term, Term, Term, str], Term]
"""(x, y = r_axis(x), g, axis) -> contribution to x (may lack ``axis``: it broadcasts)."""


def _max_vjp(x: Term, y: Term, g: Term, axis: str) -> Term:
    """amax's: g shared evenly among the positions equal to the maximum (y <= x only there)."""
    hit = binary("le", y, x)
    return _mul(g, _div(hit, reduce("sum", hit, axis)))


REDUCE_VJP: dict[str, ReduceVjp] = {
    "sum": lambda x, y, g, axis: g,
    "max": _max_vjp,
    "mean": lambda x, y, g, axis: _div(g, axis_size(axis)),
}


def _contract_with(g: Term, other: Term, free: tuple[str, ...], axes: AxesOf) -> Term:
    """sum over ``free`` of g * other: a contraction where g carries one of them, else a product
    (the caller sums the rest away)."""
    have = axes(g)
    for r in free:
        if r in have:
            return matmul(g, other, contract=r)
    return _mul(g, other)


def _matmul_vjp(t: Term, vals: tuple[Term, ...], y: Term, g: Term, axes: AxesOf) -> tuple[Term | None, ...]:
    """y = a @_c b: da = g contracted with b over b's free axes (those a lacks), db likewise."""
    a, b = t.args
    ax_a, ax_b = axes(a), axes(b)
    free_b = tuple(x for x in ax_b if x != t.axis and x not in ax_a)
    free_a = tuple(x for x in ax_a if x != t.axis and x not in ax_b)
    return _contract_with(g, vals[1], free_b, axes), _contract_with(g, vals[0], free_a, axes)


def _elementwise_vjp(t: Term, vals: tuple[Term, ...], y: Term, g: Term, axes: AxesOf) -> tuple[Term | None, ...]:
    if t.op == "unary":
        return (UNARY_VJP[t.fn](vals[0], y, g),)
    if t.op == "binary":
        return BINARY_VJP[t.fn](vals[0], vals[1], y, g)
    return TERNARY_VJP[t.fn](vals[0], vals[1], vals[2], y, g)


def _reduce_vjp(t: Term, vals: tuple[Term, ...], y: Term, g: Term, axes: AxesOf) -> tuple[Term | None, ...]:
    return (REDUCE_VJP[t.fn](vals[0], y, g, t.axis),)


def _leaf_vjp(t: Term, vals: tuple[Term, ...], y: Term, g: Term, axes: AxesOf) -> tuple[Term | None, ...]:
    return ()


KindVjp = Callable[[Term, tuple[Term, ...], Term, Term, AxesOf], tuple["Term | None", ...]]
"""(forward term, its operands' values, its value, its cotangent, axes) -> one contribution per operand."""

KIND_VJP: dict[str, KindVjp] = {
    "input": _leaf_vjp,  # an input's cotangent is its gradient, collected by the caller
    "const": _leaf_vjp,
    "axis_size": _leaf_vjp,
    "iota": _leaf_vjp,
    "unary": _elementwise_vjp,
    "binary": _elementwise_vjp,
    "ternary": _elementwise_vjp,
    "reduce": _reduce_vjp,
    "matmul": _matmul_vjp,
}


# --- the backward graph --------------------------------------------------------------------------------

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
                m = reduce("max", x, axis)
                lse = _add(unary("log", reduce("sum", unary("exp", _sub(x, m)), axis)), m)
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
                val[t] = unary("exp", _sub(val[self.softmax[t][0]], val[self.lse[t]]))
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
            row = _mul(cot[y], val[y])
            for r in [r for r in self.axes(y) if r not in self.axes(p)]:
                row = reduce("sum", row, r)
        else:
            row = reduce("sum", _mul(g, pv), axis)
        return _mul(pv, _sub(g, row))

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
        grads: dict[str, Term] = {}
        for t in reversed(order):
            parts = contribs.pop(t, None)
            if t not in live or not parts:
                continue
            g = parts[0]
            for c in parts[1:]:
                g = _add(g, c)
            cot[t] = g
            if t.op == "input":
                grads[t.name] = g
                continue
            if t in self.softmax:
                got: tuple[Term | None, ...] = (self._softmax_vjp(t, val[t], g, cot, val),)
                targets: tuple[Term, ...] = (self.softmax[t][0],)
            else:
                got = KIND_VJP[t.op](t, tuple(val[a] for a in t.args), val[t], g, self.axes)
                targets = t.args
            for a, c in zip(targets, got, strict=True):
                if c is not None and a in live:
                    contribs.setdefault(a, []).append(self._unbroadcast(c, a))
        return grads, cot_inputs

    def widen(self, g: Term, x: Term) -> Term:
        """g given every axis of input x (a cotangent constant along an axis lacks it): g + 0 * index."""
        for a in [a for a in self.axes(x) if a not in self.axes(g)]:
            g = _add(g, _mul(iota(a), _c(0.0)))
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
    for n in in_names:
        if n in grads:
            name = d._fresh(f"d_{n}", "d_in")
            gradients[name] = n
            out_terms.append((name, d.widen(grads[n], by_name[n])))
    if not out_terms:
        raise GraphError(f"backward: no output of graph {graph.name!r} depends smoothly on the inputs "
                         f"{sorted(targets)}; every gradient is zero")
    labels = {t: n for n, t in out_terms}
    bwd = with_unit_axis(Graph(f"{graph.name}Backward", dict(graph.sizes), tuple(out_terms), labels))
    check(bwd)
    read = {t.name for t in bwd.inputs()}
    extra = tuple((n, t) for n, t in d.extra if n in read)
    forward = graph
    if extra:
        forward = Graph(graph.name, dict(graph.sizes), graph.outputs + extra,
                        {**graph.labels, **{t: n for n, t in extra}})
        check(forward)
    saved = tuple(n for n, _ in forward.outputs if n in read)
    in_bwd = set(bwd.terms())
    recomputed = tuple(t for t in d.order if t.op == "matmul" and t not in d.saved and d.val[t] in in_bwd)
    return Backward(bwd, forward, saved, {k: v for k, v in cot_inputs.items() if k in read}, gradients,
                    tuple(sorted(targets)), recomputed)


def backward_graph(graph: Graph, outputs: Iterable[str] | None = None) -> Graph:
    """The backward graph of ``graph`` (see ``derive``): inputs are forward inputs, saved forward
    outputs and ``d_<output>`` cotangents; outputs are ``d_<input>`` gradients."""
    return derive(graph, outputs).graph
