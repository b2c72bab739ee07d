"""The same graph gives the same plan bytes on any machine and under any load (issue 46).

The partition search used to stop at a 30 s wall-clock deadline, so a loaded machine returned a
different plan for the held-out QK-norm attention graph. Budgets now count work only; these tests
plan graphs twice in fresh interpreters, once with a different hash seed and busy processes beside
it, and compare the bytes. Planning time itself is a benchmark matter, not asserted here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GRAPH_DIRS = (ROOT / "tests" / "data", ROOT / "benchmarks" / "graphs")

_PLAN_ALL = """
import json, sys
from pyrunner.ir import catalog
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.plan.schema import canonical_json, plan_document
from pyrunner.planner import search
out = {}
for item in json.loads(sys.argv[1]):
    g = catalog.get(item[8:]) if item.startswith("catalog:") else load_graph_file(item)
    out[item] = canonical_json(plan_document(search(g, "bf16")[0]))
sys.stdout.write(json.dumps(out))
"""


def _plan_bytes(items: list[str], seed: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    proc = subprocess.run([sys.executable, "-c", _PLAN_ALL, json.dumps(items)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _busy(n: int) -> list[subprocess.Popen]:
    """``n`` processes spinning on the CPU beside the planner (the load the wall-clock budget saw)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _planned_twice(items: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    quiet = _plan_bytes(items, "0")
    busy = _busy(4)
    try:
        loaded = _plan_bytes(items, "12345")
    finally:
        for p in busy:
            p.kill()
            p.wait()
    return quiet, loaded


SUBSET = ["catalog:Matmul", str(ROOT / "tests/data/softmax_rows.json"),
          str(ROOT / "benchmarks/graphs/band_mask_softmax.json")]
CUT = [str(ROOT / "tests/data/attention_qk_norm.json")]  # the longest search (cut by its budget before issue 46)


def _same_bytes(items: list[str]) -> None:
    quiet, loaded = _planned_twice(items)
    assert set(quiet) == set(items)
    for item in items:
        assert quiet[item] == loaded[item], f"{item}: the plan differs between an idle and a loaded run"


def test_plans_are_byte_identical_under_load_and_another_hash_seed() -> None:
    _same_bytes(SUBSET)


@pytest.mark.slow
def test_the_longest_search_is_byte_identical_under_load_and_another_hash_seed() -> None:
    """The held-out graph of issue 46 (about a minute of planning, twice; cut by its budget before issue 46
    completed its search); the fast tier's cut search is test_a_cut_search_says_so_and_explain_names_what_was_left."""
    _same_bytes(CUT)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("SUPEROPT_SLOW"), reason="whole catalog and corpus planned twice (tens of "
                    "minutes on two cores): set SUPEROPT_SLOW=1")
def test_every_catalog_and_corpus_graph_plans_byte_identically_under_load() -> None:
    from pyrunner.ir import catalog

    items = [f"catalog:{n}" for n in catalog.CATALOG]
    items += [str(p) for d in GRAPH_DIRS for p in sorted(d.glob("*.json"))]
    quiet, loaded = _planned_twice(items)
    differ = [item for item in items if quiet[item] != loaded[item]]
    assert not differ, f"plans differ under load: {differ}"


def test_no_wall_clock_decides_a_plan() -> None:
    """No clock is read anywhere in the planner (the grep of issue 46)."""
    clock = re.compile(r"\btime\.time\b|perf_counter|monotonic|process_time|datetime\.now")
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "pyrunner" / "planner").glob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if clock.search(line)]
    assert not hits, hits


def test_a_cut_search_says_so_and_explain_names_what_was_left() -> None:
    """A work budget that runs out leaves a note in the plan and in ``--explain``; a search that
    completes leaves none (and its plan file has no ``search_cut`` key, so older plans keep their bytes)."""
    from pyrunner.ir import catalog
    from pyrunner.plan.schema import plan_document
    from pyrunner.planner import explain, search
    from pyrunner.planner.search import Budget

    g = catalog.get("RMSNormMLP", {"m": 64, "d": 128, "n": 64})
    full = search(g, "fp16", tuning=False)[0]
    assert not any("partition search" in n for n in full.provenance.search_cut)
    cut = search(g, "fp16", tuning=False, budget=Budget(work=1))[0]
    notes = [n for n in cut.provenance.search_cut if "partition search" in n]
    assert notes and any("not explored" in n or "not evaluated" in n or "stopped" in n for n in notes)
    text = explain(cut)
    assert "search cut short" in text and notes[0] in text
    if not full.provenance.search_cut:
        assert "search_cut" not in plan_document(full)["provenance"]
        assert "search cut short" not in explain(full)
