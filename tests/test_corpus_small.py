"""The fast tier's corpus check: every corpus graph and catalog workload, at the GPU sweep's small shape
(long axes cut to 128, head and group counts to 2; the shape every sweep verifies on the device), plans
and its best plan passes the CPU executor against float64.

The slow tier (tests/test_corpus.py, tests/test_render_emulated.py) plans the same graphs at their own
sizes, checks the three best plans, emulates the rendered source and builds cubins.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_corpus import PLANNER_XFAIL, corpus_files

from pyrunner.ir import catalog
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.planner import search
from pyrunner.run.executor import execute
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import scale_down
from pyrunner.run.verify import verify_executor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from gpu_sweep import small_sizes  # noqa: E402

SLOW = {"attention_qk_norm": "the fast tier's slowest test (about 15 CPU-s, most of it planning); the slow tier "
                             "checks it here and at its own size (tests/test_corpus.py), and the fast tier plans "
                             "it at the sweep's real shape (tests/test_render_bridges.py)"}
"""Cases run in the slow tier only, with the reason."""

CASES = [pytest.param(("catalog", n), id=n) for n in catalog.CATALOG]
CASES += [pytest.param(("corpus", p), id=p.stem, marks=[pytest.mark.slow] if p.stem in SLOW else [])
          for p in corpus_files() if p.stem not in PLANNER_XFAIL]


@pytest.mark.parametrize("case", CASES)
def test_small_shape_plans_and_passes_cpu_executor(case) -> None:
    kind, x = case
    graph = catalog.get(x) if kind == "catalog" else load_graph_file(Path(x))
    graph = graph.with_sizes(small_sizes(dict(graph.sizes)))
    (plan,) = search(graph, "bf16", top=1)
    small = scale_down(plan)
    res = verify_executor(small, graph_of(small), execute)
    assert res.ok, f"{graph.name} at {dict(graph.sizes)}: plan {plan.provenance.plan_hash}: {res.message}"
