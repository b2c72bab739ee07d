"""Random graphs (tests/graph_strategies.py): every one plans and its best plan passes the CPU executor.

CI runs a bounded number of examples (derandomized under CI=1, see conftest); set
SUPEROPT_RANDOM_GRAPHS=N for a larger run on demand, e.g.
``SUPEROPT_RANDOM_GRAPHS=500 python -m pytest -q tests/test_random_graphs.py``.
"""

from __future__ import annotations

import json
import os

from graph_strategies import graph_docs, seeded_graph_doc
from hypothesis import HealthCheck, given, settings

from pyrunner.ir.graph_json import graph_from_json
from pyrunner.planner import search
from pyrunner.run.executor import execute
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import scale_down
from pyrunner.run.verify import verify_executor

EXAMPLES = int(os.environ.get("SUPEROPT_RANDOM_GRAPHS", "12"))
QK_NORM = EXAMPLES > 12
"""QK-norm attention takes 10-50 s to plan today (issue 8 item 5): only in the larger run (the corpus
and the GPU sweep cover it)."""


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph_docs(qk_norm=QK_NORM))
def test_random_graph_plans_and_passes_cpu_executor(doc: dict) -> None:
    graph = graph_from_json(doc)
    (plan,) = search(graph, "bf16", top=1)
    small = scale_down(plan)
    res = verify_executor(small, graph_of(small), execute, seed=0)  # reproducible under derandomized CI
    assert res.ok, f"{res.message} (seed {res.seed}) for graph {json.dumps(doc)}"


def test_generator_is_valid_varied_and_reproducible() -> None:
    docs = [seeded_graph_doc(s) for s in range(200)]
    assert seeded_graph_doc(7) == seeded_graph_doc(7)
    ops = {n["op"] for d in docs for n in d["nodes"]}
    assert {"matmul", "softmax", "rmsnorm", "layernorm", "sigmoid", "tanh", "sum", "max"} <= ops
    assert any(len(d["outputs"]) > 1 for d in docs)
    for d in docs:
        g = graph_from_json(d)
        assert all(n % 64 == 0 or n <= 4 for n in g.sizes.values())
