"""Numerical verification before timing: a plan that computes the wrong thing is never timed.

Every check draws fresh random inputs (never zeros: ``reference.random_inputs``
with a fresh seed, recorded in the log), poisons outputs and intermediates with
NaN so an unwritten element cannot pass, and compares with the graph's float64
meaning by the normalised max error ``max|out - ref| / max|ref|``. It does so twice
(``DRAWS``): on N(0, 0.5) inputs and on heavy-tailed ones (``reference.outlier_inputs``: an
outlier of magnitude 10 to 20 in every row and 1% of entries), which expose a plan that clamps
values or shifts a softmax by the wrong maximum; the bound of each is derived on its own inputs. Both
checks add a third (``draws.PLANTED``, ``draws.CHECK_DRAWS``) for a graph with a reduction: the extremes sit
at the last index of every uncontracted axis, so a plan that drops a tail a max, a mean or a softmax would
drown fails.

Why one module: the CPU executor check and the GPU check apply one bound formula, one judgement and one
way of combining draws, and their messages must read alike; split, they drift apart (the inputs they
draw are ``run.draws``).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pyrunner.ir.graph import Graph, result_axes
from pyrunner.ir.reference import computed_operands, evaluate, evaluate_terms
from pyrunner.plan.views import View, to_plan_layout, to_source_layout, view_of
from pyrunner.run.draws import (
    CHECK_DRAWS,
    DTYPE_MAX,
    GIVEN,
    LOST_OPERAND_ERROR,
    Draw,
    Drawn,
    checkable,
    drawn,
    output_dtypes,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from pyrunner.plan.schema import Plan

UNIT_ROUNDOFF: dict[str, float] = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}
"""Unit roundoff u = 2**-(significand bits) of each storage dtype (round to nearest)."""
STORE_ROUNDINGS = 2.0
"""Roundings to the compute dtype a correct plan may show at one output element, in units of u:
the output's own store (u/2) plus intermediates kept in the compute dtype (probabilities before
P @ V, say) whose rounding reaches the output attenuated by the normalisation. Measured on the
Hopper GPU (benchmarks/results): at most 0.8 u for every seed workload in both dtypes."""
ACCUMULATION_FACTOR = 16.0
"""float32 accumulation of an n-term reduction grows like sqrt(n) roundings of float32 for
random data (Higham, rule of thumb); 16 sqrt(n) u_f32 leaves room for ordered sums and tiling."""


def error_bound(dtype: str, reduction: int = 1, stores: int = 1) -> float:
    """Bound on the normalised max error of a plan storing values in ``dtype`` whose longest
    reduction or contraction has ``reduction`` terms and whose values pass through ``stores``
    kernels (each global intermediate is stored in ``dtype``: one more rounding that reaches the
    output, so a chain of k kernels gets k - 1 more units of u):

        (STORE_ROUNDINGS + stores - 1) * u(dtype) + ACCUMULATION_FACTOR * sqrt(reduction) * u(float32)

    float16: 9.8e-4 (+6.1e-5 at n = 4096); bfloat16: 7.8e-3 (+6.1e-5). Both reject an output scaled by
    1% (error >= 1e-2 - u/2, above either bound), which the old flat 1e-2 / 3e-2 bounds let pass.
    """
    n = max(1, int(reduction))
    roundings = STORE_ROUNDINGS + max(0, int(stores) - 1)
    return roundings * UNIT_ROUNDOFF[dtype] + ACCUMULATION_FACTOR * math.sqrt(n) * UNIT_ROUNDOFF["float32"]


OPERAND_ROUNDING_FACTOR = 2.0
"""A tensor-core plan must round every contraction operand it computes (attention's probabilities, a
normalised activation) to the storage dtype. Where the graph amplifies that rounding (an
unnormalised sum of rounded terms that cancels, then a saturating op: sigmoid attention fed to tanh)
it alone can exceed the a-priori bound, and a correct kernel would fail. So the bound is at least
this many times the error that rounding causes in the float64 reference itself (the plan rounds
values of the same size, not the same values: another draw of the same error). For the seed
workloads that error is far below the a-priori bound, so their bounds do not move
(tests/test_verify.py)."""


def storage_dtype(plan: Plan) -> str:
    """The dtype whose roundings a plan's check allows: float32 when every buffer and non-input
    global is float32, else the plan's dtype."""
    dts = {gt.dtype for gt in plan.tensors if gt.role != "input"}
    dts |= {b.dtype for k in plan.kernels for b in k.buffers}
    return "float32" if dts <= {"float32"} else plan.dtype


def operand_rounding(dtype: str) -> Callable[[np.ndarray], np.ndarray]:
    """``reference.evaluate``'s ``round_operand`` for a storage dtype (the device's rounding)."""
    from pyrunner.target.rounding import round_to

    return lambda x: round_to(x, dtype).astype(np.float64)


def conditioned_bound(a_priori: float, operand_error: float) -> float:
    """The bound a check applies: the a-priori one, raised where the graph's own operand rounding needs it."""
    return max(a_priori, OPERAND_ROUNDING_FACTOR * operand_error)


def out_of_range(operand_error: float, dtype: str, seed: int, what: str = "",
                 inputs: str = "normal, std 0.5") -> VerifyResult | None:
    """A failed verdict where rounding the graph's computed GEMM operands to ``dtype`` sends the float64
    reference out of range (an operand error of inf: the values overflow ``dtype`` on these inputs), else
    None. No bound can be conditioned on that, and an infinite one would pass any output."""
    if math.isfinite(operand_error):
        return None
    return VerifyResult(False, float("nan"), float("nan"), seed, {}, (
        f"{what}the graph's computed GEMM operands overflow {dtype} on these random inputs ({inputs}, "
        f"seed {seed}): rounded to {dtype}, the float64 reference is no longer finite, so no kernel that "
        f"stores them in {dtype} can be checked against it"))


def _raised(a_priori: float, bound: float, operand_error: float, dtype: str, arith_error: float = 0.0) -> str:
    if bound <= a_priori:
        return ""
    if arith_error > operand_error:
        return (f" (bound raised from {a_priori:.0e}: the graph is ill-conditioned on these inputs; float32 "
                f"roundings of its own values alone move the float64 reference by {arith_error:.2e})")
    return (f" (bound raised from {a_priori:.0e}: rounding the graph's computed GEMM operands to {dtype} "
            f"alone moves the float64 reference by {operand_error:.2e})")


def ill_conditioned(arith_error: float, seed: int, what: str = "", inputs: str = GIVEN) -> VerifyResult | None:
    """A not-checkable verdict where float32 roundings of the graph's own values alone move its float64
    reference by ``LOST_OPERAND_ERROR`` or more of its scale (``run.conditioning``), else None: no kernel
    computing in float32 is determined there, and a bound raised that far would pass anything."""
    if arith_error < LOST_OPERAND_ERROR:
        return None
    return VerifyResult(False, float("nan"), float("nan"), seed, {}, (
        f"{what}not checkable: the graph is ill-conditioned on these inputs ({inputs}, seed {seed}): float32 "
        f"roundings of its own computed values alone move the float64 reference by {arith_error:.2e} of its "
        f"scale (>= {LOST_OPERAND_ERROR}), so no float32 kernel can be checked against it"), uncheckable=True)


BOUNDS: dict[str, float] = {dt: error_bound(dt, 4096) for dt in UNIT_ROUNDOFF}
"""Per-dtype bounds at a 4096-term reduction, for callers that check without a graph."""


def reduction_length(graph: Graph) -> int:
    """Terms in the graph's longest reduction or contraction (1 when it has none)."""
    lengths = [graph.sizes[t.axis] for t in graph.terms() if t.op in ("reduce", "matmul")]
    return max(lengths, default=1)


def executor_bound(plan: Plan, graph: Graph | None = None) -> float:
    """Bound for the CPU executor: it follows the plan's buffer dtypes (fp16/bf16 tiles and
    stores round like the GPU does), so the plan dtype's bound applies; a plan whose
    buffers and globals are all float32 gets the float32 bound."""
    n = reduction_length(graph) if graph is not None else max(
        (n for t in plan.tensors for n in t.shape), default=1)
    return error_bound(storage_dtype(plan), n, len(plan.kernels))


def bound_for(dtype: str, reduction: int = 1) -> float:
    return error_bound(dtype, reduction)


def fresh_seed() -> int:
    """A new seed per run (recorded in the log) so no plan is tuned to one input."""
    return secrets.randbits(31)


@dataclass
class VerifyResult:
    ok: bool
    error: float
    bound: float
    seed: int
    per_output: dict[str, float] = field(default_factory=dict)
    message: str = ""
    uncheckable: bool = False
    """The float64 reference itself is not finite on the draw (the graph's own math is undefined there, e.g.
    an infinite derivative): no kernel can be checked against it, so the verdict is neither a pass nor a
    failure. Set only when every output whose reference is finite passed (``ok`` stays False)."""
    draws: list[str] = field(default_factory=list)
    """The draws the verdict covers, by ``Draw.name`` in order (``given`` for a caller's inputs): every one
    checked on a pass, those up to the failing one on a failure."""
    not_checked: list[str] = field(default_factory=list)
    """The draws skipped because the graph's own values leave the plan's dtypes (or are ill-conditioned) on every
    magnitude of them."""

    def draws_record(self) -> dict[str, list[str]]:
        """What a results record keeps of the draws (``checked``, ``not_checked``)."""
        return {"checked": list(self.draws), "not_checked": list(self.not_checked)}


def max_error(out: np.ndarray, ref: np.ndarray, tolerance: np.ndarray | None = None) -> float:
    """Normalised max error; inf when out has a NaN/inf (e.g. an unwritten, poisoned element);
    NaN when the reference itself is not finite (nothing can be checked against it). ``tolerance``: how far
    each element may lie from ``ref`` before its error counts (``run.conditioning.decision_tolerance``)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(ref)):
        return float("nan")
    if out.shape != ref.shape:
        return float("inf")
    if not np.all(np.isfinite(out)):
        return float("inf")
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    gap = np.abs(out - ref) if tolerance is None else np.maximum(np.abs(out - ref) - tolerance, 0.0)
    diff = float(np.max(gap)) if ref.size else 0.0
    return diff / scale if scale > 0 else diff


def finite_max(errors: Iterable[float]) -> float:
    """Largest of the errors that are numbers (a non-finite reference is judged on its own)."""
    return max((e for e in errors if not math.isnan(e)), default=0.0)


def _max_error_torch(out: torch.Tensor, ref: torch.Tensor, tolerance: torch.Tensor | None = None) -> float:
    import torch

    if not bool(torch.isfinite(ref).all()):
        return float("nan")
    if tuple(out.shape) != tuple(ref.shape):
        return float("inf")
    o = out.to(torch.float64)
    if not bool(torch.isfinite(o).all()):
        return float("inf")
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    gap = (o - ref).abs() if tolerance is None else ((o - ref).abs() - tolerance).clamp_min(0.0)
    diff = float(gap.max()) if ref.numel() else 0.0
    return diff / scale if scale > 0 else diff


def judge(errors: Mapping[str, float], bound: float, seed: int, what: str = "",
          inputs: str = "normal, std 0.5") -> VerifyResult:
    """Turn per-output errors into a verdict with a message naming the worst output. An output whose float64
    reference is not finite (error NaN) cannot be judged: the others are, and when they all pass the result
    is ``uncheckable`` (a failing one is still a failure)."""
    unfinite = sorted(k for k, e in errors.items() if math.isnan(e))
    judged = {k: e for k, e in errors.items() if not math.isnan(e)}
    worst = max(judged, key=lambda k: judged[k]) if judged else ""
    err = judged[worst] if judged else float("inf")
    ok = bool(judged) and math.isfinite(err) and err <= bound  # NaN/inf outputs never pass, whatever the bound
    if unfinite and (ok or not judged):
        rest = f"; the other outputs pass (max normalised error {err:.2e} <= {bound:.0e})" if judged else ""
        return VerifyResult(False, float("nan"), bound, seed, dict(errors), (
            f"{what}not checkable: the float64 reference of output {unfinite[0]!r} is not finite on these "
            f"inputs ({inputs}, seed {seed}): the graph's own math overflows, divides by zero or has an "
            f"infinite derivative there in float64, so no kernel can be checked against it{rest}"),
            uncheckable=True)
    if not errors:
        msg = "no outputs to compare"
    elif ok:
        msg = f"{what}max normalised error {err:.2e} <= {bound:.0e}".strip()
    elif err == float("inf"):
        msg = f"{what}output {worst!r} has NaN/inf or wrong shape (unwritten elements stay NaN)"
    else:
        msg = f"{what}output {worst!r}: normalised max error {err:.2e} > bound {bound:.0e}"
    return VerifyResult(ok, err, bound, seed, dict(errors), msg)


def output_axes(graph: Graph) -> dict[str, tuple[str, ...]]:
    return {n: result_axes(t) for n, t in graph.outputs}


def compare(outputs: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray], bound: float, seed: int,
            axes: Mapping[str, list[str]] | None = None, graph: Graph | None = None,
            what: str = "", inputs: str = "normal, std 0.5",
            tolerance: Mapping[str, np.ndarray] | None = None) -> VerifyResult:
    """Compare numpy outputs (axes ``axes``, a permutation of the graph's) with the float64 reference
    (a missing output is a failure; ``tolerance``: per output, as ``max_error`` takes it)."""
    want = output_axes(graph) if graph is not None else {}
    errs: dict[str, float] = {}
    for name, r in ref.items():
        if name not in outputs:
            errs[name] = float("inf")
            continue
        o = outputs[name]
        if axes and name in axes and name in want:
            o = to_source_layout(np.asarray(o), axes[name], want[name], View())
        errs[name] = max_error(o, r, (tolerance or {}).get(name))
    return judge(errs, bound, seed, what, inputs)


def undecided_note(count: int) -> str:
    """The message's note on a draw with comparisons the kernel may decide either way."""
    if not count:
        return ""
    return (f" ({count} comparison(s) within float32 rounding of their threshold, accepted either way: "
            f"run.conditioning.decision_tolerance)")


# --- the GPU check -------------------------------------------------------------

_TORCH_DTYPES = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32"}


def _tdtype(name: str):
    import torch

    return getattr(torch, _TORCH_DTYPES[name])


@dataclass
class _DeviceDraw:
    """One draw of the GPU check: inputs on the device, their float64 reference and its bound."""

    describe: str
    inputs: dict
    ref: dict
    a_priori: float
    operand_error: float
    bound: float
    arith_error: float = 0.0
    """``run.conditioning.arithmetic_error`` on these inputs."""
    tolerance: dict = field(default_factory=dict)
    """Per output, ``run.conditioning.decision_tolerance`` on these inputs (empty: nothing undecided)."""
    undecided: int = 0


class GpuVerifier:
    """Inputs and float64 reference drawn once per run; ``check(launch)`` per candidate.

    The reference is the graph's float64 meaning evaluated on the inputs as the
    kernel sees them (rounded to the plan dtype). ``reference="torch"`` evaluates it
    with ``run.baselines.torch_fn`` in float64 on the device (same semantics as
    ``ir.reference.evaluate``, which tests/test_baselines.py checks on every catalog
    workload) because numpy's einsum takes minutes at full shapes; ``"numpy"`` uses
    ``reference.evaluate`` itself. Every draw of ``CHECK_DRAWS`` is checked (normal inputs, outliers,
    then planted extremes in a graph with a reduction), as on the CPU, at the plan's own shapes; ``inputs``
    (a caller's) are checked alone. ``inputs``, ``ref``, ``bound`` and ``tensors()`` are the first draw's
    (timing and baselines use those). A backward plan that records its derivation draws its saved tensors
    from its forward inputs (``run.backward_draws``). A later draw is taken at the first magnitude whose
    outputs and computed GEMM operands fit (``draws.checkable``, and ``Draw.accepts``); unlike the CPU
    check, the graph's other intermediate values are not asked to fit (the reference does not compute
    them: an IR softmax's unshifted exp, which no plan stores), so a draw may be taken larger here.
    """

    def __init__(self, plan: Plan, graph: Graph, seed: int | None = None, device: str = "cuda",
                 reference: str = "torch", inputs: Mapping[str, np.ndarray] | None = None,
                 draws: tuple[Draw, ...] = CHECK_DRAWS) -> None:
        self.plan, self.graph, self.device, self._reference_kind = plan, graph, device, reference
        self.seed = fresh_seed() if seed is None else seed
        self.storage_dtype = storage_dtype(plan)
        self.a_priori = error_bound(plan.dtype, reduction_length(graph), len(plan.kernels))
        if inputs is not None:  # a caller's: they belong together
            self._drawn: Drawn[_DeviceDraw] = Drawn([("", self._draw(GIVEN, inputs))],
                                                    ["given"], [], [])
        else:
            from pyrunner.run.backward_draws import numpy_forward, plan_draws, torch_forward

            dts = output_dtypes(plan)
            linked = plan_draws(plan, draws, numpy_forward if reference == "numpy" else torch_forward(device))
            self._drawn = drawn(linked, graph, self.seed, self._draw,
                                lambda d: checkable(d.ref, d.operand_error, dts, d.arith_error), self.storage_dtype)
        self.draws: list[tuple[str, _DeviceDraw]] = self._drawn.prepared
        """Each draw checked (its label, empty for the first; its inputs, reference and bound)."""
        self.skipped: list[str] = self._drawn.skipped
        first = self.draws[0][1]
        self.inputs, self.ref = first.inputs, first.ref
        self.operand_error, self.bound = first.operand_error, first.bound
        self._axes = output_axes(graph)
        self.view = view_of(plan)

    def _draw(self, describe: str, raw: Mapping[str, np.ndarray]) -> _DeviceDraw:
        """One draw prepared, with the arithmetic's error on it measured (``run.conditioning``): an outlier
        draw can put a graph's values where float32 cannot determine them (run 134), and a backward's saved
        tensors carry conditioning no random draw chose."""
        import torch

        dts = input_dtypes(self.plan)
        inputs = {k: torch.from_numpy(np.asarray(v)).to(device=self.device, dtype=_tdtype(dts.get(k, self.plan.dtype)))
                  for k, v in raw.items()}
        rounded = {k: v.to(torch.float64) for k, v in inputs.items()}
        ref = self._reference(self.graph, rounded, self._reference_kind, None)
        operand_error = 0.0
        if computed_operands(self.graph):
            moved = self._reference(self.graph, rounded, self._reference_kind, self.storage_dtype)
            operand_error = finite_max(_max_error_torch(moved[n], r) for n, r in ref.items())
            del moved
        from pyrunner.run.conditioning import arithmetic_error, arithmetic_error_torch, decision_tolerance

        if self._reference_kind == "numpy":
            arith = arithmetic_error(self.graph, {k: v.cpu().numpy() for k, v in rounded.items()},
                                     {k: v.cpu().numpy() for k, v in ref.items()}, self.seed, max_error)
        else:
            arith = arithmetic_error_torch(self.graph, rounded, ref, self.seed, _max_error_torch)
        bound = conditioned_bound(self.a_priori, max(operand_error, arith))
        tolerance, undecided = decision_tolerance(self.graph, rounded)
        return _DeviceDraw(describe, inputs, ref, self.a_priori, operand_error, bound, arith, tolerance, undecided)

    def _reference(self, graph: Graph, rounded: dict, reference: str, operand_dtype: str | None) -> dict:
        """The float64 outputs (``operand_dtype``: with computed GEMM operands rounded to it)."""
        import torch

        if reference == "numpy":
            rnd = operand_rounding(operand_dtype) if operand_dtype else None
            ref = evaluate(graph, {k: v.cpu().numpy() for k, v in rounded.items()}, rnd)
            return {k: torch.from_numpy(np.ascontiguousarray(v)).to(self.device) for k, v in ref.items()}
        from pyrunner.run.baselines import torch_fn

        with torch.no_grad():
            return torch_fn(graph, operand_dtype)(**rounded)

    def tensors(self, inputs: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Global tensors of the plan: inputs (default: the first draw's) filled, everything else poisoned
        with NaN."""
        import torch

        inputs = self.inputs if inputs is None else inputs
        out: dict[str, torch.Tensor] = {}
        graph_in = {t.name: t.axes for t in self.graph.inputs()}
        for gt in self.plan.tensors:
            if gt.role == "input":
                x = to_plan_layout(inputs[gt.name], graph_in[gt.name], gt.axes, self.view)
                out[gt.name] = x.to(_tdtype(gt.dtype)).contiguous()
            else:
                out[gt.name] = torch.full(gt.shape, float("nan"), dtype=_tdtype(gt.dtype), device=self.device)
        return out

    def check(self, launch: Callable[[dict], object], what: str = "") -> VerifyResult:
        """Run launch once per draw on fresh poisoned buffers and compare every graph output; the
        first failing draw is the verdict."""
        return run_draws(self._drawn, lambda label, d: self._check_draw(launch, d, f"{what}{label}: " if label
                                                                        else what))

    def _check_draw(self, launch: Callable[[dict], object], d: _DeviceDraw, what: str) -> VerifyResult:
        import torch

        unchecked = (out_of_range(d.operand_error, self.storage_dtype, self.seed, what, d.describe)
                     or ill_conditioned(d.arith_error, self.seed, what, d.describe))
        if unchecked is not None:
            return unchecked
        t = self.tensors(d.inputs)
        launch(t)
        torch.cuda.synchronize() if self.device.startswith("cuda") else None
        axes = {gt.name: gt.axes for gt in self.plan.tensors if gt.role == "output"}
        errs: dict[str, float] = {}
        for name, ref in d.ref.items():
            if name not in t:
                errs[name] = float("inf")
                continue
            o = to_source_layout(t[name], axes.get(name, self._axes[name]), self._axes[name], self.view)
            errs[name] = _max_error_torch(o, ref, d.tolerance.get(name))
        res = judge(errs, d.bound, self.seed, what, d.describe)
        res.message += _raised(d.a_priori, d.bound, d.operand_error, self.storage_dtype, d.arith_error)
        res.message += undecided_note(d.undecided)
        return res

    def check_fn(self, fn: Callable[..., Mapping[str, torch.Tensor]]) -> float:
        """Normalised max error of a baseline (a ``run.baselines`` function) on the first draw; informative only."""
        outs = fn(**self.inputs)
        return max(_max_error_torch(outs[n], r) for n, r in self.ref.items())


# --- the CPU executor check ----------------------------------------------------

def _rounded_one(v: np.ndarray, dtype: str) -> np.ndarray:
    """``v`` rounded once to ``dtype`` (round to nearest even), back in float64."""
    v = np.asarray(v, dtype=np.float64)
    if dtype == "bfloat16":
        import torch

        return torch.from_numpy(v).to(torch.bfloat16).to(torch.float64).numpy()
    return v.astype({"float16": np.float16, "float32": np.float32}[dtype]).astype(np.float64)


def input_dtypes(plan: Plan) -> dict[str, str]:
    """Each input tensor's dtype: the plan's, or float32 for a statistic (``Graph.float32_io``)."""
    return {t.name: t.dtype for t in plan.tensors if t.role == "input"}


def _rounded(raw: Mapping[str, np.ndarray], plan: Plan) -> dict[str, np.ndarray]:
    """Inputs as the plan's kernels see them (each stored in its own dtype), back in float64."""
    dts = input_dtypes(plan)
    return {k: _rounded_one(v, dts.get(k, plan.dtype)) for k, v in raw.items()}


def combined(passes: list[tuple[str, VerifyResult]], skipped: list[str]) -> VerifyResult:
    """One verdict from the passing checks of several draws (label, result; the first's label empty): the
    error and bound of the draw nearest its bound, a message naming each draw's error and any draw the
    graph itself could not be checked on. ``per_output`` is the first draw's."""
    first = passes[0][1]
    worst = max((r for _, r in passes), key=lambda r: r.error / r.bound if r.bound > 0 else math.inf)
    rest = [f"{label} {r.error:.2e} <= {r.bound:.0e}" for label, r in passes[1:]]
    msg = "; ".join([first.message, *rest, *skipped])
    return VerifyResult(True, worst.error, worst.bound, first.seed, dict(first.per_output), msg)


def run_draws(drawn_set: Drawn, once: Callable[[str, Any], VerifyResult]) -> VerifyResult:
    """``once(label, prepared)`` on each prepared draw in turn (the first failure is the verdict), the draws
    the verdict covers and those skipped recorded on it (``VerifyResult.draws``)."""
    passes: list[tuple[str, VerifyResult]] = []
    res: VerifyResult | None = None
    for i, (label, prep) in enumerate(drawn_set.prepared):
        res = once(label, prep)
        res.draws = drawn_set.names[:i + 1]
        if not res.ok:
            break
        passes.append((label, res))
    else:
        res = combined(passes, drawn_set.skipped)
        res.draws = list(drawn_set.names)
    res.not_checked = list(drawn_set.not_checked)
    return res


@dataclass
class _Prepared:
    """One draw of the CPU check: inputs rounded to the plan dtype, their reference and its bound."""

    describe: str
    rounded: dict[str, np.ndarray]
    ref: dict[str, np.ndarray]
    a_priori: float
    operand_error: float
    peak: float = 0.0
    """The largest magnitude of any value the graph computes on these inputs (inf if one is not finite):
    a plan may store any of them at a kernel boundary in its dtype."""
    arith_error: float = 0.0
    """``run.conditioning.arithmetic_error`` on these inputs (0.0 where the caller gives the bound)."""
    tolerance: dict[str, np.ndarray] = field(default_factory=dict)
    """Per output, ``run.conditioning.decision_tolerance`` on these inputs."""
    undecided: int = 0


def _prepare(plan: Plan, graph: Graph, raw: Mapping[str, np.ndarray], describe: str,
             bound: float | None, seed: int) -> _Prepared:
    """One draw of the CPU check, with the arithmetic's error on it measured (``seed`` draws its roundings)
    as the GPU check does."""
    rounded = _rounded(raw, plan)
    memo = evaluate_terms([t for _, t in graph.outputs], graph.sizes, rounded)
    ref = {n: memo[t] for n, t in graph.outputs}
    peak = max((float(np.max(np.abs(v))) if np.size(v) else 0.0 for v in memo.values()), default=0.0)
    a_priori = executor_bound(plan, graph) if bound is None else bound
    operand_error = 0.0
    if bound is None and computed_operands(graph):
        moved = evaluate(graph, rounded, operand_rounding(storage_dtype(plan)))
        operand_error = finite_max(max_error(moved[n], r) for n, r in ref.items())
    arith = 0.0
    if bound is None:
        from pyrunner.run.conditioning import arithmetic_error

        arith = arithmetic_error(graph, rounded, ref, seed, max_error)
    tolerance, undecided = _numpy_decisions(graph, rounded)
    return _Prepared(describe, rounded, ref, a_priori, operand_error, peak if math.isfinite(peak) else math.inf,
                     arith, tolerance, undecided)


def _numpy_decisions(graph: Graph, rounded: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
    """``run.conditioning.decision_tolerance`` for the CPU check (evaluated by torch on the CPU)."""
    import torch

    from pyrunner.run.conditioning import decision_tolerance

    tol, n = decision_tolerance(graph, {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64))
                                        for k, v in rounded.items()})
    return {k: v.numpy() for k, v in tol.items()}, n


def verify_executor(plan: Plan, graph: Graph, execute: Callable, seed: int | None = None,
                    bound: float | None = None, inputs: Mapping[str, np.ndarray] | None = None,
                    draws: tuple[Draw, ...] = CHECK_DRAWS) -> VerifyResult:
    """Run the plan's tiled algorithm on the CPU and compare with ``reference.evaluate``, on every
    draw of ``CHECK_DRAWS`` (normal inputs, outliers, then planted extremes in a graph with a reduction;
    the first failure is the verdict).

    Inputs are rounded to the plan dtype first (what the kernel would see), so
    the remaining error is the executor's own arithmetic and roundings. ``inputs`` (default: each
    draw of ``draws`` from ``seed``) lets a caller give values that belong together, such as a
    backward graph's saved tensors computed from its forward inputs (``run.grad_check``): those
    are checked alone. A later draw is taken at the largest of its outlier magnitudes on which the
    graph's own values fit the plan's dtypes (``checkable``), and skipped with a note where none does.
    A backward plan that records its derivation (``plan.backward_of``) draws forward inputs and cotangents
    and computes its saved tensors from them, on every draw (``run.backward_draws.plan_draws``).
    """
    seed = fresh_seed() if seed is None else seed
    if inputs is not None:
        res = _executor_once(plan, graph, execute, seed, _prepare(plan, graph, inputs, GIVEN, bound, seed), "")
        res.draws = ["given"]
        return res
    from pyrunner.run.backward_draws import plan_draws

    dts = output_dtypes(plan)
    linked = plan_draws(plan, draws)
    prepared = drawn(linked, graph, seed, lambda desc, raw: _prepare(plan, graph, raw, desc, bound, seed),
                     lambda p: checkable(p.ref, p.operand_error, dts, p.arith_error)
                     and p.peak <= DTYPE_MAX[storage_dtype(plan)],
                     storage_dtype(plan))
    return run_draws(prepared, lambda label, prep: _executor_once(plan, graph, execute, seed, prep, label))


def _executor_once(plan: Plan, graph: Graph, execute: Callable, seed: int, prep: _Prepared,
                   label: str) -> VerifyResult:
    """The CPU check on one prepared draw."""
    what = f"CPU executor {label}: " if label else "CPU executor: "
    dtype = storage_dtype(plan)
    unchecked = (out_of_range(prep.operand_error, dtype, seed, what, prep.describe)
                 or ill_conditioned(prep.arith_error, seed, what, prep.describe))
    if unchecked is not None:
        return unchecked
    bound = conditioned_bound(prep.a_priori, max(prep.operand_error, prep.arith_error))
    view = view_of(plan)  # execute() hands outputs back in source axis names, in the plan's order
    axes = {gt.name: list(view.source_axes(gt.axes)) for gt in plan.tensors if gt.role == "output"}
    try:
        outs = execute(plan, prep.rounded)
    except Exception as e:  # noqa: BLE001 - any executor failure is a failed plan
        return VerifyResult(False, float("inf"), bound, seed, {},
                            f"CPU executor {label}: failed: {type(e).__name__}: {e}" if label else
                            f"CPU executor failed: {type(e).__name__}: {e}")
    res = compare(outs, prep.ref, bound, seed, axes, graph, what, prep.describe, prep.tolerance)
    res.message += _raised(prep.a_priori, bound, prep.operand_error, dtype, prep.arith_error)
    res.message += undecided_note(prep.undecided)
    return res
