"""The corpus: operators outside the catalog, written from their usual definitions (tests/data/*.json).

Each graph plans (top 3), every plan passes the CPU executor against the float64 reference at
scaled-down shapes, and the best plan lowers to CUDA for sm_90a and builds a cubin with nvcc.
A graph the planner cannot handle yet because of a known planner bug is an expected failure
that names the bug (strict=False: it starts passing when the planner is fixed).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from plan_cache import search

from pyrunner.backend.tilelang.compile import check_fits, compile_cubin, lower_to_cuda
from pyrunner.backend.tilelang.lowered import tma_races, warp_specialised_thread_reads
from pyrunner.errors import GraphError
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.run.executor import execute
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import scale_down
from pyrunner.run.verify import verify_executor

DATA = Path(__file__).resolve().parent / "data"
FORMAT_EXAMPLES = {"gated_mixture"}
"""Files in tests/data that document the graph format (odd sizes on purpose), not corpus operators."""

PLANNER_XFAIL: dict[str, str] = {}
"""Corpus graphs that do not plan yet, with the planner bug that stops them (none: the chained-contraction
MLPs plan since issue 9 item 1 was fixed; an entry here is strict, so a fixed graph fails until removed)."""


TOP = 3
"""Plans checked per corpus graph. The slow tier's corpus tests (here and tests/test_render_emulated.py) all
ask the plan cache (tests/plan_cache.py) for this many and take the first ones they need, so each graph is
planned once for all of them (a different ``top`` is another cache entry, planned again)."""


def corpus_files() -> list[Path]:
    return sorted(p for p in DATA.glob("*.json") if p.stem not in FORMAT_EXAMPLES)


def planned_cases() -> list:
    """Every catalog workload and every corpus graph that plans, as ``("catalog", name)`` /
    ``("corpus", path)`` parameters (the slow tier's whole-corpus tests over renderings)."""
    from pyrunner.ir import catalog

    cases = [pytest.param(("catalog", n), id=n) for n in catalog.CATALOG]
    return cases + [pytest.param(("corpus", p), id=p.stem) for p in corpus_files() if p.stem not in PLANNER_XFAIL]


def case_graph(case: tuple) -> object:
    """The graph of a ``planned_cases`` parameter."""
    from pyrunner.ir import catalog
    from pyrunner.ir.graph_json import load_graph_file

    kind, x = case
    return catalog.get(x) if kind == "catalog" else load_graph_file(Path(x))


def _params() -> list:
    out = []
    for p in corpus_files():
        marks = [pytest.mark.xfail(reason=PLANNER_XFAIL[p.stem], raises=GraphError, strict=True)] \
            if p.stem in PLANNER_XFAIL else []
        out.append(pytest.param(p, id=p.stem, marks=marks))
    return out


def test_corpus_is_big_and_varied() -> None:
    files = corpus_files()
    assert len(files) >= 15
    graphs = [load_graph_file(p) for p in files]
    assert sum(len(g.outputs) > 1 for g in graphs) >= 2
    for g in graphs:  # tile-friendly: every axis a multiple of 64 or a small head/group count
        assert all(n % 64 == 0 or n <= 16 for n in g.sizes.values()), (g.name, g.sizes)


@pytest.mark.slow
@pytest.mark.parametrize("path", _params())
def test_corpus_plans_pass_cpu_executor(path: Path) -> None:
    graph = load_graph_file(path)
    plans = search(graph, "bf16", top=TOP)
    assert plans
    for plan in plans:
        small = scale_down(plan)
        res = verify_executor(small, graph_of(small), execute)
        assert res.ok, f"{path.stem} plan {plan.provenance.plan_hash}: {res.message} (seed {res.seed})"


@pytest.mark.slow
@pytest.mark.parametrize("path", _params())
def test_corpus_best_plan_builds_cubin(path: Path, tmp_path: Path) -> None:
    plan = search(load_graph_file(path), "bf16", top=TOP)[0]  # the best of the plans checked above: planned once
    check_fits(plan)
    sources = lower_to_cuda(plan)
    assert set(sources) == {k.name for k in plan.kernels}
    assert {k: [str(r) for r in tma_races(src)] for k, src in sources.items() if tma_races(src)} == {}
    assert {k: warp_specialised_thread_reads(src) for k, src in sources.items()
            if warp_specialised_thread_reads(src)} == {}
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH: CUDA source checked, cubin not built")
    cubins = compile_cubin(sources, tmp_path)
    assert len(cubins) == len(plan.kernels) and all(p.stat().st_size > 0 for p in cubins)
