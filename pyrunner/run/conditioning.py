"""How far a kernel's own float32 arithmetic can move a graph's float64 value on given inputs.

The checks' a-priori bound (``verify.error_bound``) assumes a well-conditioned graph: float32 roundings
that stay near their own size in the outputs. A graph can amplify them on some inputs by orders of
magnitude. A query temperature's backward, ``d_tau = -sum(dS * S0) / tau^2`` with ``dS = P (dP - D)``,
cancels ``dP - D`` to nothing at a query whose tau is near 0 (its row of P one-hot), then multiplies what
rounding left by ``P S0 / tau^2``: a float32 difference of two equal dot products, 1e-7 of each, became
2.4e2 of the output's scale at tau = -0.0031 (run 127; the CPU executor the same). No kernel computing in
float32 can do better there; no bound derived without the inputs can say so.

So the error is measured the way Monte Carlo arithmetic measures it: the float64 reference evaluated with
every value the graph computes by a rounding op (``rounds``) multiplied by ``1 + u e`` (``u`` float32's unit
roundoff, ``e`` uniform in [-1, 1], independently per element; ``SAMPLES`` draws), the normalised move of its
outputs taken as the arithmetic's error on these inputs. Exact ops are left alone: a maximum, a comparison
or a selection rounds nothing in a kernel either, and perturbing a row maximum apart from its row would
break ``max(x) <= x``, the argmax mask of a max's gradient, where the kernel keeps it; so is index arithmetic
(a band mask's ``|i - j| <= 4`` must not flip). Each perturbed value is also held to float32's range: below its
smallest normal it is 0 (a kernel built with fast math flushes it) and past its largest it is infinite. An RBF
smoother's weights ``exp(-|q - k|^2 / 2)`` of a query 20 from every key are 1e-87 in float64 and 0 in any float32
kernel, and its ``U / sum(W)`` is then 0/0 (run 134): the graph's value, not the plan's. Large values alone
are not lost: scores of 1e10 whose softmax is one-hot (a temperature ``exp(16)``, runs 132-133) move by 600
under a rounding and stay one-hot, so a kernel that gives NaN there is wrong (``emit.FOLD_EXP_SHIFT``).
It depends on the graph and the inputs alone, never on a plan.
``verify`` raises a check's bound to ``OPERAND_ROUNDING_FACTOR`` times it (as it does for operand rounding)
and calls a draw where it reaches ``draws.LOST_OPERAND_ERROR`` not checkable: the graph's value there is
not determined to float32 arithmetic at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from pyrunner.ir.graph import Graph, Term, subterms
from pyrunner.ir.reference import evaluate

if TYPE_CHECKING:
    import torch

UNIT_ROUNDOFF_FP32 = 2.0**-24
FP32_TINY = 2.0**-126
"""float32's smallest normal: a fast-math kernel flushes anything smaller to 0."""
FP32_MAX = float(np.finfo(np.float32).max)
SAMPLES = 2
"""Perturbed evaluations per check; the larger move is kept (one can land on a lucky cancellation)."""


EXACT = frozenset({"neg", "abs", "relu", "max", "min", "lt", "le", "where"})
"""Functions whose float result is one of their operands' values (or 0/1): no rounding in any dtype."""


def rounds(t: Term) -> bool:
    """Whether a kernel rounds the value of ``t``: an arithmetic op, a sum, a contraction or a transcendental
    of a value read from an input (index arithmetic, ``i - j`` of a band mask, is exact in float32)."""
    if not (t.op == "matmul" or (t.op in ("unary", "binary", "ternary", "reduce") and t.fn not in EXACT)):
        return False
    return _reads_input(t)


@lru_cache(maxsize=1 << 16)
def _reads_input(t: Term) -> bool:
    return t.op == "input" or any(_reads_input(a) for a in t.args)


def _numpy_perturbation(rng: np.random.Generator) -> Callable[[Term, np.ndarray], np.ndarray]:
    def perturb(t: Term, v: np.ndarray) -> np.ndarray:
        if not rounds(t):
            return v
        v = np.asarray(v, dtype=np.float64)
        return _numpy_range(v * (1.0 + UNIT_ROUNDOFF_FP32 * rng.uniform(-1.0, 1.0, v.shape)))
    return perturb


def _numpy_range(v: np.ndarray) -> np.ndarray:
    """``v`` as float32 can hold it: flushed to 0 below ``FP32_TINY``, infinite past ``FP32_MAX``."""
    mag = np.abs(v)
    return np.where(mag < FP32_TINY, 0.0, np.where(mag > FP32_MAX, np.copysign(np.inf, v), v))


def _torch_range(v: torch.Tensor) -> torch.Tensor:
    """``_numpy_range`` on the device."""
    import torch

    mag = v.abs()
    inf = torch.full_like(v, float("inf")).copysign(v)
    return torch.where(mag < FP32_TINY, torch.zeros_like(v), torch.where(mag > FP32_MAX, inf, v))


def arithmetic_error(graph: Graph, inputs: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray],
                     seed: int, error: Callable[[np.ndarray, np.ndarray], float]) -> float:
    """The largest normalised move (``error(moved, ref)``, NaN where ``ref`` is not finite: left out) of the
    float64 outputs ``ref`` of ``graph`` on ``inputs`` when every computed value carries a float32
    rounding; 0.0 when nothing moves."""
    worst = 0.0
    for s in range(SAMPLES):
        rng = np.random.default_rng([seed % 2**32, s])
        moved = evaluate(graph, inputs, perturb=_numpy_perturbation(rng))
        worst = max([worst, *(e for n, r in ref.items() if not np.isnan(e := error(moved[n], r)))])
    return worst


def arithmetic_error_torch(graph: Graph, inputs: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor],
                           seed: int, error: Callable[[torch.Tensor, torch.Tensor], float]) -> float:
    """``arithmetic_error`` with the reference evaluated by ``run.baselines`` on the inputs' device."""
    import torch

    from pyrunner.run.baselines import perturbed_fn

    worst = 0.0
    device = next(iter(inputs.values())).device
    for s in range(SAMPLES):
        gen = torch.Generator(device=device)
        gen.manual_seed((seed % 2**32) * SAMPLES + s)

        def perturb(v: torch.Tensor, gen: torch.Generator = gen) -> torch.Tensor:
            e = torch.rand(v.shape, generator=gen, device=v.device, dtype=torch.float64) * 2.0 - 1.0
            return _torch_range(v * (1.0 + UNIT_ROUNDOFF_FP32 * e).to(v.dtype))

        with torch.no_grad():
            moved = perturbed_fn(graph, perturb, rounds)(**inputs)
        worst = max([worst, *(e for n, r in ref.items() if not np.isnan(e := error(moved[n], r)))])
        del moved
    return worst


# --- decisions a kernel's rounding can take the other way -------------------------------------------------

DECISION_BAND = 4.0
"""A comparison is undecided where its operands differ by at most this many float32 unit roundoffs of their
magnitudes (``torch_code.magnitude_code``): run 168's flip of ``relu'(X W)`` had ``X W = -4.1e-5`` against
``|X| @ |W| = 957``, 0.7 of one."""


@lru_cache(maxsize=1 << 16)
def inexact(t: Term) -> bool:
    """Whether a kernel's value of ``t`` carries rounding: ``t`` or a term it reads rounds (``rounds``)."""
    if t.op in ("input", "const", "axis_size", "iota"):
        return False
    return rounds(t) or any(inexact(a) for a in t.args)


def decides(t: Term) -> bool:
    """A comparison of a value the kernel rounds: its 0/1 result can differ from float64's where the operands
    are within rounding of each other (a ReLU's derivative at a pre-activation near 0)."""
    return t.op == "binary" and t.fn in ("lt", "le") and any(inexact(a) for a in t.args)


def has_decisions(graph: Graph) -> bool:
    """Whether ``graph`` compares a value a kernel rounds anywhere (``decides``)."""
    return any(decides(t) for t in subterms([t for _, t in graph.outputs]))


def decision_tolerance(graph: Graph, inputs: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
    """Per output element, how far the float64 value moves when the comparisons a float32 kernel can decide
    either way (``decides``, operands within ``DECISION_BAND`` of each other, not exactly equal) are taken
    the other way: ``|up - as_is| + |down - as_is|``, ``up`` with every undecided comparison true and ``down``
    false (non-finite moves are infinite), and the count of undecided comparisons (0: the dict is empty, and a
    graph comparing no computed value costs no evaluation).

    Such a comparison is not the graph's value to float32 arithmetic at all: run 168's ReLU backward took one
    pre-activation of ``-4.1e-5`` (``|X| @ |W| = 957``) as positive, which moved a row of ``d_X`` by 0.30 of
    its scale, while the kernel was right to the bound elsewhere. A kernel must match the reference where no
    such decision reaches and either decision where one does; an exact tie (a row's maximum against itself,
    the argmax mask of a max's gradient) is the kernel's exactly too and stays decided. The masks come from
    each run's own operands, so a decision downstream of a flipped one is judged on moved operands."""
    import torch

    from pyrunner.run.baselines import decided_fn

    if not has_decisions(graph):
        return {}, 0
    counts: list[int] = []

    def decider(force: float | None) -> Callable[..., torch.Tensor]:
        def decide(mask: torch.Tensor, a, b, ma, mb) -> torch.Tensor:
            gap = torch.as_tensor(a - b, dtype=torch.float64).abs()
            undecided = (gap > 0) & (gap <= DECISION_BAND * UNIT_ROUNDOFF_FP32 * torch.as_tensor(ma + mb))
            if force is None:
                counts.append(int(undecided.sum()))
                return mask
            return torch.where(undecided, torch.full_like(mask, force), mask)
        return decide

    def run(force: float | None) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            return decided_fn(graph, decider(force), decides)(**inputs)

    as_is = run(None)
    n = sum(counts)
    if not n:
        return {}, 0
    up, down = run(1.0), run(0.0)
    tol: dict[str, torch.Tensor] = {}
    for name, r in as_is.items():
        move = (up[name] - r).abs() + (down[name] - r).abs()
        tol[name] = torch.nan_to_num(move.to(torch.float64), nan=float("inf"))
    return tol, n
