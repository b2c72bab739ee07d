"""Checks a derived backward graph against PyTorch float64 autograd of the forward graph.

The backward graph (``ir.grad``) is evaluated by the float64 reference interpreter with the saved
tensors the forward writes and random output cotangents; autograd differentiates the forward's
eager PyTorch form (``run.baselines.torch_fn``, float64) with the same cotangents. Independent
derivations agreeing to float64 rounding is the evidence the VJP table is right; a gradient the
backward graph leaves out must be zero under autograd too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from pyrunner.ir.grad import Backward
from pyrunner.ir.graph import Graph
from pyrunner.ir.reference import align, evaluate, random_inputs
from pyrunner.plan.schema import Plan


@dataclass(frozen=True)
class GradCheck:
    """Per forward input: the largest gradient error, relative to the largest autograd gradient."""

    errors: dict[str, float]
    seed: int

    def worst(self) -> float:
        return max(self.errors.values(), default=0.0)


def _relative(out: np.ndarray, ref: np.ndarray) -> float:
    if not np.all(np.isfinite(ref)):
        same = np.array_equal(np.isnan(out), np.isnan(ref)) and np.array_equal(out[np.isinf(ref)], ref[np.isinf(ref)])
        if not same:
            return float("inf")
        keep = np.isfinite(ref)
        out, ref = out[keep], ref[keep]
    if ref.size == 0:
        return 0.0
    return float(np.max(np.abs(out - ref)) / max(float(np.max(np.abs(ref))), 1e-300))


def float64_torch(graph: Graph) -> Callable[..., dict[str, torch.Tensor]]:
    """The graph's eager PyTorch form with its indices in the inputs' dtype: the baseline builds them
    in float32, and a 0-dim float64 value plus a float32 index (a scalar output's unit axis) would
    be float32 under PyTorch's promotion, hiding float64 autograd behind float32 rounding."""
    from pyrunner.run.baselines import _load, torch_source

    return _load(torch_source(graph).replace("device=_dev, dtype=torch.float32)", "device=_dev, dtype=_dt)"))


def check_gradients(forward: Graph, bwd: Backward, seed: int = 0,
                    inputs: Mapping[str, np.ndarray] | None = None) -> GradCheck:
    """Compare ``bwd`` (derived from ``forward``) with torch float64 autograd at ``forward``'s sizes,
    on ``inputs`` (default: ``random_inputs(forward, seed)``) and random output cotangents."""
    rng = np.random.default_rng(seed + 1)
    inputs = dict(random_inputs(forward, seed) if inputs is None else inputs)
    fwd_values = evaluate(bwd.forward, inputs)
    out_axes = {n: bwd.forward.axes_of(t) for n, t in bwd.forward.outputs}
    cot_axes = {name: out_axes[out] for name, out in bwd.cotangents.items()}
    cot = {name: rng.standard_normal(fwd_values[out].shape) * 0.5 for name, out in bwd.cotangents.items()}
    feed = {t.name: (inputs[t.name] if t.name in inputs else fwd_values[t.name] if t.name in bwd.saved
                     else cot[t.name]) for t in bwd.graph.inputs()}
    got = evaluate(bwd.graph, feed)

    leaves = {n: torch.tensor(v, dtype=torch.float64, requires_grad=True) for n, v in inputs.items()}
    outs = float64_torch(forward)(**leaves)
    by_out = {out: name for name, out in bwd.cotangents.items()}
    pairs = [(outs[o], torch.from_numpy(cot[by_out[o]])) for o in by_out]
    grads = torch.autograd.grad([p for p, _ in pairs], list(leaves.values()), [c for _, c in pairs],
                                allow_unused=True) if pairs else [None] * len(leaves)
    want = dict(zip(leaves, grads, strict=True))
    in_axes = {t.name: t.axes for t in forward.inputs()}
    out_term = dict(bwd.graph.outputs)
    errors: dict[str, float] = {}
    for name in bwd.wrt:
        ref = want[name]
        ref_np = np.zeros(inputs[name].shape) if ref is None else ref.detach().numpy()
        gname = next((g for g, i in bwd.gradients.items() if i == name), None)
        if gname is None:
            errors[name] = _relative(np.zeros_like(ref_np), ref_np) if np.any(ref_np) else 0.0
            continue
        if gname in bwd.aliases:
            alias = bwd.aliases[gname]
            axes, value = cot_axes[alias], cot[alias]
        else:
            axes, value = bwd.graph.axes_of(out_term[gname]), got[gname]
        extra = [a for a in axes if a not in in_axes[name]]  # a scalar input's gradient gains a unit axis
        if extra:
            value = value.reshape([n for a, n in zip(axes, value.shape, strict=True) if a not in extra])
            axes = tuple(a for a in axes if a not in extra)
        errors[name] = _relative(np.asarray(align(value, axes, in_axes[name])).reshape(ref_np.shape), ref_np)
    return GradCheck(errors, seed)


def backward_inputs(bwd: Backward, graph: Graph, seed: int) -> dict[str, np.ndarray]:
    """Inputs of the backward graph ``graph`` (``bwd.graph`` at some sizes) that belong together:
    random forward inputs, the saved tensors the forward computes from them, random cotangents
    (random saved values would make ``exp(S - LSE)`` overflow where the scores are large);
    ``run.backward_draws.linked_inputs`` on the normal draw."""
    from pyrunner.run.backward_draws import linked_inputs

    return linked_inputs(bwd, graph, seed, random_inputs)


# --- gradient error bounds: both planned halves composed ------------------------------------------------

def gradient_bound(forward_plan: Plan, backward_plan: Plan, bwd: Backward) -> float:
    """Bound on a gradient's normalised max error against float64 when the forward-with-saves plan and the
    backward plan both run (CPU executor or GPU), derived as the forward bound is (``verify.error_bound``):
    the saved tensors and the cotangents reach the backward stored (in the plan dtype; a saved statistic
    such as a log-sum-exp in float32, ``ir.grad.statistic``), so the forward's kernels are stores on the
    gradient's path like the backward's own; the accumulation term is the longest reduction of either
    graph. Where rounding the backward's computed GEMM operands and its saved inputs (the forward's stored
    outputs and statistics) to their own dtypes alone moves the float64 backward further (``D = rowsum(dO
    * O)`` against ``dP`` cancels), the bound is raised as the forward's is (``verify.conditioned_bound``,
    applied by ``composed_error``): with the log-sum-exp in float32 that raise is smaller."""
    from pyrunner.run.verify import error_bound, reduction_length, storage_dtype

    n = max(reduction_length(bwd.forward), reduction_length(bwd.graph))
    dtype = storage_dtype(backward_plan) if storage_dtype(forward_plan) != "float32" else "float32"
    return error_bound(dtype, n, len(forward_plan.kernels) + len(backward_plan.kernels))


def composed_error(forward: Graph, bwd: Backward, forward_plan: Plan, backward_plan: Plan,
                   seed: int = 0, inputs: Mapping[str, np.ndarray] | None = None) -> tuple[dict[str, float], float]:
    """Both plans on the CPU executor, chained as training runs them (the forward's stored outputs and saves
    feed the backward, cotangents rounded to the plan dtype), against float64 autograd of ``forward`` on the
    same rounded inputs and cotangents: per input its normalised gradient error, and the bound that applies
    (``gradient_bound``, conditioned on the backward's operand rounding). ``inputs``: the forward inputs
    (default ``random_inputs(forward, seed)``), rounded to the plan dtype here."""
    from pyrunner.ir.reference import computed_operands
    from pyrunner.run.executor import execute
    from pyrunner.run.verify import conditioned_bound, operand_rounding, storage_dtype
    from pyrunner.target.rounding import round_to

    dtype = backward_plan.dtype
    raw = random_inputs(forward, seed) if inputs is None else inputs
    inputs = {k: round_to(v, dtype).astype(np.float64) for k, v in raw.items()}
    fwd_out = {k: np.asarray(v, dtype=np.float64) for k, v in execute(forward_plan, inputs).items()}  # stored: rounded
    rng = np.random.default_rng(seed + 1)
    cot = {c: round_to(rng.standard_normal(fwd_out[o].shape) * 0.5, dtype).astype(np.float64)
           for c, o in bwd.cotangents.items()}
    feed = {t.name: inputs[t.name] if t.name in inputs else fwd_out[t.name] if t.name in bwd.saved else cot[t.name]
            for t in bwd.graph.inputs()}
    got = execute(backward_plan, feed)
    leaves = {n: torch.tensor(v, dtype=torch.float64, requires_grad=True) for n, v in inputs.items()}
    outs = float64_torch(forward)(**leaves)
    by_out = {o: c for c, o in bwd.cotangents.items()}
    grads = torch.autograd.grad([outs[o] for o in by_out], list(leaves.values()),
                                [torch.from_numpy(cot[c]) for c in by_out.values()], allow_unused=True)
    want = dict(zip(leaves, grads, strict=True))
    in_axes = {t.name: t.axes for t in forward.inputs()}
    out_axes = {n: bwd.graph.axes_of(t) for n, t in bwd.graph.outputs}
    errors: dict[str, float] = {}
    for g, name in bwd.gradients.items():
        if want[name] is None or g in bwd.aliases:
            continue
        value, axes = np.asarray(got[g]), out_axes[g]
        extra = [a for a in axes if a not in in_axes[name]]
        if extra:
            value = value.reshape([n for a, n in zip(axes, value.shape, strict=True) if a not in extra])
            axes = tuple(a for a in axes if a not in extra)
        ref = want[name].detach().numpy()
        errors[name] = _relative(np.asarray(align(value, axes, in_axes[name])).reshape(ref.shape), ref)
    exact = evaluate(bwd.forward, inputs)  # the saved tensors unrounded: what float64 autograd sees
    ref = evaluate(bwd.graph, {k: exact[k] if k in bwd.saved else v for k, v in feed.items()})
    rnd = operand_rounding(storage_dtype(backward_plan)) if computed_operands(bwd.graph) else None
    moved = evaluate(bwd.graph, feed, rnd)
    bound = conditioned_bound(gradient_bound(forward_plan, backward_plan, bwd),
                              max(_relative(moved[n], ref[n]) for n in ref))
    return errors, bound
