"""Graph IR over named axes.

A graph is a DAG of hash-consed ``Term`` values. Terms are immutable and
structurally compared, so rewrite rules can build new terms freely and the
search can deduplicate equal graphs. Axis names carry broadcasting: a binary
op aligns its operands by name, never by position.

Why one module: terms, their traversal (iterative, memoised: untrusted graphs can be deep or
share subgraphs exponentially), the type check and the builder DSL change together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from pyrunner.errors import GraphError
from pyrunner.ir.names import fresh_name
from pyrunner.ir.ops import ALL_OPS, BINARY_OPS, REDUCE_OPS, TERM_KINDS, TERNARY_OPS, UNARY_OPS

LOG2E = 1.4426950408889634
MAX_AXIS_SIZE = 2**31 - 1
"""Largest axis extent: what one launch dimension (and int32 index arithmetic) can address."""
MAX_ELEMENTS = 2**40
"""Largest number of elements of any value in a graph (bounds every size product the cost model forms)."""
MAX_TERMS = 20000
"""Most distinct nodes a graph may have after helpers expand (graph files are capped at MAX_NODES)."""


@dataclass(frozen=True, eq=True)
class Term:
    """One node of the graph.

    ``op`` is one of ALL_OPS; ``fn`` names the unary/binary/reduce function;
    ``axis`` is the reduced or contracted axis; ``name``/``axes`` describe an
    input; ``value`` is a constant's value.
    """

    op: str
    args: tuple["Term", ...] = ()
    fn: str = ""
    axis: str = ""
    name: str = ""
    axes: tuple[str, ...] = ()
    value: float = 0.0
    _hash: int = field(default=0, compare=False, repr=False)
    _axes: tuple[str, ...] | None = field(default=None, init=False, compare=False, repr=False)
    """``result_axes`` of this term, kept once computed (terms are immutable): asked of every term of
    a deep graph, it would otherwise walk the subgraph below each one (quadratic)."""
    _index_only: bool | None = field(default=None, init=False, compare=False, repr=False)
    """``index_only`` of this term, kept once computed (as ``_axes``)."""
    _same: "Term | None" = field(default=None, init=False, compare=False, repr=False)
    """A term found structurally equal to this one (``__eq__``): equal terms built apart (a graph read
    twice, a plan's certificate replayed) compare in constant time after their first comparison,
    which on a deep chain would otherwise walk the whole chain each time (quadratic)."""

    def __post_init__(self) -> None:
        h = hash((self.op, self.args, self.fn, self.axis, self.name, self.axes, self.value))
        object.__setattr__(self, "_hash", h)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        """Structural equality, iteratively (deep graphs) and once per pair of shared subterms."""
        if self is other:
            return True
        if not isinstance(other, Term):
            return NotImplemented
        stack: list[tuple[Term, Term]] = [(self, other)]
        seen: dict[tuple[int, int], tuple[Term, Term]] = {}
        while stack:
            a, b = stack.pop()
            a, b = _representative(a), _representative(b)
            if a is b or (id(a), id(b)) in seen:
                continue
            seen[(id(a), id(b))] = (a, b)
            if (a._hash != b._hash or a.op != b.op or a.fn != b.fn or a.axis != b.axis or a.name != b.name
                    or a.axes != b.axes or a.value != b.value or len(a.args) != len(b.args)):
                return False
            stack.extend(zip(a.args, b.args, strict=True))
        for a, b in seen.values():  # every pair compared is equal: remember it
            a, b = _representative(a), _representative(b)
            if a is not b:
                object.__setattr__(b, "_same", a)
        return True

    def __repr__(self) -> str:
        return show(self)

    def replace_args(self, args: tuple["Term", ...]) -> "Term":
        return Term(self.op, args, self.fn, self.axis, self.name, self.axes, self.value)


def _representative(t: Term) -> Term:
    """The term ``t`` was last found equal to, following ``Term._same`` links (shortened on the way)."""
    root = t
    while root._same is not None:
        root = root._same
    while t._same is not None and t._same is not root:
        nxt = t._same
        object.__setattr__(t, "_same", root)
        t = nxt
    return root


# --- term constructors -------------------------------------------------------

def inp(name: str, axes: Iterable[str]) -> Term:
    return Term("input", name=name, axes=tuple(axes))


def const(value: float) -> Term:
    return Term("const", value=float(value))


def axis_size(axis: str) -> Term:
    return Term("axis_size", axis=axis)


def iota(axis: str) -> Term:
    return Term("iota", axis=axis)


def where(c: Term, x: Term, y: Term) -> Term:
    return Term("ternary", (c, x, y), fn="where")


def unary(fn: str, x: Term) -> Term:
    return Term("unary", (x,), fn=fn)


def binary(fn: str, a: Term, b: Term) -> Term:
    return Term("binary", (a, b), fn=fn)


def reduce(fn: str, x: Term, axis: str) -> Term:
    return Term("reduce", (x,), fn=fn, axis=axis)


def matmul(a: Term, b: Term, contract: str) -> Term:
    return Term("matmul", (a, b), axis=contract)


def positive_constant(t: Term) -> bool:
    """Whether t has no axes and is positive whatever the sizes: a positive constant, an axis size,
    sqrt/rsqrt/exp of one, or a product or quotient of them (attention's ``rsqrt(|d|)``)."""
    if result_axes(t):
        return False
    if t.op == "const":
        return t.value > 0
    if t.op == "axis_size":
        return True
    if t.op == "unary" and t.fn in ("exp", "exp2"):
        return True
    if t.op == "unary" and t.fn in ("sqrt", "rsqrt"):
        return positive_constant(t.args[0])
    if t.op == "binary" and t.fn in ("mul", "div"):
        return all(positive_constant(x) for x in t.args)
    return False


def positive_scalings(x: Term, axis: str) -> list[tuple[Term, Term, bool]]:
    """``x = y * c`` with ``c`` a positive constant and ``axis`` an axis of ``y``: ``(y, c, y_first)`` for each
    factor order that fits. A softmax over such scores may take its shift of ``y`` and keep ``c`` on the
    exponent (``softmax_scaled_max_shift``, and the log-sum-exp a training forward saves)."""
    if x.op != "binary" or x.fn != "mul":
        return []
    p, q = x.args
    return [(y, c, first) for y, c, first in ((p, q, True), (q, p, False))
            if positive_constant(c) and axis in result_axes(y)]


def scaled_by(y: Term, c: Term, y_first: bool) -> Term:
    """``y * c`` in the factor order ``positive_scalings`` found."""
    return binary("mul", y, c) if y_first else binary("mul", c, y)


SHOW_LIMIT = 400
"""Longest rendering of any term by ``show``: shared subgraphs would otherwise grow it exponentially."""


def _cap(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def show(t: Term, limit: int = SHOW_LIMIT) -> str:
    """A compact, human-readable rendering of a term (for --explain and errors), at most ``limit``
    characters; iterative and memoised over shared subterms, so any graph prints in linear time."""
    memo: dict[Term, str] = {}  # keyed by value: subterms keeps one of several equal subterms
    for u in subterms([t]):
        a = [memo[x] for x in u.args]
        if u.op == "input":
            text = u.name
        elif u.op == "const":
            text = f"{u.value:g}"
        elif u.op == "axis_size":
            text = f"|{u.axis}|"
        elif u.op == "iota":
            text = f"iota_{u.axis}"
        elif u.op == "ternary":
            text = f"{u.fn}({', '.join(a)})"
        elif u.op == "unary":
            text = f"{u.fn}({a[0]})"
        elif u.op == "binary":
            text = f"{u.fn}({a[0]}, {a[1]})"
        elif u.op == "reduce":
            text = f"{u.fn}_{u.axis}({a[0]})"
        elif u.op == "matmul":
            text = f"({a[0]} @{u.axis} {a[1]})"
        else:
            text = f"<{u.op}>"
        memo[u] = _cap(text, limit)
    return memo[t]


def subterms(roots: Iterable[Term], deps: Callable[[Term], Iterable[Term]] | None = None) -> list[Term]:
    """All distinct terms reachable from roots, operands before users.

    ``deps`` replaces a term's operands as the edges to follow (a caller that
    computes some sub-graph another way visits only what that way reads).
    """
    edges = deps or (lambda t: t.args)
    seen: set[Term] = set()
    order: list[Term] = []

    def visit(t: Term) -> None:
        stack: list[tuple[Term, bool]] = [(t, False)]
        while stack:
            cur, done = stack.pop()
            if done:
                if cur not in seen:
                    seen.add(cur)
                    order.append(cur)
                continue
            if cur in seen:
                continue
            stack.append((cur, True))
            for a in reversed(tuple(edges(cur))):
                if a not in seen:
                    stack.append((a, False))

    for r in roots:
        visit(r)
    return order


def softmax_source(t: Term) -> tuple[Term, str] | None:
    """(x, a) when t is ``exp(y) / sum_a(exp(y))`` with softmax_a(x) == t, else None.

    ``y = x - max_a(x)`` (the stable form) is recognised as softmax of x too. Both references
    evaluate such a term as a softmax, shifted by its maximum, because ``exp(y)`` alone overflows
    float64 once y passes 709 (scores divided by a small temperature) while the softmax is finite.
    """
    if t.op != "binary" or t.fn != "div":
        return None
    num, den = t.args
    if num.op != "unary" or num.fn != "exp":
        return None
    if den.op != "reduce" or den.fn != "sum" or den.args[0] != num:
        return None
    y, axis = num.args[0], den.axis
    if y.op == "binary" and y.fn == "sub":
        x, m = y.args
        if m.op == "reduce" and m.fn == "max" and m.axis == axis and m.args[0] == x:
            return x, axis
    return y, axis


def result_axes(t: Term, memo: dict[Term, tuple[str, ...]] | None = None) -> tuple[str, ...]:
    """Named axes of a term's value (order is the canonical memory order); iterative, memoised on the
    terms themselves (``Term._axes``), so each term of a graph is typed once however often it is asked.
    ``memo`` is filled too, for callers that read it."""
    if t._axes is None:
        _fill(t, "_axes", _typed)
    if memo is not None:
        memo[t] = t._axes
    return t._axes


INDEX_OPS = ("iota", "const", "axis_size", "unary", "binary", "ternary")
"""Ops of a term that reads no tensor: indices, constants, sizes and elementwise functions of them."""


def index_only(t: Term) -> bool:
    """Whether every term below t (t too) is one of ``INDEX_OPS`` (a mask predicate, a scale built of
    sizes): iterative, memoised on the terms, so asking it of every term of a deep graph is linear."""
    if t._index_only is None:
        _fill(t, "_index_only", lambda u: u.op in INDEX_OPS and all(a._index_only for a in u.args))
    return bool(t._index_only)


def _typed(u: Term) -> tuple[str, ...]:
    kind = TERM_KINDS.get(u.op)
    if kind is None:
        raise GraphError(f"unknown op {u.op!r}")
    return kind.axes(u, [x._axes for x in u.args])


def _fill(t: Term, attr: str, compute: Callable[[Term], object]) -> None:
    """Set ``attr`` on t and every object below it where it is unset, operands first: iterative, and
    by object rather than by equality (equal terms built apart each get their own value)."""
    stack = [t]
    while stack:
        u = stack[-1]
        if getattr(u, attr) is not None:
            stack.pop()
            continue
        pending = [a for a in u.args if getattr(a, attr) is None]
        if pending:
            stack.extend(pending)
            continue
        object.__setattr__(u, attr, compute(u))
        stack.pop()


# --- whole graphs ------------------------------------------------------------

@dataclass(frozen=True)
class Graph:
    """A named set of output terms plus the axis sizes they are defined over.

    ``labels`` maps terms to the names the author gave them; it is only for
    readable plans and does not take part in equality.
    """

    name: str
    sizes: dict[str, int]
    outputs: tuple[tuple[str, Term], ...]
    labels: dict[Term, str] = field(default_factory=dict, compare=False, hash=False)
    _axes: dict[Term, tuple[str, ...]] = field(default_factory=dict, compare=False, hash=False, repr=False)
    float32_io: frozenset[str] = frozenset()
    """Inputs and outputs stored in float32 whatever the plan dtype: statistics a derived backward reads
    (a softmax's log-sum-exp, ``ir.grad``), whose rounding an exponent would turn into relative error.
    Not part of the graph JSON: a plan carries it as its tensors' dtypes (``plan.views.plan_graph``)."""

    def terms(self) -> list[Term]:
        return subterms(t for _, t in self.outputs)

    def inputs(self) -> list[Term]:
        return [t for t in self.terms() if t.op == "input"]

    def axes_of(self, t: Term) -> tuple[str, ...]:
        return result_axes(t, self._axes)

    def shape_of(self, t: Term) -> tuple[int, ...]:
        return tuple(self.sizes[a] for a in result_axes(t, self._axes))

    def with_sizes(self, overrides: dict[str, int]) -> "Graph":
        for axis, n in overrides.items():
            if axis not in self.sizes:
                raise GraphError(
                    f"--shape names axis {axis!r}, but graph {self.name!r} has axes "
                    f"{sorted(self.sizes)}")
            if n <= 0:
                raise GraphError(f"axis {axis!r} must have a positive size, got {n}")
            if n > MAX_AXIS_SIZE:
                raise GraphError(f"axis {axis!r} has size {n}; the limit is {MAX_AXIS_SIZE} (2**31 - 1)")
        g = Graph(self.name, {**self.sizes, **overrides}, self.outputs, self.labels, float32_io=self.float32_io)
        check(g)
        return g

    def with_outputs(self, outputs: tuple[tuple[str, Term], ...]) -> "Graph":
        names = {n for n, _ in outputs} | {t.name for t in subterms(t for _, t in outputs) if t.op == "input"}
        return Graph(self.name, self.sizes, outputs, self.labels, float32_io=self.float32_io & names)

    def key(self) -> tuple[Term, ...]:
        return tuple(t for _, t in self.outputs)

    def label(self, t: Term, fallback: str) -> str:
        return self.labels.get(t, fallback)


class _Where:
    """``node 'label'`` for error messages, rendered only when an error needs it (show is linear)."""

    def __init__(self, g: Graph, t: Term) -> None:
        self.g, self.t = g, t

    def __format__(self, spec: str) -> str:
        return f"node {self.g.labels.get(self.t) or show(self.t)!r}"


def check(g: Graph) -> None:
    """Type-check a graph: known ops, known axes, consistent contractions.

    Raises GraphError naming the offending node (by label where one exists).
    """
    memo: dict[Term, tuple[str, ...]] = {}
    input_axes: dict[str, tuple[str, ...]] = {}
    if not g.outputs:
        raise GraphError(f"graph {g.name!r} has no outputs")
    for a, n in g.sizes.items():
        if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_AXIS_SIZE:
            raise GraphError(f"axis {a!r} has size {n!r}; sizes are integers from 1 to {MAX_AXIS_SIZE} (2**31 - 1)")
    terms = g.terms()
    if len(terms) > MAX_TERMS:
        raise GraphError(f"graph {g.name!r} has {len(terms)} distinct nodes; the limit is {MAX_TERMS}")
    for t in terms:
        where = _Where(g, t)
        if t.op not in ALL_OPS:
            raise GraphError(f"{where}: unknown op {t.op!r}; known ops: {', '.join(ALL_OPS)}")
        if t.op == "input":
            if len(set(t.axes)) != len(t.axes):
                raise GraphError(f"input {t.name!r} repeats an axis: {list(t.axes)}")
            prev = input_axes.setdefault(t.name, t.axes)
            if prev != t.axes:
                raise GraphError(f"input {t.name!r} is declared with axes {list(prev)} and {list(t.axes)}")
        if t.op == "unary" and t.fn not in UNARY_OPS:
            raise GraphError(f"{where}: unknown unary function {t.fn!r}; known: {', '.join(UNARY_OPS)}")
        if t.op == "binary" and t.fn not in BINARY_OPS:
            raise GraphError(f"{where}: unknown binary function {t.fn!r}; known: {', '.join(BINARY_OPS)}")
        if t.op == "ternary" and t.fn not in TERNARY_OPS:
            raise GraphError(f"{where}: unknown ternary function {t.fn!r}; known: {', '.join(TERNARY_OPS)}")
        if t.op == "reduce" and t.fn not in REDUCE_OPS:
            raise GraphError(f"{where}: unknown reduction {t.fn!r}; known: {', '.join(REDUCE_OPS)}")
        for a in t.axes + ((t.axis,) if t.axis else ()):
            if a not in g.sizes:
                raise GraphError(f"{where}: unknown axis {a!r}; graph axes are {sorted(g.sizes)}")
        if t.op == "const" and math.isnan(t.value):
            raise GraphError(f"{where}: constant must be a number or +-inf, got {t.value}")
        if t.op == "reduce" and t.axis not in result_axes(t.args[0], memo):
            raise GraphError(
                f"{where}: reduces over axis {t.axis!r}, but its operand has axes "
                f"{list(result_axes(t.args[0], memo))}")
        if t.op == "matmul":
            a, b = (result_axes(x, memo) for x in t.args)
            if t.axis not in a or t.axis not in b:
                raise GraphError(
                    f"{where}: contracts axis {t.axis!r}, which both operands must have; "
                    f"left has {list(a)}, right has {list(b)}")
        elements = math.prod(g.sizes[a] for a in result_axes(t, memo))
        if elements > MAX_ELEMENTS:
            raise GraphError(f"{where}: its value has {elements} elements; the limit is {MAX_ELEMENTS} (2**40)")
    names = [n for n, _ in g.outputs]
    if len(set(names)) != len(names):
        raise GraphError(f"graph {g.name!r} repeats an output name: {names}")
    for n, t in g.outputs:
        if not result_axes(t, memo):
            raise GraphError(f"output {n!r} is a scalar; outputs must have at least one axis")


def reads_input(t: Term) -> bool:
    """Whether ``t`` depends on a graph input (a constant, an axis size or an index does not)."""
    return any(u.op == "input" for u in subterms([t]))


def with_unit_axis(g: Graph) -> Graph:
    """``g`` with each scalar output (a loss, a total) given an axis of extent 1, named ``unit``
    (``unit_2``, ... where taken): kernels store tiles of their outputs' axes, so a scalar is stored
    as one element. The output becomes ``x + iota(unit)``, which is ``x + 0``, exactly ``x``.
    A scalar output that reads no input is refused: it is a constant, nothing to compute."""
    memo: dict[Term, tuple[str, ...]] = {}
    scalars = [t for _, t in g.outputs if not result_axes(t, memo)]
    if not scalars:
        return g
    for n, t in g.outputs:
        if t in scalars and not reads_input(t):
            raise GraphError(f"output {n!r} is a scalar that reads no input; an output must be computed "
                             f"from the inputs")
    unit = fresh_name("unit", g.sizes, "unit")
    widened = {t: binary("add", t, iota(unit)) for t in scalars}
    outputs = tuple((n, widened.get(t, t)) for n, t in g.outputs)
    out_names = {n for n, _ in g.outputs}
    labels = {t: lab for t, lab in g.labels.items() if not (t in widened and lab in out_names)}
    labels.update({widened[t]: n for n, t in g.outputs if t in widened})
    return Graph(g.name, {**g.sizes, unit: 1}, outputs, labels, float32_io=g.float32_io)


# --- builder DSL ---------------------------------------------------------------

@dataclass(frozen=True)
class Tensor:
    """A handle the builder returns; wraps a term so Python operators work."""

    term: Term
    builder: "GraphBuilder"

    def __add__(self, o: "Tensor | float") -> "Tensor":
        return self.builder.add(self, o)

    def __sub__(self, o: "Tensor | float") -> "Tensor":
        return self.builder.sub(self, o)

    def __mul__(self, o: "Tensor | float") -> "Tensor":
        return self.builder.mul(self, o)

    def __truediv__(self, o: "Tensor | float") -> "Tensor":
        return self.builder.div(self, o)


class GraphBuilder:
    """Builds a graph in the style ``x = g.input("X", m=1024, d=2048)``.

    Axis sizes are given where an input first names the axis; every later
    mention must agree.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.sizes: dict[str, int] = {}
        self.labels: dict[Term, str] = {}
        self._outputs: list[tuple[str, Term]] = []

    def _wrap(self, t: Term, label: str | None = None) -> Tensor:
        if label:
            self.labels.setdefault(t, label)
        return Tensor(t, self)

    def _lift(self, x: "Tensor | float") -> Term:
        return x.term if isinstance(x, Tensor) else const(x)

    def input(self, name: str, **axes: int) -> Tensor:
        for a, n in axes.items():
            if self.sizes.setdefault(a, n) != n:
                raise GraphError(f"input {name!r}: axis {a!r} has size {n}, earlier {self.sizes[a]}")
        return self._wrap(inp(name, axes), name)

    def const(self, value: float) -> Tensor:
        return self._wrap(const(value))

    def size(self, axis: str) -> Tensor:
        return self._wrap(axis_size(axis))

    def iota(self, axis: str) -> Tensor:
        """The index along ``axis`` (0 .. size-1) as a value; the axis must be named by an input."""
        if axis not in self.sizes:
            raise GraphError(f"iota over axis {axis!r}: no input names that axis yet")
        return self._wrap(iota(axis))

    def where(self, c: "Tensor | float", x: "Tensor | float", y: "Tensor | float",
              name: str | None = None) -> Tensor:
        """x where c != 0, else y."""
        return self._wrap(where(self._lift(c), self._lift(x), self._lift(y)), name)

    def lt(self, a: "Tensor | float", b: "Tensor | float", name: str | None = None) -> Tensor:
        return self.binary("lt", a, b, name)

    def le(self, a: "Tensor | float", b: "Tensor | float", name: str | None = None) -> Tensor:
        return self.binary("le", a, b, name)

    def masked(self, x: Tensor, keep: Tensor, name: str | None = None) -> Tensor:
        """x where the predicate ``keep`` holds, -inf elsewhere (a score mask before softmax)."""
        return self.where(keep, x, -math.inf, name)

    def unary(self, fn: str, x: Tensor, name: str | None = None) -> Tensor:
        return self._wrap(unary(fn, x.term), name)

    def binary(self, fn: str, a: "Tensor | float", b: "Tensor | float", name: str | None = None) -> Tensor:
        return self._wrap(binary(fn, self._lift(a), self._lift(b)), name)

    def add(self, a: "Tensor | float", b: "Tensor | float", name: str | None = None) -> Tensor:
        return self.binary("add", a, b, name)

    def sub(self, a: "Tensor | float", b: "Tensor | float", name: str | None = None) -> Tensor:
        return self.binary("sub", a, b, name)

    def mul(self, a: "Tensor | float", b: "Tensor | float", name: str | None = None) -> Tensor:
        return self.binary("mul", a, b, name)

    def div(self, a: "Tensor | float", b: "Tensor | float", name: str | None = None) -> Tensor:
        return self.binary("div", a, b, name)

    def reduce(self, fn: str, x: Tensor, axis: str, name: str | None = None) -> Tensor:
        return self._wrap(reduce(fn, x.term, axis), name)

    def matmul(self, a: Tensor, b: Tensor, contract: str, name: str | None = None) -> Tensor:
        return self._wrap(matmul(a.term, b.term, contract), name)

    # sub-graph helpers: they expand into primitive ops, so rules see through them
    def softmax(self, x: Tensor, axis: str, name: str | None = None) -> Tensor:
        e = self.unary("exp", x)
        return self.div(e, self.reduce("sum", e, axis), name)

    def rmsnorm(self, x: Tensor, axis: str, eps: float = 1e-6, name: str | None = None) -> Tensor:
        ms = self.reduce("mean", self.unary("square", x), axis)
        return self.mul(x, self.unary("rsqrt", self.add(ms, eps)), name)

    def layernorm(self, x: Tensor, axis: str, eps: float = 1e-5, name: str | None = None) -> Tensor:
        centered = self.sub(x, self.reduce("mean", x, axis))
        var = self.reduce("mean", self.unary("square", centered), axis)
        return self.mul(centered, self.unary("rsqrt", self.add(var, eps)), name)

    def output(self, name: str, x: Tensor) -> None:
        self.labels[x.term] = name
        self._outputs.append((name, x.term))

    def build(self) -> Graph:
        g = with_unit_axis(Graph(self.name, dict(self.sizes), tuple(self._outputs), dict(self.labels)))
        check(g)
        return g


def iter_positions(t: Term) -> Iterator[tuple[Term, tuple[int, ...]]]:
    """Each subterm occurrence of a tree with its path (for rule application)."""
    stack: list[tuple[Term, tuple[int, ...]]] = [(t, ())]
    while stack:
        cur, path = stack.pop()
        yield cur, path
        for i, a in enumerate(cur.args):
            stack.append((a, path + (i,)))
