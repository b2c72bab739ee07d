"""Shared pytest setup: the `gpu` marker, skipped with a reason where no CUDA GPU exists;
property tests derandomized under CI (same examples every run, so a landing is reproducible;
locally they keep exploring new examples); the shared plan cache (tests/plan_cache.py) in pytest's
cache folder, off for tests that use ``monkeypatch``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
"""Under CI (``.ci/run`` exports CI=true): the same examples every run (derandomize, which also leaves
the example database out), each property test bounded by its own ``max_examples``, and no per-example
deadline (timing belongs in benchmarks; a 200 ms deadline fails by load on a shared machine)."""
if os.environ.get("CI"):
    settings.load_profile("ci")

os.environ.setdefault("SUPEROPT_NO_LOWER_CHECK", "1")
"""`superopt` lowers each plan it hands out with TileLang (seconds each); the CLI tests check its
contract with the planner, and tests/test_buildable.py turns the check back on to test it."""

if "SUPEROPT_TUNING_DIR" not in os.environ:
    import tempfile

    os.environ["SUPEROPT_TUNING_DIR"] = tempfile.mkdtemp(prefix="superopt-no-tuning-")
"""The ``superopt`` command, the runner and the frontend plan with the committed tuning database
(``benchmarks/tuning``); tests see an empty one instead, so merging GPU timings cannot change a test's
outcome. A test of the committed database itself loads it by path (``target.tuning.TUNING_DIR``)."""

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped, saying so, where none is present")
    import plan_cache

    cache = getattr(config, "cache", None)  # None under -p no:cacheprovider: plans are shared in-process only
    try:
        root = None if cache is None else cache.mkdir("superopt-plans")
    except OSError:  # a read-only checkout: plans are shared in-process only
        root = None
    if root is not None and not hasattr(config, "workerinput"):  # the controller, before any worker starts
        plan_cache.prune(root)
    plan_cache.configure(root)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    import plan_cache

    plan_cache.enable("monkeypatch" not in getattr(item, "fixturenames", ()))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture
def matmul_plan():
    """A renderer-fixture GEMM plan carrying its real source graph, at any small size."""
    from plan_fixtures import gemm_plan

    from pyrunner.ir import catalog as workloads
    from pyrunner.ir.graph_json import graph_to_json
    from pyrunner.plan.schema import with_hash

    def make(m: int = 64, d: int = 64, n: int = 64, dtype: str = "float16"):
        p = gemm_plan(m, d, n, dtype)
        from pyrunner.planner.aliases import graph_hash

        graph = workloads.get("Matmul", {"m": m, "d": d, "n": n})
        prov = p.provenance.model_copy(update={"graph_hash": graph_hash(graph)})
        return with_hash(p.model_copy(update={"graph": graph_to_json(graph), "provenance": prov}))

    return make


@pytest.fixture
def executor_launch():
    """launch(tensors) that runs a plan's tiled algorithm on the CPU executor (``run.executor.execute``) on the
    GPU check's tensors (CPU torch tensors, the plan's layout) and stores its outputs: ``GpuVerifier`` with
    ``device="cpu"`` then checks a plan as the device would run it."""
    import numpy as np
    import torch

    from pyrunner.plan.validate import plan_graph
    from pyrunner.plan.views import to_source_layout, view_of
    from pyrunner.run.executor import execute

    def make(plan):
        graph, view = plan_graph(plan), view_of(plan)
        axes = {t.name: t.axes for t in graph.inputs()}

        def launch(t: dict) -> None:
            ins = {gt.name: to_source_layout(t[gt.name].double().numpy(), gt.axes, axes[gt.name], view)
                   for gt in plan.tensors if gt.role == "input"}
            for name, v in execute(plan, ins).items():
                t[name].copy_(torch.from_numpy(np.asarray(v, dtype=np.float64)).reshape(t[name].shape))

        return launch

    return make


@pytest.fixture
def fake_launch():
    """launch(tensors) that computes the graph with run.baselines.torch_fn (float64) and stores the outputs."""
    from pyrunner.run.baselines import torch_fn

    def make(graph, corrupt=None):
        fn = torch_fn(graph)
        names = [t.name for t in graph.inputs()]

        def launch(tensors):
            out = fn(**{k: tensors[k].double() for k in names})
            for name, v in out.items():
                if corrupt is not None:
                    v = corrupt(v)
                tensors[name].copy_(v.to(tensors[name].dtype))

        return launch

    return make
