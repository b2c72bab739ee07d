"""Torch expressions over named axes, as generated reference code writes them: literals, permutes and broadcasts
between axis orders, a contraction as one batched ``torch.matmul``, and the magnitudes beside each value that
``run.conditioning.decision_tolerance`` bounds a kernel's rounding with. ``run.baselines`` composes them into
whole functions; they are apart so that module stays about the graph, not about index bookkeeping."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from pyrunner.ir.graph import Term
from pyrunner.ir.ops import REDUCTIONS


def lit(v: float) -> str:
    """A Python literal for a constant (infinities included)."""
    return repr(v) if math.isfinite(v) else f"float({str(v)!r})"


def permute(x: str, have: tuple[str, ...], want: tuple[str, ...]) -> str:
    """Code reordering x's dims (same axis set) from `have` to `want`."""
    if have == want:
        return x
    return f"{x}.permute({', '.join(str(have.index(a)) for a in want)})"


def reshape(x: str, shape: list[int]) -> str:
    return f"{x}.reshape({', '.join(str(n) for n in shape)})"


def broadcast(x: str, have: tuple[str, ...], want: tuple[str, ...], sizes: Mapping[str, int]) -> str:
    """Code viewing x (axes `have`, a subset of `want`) as broadcastable against `want`."""
    if have == want or not have:
        return x
    order = tuple(sorted(have, key=want.index))
    y = permute(x, have, order)
    if order == want:
        return y
    return reshape(y, [sizes[a] if a in have else 1 for a in want])


def matmul_code(a: str, a_axes: tuple[str, ...], b: str, b_axes: tuple[str, ...], contract: str,
                 out_axes: tuple[str, ...], sizes: Mapping[str, int]) -> str:
    """A named-axis contraction as one (batched) ``torch.matmul``.

    Batch axes are those both operands carry; each operand's other axes are
    flattened into the matrix's free dimension (a view where there is one).
    """
    batch = tuple(x for x in a_axes if x in b_axes and x != contract)
    left = tuple(x for x in a_axes if x not in batch and x != contract)
    right = tuple(x for x in b_axes if x not in batch and x != contract)
    bshape = [sizes[x] for x in batch]
    a2 = permute(a, a_axes, batch + left + (contract,))
    b2 = permute(b, b_axes, batch + (contract,) + right)
    if len(left) != 1:
        a2 = reshape(a2, bshape + [math.prod(sizes[x] for x in left), sizes[contract]])
    if len(right) != 1:
        b2 = reshape(b2, bshape + [sizes[contract], math.prod(sizes[x] for x in right)])
    c = f"torch.matmul({a2}, {b2})"
    have = batch + left + right
    if len(left) != 1 or len(right) != 1:
        c = reshape(c, [sizes[x] for x in have])
    return permute(c, have, out_axes)


@dataclass(frozen=True)
class Values:
    """How generated code names each value and its magnitude (``_source``'s tables)."""

    name: Mapping[Term, str]
    consts: Mapping[Term, float]
    axes: Mapping[Term, tuple[str, ...]]
    sizes: Mapping[str, int]

    def value(self, x: Term, want: tuple[str, ...]) -> str:
        """``x``'s value viewed against the axes ``want`` (a constant as a Python number)."""
        if x in self.consts:
            return lit(self.consts[x])
        return broadcast(self.name[x], self.axes[x], want, self.sizes)

    def mag(self, x: Term, want: tuple[str, ...] | None = None) -> str:
        """The magnitude of ``x``'s value (``want``: viewed against those axes)."""
        if x in self.consts:
            return lit(abs(self.consts[x]))
        m = f"m{self.name[x]}"
        return m if want is None else broadcast(m, self.axes[x], want, self.sizes)


def magnitude_code(t: Term, v: str, vals: Values) -> str:
    """The magnitude a kernel's float32 rounding of ``t`` scales with: a running error analysis's bound, one
    rule per linear op (a contraction's ``|A| @ |B|``, a sum's sum of magnitudes, a sum's or product's of its
    operands'), the value's own size for everything else. Where a contraction cancels (``X W`` near 0 in a
    row of large products) its rounding is that of the products, not of the small result."""
    axes = vals.axes
    if t.op == "matmul":
        a, b = t.args
        return matmul_code(vals.mag(a), axes[a], vals.mag(b), axes[b], t.axis, axes[t], vals.sizes)
    if t.op == "reduce" and t.fn in ("sum", "mean"):
        return REDUCTIONS[t.fn].torch.format(vals.mag(t.args[0]), axes[t.args[0]].index(t.axis))
    if t.op == "unary" and t.fn == "neg":
        return vals.mag(t.args[0])
    if t.op == "binary" and t.fn in ("add", "sub", "mul"):
        ma, mb = (vals.mag(x, axes[t]) for x in t.args)
        return f"({ma} {'*' if t.fn == 'mul' else '+'} {mb})"
    return f"{v}.abs().double()"
