"""Index predicates over tiles: which tiles a mask hides entirely, shows entirely, or cuts.

A mask is plain expression data: comparisons (``lt``/``le``) of affine forms in element indices
(``Index``), combined with ``min``/``mul`` (and) and ``max`` (or). Over a tile every index lies
in an interval, so each comparison's affine form ``f`` has a least and a greatest value there
(interval arithmetic, exact for one affine form):

* all false on the tile when ``min f > 0`` (for ``f <= 0``): the tile is fully masked;
* all true when ``max f <= 0``: fully visible, the predicate need not be applied.

``and``/``or`` combine these soundly (a conjunction is all false if one part is, all true if all
parts are; dually for a disjunction). Anything else in a predicate (a loaded tensor, say key
lengths per batch row) is *unknown*: never proven either way, so it is always applied.

The same formulas give the range of loop steps a streamed loop must run (the steps whose tile is
not provably all false), solved per comparison for the loop axis's step. They are written once
over an ``Arith`` (``IntArith``: numbers, for the CPU executor and the cost model;
``SrcArith``: TileLang source text, for the renderer), so the executor runs exactly the loop
bounds the kernel source shows.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar, Union

from pyrunner.plan.schema import AxisSize, Call, Const, Expr, Index, Map, Ref

N = TypeVar("N")


# --- predicate structure ---------------------------------------------------------------------

@dataclass(frozen=True)
class Atom:
    """``sum(coef[a] * index(a)) + offset <= 0`` with integer coefficients."""

    coef: tuple[tuple[str, int], ...]
    offset: int

    def c(self, axis: str) -> int:
        return dict(self.coef).get(axis, 0)


@dataclass(frozen=True)
class All:
    parts: tuple["Pred", ...]


@dataclass(frozen=True)
class Any_:
    parts: tuple["Pred", ...]


@dataclass(frozen=True)
class Unknown:
    """A predicate the interval reasoning does not see through (always applied, never skipped)."""


Pred = Union[Atom, All, Any_, Unknown]


def _int(v: float) -> int | None:
    return int(v) if float(v).is_integer() and abs(v) < 2**31 else None


def size_symbol(axis: str) -> str:
    """The name an axis extent has in affine forms and boxes (its interval is the one value)."""
    return f"#size:{axis}"


def affine(e: Expr) -> dict[str, int] | None:
    """``e`` as an integer affine form in indices and axis extents (key "" is the constant), or None."""
    if isinstance(e, Index):
        return {e.axis: 1}
    if isinstance(e, AxisSize):
        return {size_symbol(e.axis): 1}
    if isinstance(e, Const):
        v = e.number()
        i = _int(v) if v == v and abs(v) != float("inf") else None
        return None if i is None else {"": i}
    if isinstance(e, Call) and e.fn in ("add", "sub"):
        a, b = (affine(x) for x in e.args)
        if a is None or b is None:
            return None
        sign = 1 if e.fn == "add" else -1
        out = dict(a)
        for k, v in b.items():
            out[k] = out.get(k, 0) + sign * v
        return out
    if isinstance(e, Call) and e.fn == "neg":
        a = affine(e.args[0])
        return None if a is None else {k: -v for k, v in a.items()}
    if isinstance(e, Call) and e.fn == "mul":
        a, b = (affine(x) for x in e.args)
        if a is None or b is None:
            return None
        for x, y in ((a, b), (b, a)):
            if set(y) <= {""}:
                k = y.get("", 0)
                return {n: v * k for n, v in x.items()}
    return None


def _atom(form: dict[str, int]) -> Atom:
    coef = tuple(sorted((a, c) for a, c in form.items() if a and c))
    return Atom(coef, form.get("", 0))


def predicate(e: Expr) -> Pred:
    """The structure of an index predicate (value != 0 means visible)."""
    if isinstance(e, Call) and e.fn in ("lt", "le"):
        a, b = (affine(x) for x in e.args)
        if a is None or b is None:
            return Unknown()
        form = dict(a)
        for k, v in b.items():
            form[k] = form.get(k, 0) - v
        if e.fn == "lt":  # integers: a < b  <=>  a - b + 1 <= 0
            form[""] = form.get("", 0) + 1
        return _atom(form)
    if isinstance(e, Call) and e.fn in ("min", "mul"):
        return All(tuple(predicate(x) for x in e.args))
    if isinstance(e, Call) and e.fn == "max":
        return Any_(tuple(predicate(x) for x in e.args))
    if isinstance(e, Const):
        return _atom({"": -1 if e.number() != 0 else 1})
    return Unknown()


def is_index_predicate(e: Expr) -> bool:
    """Whether ``e`` is a predicate the interval reasoning understands completely."""
    def known(p: Pred) -> bool:
        if isinstance(p, Unknown):
            return False
        return isinstance(p, Atom) or all(known(x) for x in p.parts)

    return known(predicate(e))


# --- arithmetic over numbers or source text ------------------------------------------------------

class Arith(Generic[N]):
    """Integer arithmetic the bound formulas are written in."""

    def const(self, v: int) -> N:
        raise NotImplementedError

    def add(self, a: N, b: N) -> N:
        raise NotImplementedError

    def scale(self, a: N, k: int) -> N:
        raise NotImplementedError

    def mul(self, a: N, b: N) -> N:
        raise NotImplementedError

    def floordiv(self, a: N, k: N) -> N:
        """Floor division by a positive value."""
        raise NotImplementedError

    def max(self, a: N, b: N) -> N:
        raise NotImplementedError

    def min(self, a: N, b: N) -> N:
        raise NotImplementedError


class IntArith(Arith[int]):
    def const(self, v: int) -> int:
        return v

    def add(self, a: int, b: int) -> int:
        return a + b

    def scale(self, a: int, k: int) -> int:
        return a * k

    def mul(self, a: int, b: int) -> int:
        return a * b

    def floordiv(self, a: int, k: int) -> int:
        return a // k

    def max(self, a: int, b: int) -> int:
        return max(a, b)

    def min(self, a: int, b: int) -> int:
        return min(a, b)


class SrcArith(Arith[str]):
    """TileLang (TVMScript) integer expressions; ``//`` on PrimExprs is floor division."""

    @staticmethod
    def _num(a: str) -> int | None:
        try:
            return int(a)
        except ValueError:
            return None

    def const(self, v: int) -> str:
        return str(v)

    def add(self, a: str, b: str) -> str:
        x, y = self._num(a), self._num(b)
        if x is not None and y is not None:
            return str(x + y)
        if y == 0:
            return a
        if x == 0:
            return b
        if y is not None and y < 0:
            return f"{a} - {-y}"
        if b.startswith("-(") and b.endswith(")") and _balanced(b[2:-1]):
            return f"{a} - {b[1:]}"
        return f"{a} + {b}"

    def scale(self, a: str, k: int) -> str:
        x = self._num(a)
        if x is not None:
            return str(x * k)
        if k == 1:
            return a
        if k == 0:
            return "0"
        if k == -1:
            return a[2:-1] if a.startswith("-(") and a.endswith(")") and _balanced(a[2:-1]) else f"-({a})"
        return f"({a}) * {k}" if k > 0 else f"-(({a}) * {-k})"

    def mul(self, a: str, b: str) -> str:
        x, y = self._num(a), self._num(b)
        if x is not None and y is not None:
            return str(x * y)
        if x is not None:
            return self.scale(b, x)
        if y is not None:
            return self.scale(a, y)
        return f"({a}) * ({b})"

    def floordiv(self, a: str, k: str) -> str:
        x, y = self._num(a), self._num(k)
        if x is not None and y is not None:
            return str(x // y)
        return a if y == 1 else f"({a}) // ({k})"

    def max(self, a: str, b: str) -> str:
        x, y = self._num(a), self._num(b)
        return str(max(x, y)) if x is not None and y is not None else f"T.max({a}, {b})"

    def min(self, a: str, b: str) -> str:
        x, y = self._num(a), self._num(b)
        return str(min(x, y)) if x is not None and y is not None else f"T.min({a}, {b})"


def _balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


# --- tiles ------------------------------------------------------------------------------------

Box = Mapping[str, tuple[N, N]]
"""Per axis, the least and greatest index of the tile (inclusive)."""


def _extreme(atom: Atom, box: Box, ar: Arith[N], least: bool, skip: str = "") -> N | None:
    """Least (or greatest) value of the atom's form over the box, leaving out axis ``skip``."""
    acc = ar.const(atom.offset)
    for a, c in atom.coef:
        if a == skip:
            continue
        if a not in box:
            return None
        lo, hi = box[a]
        acc = ar.add(acc, ar.scale(lo if (c > 0) == least else hi, c))
    return acc


@dataclass(frozen=True)
class TileTest(Generic[N]):
    """Per tile: ``all_false`` > 0 proves every element masked; ``all_true`` <= 0 proves every
    element visible; None where nothing can be proven."""

    all_false: N | None
    all_true: N | None


def tile_test(p: Pred, box: Box, ar: Arith[N]) -> TileTest[N]:
    if isinstance(p, Unknown):
        return TileTest(None, None)
    if isinstance(p, Atom):
        return TileTest(_extreme(p, box, ar, True), _extreme(p, box, ar, False))
    parts = [tile_test(x, box, ar) for x in p.parts]
    f = [t.all_false for t in parts]
    u = [t.all_true for t in parts]

    def fold(xs: list[N | None], op, need_all: bool) -> N | None:
        known = [x for x in xs if x is not None]
        if not known or (need_all and len(known) != len(xs)):
            return None
        acc = known[0]
        for x in known[1:]:
            acc = op(acc, x)
        return acc

    if isinstance(p, All):  # all false if any part is; all true if every part is
        return TileTest(fold(f, ar.max, False), fold(u, ar.max, True))
    return TileTest(fold(f, ar.min, True), fold(u, ar.min, False))


def step_range(p: Pred, axis: str, block: N, steps: N, box: Box, ar: Arith[N]) -> tuple[N, N]:
    """Loop steps ``[lo, hi)`` (of ``steps``, ``block`` indices each along ``axis``) outside which
    every tile is provably all false; ``box`` bounds the other axes."""
    full = (ar.const(0), steps)
    if isinstance(p, Unknown):
        return full
    if isinstance(p, Atom):
        c = p.c(axis)
        rest = _extreme(p, box, ar, True, skip=axis)
        if c == 0 or rest is None:
            return full
        if c > 0:  # some element visible iff c*j*B + rest <= 0  iff  j <= floor(-rest / (c*B))
            hi = ar.add(ar.floordiv(ar.scale(rest, -1), ar.scale(block, c)), ar.const(1))
            return ar.const(0), ar.min(ar.max(hi, ar.const(0)), steps)
        a = -c  # some element visible iff a*(j*B + B - 1) >= rest  iff  j >= ceil((ceil(rest/a) - B + 1) / B)
        need = ar.scale(ar.floordiv(ar.scale(rest, -1), ar.const(a)), -1)  # ceil(rest / a)
        lo = ar.scale(ar.floordiv(ar.scale(ar.add(ar.add(need, ar.const(1)), ar.scale(block, -1)), -1), block), -1)
        return ar.min(ar.max(lo, ar.const(0)), steps), steps
    ranges = [step_range(x, axis, block, steps, box, ar) for x in p.parts]
    lo, hi = ranges[0]
    for lo2, hi2 in ranges[1:]:
        if isinstance(p, All):
            lo, hi = ar.max(lo, lo2), ar.min(hi, hi2)
        else:  # the hull of a union: sound, as only steps outside every part are left out
            lo, hi = ar.min(lo, lo2), ar.max(hi, hi2)
    return lo, ar.max(hi, lo) if isinstance(p, All) else hi


def visible_steps(p: Pred, axis: str, block: int, steps: int, box: Box[int]) -> range:
    """The loop steps a block runs, as numbers."""
    lo, hi = step_range(p, axis, block, steps, box, IntArith())
    return range(lo, max(lo, hi))


def visible_fraction(p: Pred, axis: str, block: int, size: int, grid: Mapping[str, tuple[int, int]]) -> float:
    """Fraction of loop steps run, over all blocks of the grid axes the predicate names
    (``grid``: axis -> (block, size)); for the cost model."""
    named = _axes(p)
    return _fraction(p, axis, block, size, tuple(sorted((a, v) for a, v in grid.items() if a in named)))


@functools.lru_cache(maxsize=4096)
def _fraction(p: Pred, axis: str, block: int, size: int, grid_items: tuple) -> float:
    grid = dict(grid_items)
    steps = -(-size // block)
    axes = sorted(grid)
    total = run = 0
    counts = [-(-grid[a][1] // grid[a][0]) for a in axes]
    coords = [0] * len(axes)
    while True:
        box = {a: (c * grid[a][0], min(grid[a][1], (c + 1) * grid[a][0]) - 1) for a, c in zip(axes, coords)}
        total += steps
        run += len(visible_steps(p, axis, block, steps, box))
        i = len(axes) - 1
        while i >= 0:
            coords[i] += 1
            if coords[i] < counts[i]:
                break
            coords[i] = 0
            i -= 1
        if i < 0:
            break
    return run / total if total else 1.0


def _axes(p: Pred) -> set[str]:
    if isinstance(p, Atom):
        return {a for a, _ in p.coef}
    if isinstance(p, Unknown):
        return set()
    return set().union(*(_axes(x) for x in p.parts))


def mask_predicate(op: Map) -> Pred | None:
    """If ``op`` masks its destination in place (``dst = where(p, dst, other)``) with a predicate the
    interval reasoning understands, that predicate: on a tile where it is all true the op is a no-op
    and is left out."""
    e = op.expr
    if not (isinstance(e, Call) and e.fn == "where" and e.args[1] == Ref(buf=op.dst)):
        return None
    return predicate(e.args[0]) if is_index_predicate(e.args[0]) else None
