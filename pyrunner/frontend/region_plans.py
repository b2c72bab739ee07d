"""A region graph's plan, loaded kernels and CPU check, each made once per process (plans also across processes,
through the plan store where one is in use: ``frontend.plan_store``).

The layers of a model, and every decode step of a KV bucket, give the same region graph: these
caches are why they are planned, compiled and checked once. Planning is deterministic, so a cache
changes no plan.
"""

from __future__ import annotations

from typing import Any

from pyrunner.errors import UserError
from pyrunner.frontend.runtime import Impl, plan_impl
from pyrunner.plan.schema import Plan

LOWER_CHECK: bool | None = None
"""Whether ``plan_region`` runs the TileLang lowering gate; None: where a GPU is (``grad_bench --plan-only`` sets
it, so plans made on a CPU machine for the plan store are the ones the GPU host would make)."""


def plan_region(graph: Any, dtype: str, device: str | None = None) -> Plan:
    """The one place the frontend asks for a plan: ``pipeline.best_plan``, as the ``superopt`` command does
    (the backend of ``device``, default the GPU found at run time, and that device's committed tuning
    database, so both doors hand out the same plan). The lowering gate runs where the kernels will be
    built (a GPU); without one the plan is only CPU-checked, and TileLang lowering there would cost
    seconds per region for nothing the check uses."""
    from pyrunner.backend.tilelang.backend import resolve_backend
    from pyrunner.pipeline import best_plan
    from pyrunner.target.tuning import committed_tuning

    backend = resolve_backend(device)
    return best_plan(graph, dtype, backend=backend, tuning=committed_tuning(backend.device.name),
                     lower_check=lower_check())[0]


def lower_check() -> bool:
    """``LOWER_CHECK``, or whether a GPU is here when it is None."""
    import torch

    return torch.cuda.is_available() if LOWER_CHECK is None else LOWER_CHECK


_PLANS: dict[tuple[str, str, str | None], Plan] = {}
_CHECKS: dict[str, str] = {}


def cached_plan(graph: Any, dtype: str, device: str | None = None) -> tuple[Plan, bool]:
    """``plan_region`` once per distinct region graph and dtype in this process, and whether it was cached.

    Regions are named canonically (``region``, ``in<k>``, ``out<k>``), so the layers of a model, or a
    shape seen again, are one graph: planned once. Planning is deterministic, so the cache changes no plan."""
    from pyrunner.ir.graph_json import graph_to_json
    from pyrunner.plan.schema import canonical_json

    key = (canonical_json(graph_to_json(graph)), dtype, device)
    hit = key in _PLANS
    if not hit:
        _PLANS[key] = _stored_or_planned(graph, dtype, device)
    return _PLANS[key], hit


def _stored_or_planned(graph: Any, dtype: str, device: str | None) -> Plan:
    """``plan_region``, through the plan store where one is in use (``frontend.plan_store``)."""
    import pyrunner.frontend.plan_store as plan_store

    if plan_store.ROOT is None:
        return plan_region(graph, dtype, device)
    from pyrunner.backend.tilelang.backend import resolve_backend
    from pyrunner.ir.graph_json import graph_to_json

    key = plan_store.plan_key(graph_to_json(graph), dtype, resolve_backend(device).device.name, lower_check())
    plan = plan_store.load_plan(key)
    if plan is None:
        plan = plan_region(graph, dtype, device)
        plan_store.save_plan(key, plan)
    return plan


_IMPLS: dict[tuple[str, int, str | None], Impl] = {}


def loaded_impl(plan: Plan, device: str | None = None) -> Impl:
    """``plan_impl`` once per plan, backend and CUDA device in this process: its kernels compiled and checked once.

    Every decode step of a KV bucket (a new concrete shape, so a new static graph: ``specialize``) plans the
    same region graph, so it gets the same plan and, here, the same loaded kernels, already verified."""
    import torch

    from pyrunner.plan.schema import plan_hash

    key = (plan_hash(plan), torch.cuda.current_device() if torch.cuda.is_available() else -1, device)
    if key not in _IMPLS:
        _IMPLS[key] = plan_impl(plan, verify=False, device=device)
    return _IMPLS[key]


def naive_plan(graph: Any, dtype: str, device: str | None = None) -> Plan:
    """The unfused plan (one kernel per op) that a region must beat in the backend, for ``device``'s backend."""
    from pyrunner.backend.tilelang.backend import resolve_backend
    from pyrunner.planner import search

    return search(graph, dtype, naive=True, device=resolve_backend(device).device)[0]


def cpu_check(plan: Plan) -> str:
    """The plan's tiled algorithm on the CPU executor against float64, at reduced shapes; raises on a miss."""
    from pyrunner.plan.schema import plan_hash
    from pyrunner.run.executor import execute
    from pyrunner.run.runner import graph_of
    from pyrunner.run.shrink import cpu_check_plan
    from pyrunner.run.verify import verify_executor

    key = plan_hash(plan)
    if key not in _CHECKS:
        small = cpu_check_plan(plan)
        res = verify_executor(small, graph_of(small), execute, seed=0)
        if not res.ok:
            raise UserError(f"CPU check failed: {res.message}")
        _CHECKS[key] = f"CPU-checked at {dict(graph_of(small).sizes)}"
    return _CHECKS[key]
