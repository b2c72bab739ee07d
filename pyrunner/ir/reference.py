"""Float64 numpy reference interpreter: the meaning of every graph (op meanings from ``ir.ops``)."""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from pyrunner.ir.graph import Graph, Term, result_axes, softmax_source, subterms
from pyrunner.ir.ops import ELEMENTWISE, REDUCTIONS

OperandRounding = Callable[[np.ndarray], np.ndarray]
Perturbation = Callable[["Term", np.ndarray], np.ndarray]
"""Rounds a float64 array to a storage precision, keeping float64 (``run.verify`` supplies it)."""


def align(x: np.ndarray, have: tuple[str, ...], want: tuple[str, ...]) -> np.ndarray:
    """View x (axes `have`) as broadcastable against axes `want` (have is a subset)."""
    if not have:
        return np.asarray(x)
    perm = sorted(range(len(have)), key=lambda i: want.index(have[i]))
    y = np.transpose(x, perm)
    shape = [1] * len(want)
    for i in perm:
        shape[want.index(have[i])] = x.shape[i]
    return y.reshape(shape)


def _softmax(x: np.ndarray, have: tuple[str, ...], axis: str, want: tuple[str, ...]) -> np.ndarray:
    """softmax over ``axis`` of x (axes ``have``), shifted by its maximum, with the axes ``want``."""
    i = have.index(axis)
    e = np.exp(x - np.max(x, axis=i, keepdims=True))
    return align(e / np.sum(e, axis=i, keepdims=True), have, want)


def evaluate_terms(roots: list[Term], sizes: Mapping[str, int], inputs: Mapping[str, np.ndarray],
                   dtype=np.float64, round_operand: OperandRounding | None = None,
                   perturb: Perturbation | None = None) -> dict[Term, np.ndarray]:
    """Evaluate every term reachable from roots; returns the memo table.

    ``round_operand``: applied to every computed operand of a contraction (an arg of a matmul that
    is not a graph input) before it is contracted, as a tensor-core kernel must round it.
    ``perturb``: ``perturb(term, value)`` replaces every value the graph computes (not inputs, constants
    or indices), as a kernel's own arithmetic rounds each (``run.conditioning``).
    """
    memo: dict[Term, np.ndarray] = {}
    axes: dict[Term, tuple[str, ...]] = {}
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for t in subterms(roots):
            ax = result_axes(t, axes)
            if t.op == "input":
                v = np.asarray(inputs[t.name], dtype=dtype)
            elif t.op == "const":
                v = np.asarray(t.value, dtype=dtype)
            elif t.op == "axis_size":
                v = np.asarray(float(sizes[t.axis]), dtype=dtype)
            elif t.op == "iota":
                v = np.arange(sizes[t.axis], dtype=dtype)
            elif t.op == "ternary":
                v = ELEMENTWISE[t.fn].numpy(*(align(memo[a], axes[a], ax) for a in t.args)).astype(dtype)
                v = np.broadcast_to(v, tuple(sizes[x] for x in ax)).copy()
            elif t.op == "unary":
                v = ELEMENTWISE[t.fn].numpy(memo[t.args[0]]).astype(dtype)
            elif (sm := softmax_source(t)) is not None:
                v = _softmax(memo[sm[0]], axes[sm[0]], sm[1], ax).astype(dtype)
            elif t.op == "binary":
                a, b = t.args
                v = ELEMENTWISE[t.fn].numpy(align(memo[a], axes[a], ax), align(memo[b], axes[b], ax)).astype(dtype)
                v = np.broadcast_to(v, tuple(sizes[x] for x in ax)).copy()
            elif t.op == "reduce":
                src_axes = axes[t.args[0]]
                v = REDUCTIONS[t.fn].numpy(memo[t.args[0]], src_axes.index(t.axis)).astype(dtype)
            elif t.op == "matmul":
                a, b = t.args
                letters = {n: chr(ord("a") + i) for i, n in enumerate(sorted(set(axes[a]) | set(axes[b])))}
                spec = "".join(letters[n] for n in axes[a]) + "," + "".join(letters[n] for n in axes[b])
                spec += "->" + "".join(letters[n] for n in ax)
                xa, xb = (memo[x] if round_operand is None or x.op == "input" else round_operand(memo[x])
                          for x in (a, b))
                v = np.einsum(spec, xa, xb).astype(dtype)
            else:  # pragma: no cover - check() rejects unknown ops first
                raise ValueError(t.op)
            if perturb is not None and t.op not in ("input", "const", "axis_size", "iota"):
                v = perturb(t, v)
            memo[t] = v
    return memo


def evaluate(g: Graph, inputs: Mapping[str, np.ndarray], round_operand: OperandRounding | None = None,
             perturb: Perturbation | None = None) -> dict[str, np.ndarray]:
    """Float64 value of each output of g, keyed by output name (``round_operand``, ``perturb``: see
    ``evaluate_terms``)."""
    memo = evaluate_terms([t for _, t in g.outputs], g.sizes, inputs, round_operand=round_operand, perturb=perturb)
    return {n: memo[t] for n, t in g.outputs}


def computed_operands(g: Graph) -> list[Term]:
    """Contraction operands the graph computes (not its inputs): what ``round_operand`` rounds."""
    return [x for t in subterms([t for _, t in g.outputs]) if t.op == "matmul" for x in t.args if x.op != "input"]


def random_inputs(g: Graph, seed: int, scale: float = 0.5) -> dict[str, np.ndarray]:
    """Fresh, never-zero random inputs (normal, std `scale`) for every graph input."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for t in sorted(g.inputs(), key=lambda t: t.name):
        shape = tuple(g.sizes[a] for a in t.axes)
        x = rng.standard_normal(shape) * scale
        x[x == 0.0] = scale * 0.5
        out[t.name] = x
    return out


OUTLIER_SCALE = 1.0
"""Standard deviation of the bulk of ``outlier_inputs``: twice ``random_inputs``' (a wider scale)."""
OUTLIER_MAGNITUDE = 20.0
"""Largest magnitude of an outlier entry; each is drawn uniformly from [magnitude / 2, magnitude] with a
random sign, so none is clamped back by ``min``/``max`` near the bulk and no two cancel exactly."""
OUTLIER_RATE = 0.01
"""Share of the entries of every input made outliers, on top of the one each row gets."""


def outlier_inputs(g: Graph, seed: int, scale: float = OUTLIER_SCALE, magnitude: float = OUTLIER_MAGNITUDE,
                   rate: float = OUTLIER_RATE) -> dict[str, np.ndarray]:
    """Heavy-tailed inputs: normal (std ``scale``) with at least one outlier in every row (along the last axis)
    and ``rate`` of all entries outliers of magnitude ``magnitude / 2`` to ``magnitude``, random signs.

    Why: N(0, 0.5) values never leave [-4, 4] and make every row's maximum look alike, so a plan that
    clamps its inputs or outputs, or takes a softmax's shift from the wrong values, computes the right
    answer on them. A row holding one large entry exposes both (the CPU and GPU checks run these as well)."""
    rng = np.random.default_rng([seed, 46])
    out: dict[str, np.ndarray] = {}
    for t in sorted(g.inputs(), key=lambda t: t.name):
        shape = tuple(g.sizes[a] for a in t.axes)
        x = rng.standard_normal(shape) * scale
        x[x == 0.0] = scale * 0.5
        hit = rng.random(shape) < rate
        if x.size:
            rows = x.reshape(-1, shape[-1]) if shape else x.reshape(1, 1)
            picks = rng.integers(0, rows.shape[1], size=rows.shape[0])
            hit.reshape(rows.shape)[np.arange(rows.shape[0]), picks] = True
        size = rng.uniform(magnitude / 2, magnitude, size=shape) * rng.choice([-1.0, 1.0], size=shape)
        out[t.name] = np.where(hit, size, x)
    return out
