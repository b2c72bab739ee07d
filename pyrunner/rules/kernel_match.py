"""A kernel's index predicates and constants come from the terms its certificate says it computes.

The replay proves the kernels' terms compose to the derived graph; whether a kernel's ops compute
its terms is the renderer's and executor's business. One part of that is cheap to check and is
where a hand edit hides: the expressions a kernel evaluates without reading a buffer (mask
predicates such as a sliding window's ``t_q - 1024 < t_kv``, the loop's ``visible`` predicate,
constant scales). Each must be the plan expression of a sub-term of the kernel's terms that reads
no tensor, or one of the few the lowering adds itself: a reduction's identity (0, 1, +-inf), the
padding mask ``index(a) < size(a)`` (true at every real element), the extent dividing a mean, or a
product of allowed factors (an exponent's folded scale). Checked, not proven.

A loop's ``visible`` predicate must moreover satisfy ``masked_tile_skip``'s side condition: each of its
conjuncts is a conjunct of a mask whose all-false tiles leave every loop accumulator unchanged
(``loop_body.skip_predicates``, the planner's abstract evaluation of the loop body), so a hand edit that
skips tiles of a mask whose hidden elements still count fails here. That a skipped tile is all false
is interval reasoning (``plan.masks``; proved in Lean, ``Superopt/Masks.lean``).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator, Mapping, Sequence

from pydantic import TypeAdapter

from pyrunner.errors import PlanError
from pyrunner.ir.graph import Term, subterms
from pyrunner.plan.analysis import constant_value
from pyrunner.plan.schema import Expr, Kernel, Map
from pyrunner.rules.loop_body import skip_predicates

STATIC_OPS = ("iota", "const", "axis_size", "unary", "binary", "ternary")
IDENTITIES = (0.0, 1.0, "-inf", "inf")
_EXPR: TypeAdapter = TypeAdapter(Expr)


def _expr(t: Term) -> dict:
    """The plan expression (as JSON) of a term that reads no tensor (``lower.static_expr``)."""
    if t.op == "const":
        v = t.value
        return {"kind": "const", "value": ("-inf" if v < 0 else "inf") if math.isinf(v) else v}
    if t.op == "axis_size":
        return {"kind": "size", "axis": t.axis}
    if t.op == "iota":
        return {"kind": "index", "axis": t.axis}
    return {"kind": "call", "fn": t.fn, "args": [_expr(a) for a in t.args]}


def _key(e: dict) -> str:
    return json.dumps(e, sort_keys=True)


def _has_ref(e: dict) -> bool:
    return e["kind"] == "ref" or (e["kind"] == "call" and any(_has_ref(a) for a in e["args"]))


def _bufferless(e: dict) -> Iterator[tuple[dict, str]]:
    """The largest sub-expressions of e that read no buffer, each with the function it is an argument
    of ('' at the top)."""
    stack = [(e, "")]
    while stack:
        x, parent = stack.pop()
        if not _has_ref(x):
            yield x, parent
        elif x["kind"] == "call":
            stack.extend((a, x["fn"]) for a in x["args"])


def _folded(v: float | str, values: list[float]) -> bool:
    """v is a product of up to three of the kernel terms' constant values (a folded coefficient)."""
    if isinstance(v, str):
        return False
    for n in (1, 2, 3):
        for combo in itertools.combinations_with_replacement(values, n):
            if math.isclose(v, math.prod(combo), rel_tol=1e-12, abs_tol=0.0):
                return True
    return False


def _allowed(e: dict, parent: str, known: set[str], means: set[str], values: list[float]) -> bool:
    """e is a kernel term's expression, or one the lowering adds (a reduction's identity selected by a
    ``where`` or compared with, a padding mask, a mean's extent), or a product of kernel terms'
    expressions or values (a folded scale)."""
    if _key(e) in known:
        return True
    kind = e["kind"]
    if kind == "const":
        return (e["value"] in IDENTITIES and parent in ("where", "lt", "le")) or _folded(e["value"], values)
    if kind == "size":
        return e["axis"] in means
    args = e.get("args", [])
    if kind == "call" and e["fn"] == "lt" and len(args) == 2:
        a, b = args
        return a["kind"] == "index" and b["kind"] == "size" and a["axis"] == b["axis"]
    return kind == "call" and e["fn"] == "mul" and _product_of(e, known)


def _product_of(e: dict, known: set[str]) -> bool:
    if _key(e) in known:
        return True
    return e["kind"] == "call" and e["fn"] == "mul" and all(_product_of(a, known) for a in e["args"])


def _conjuncts(e: dict) -> Iterator[dict]:
    stack = [e]
    while stack:
        x = stack.pop()
        if x["kind"] == "call" and x["fn"] == "min" and len(x["args"]) == 2:
            stack.extend(x["args"])
        else:
            yield x


def _nodes(e: dict) -> Iterator[dict]:
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        if x["kind"] == "call":
            stack.extend(x["args"])


def _value(t: Term, sizes: Mapping[str, int]) -> float | None:
    """A static term's value when it reads no index (``analysis.constant_value``)."""
    if any(u.op == "iota" for u in subterms([t])):
        return None
    return constant_value(_EXPR.validate_python(_expr(t)), sizes)


def mask_exprs(roots: Sequence[Term]) -> list[dict]:
    """The plan expressions of the ``where`` conditions among the terms' sub-terms that read no tensor
    (the masks a kernel computing ``roots`` applies; ``plan.schedule_rules`` checks a loop's skips
    against them, as ``Superopt/Schedule.lean`` does)."""
    out: list[dict] = []
    for t in subterms(roots):
        if t.op == "ternary" and t.fn == "where" and all(u.op in STATIC_OPS for u in subterms([t.args[0]])):
            e = _expr(t.args[0])
            if e not in out:
                out.append(e)
    return out


def check_kernel_exprs(ki: int, kernel: Kernel, roots: Sequence[Term], sizes: Mapping[str, int]) -> None:
    """PlanError naming the op whose bufferless expression is not one of the kernel's terms', or the
    mask predicate of the kernel's terms that no op evaluates."""
    terms = subterms(roots)
    static = [t for t in terms if all(u.op in STATIC_OPS for u in subterms([t]))]
    known = {_key(_expr(t)) for t in static}
    means = {t.axis for t in terms if t.op == "reduce" and t.fn == "mean"}
    values = sorted({v for t in static if (v := _value(t, sizes)) is not None and v not in (0.0, 1.0)})[:12]
    kw = f"kernels[{ki}] {kernel.name!r}"
    evaluated: set[str] = set()
    for section in ("prologue", "body", "epilogue"):
        for oi, op in enumerate(getattr(kernel, section)):
            if not isinstance(op, Map):
                continue
            for e, parent in _bufferless(op.expr.model_dump(mode="json")):
                if not _allowed(e, parent, known, means, values):
                    raise PlanError(f"{kw}.{section}[{oi}]: the expression {_key(e)[:120]} is not one of the "
                                    f"terms the certificate says this kernel computes")
                evaluated.update(_key(x) for x in _nodes(e))
    if kernel.loop is not None and kernel.loop.visible is not None:
        for e in _conjuncts(kernel.loop.visible.model_dump(mode="json")):
            if _key(e) not in known:
                raise PlanError(f"{kw}.loop.visible: the predicate {_key(e)[:120]} is not a mask of the terms "
                                f"the certificate says this kernel computes")
    _check_skippable(kw, kernel, roots)
    for t in terms:
        if t.op == "ternary" and t.args[0] in static and _key(_expr(t.args[0])) not in evaluated:
            raise PlanError(f"{kw}: no op evaluates the mask predicate {_key(_expr(t.args[0]))[:120]} of the "
                            f"terms the certificate says this kernel computes")


def _check_skippable(kw: str, kernel: Kernel, roots: Sequence[Term]) -> None:
    """PlanError where a conjunct of the loop's ``visible`` predicate is not part of a mask whose
    all-false tiles the loop may skip (a tile is skipped when one conjunct is false throughout, so
    each conjunct must make a skippable mask false there too)."""
    if kernel.loop is None or kernel.loop.visible is None:
        return
    root = roots[0] if len(roots) == 1 else tuple(roots)
    allowed = {_key(e) for p in skip_predicates(root, kernel.loop.axis) for e in _conjuncts(_expr(p))}
    for e in _conjuncts(kernel.loop.visible.model_dump(mode="json")):
        if _key(e) not in allowed:
            raise PlanError(f"{kw}.loop.visible: the loop may not skip tiles where {_key(e)[:120]} is false: "
                            "the masked elements still change a loop accumulator (masked_tile_skip's side "
                            "condition)")
