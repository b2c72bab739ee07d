"""Inputs of a few kilobytes must not take minutes or gigabytes (issue 46's re-probe, generated here).

Each case runs the command a user would run (``superopt`` with its lowering check on, ``run --small``)
in a child process on a generated graph file under 1 MB, and must end within ``LIMIT_S`` CPU seconds
(the child's own, so other work on the machine does not count) and ``LIMIT_KB`` of peak memory, either
with a plan (exit 0) or with one clear error line (exit 2), never a traceback. The roots: kernel cones
are capped (``planner.search.MAX_KERNEL_TERMS``), term typing and equality are memoised on the terms
(deep chains were quadratic), and TileLang is asked to lower only plans within
``backend.tilelang.limits``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIMIT_S = 60
LIMIT_KB = 2 * 1024 * 1024
GUARD_BYTES = 6 << 30
"""Address-space cap of the child: a regression fails the memory bound without taking the machine."""

_CHILD = """
import resource, sys
from pyrunner.cli import main
code = main(sys.argv[1:])
use = resource.getrusage(resource.RUSAGE_SELF)
print("MAXRSS_KB", use.ru_maxrss, file=sys.stderr)
print("CPU_S", use.ru_utime + use.ru_stime, file=sys.stderr)
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


def _guard() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (GUARD_BYTES, GUARD_BYTES))


def _cli(argv: list[str], timeout: float = 20 * LIMIT_S) -> tuple[int, str]:
    """Exit code and stderr of ``superopt ARGV`` in a child; the wall-clock timeout is generous (a loaded
    machine), the bound is on the child's CPU time (``_bounded``)."""
    env = {k: v for k, v in os.environ.items() if k != "SUPEROPT_NO_LOWER_CHECK"}  # as a user runs it
    proc = subprocess.run([sys.executable, "-c", _CHILD, *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, preexec_fn=_guard)
    return proc.returncode, proc.stderr


def _measured(err: str, key: str) -> float:
    got = [float(line.split()[1]) for line in err.splitlines() if line.startswith(key + " ")]
    assert got, f"no {key} line (the child died?): {err[-2000:]}"
    return got[0]


def _bounded(argv: list[str]) -> None:
    try:
        code, err = _cli(argv)
    except subprocess.TimeoutExpired:
        pytest.fail(f"over {20 * LIMIT_S} s of wall-clock time: {' '.join(argv)}")
    assert "Traceback" not in err, err[-3000:]
    assert _measured(err, "MAXRSS_KB") <= LIMIT_KB, f"{_measured(err, 'MAXRSS_KB')} KB: {' '.join(argv)}"
    assert _measured(err, "CPU_S") <= LIMIT_S, f"{_measured(err, 'CPU_S')} CPU-s: {' '.join(argv)}"
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 0 or (code == 2 and len(errors) == 1), (code, err[-2000:])


CASES = {
    "softmax chain 200": softmax_chain(200),
    "softmax chain 1000": softmax_chain(1000),
    "doubling DAG 200": doubling(200),
    "doubling DAG 1000": doubling(1000),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_superopt_on_a_generated_graph_is_bounded(name: str, tmp_path: Path) -> None:
    f = tmp_path / "g.json"
    f.write_text(json.dumps(CASES[name]))
    assert f.stat().st_size < 1 << 20
    _bounded(["superopt", "--graph", str(f), "--out", str(tmp_path / "plan.json")])


@pytest.mark.slow
def test_run_small_of_a_doubling_dag_plan_is_bounded(tmp_path: Path) -> None:
    """The naive plan of a 200-node doubling DAG (200 kernels): ``run`` refuses it before rendering,
    lowering or logging anything, in one line."""
    f = tmp_path / "g.json"
    f.write_text(json.dumps(doubling(200)))
    plan = tmp_path / "plan.json"
    code, err = _cli(["superopt", "--graph", str(f), "--out", str(plan), "--no-lower-check"])
    assert code == 0, err[-2000:]
    log = tmp_path / "r.jsonl"
    _bounded(["run", str(plan), "--small", "--no-baselines", "--quiet", "--log", str(log),
              "--out", str(tmp_path / "out")])
    assert not log.exists()


def test_the_generated_graphs_are_what_the_cases_say() -> None:
    """The generators build valid graphs of the stated depth (fast tier)."""
    from pyrunner.ir.graph_json import graph_from_json

    for n in (3, 200):
        chain = graph_from_json(softmax_chain(n))
        assert sum(1 for t in chain.terms() if t.op == "reduce") == n  # exp / sum per softmax, as written
        dag = graph_from_json(doubling(n))
        assert len(dag.terms()) == n + 1  # shared: n nodes and the input, not 2**n
