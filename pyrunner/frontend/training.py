"""A graph's training plans: the forward that also writes what its backward reads, and the backward.

Both come from the same door as every other plan (``compile.cached_plan``: ``pipeline.best_plan``),
for the derivation ``planner.saves.choose_saves`` picks (recompute or save, by the cost model), as
``superopt --with-saves`` and ``superopt --backward`` plan them. Before a backward plan is used it is
checked twice on the CPU: its tiled algorithm on the CPU executor against the float64 reference of
the backward graph on every draw of the checks (normal, outlier and planted inputs, ``run.draws``), each
draw's saved tensors computed from its own forward inputs (``run.backward_draws``: the plan records its
derivation), and the derived backward graph against PyTorch float64 autograd of the forward graph
(``run.grad_check.check_gradients``), both at the CPU-check shapes. On a GPU the compiled backward
is checked against float64 on the same draws (``gpu_check_backward``), as ``pyrunner run`` and
``gpu_sweep --backward`` check a backward plan file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyrunner.errors import UserError
from pyrunner.ir.grad import Backward, derive
from pyrunner.ir.graph import Graph
from pyrunner.plan.schema import Plan

DERIVATION_TOL = 1e-9
"""The derived backward graph evaluated in float64 against float64 autograd: two exact derivations
differ by float64 rounding only (tests/test_grad.py uses the same tolerance)."""


@dataclass
class TrainingPlans:
    """A graph's derivation and its two plans (None where only the derivation was asked for)."""

    bwd: Backward
    forward: Plan | None = None
    backward: Plan | None = None
    check: str = ""


_DERIVED: dict[tuple[str, str | None, str | None, tuple[str, ...] | None], Backward] = {}


def derivation(graph: Graph, dtype: str | None, device: str | None = None,
               wrt: frozenset[str] | None = None) -> Backward:
    """The backward of ``graph`` with the saves the cost model prefers at ``dtype`` (None: the default
    saves of ``ir.grad.derive``: outputs, log-sum-exps and the D identity's contraction). Once per
    distinct graph and dtype in a process, as ``compile.cached_plan`` plans: a model's layers share it.
    ``device``: the backend's device whose cost model chooses the saves (None: the local GPU's); ``wrt``:
    the inputs whose gradients are asked for (None: every input; a model's rotary tables, masks and
    position indices need none, and their gradients would be kernels of their own)."""
    from pyrunner.ir.graph_json import graph_to_json
    from pyrunner.plan.schema import canonical_json

    key = (canonical_json(graph_to_json(graph)), dtype, device, None if wrt is None else tuple(sorted(wrt)))
    if key not in _DERIVED:
        if dtype is None:
            _DERIVED[key] = derive(graph, wrt=wrt)
        else:
            _DERIVED[key] = _stored_or_chosen(graph, dtype, device, wrt)
    return _DERIVED[key]


def _stored_or_chosen(graph: Graph, dtype: str, device: str | None, wrt: frozenset[str] | None) -> Backward:
    """``choose_saves`` for the backend of ``device``, through the plan store where one is in use."""
    import pyrunner.frontend.plan_store as plan_store
    from pyrunner.backend.tilelang.backend import resolve_backend
    from pyrunner.ir.graph_json import graph_to_json
    from pyrunner.planner.saves import choose_saves

    target = resolve_backend(device).device
    key = {"graph": graph_to_json(graph), "dtype": dtype, "device": target.name}
    if wrt is not None:
        key["wrt"] = sorted(wrt)
    bwd = plan_store.load_derivation(key) if plan_store.ROOT is not None else None
    if bwd is None:
        bwd = choose_saves(graph, dtype, device=target, wrt=wrt)
        plan_store.save_derivation(key, bwd)
    return bwd


def plan_training(graph: Graph, dtype: str, *, cpu_check: bool = True, device: str | None = None,
                  wrt: frozenset[str] | None = None) -> TrainingPlans:
    """Derive (the gradients of the inputs ``wrt``, default all), plan forward-with-saves and backward for the
    backend of ``device`` (None: the local GPU's), and (``cpu_check``) check both on the CPU. The backward plan
    records its derivation (``plan.backward_of``)."""
    from pyrunner.frontend.region_plans import cached_plan
    from pyrunner.frontend.region_plans import cpu_check as check_forward
    from pyrunner.plan.backward_of import with_backward_of

    bwd = derivation(graph, dtype, device, wrt)
    fwd_plan, _ = cached_plan(bwd.forward, dtype, device)
    back_plan = with_backward_of(cached_plan(bwd.graph, dtype, device)[0], bwd)
    tp = TrainingPlans(bwd, fwd_plan, back_plan)
    if cpu_check:
        tp.check = "; ".join((f"forward {check_forward(fwd_plan)}", cpu_check_backward(graph, bwd, back_plan)))
    return tp


def training_plans(plan: Plan, device: str | None = None) -> TrainingPlans:
    """Both halves for a forward ``plan`` (``load(plan, backward=True)``): ``plan`` itself as the forward where
    its graph already writes every saved tensor, else the forward-with-saves plan, and the derived backward;
    for the backend of ``device`` (None: the local GPU's)."""
    from pyrunner.frontend.region_plans import cached_plan
    from pyrunner.plan.backward_of import with_backward_of
    from pyrunner.plan.validate import plan_graph

    graph = plan_graph(plan)
    bwd = derivation(graph, plan.dtype, device)
    same = [n for n, _ in bwd.forward.outputs] == [n for n, _ in graph.outputs]
    fwd_plan = plan if same else cached_plan(bwd.forward, plan.dtype, device)[0]
    return TrainingPlans(bwd, fwd_plan, with_backward_of(cached_plan(bwd.graph, plan.dtype, device)[0], bwd))


def recorded(plan: Plan, bwd: Backward) -> Plan:
    """``plan`` carrying the record of ``bwd`` (``plan.backward_of``) where it has none: a check then draws each
    of its draws' saved tensors from that draw's forward inputs (``run.backward_draws``)."""
    from pyrunner.plan.backward_of import derivation_of, with_backward_of

    return plan if derivation_of(plan) is not None else with_backward_of(plan, bwd)


def cpu_check_backward(graph: Graph, bwd: Backward, plan: Plan, seed: int = 0) -> str:
    """The backward plan on the CPU executor against float64 on every draw of the checks (``draws.CHECK_DRAWS``,
    saved tensors computed from each draw's forward inputs), then the derivation against float64 autograd,
    both at the plan's CPU-check shapes; raises ``UserError`` on a miss."""
    from pyrunner.run.executor import execute
    from pyrunner.run.grad_check import check_gradients
    from pyrunner.run.runner import graph_of
    from pyrunner.run.shrink import cpu_check_plan
    from pyrunner.run.verify import verify_executor

    small = cpu_check_plan(recorded(plan, bwd))
    g = graph_of(small)
    res = verify_executor(small, g, execute, seed=seed)
    if not res.ok and not res.uncheckable:  # a gradient infinite in float64 itself is reported, not failed
        raise UserError(f"backward plan CPU check failed: {res.message}")
    fwd = graph.with_sizes({a: n for a, n in g.sizes.items() if a in graph.sizes})
    grad = check_gradients(fwd, derive(fwd), seed=seed)
    if not grad.worst() <= DERIVATION_TOL:
        raise UserError(f"the derived backward differs from float64 autograd by {grad.worst():.2e} "
                        f"(> {DERIVATION_TOL:.0e}) at {dict(fwd.sizes)}")
    checked = "not CPU-checked" if res.uncheckable else "CPU-checked"
    return (f"backward {checked} at {dict(g.sizes)} ({res.message}); derivation within "
            f"{DERIVATION_TOL:.0e} of float64 autograd")


def gpu_check_backward(loaded: Any, bwd: Backward, device: str = "cuda", seed: int = 0) -> Any:
    """The compiled backward (a ``load.LoadedPlan``) against float64 on every draw of the GPU check, each draw's
    saved tensors computed from its forward inputs by float64 PyTorch on ``device`` (``run.backward_draws``);
    raises ``UserError`` when it fails (the bound is ``verify.GpuVerifier``'s, derived as the forward's)."""
    from pyrunner.run.verify import GpuVerifier

    res = GpuVerifier(recorded(loaded.plan, bwd), loaded.graph, seed=seed, device=device).check(loaded.compile(device))
    if not res.ok and not res.uncheckable:  # as on the CPU: a non-finite float64 gradient is reported, not failed
        raise UserError(f"backward plan {loaded.hash} failed the float64 check: {res.message}")
    return res
