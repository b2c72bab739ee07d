"""``compile_kernels_in_threads``: a plan's kernels JIT-compile at the same time, each under its own pass
configs and on the caller's CUDA device (the first training step compiled a Llama layer's kernels one after
another: 318 s in run 155).

TileLang's ``compile`` and torch's device calls are replaced here (no GPU); the rendered module, its
prim_funcs and its pass configs are the real ones.
"""

from __future__ import annotations

import threading
import types

import pytest

from pyrunner.backend.tilelang import compile as tl_compile
from pyrunner.ir import catalog
from pyrunner.plan.analysis import resolve_config


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    """The rendered module of a plan with three or more kernels (SwiGLU's backward)."""
    from pyrunner.frontend.training import plan_training

    graph = catalog.get("SwiGLU", {"m": 1024, "d": 2048, "n": 2048})  # three kernels at its catalog shape
    plan = plan_training(graph, "bf16", cpu_check=False).backward
    assert plan is not None and len(plan.kernels) >= 3, "a multi-kernel plan is needed to see threads"
    return plan, tl_compile.rendered_module(plan, work_dir=tmp_path_factory.mktemp("render"))


def _fake_torch(monkeypatch, device: int) -> list[tuple[int, int]]:
    import torch

    selected: list[tuple[int, int]] = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: device)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: selected.append((threading.get_ident(), d)))
    return selected


def test_kernels_compile_concurrently_on_the_callers_device(monkeypatch, module) -> None:
    import tilelang

    plan, mod = module
    cfg = resolve_config(plan, None)
    n = len(plan.kernels)
    selected = _fake_torch(monkeypatch, device=3)
    barrier = threading.Barrier(n, timeout=30)  # breaks unless all n compiles are in flight at once
    calls = []

    def fake_compile(func, target, pass_configs):
        calls.append((threading.get_ident(), func, target, pass_configs))
        barrier.wait()
        return types.SimpleNamespace(func=func)

    monkeypatch.setattr(tilelang, "compile", fake_compile)
    funcs = mod.build_kernels(cfg)
    kernels = tl_compile.compile_kernels_in_threads(funcs, tl_compile.pass_configs(plan), "cuda -arch=sm_90a",
                                                    workers=n)

    assert list(kernels) == list(funcs)
    assert len({tid for tid, *_ in calls}) == n
    for tid, func, target, passes in calls:
        name = next(k for k, f in funcs.items() if f is func)
        assert kernels[name].func is func
        assert target == "cuda -arch=sm_90a"
        assert passes == {**mod.PASS_CONFIGS, **mod.KERNEL_PASS_CONFIGS.get(name, {})}
        assert (tid, 3) in selected, "each thread selects the caller's device before compiling"


def test_one_worker_compiles_in_order_on_the_calling_thread(monkeypatch, module) -> None:
    import tilelang

    plan, mod = module
    _fake_torch(monkeypatch, device=0)
    seen = []
    monkeypatch.setattr(tilelang, "compile",
                        lambda func, target, pass_configs: seen.append(threading.get_ident()) or func)
    kernels = tl_compile.compile_kernels_in_threads(mod.build_kernels(resolve_config(plan, None)),
                                                    tl_compile.pass_configs(plan), "cuda", workers=1)
    assert list(kernels) == [k.name for k in plan.kernels]
    assert set(seen) == {threading.get_ident()}
