"""The inputs every numerical check runs on (``CHECK_DRAWS``), and when a draw can be checked at all.

Why: the CPU executor check and the GPU check must draw the same inputs (a plan that passes one on
values the other never sees is a hole): both take their draws (``CHECK_DRAWS``), and the rule that lowers a
later draw's magnitude where the graph's own values leave the plan's dtypes, from here. The planted draw
checks where the plan computes each value (tails), which a reduction hides on normal and outlier inputs.
A backward plan that records its derivation takes each draw through
``run.backward_draws.plan_draws``: the draw makes its forward inputs and cotangents, and its saved tensors
are computed from them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, NamedTuple, TypeVar

import numpy as np

from pyrunner.ir.reference import OUTLIER_MAGNITUDE, OUTLIER_RATE, OUTLIER_SCALE, outlier_inputs, random_inputs

if TYPE_CHECKING:  # pragma: no cover
    from pyrunner.ir.graph import Graph
    from pyrunner.plan.schema import Plan

DTYPE_MAX: dict[str, float] = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38}
"""Largest finite value of each storage dtype."""


@dataclass(frozen=True)
class Draw:
    """One kind of input every check runs on, drawn from the run's seed."""

    name: str
    magnitudes: tuple[float, ...]
    """Outlier magnitudes tried in turn until the graph's values fit the plan's dtypes (0: no outliers):
    a SwiGLU of two +-20 outliers reaches 1.6e5, past float16, and no fp16 output can hold it."""

    def make(self, graph: Graph, seed: int, magnitude: float) -> dict[str, np.ndarray]:
        return outlier_inputs(graph, seed, magnitude=magnitude) if magnitude else random_inputs(graph, seed)

    def series(self, graph: Graph, seed: int) -> Iterator[tuple[float, dict[str, np.ndarray]]]:
        """Each magnitude with its inputs, drawn as it is asked for (a check stops at the first that fits)."""
        for m in self.magnitudes:
            yield m, self.make(graph, seed, m)

    def label(self, magnitude: float) -> str:
        """How a message names a later draw (the first is named by its seed line only)."""
        return f"on {self.name} inputs (up to {magnitude:g})" if magnitude else f"on {self.name} inputs"

    def applies(self, graph: Graph) -> bool:
        """Whether a check of ``graph`` draws these inputs at all."""
        return True

    def accepts(self, prepared: object) -> bool:
        """Whether a later draw's magnitude is taken, beyond the graph's values fitting the dtypes."""
        return True

    def describe(self, magnitude: float) -> str:
        if not magnitude:
            return "normal, std 0.5"
        return (f"normal, std {OUTLIER_SCALE:g}, with outliers of magnitude {magnitude / 2:g} to {magnitude:g} "
                f"in every row and {OUTLIER_RATE:.0%} of entries")


@dataclass(frozen=True)
class PlantedDraw(Draw):
    """A draw that plants each input's largest values where a dropped tail would lose them (``planted_inputs``).

    Why: a plan that drops the last row or tile of a tensor its graph then reduces (a max, a mean of
    squares, a softmax) changes one value among many, and on normal or outlier inputs that value is
    rarely the one that matters: the maximum sits elsewhere, a mean moves by 1/m, a softmax's last
    probability is 1e-4 of its largest (issue 46: 5 of 378 edited plans passed so). Here the last index
    of every kept axis holds the extreme by construction. Only graphs with a reduction draw it: without
    one every output element sees its own row, and the other draws catch a dropped one."""

    def make(self, graph: Graph, seed: int, magnitude: float) -> dict[str, np.ndarray]:
        return planted_inputs(graph, seed, magnitude)

    def series(self, graph: Graph, seed: int) -> Iterator[tuple[float, dict[str, np.ndarray]]]:
        """The first scale drawn, each later one that draw scaled: ``planted_inputs`` is linear in its scale and
        every scale is a power-of-two multiple of the first, so the values are the ones ``make`` draws, bit for
        bit (tested), at the cost of a multiplication instead of a draw (0.5 s at attention's real shape, 70 s for
        batched decode attention's 1.1e9 input values on a loaded 2-core machine)."""
        first = self.magnitudes[0]
        base = self.make(graph, seed, first)
        for m in self.magnitudes:
            yield m, base if m == first else {k: v * (m / first) for k, v in base.items()}

    def label(self, magnitude: float) -> str:
        return f"on {self.name} inputs (std {magnitude:g})"

    def describe(self, magnitude: float) -> str:
        return (f"normal, std {magnitude:g}, the last index of every uncontracted axis x{PLANTED_BOOST:g} and its "
                "values' signs aligned along contracted axes")

    def applies(self, graph: Graph) -> bool:
        return any(t.op == "reduce" for t in graph.terms())

    def accepts(self, prepared: object) -> bool:
        """Only a scale at which rounding the graph's computed GEMM operands moves the reference by at most
        ``PLANTED_CONDITIONING`` of the a-priori bound (``operand_error``, ``a_priori`` of a prepared draw): the
        planted corner's large scores make a softmax after a computed contraction ill-conditioned
        (projected-query attention in bfloat16 at std 0.25: 4e-3, and a correct plan, rounding more values
        than those operands, 1.1e-2 past the bound raised to 8e-3); a smaller scale keeps the corner the
        largest value while the rounding's effect shrinks with it."""
        return getattr(prepared, "operand_error", 0.0) <= PLANTED_CONDITIONING * getattr(prepared, "a_priori", math.inf)


PLANTED_BOOST = 4.0
"""How much larger ``planted_inputs``' planted slices are than the rest."""
PLANTED_CONDITIONING = 0.25
"""Largest share of the a-priori bound the graph's own operand rounding may take on a planted draw (a correct
plan rounds more values than those operands: 2.7 times their error on projected-query attention)."""


def planted_inputs(graph: Graph, seed: int, scale: float = 0.5) -> dict[str, np.ndarray]:
    """Normal inputs (std ``scale``) whose extremes sit at the last index of every axis no matmul contracts.

    Each input's entries on the last index of one of its uncontracted axes (its planted slice) are scaled by
    ``PLANTED_BOOST`` (b) and take the sign product ``s_c(i_c)`` over its contracted axes ``c``, one sign vector
    per axis shared by all inputs (an input with contracted axes only is planted whole, unscaled). A contraction
    of two planted slices then adds ``n`` terms of one sign, ``~0.64 n scale^2 b^2``, while every other value is
    a sum of random signs, ``~sqrt(n) scale^2`` (times b where one operand is planted): at ``n >= 16`` the
    planted corner is the largest value of the contraction and its last row and column lead all others, so
    a max over any axis takes it, a mean of squares is led by it, and a softmax puts nearly all its mass on
    it (tests/test_mutation_holes.py checks it over seeds). A plan that drops the last
    row or tile of any kept axis loses that value and fails by a large margin, whatever the seed. A smaller
    ``scale`` shrinks every value alike (an unshifted softmax's exp of the corner leaves float16 at 0.5)."""
    boost = PLANTED_BOOST
    contracted = {t.axis for t in graph.terms() if t.op == "matmul"}
    rng = np.random.default_rng([seed, 47])
    signs = {a: rng.choice([-1.0, 1.0], size=n) for a, n in sorted(graph.sizes.items())}
    out: dict[str, np.ndarray] = {}
    for t in sorted(graph.inputs(), key=lambda t: t.name):
        shape = tuple(graph.sizes[a] for a in t.axes)
        x = rng.standard_normal(shape)
        x *= scale
        x[x == 0.0] = scale * 0.5
        coh = [i for i, a in enumerate(t.axes) if a in contracted]
        edge = [i for i, a in enumerate(t.axes) if a not in contracted and shape[i] > 1]
        sign = np.ones([1] * len(shape))  # the sign product over the contracted axes, broadcastable
        for i in coh:
            sign = sign * signs[t.axes[i]].reshape([-1 if j == i else 1 for j in range(len(shape))])
        if not edge:  # contracted axes only: planted whole, unscaled (none at all: as drawn)
            out[t.name] = np.abs(x, out=x) * sign if coh else x
            continue
        # only the planted slices are touched (a large input costs its draw, not a mask and a full copy):
        # each computed from the drawn values before any is written, so a corner two slices share agrees
        slices = [tuple(-1 if j == i else slice(None) for j in range(len(shape))) for i in edge]
        planted = [np.abs(x[s]) * sign[s] * boost for s in slices]
        for s, v in zip(slices, planted, strict=True):
            x[s] = v
        out[t.name] = x
    return out


NORMAL = Draw("normal", (0.0,))
OUTLIERS = Draw("outlier", tuple(OUTLIER_MAGNITUDE / 2**i for i in range(4)))
"""Outliers of 20, then 10, 5 and 2.5: the last is a second draw, of other values than the first, for a graph whose
own values leave float16 on larger ones (a softmax's unshifted exp reaches 7.6e9 at 5). Skipped, a plan is
judged on its first draw alone, and a row that draw leaves at zero (a ReLU whose inputs all come out
negative) hides an edit zeroing it (issue 46: a gated mixture's last row of sigmoid(X @ W2) zeroed)."""
DRAWS: tuple[Draw, ...] = (NORMAL, OUTLIERS)
"""Normal inputs, then outliers: the draws every graph is checked on (``CHECK_DRAWS`` adds the planted one)."""
PLANTED = PlantedDraw("planted", tuple(0.5 / 2**i for i in range(5)))
"""Planted extremes at std 0.5, then 0.25 down to 0.03125 where the graph's own values leave the plan's dtypes
(the corner grows with each contraction's length and each boost: a decode softmax's logit reaches 164 at
0.5 over 256 terms, 10 at 0.125)."""
CHECK_DRAWS: tuple[Draw, ...] = (*DRAWS, PLANTED)
"""The draws of every check, the CPU executor's and the GPU's, in order (a failure on one ends the check): a
tail a plan drops at the real shape only (a partial last tile there, a whole one at the CPU check's shape) is
seen by the GPU check alone, so it plants too (issue 46)."""
GIVEN = "inputs given by the caller"


LOST_OPERAND_ERROR = 0.5
"""A draw on which rounding the graph's computed GEMM operands to the storage dtype moves the float64
reference by this much (normalised) or more is not checkable: the operands under- or overflow the dtype
(an RBF smoother's exp(-d^2) weights of outliers all round to 0, and the 0/0 that follows is the graph's,
not the plan's). The first draw is judged as before; a later one is taken at a smaller magnitude."""


def checkable(ref: Mapping[str, object], operand_error: float, out_dtypes: Mapping[str, str],
              arith_error: float = 0.0) -> bool:
    """Whether a kernel can be checked on a draw: its float64 reference is finite, fits each output's
    storage dtype, and stays finite and within ``LOST_OPERAND_ERROR`` with the graph's computed GEMM
    operands rounded to the storage dtype, and with float32 roundings of its own values (``arith_error``,
    measured where saved tensors are computed: ``run.conditioning``); all depend on the graph and its
    inputs alone, never on the plan's kernels. A later draw that fails it is taken smaller: a backward's
    planted draw whose softmax is one-hot at its corner is ill-conditioned there (a decode softmax's backward:
    float32 roundings move its reference by 1e11 of its scale at std 0.5, by 2e-4 at 0.25), and ending the check
    on it reported the earlier draws' passes as not checkable."""
    for name, r in ref.items():
        if hasattr(r, "isfinite"):  # a torch tensor, possibly on the device
            peak = float(r.abs().max()) if r.numel() else 0.0  # type: ignore[attr-defined]
        else:
            arr = np.asarray(r)
            peak = float(np.max(np.abs(arr))) if arr.size else 0.0
        if not math.isfinite(peak) or peak > DTYPE_MAX[out_dtypes.get(name, "float32")]:
            return False
    return math.isfinite(operand_error) and operand_error < LOST_OPERAND_ERROR and arith_error < LOST_OPERAND_ERROR


T = TypeVar("T")


class Drawn(NamedTuple, Generic[T]):
    """The draws a check runs: each prepared with the label its messages carry, and what was left out."""

    prepared: list[tuple[str, T]]
    names: list[str]
    """The name of each prepared draw (``Draw.name``), in order."""
    skipped: list[str]
    """A note for each draw no magnitude of which fits (the result's message carries it)."""
    not_checked: list[str]
    """The names of those draws."""


def drawn(draws: tuple[Draw, ...], graph: Graph, seed: int, prepare: Callable[[str, dict[str, np.ndarray]], T],
          fits: Callable[[T], bool], dtype: str) -> Drawn[T]:
    """Each draw prepared (``prepare(description, inputs)``) at the first of its magnitudes that ``fits``
    (the first draw as it comes: it is judged, overflow included, as before outliers were drawn), with
    the label its messages carry; and a note for each draw no magnitude of which fits. A draw that does
    not apply to the graph (the planted one without a reduction) is neither."""
    out = Drawn([], [], [], [])
    for i, draw in enumerate(draws):
        if not draw.applies(graph):
            continue
        for m, raw in draw.series(graph, seed):
            prepared = prepare(draw.describe(m), raw)
            if i == 0 or (fits(prepared) and draw.accepts(prepared)):
                out.prepared.append(("" if i == 0 else draw.label(m), prepared))
                out.names.append(draw.name)
                break
        else:
            out.skipped.append(not_checked(draw, dtype, seed))
            out.not_checked.append(draw.name)
    return out


def output_dtypes(plan: Plan) -> dict[str, str]:
    return {gt.name: gt.dtype for gt in plan.tensors if gt.role == "output"}


def not_checked(draw: Draw, dtype: str, seed: int) -> str:
    """The note of a draw skipped because the graph itself overflows, leaves the dtype or is ill-conditioned on
    every magnitude of it."""
    return (f"{draw.name} inputs not checked: the graph's float64 values overflow, leave {dtype} or are "
            f"ill-conditioned on them ({draw.describe(draw.magnitudes[-1])}, seed {seed})")
