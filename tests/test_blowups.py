"""Inputs of a few kilobytes must not take minutes or gigabytes (issue 46's re-probe, generated here).

Each case runs the command a user would run (``superopt`` with its lowering check on, ``run --small``)
in a child process on a generated graph file under 1 MB, and must end within ``LIMIT_S`` seconds and
``LIMIT_KB`` of memory, either with a plan (exit 0) or with one clear error line (exit 2), never a
traceback. Cases still over the limits are expected failures naming the cause (strict: one that
starts passing fails the suite, so its marker is removed with the fix).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = pytest.mark.skipif(not os.environ.get("SUPEROPT_SLOW"),
                           reason="generated graphs still over their 60 s / 2 GB bounds "
                                  "(expected failures, minutes each): set SUPEROPT_SLOW=1")

ROOT = Path(__file__).resolve().parent.parent
LIMIT_S = 60
LIMIT_KB = 2 * 1024 * 1024

_CHILD = """
import resource, sys
from pyrunner.cli import main
code = main(sys.argv[1:])
print("MAXRSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def softmax_chain(n: int) -> dict:
    nodes = [{"name": "s0", "op": "softmax", "args": ["X"], "axis": "n"}]
    nodes += [{"name": f"s{i}", "op": "softmax", "args": [f"s{i - 1}"], "axis": "n"} for i in range(1, n)]
    return {"name": "SoftmaxChain", "axes": {"m": 64, "n": 64}, "inputs": {"X": ["m", "n"]}, "nodes": nodes,
            "outputs": [f"s{n - 1}"]}


def doubling(n: int) -> dict:
    """d_i = d_(i-1) + d_(i-1): 2**n paths through n nodes (a tree walk of it never ends)."""
    nodes = [{"name": "d0", "op": "exp", "args": ["X"]}]
    nodes += [{"name": f"d{i}", "op": "add", "args": [f"d{i - 1}", f"d{i - 1}"]} for i in range(1, n)]
    return {"name": "Doubling", "axes": {"m": 64, "n": 64}, "inputs": {"X": ["m", "n"]}, "nodes": nodes,
            "outputs": [f"d{n - 1}"]}


def _cli(argv: list[str], timeout: float = LIMIT_S) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "SUPEROPT_NO_LOWER_CHECK"}  # as a user runs it
    proc = subprocess.run([sys.executable, "-c", _CHILD, *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    return proc.returncode, proc.stderr


def _bounded(argv: list[str]) -> None:
    try:
        code, err = _cli(argv)
    except subprocess.TimeoutExpired:
        pytest.fail(f"over {LIMIT_S} s: {' '.join(argv)}")
    assert "Traceback" not in err, err[-3000:]
    rss = [int(line.split()[1]) for line in err.splitlines() if line.startswith("MAXRSS_KB")]
    assert rss and rss[0] <= LIMIT_KB, f"{rss} KB: {' '.join(argv)}"
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 0 or (code == 2 and len(errors) == 1), (code, err[-2000:])


SLOW_SEARCH = ("the all-cut start partition of the beam search fuses each softmax's elementwise tail into "
               "the next kernel, so kernel cones grow with depth and each is lowered and tile-searched anew "
               "(quadratic); no work bound covers lowering")
SLOW_LOWERING = ("the plan's one kernel holds a fragment per node, and TileLang's lowering (the superopt "
                 "lowering check, run --small's CUDA source) takes minutes and gigabytes on it")

CASES = {
    "softmax chain 200": (softmax_chain(200), SLOW_SEARCH),
    "softmax chain 1000": (softmax_chain(1000), SLOW_SEARCH),
    "doubling DAG 200": (doubling(200), SLOW_LOWERING),
    "doubling DAG 1000": (doubling(1000), SLOW_LOWERING),
}


@pytest.mark.slow
@HEAVY
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=why) if why else ())
                                  for n, (_, why) in CASES.items()])
def test_superopt_on_a_generated_graph_is_bounded(name: str, tmp_path: Path) -> None:
    graph, _ = CASES[name]
    f = tmp_path / "g.json"
    f.write_text(json.dumps(graph))
    assert f.stat().st_size < 1 << 20
    _bounded(["superopt", "--graph", str(f), "--out", str(tmp_path / "plan.json")])


@pytest.mark.slow
@HEAVY
@pytest.mark.xfail(strict=True, reason=SLOW_LOWERING)
def test_run_small_of_a_doubling_dag_plan_is_bounded(tmp_path: Path) -> None:
    f = tmp_path / "g.json"
    f.write_text(json.dumps(doubling(200)))
    plan = tmp_path / "plan.json"
    code, err = _cli(["superopt", "--graph", str(f), "--out", str(plan), "--no-lower-check"], timeout=600)
    assert code == 0, err[-2000:]
    _bounded(["run", str(plan), "--small", "--no-baselines", "--quiet", "--log", str(tmp_path / "r.jsonl"),
              "--out", str(tmp_path / "out")])


def test_the_generated_graphs_are_what_the_cases_say() -> None:
    """The generators build valid graphs of the stated depth (fast tier)."""
    from pyrunner.ir.graph_json import graph_from_json

    for n in (3, 200):
        chain = graph_from_json(softmax_chain(n))
        assert sum(1 for t in chain.terms() if t.op == "reduce") == n  # exp / sum per softmax, as written
        dag = graph_from_json(doubling(n))
        assert len(dag.terms()) == n + 1  # shared: n nodes and the input, not 2**n
