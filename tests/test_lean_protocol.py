"""The Python half of the `lake exe superopt` protocol, checked without a Lean compiler.

`lake exe superopt W` (Superopt/Plan.lean) writes the Lean catalog's graph as graph JSON, runs
`$SUPEROPT_PYTHON -m pyrunner superopt --graph FILE [options]`, checks the plan and prints the
engine's stdout unchanged. Here the graph the Lean catalog describes (evaluated from the Lean
sources by tests/test_lean_sources.py) is written as the Lean writer writes it, fed to the exact
command line read from Superopt/Plan.lean, and the output must be byte for byte what
`python -m pyrunner superopt W` prints. The Lean writer itself is tied to Python's by the golden
texts in tests/lean/SuperoptTest.lean, which `lake test` compares with `Graph.jsonText` and this
file compares with `graph_to_json`; the number table there is checked against Python's `repr`.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyrunner.ir.catalog import CATALOG
from pyrunner.ir.graph_json import graph_from_json, graph_to_json
from tests.test_lean_sources import LEAN_DIR, LEAN_TEST_DIR, ROOT, code, lean_catalog

PLAN_LEAN = LEAN_DIR / "Plan.lean"
TEST_LEAN = LEAN_TEST_DIR / "SuperoptTest.lean"


def engine_prefix() -> list[str]:
    """`engineArgs` of Superopt/Plan.lean up to the options: the literal list, graphFile a placeholder."""
    m = re.search(r"^def engineArgs \(graphFile : String\) \(o : Options\) : List String :=\s*\n"
                  r"\s*\[(?P<items>[^\]]*)\] \+\+ o\.passThrough\s*$", code(PLAN_LEAN), re.M)
    assert m, "def engineArgs not found in the expected form in Superopt/Plan.lean"
    return [item.strip() if not item.strip().startswith('"') else ast.literal_eval(item.strip())
            for item in m["items"].split(",")]


def pass_through_order() -> list[str]:
    """The option flags `Options.passThrough` emits, in order."""
    m = re.search(r"^def Options\.passThrough .*?(?=^/--|^def )", code(PLAN_LEAN), re.M | re.S)
    assert m, "def Options.passThrough not found"
    return re.findall(r'"(--[\w-]+)"', m[0])


def lean_command(graph_file: Path, options: list[str]) -> list[str]:
    """The command `lake exe superopt` runs for a graph file (interpreter: this Python)."""
    args = [str(graph_file) if a == "graphFile" else a for a in engine_prefix()]
    return [sys.executable, *args, *options]


def lean_graph_text(name: str, shapes: dict[str, int] | None = None) -> str:
    """What `Graph.jsonText` prints for the Lean catalog's workload (tied to Python by the goldens)."""
    g = lean_catalog()[name]
    if shapes:
        g = g.with_sizes(shapes)
    return json.dumps(graph_to_json(g))


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def python_planner(*args: str) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-m", "pyrunner", "superopt", *args])


def test_engine_command_line_is_the_documented_one() -> None:
    assert engine_prefix() == ["-m", "pyrunner", "superopt", "--graph", "graphFile"]
    assert pass_through_order() == ["--dtype", "--top", "--naive", "--explain", "--calibrate"]


# the graph texts of every workload are tied to Python's by test_golden_graph_texts_are_what_python_writes;
# the fast tier runs the protocol end to end on the cheap workloads, the slow tier on the rest
CHEAP = {"Attention", "SwiGLU", "Matmul", "RMSNorm", "GeGLU"}


@pytest.mark.parametrize("name", [n if n in CHEAP else pytest.param(n, marks=pytest.mark.slow) for n in CATALOG])
def test_engine_on_the_lean_graph_prints_the_python_plan(name: str, tmp_path: Path) -> None:
    graph_file = tmp_path / "graph.json"
    graph_file.write_text(lean_graph_text(name) + "\n")
    lean = run(lean_command(graph_file, []))
    py = python_planner(name)
    assert py.returncode == 0, py.stderr
    assert lean.returncode == 0, lean.stderr
    assert lean.stdout == py.stdout, f"{name}: the plan from the Lean graph differs from the Python plan"
    plan = json.loads(lean.stdout)
    assert plan["graph"] == json.loads(lean_graph_text(name)), "the plan's embedded graph is not the Lean graph"


@pytest.mark.parametrize("name, shapes, options", [
    ("Attention", {"t_kv": 64, "d": 32}, ["--top", "2"]),
    ("RMSNorm", {"m": 64, "d": 256, "n": 128}, ["--dtype", "bf16"]),
    ("SwiGLU", {}, ["--naive"]),
    ("Matmul", {"m": 64, "d": 128, "n": 64}, ["--explain"]),
])
def test_options_pass_through(name: str, shapes: dict[str, int], options: list[str], tmp_path: Path) -> None:
    graph_file = tmp_path / "graph.json"
    graph_file.write_text(lean_graph_text(name, shapes) + "\n")
    lean = run(lean_command(graph_file, options))
    shape_args = [x for a, n in shapes.items() for x in ("--shape", f"{a}={n}")]
    py = python_planner(name, *shape_args, *options)
    assert py.returncode == 0 and lean.returncode == 0, (py.stderr, lean.stderr)
    assert lean.stdout == py.stdout


def test_engine_error_is_one_line(tmp_path: Path) -> None:
    """Lean relays the last stderr line of a failed engine run; that line must be the error."""
    graph_file = tmp_path / "graph.json"
    graph_file.write_text('{"name": "G"}\n')
    r = run(lean_command(graph_file, []))
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ")


def test_generated_names_do_not_become_labels() -> None:
    """graph_from_json(graph_to_json(g)) keeps g's labels: t<N> names are the writer's, not the author's."""
    for name, make in CATALOG.items():
        g = make()
        back = graph_from_json(graph_to_json(g))
        live = set(g.terms())
        assert {t: n for t, n in back.labels.items() if t.op != "input"} == \
            {t: n for t, n in g.labels.items() if t in live and t.op != "input"}, name


# --- the golden texts and the number table of tests/lean/SuperoptTest.lean ------------------------

def lean_string(literal: str) -> str:
    """A Lean string literal (only the escapes JSON text needs: \\" and \\\\)."""
    return json.loads(literal)


def golden_graphs() -> dict[str, str]:
    m = re.search(r"^def goldenGraphs : List \(String × String\) := \[(?P<body>.*?)\]$", TEST_LEAN.read_text(),
                  re.M | re.S)
    assert m, "def goldenGraphs not found in tests/lean/SuperoptTest.lean"
    pairs = re.findall(r'\("(\w+)",\s*("(?:[^"\\]|\\.)*")\)', m["body"])
    return {name: lean_string(text) for name, text in pairs}


def test_golden_graph_texts_are_what_python_writes() -> None:
    golden = golden_graphs()
    assert list(golden) == list(CATALOG), "tests/lean/SuperoptTest.lean must hold a golden text per workload"
    for name, text in golden.items():
        assert text == json.dumps(graph_to_json(CATALOG[name]())), name
        assert text == lean_graph_text(name), name


def test_golden_resized_text() -> None:
    m = re.search(r"^def goldenResized : String :=\s*\n\s*(\"(?:[^\"\\]|\\.)*\")", TEST_LEAN.read_text(), re.M)
    assert m
    assert lean_string(m[1]) == json.dumps(graph_to_json(CATALOG["Attention"]().with_sizes({"t_kv": 64, "d": 32})))
    assert re.search(r'graphText "Attention" \[\("t_kv", 64\), \("d", 32\)\] == goldenResized', TEST_LEAN.read_text())


def number_table() -> list[tuple[str, str]]:
    m = re.search(r"^def numberTable : List \(Decimal × String\) := \[(?P<body>.*?)\]$", TEST_LEAN.read_text(),
                  re.M | re.S)
    assert m, "def numberTable not found in tests/lean/SuperoptTest.lean"
    return re.findall(r'\(([-0-9.e]+), "([^"]+)"\)', m["body"])


def test_number_table_is_pythons_repr() -> None:
    table = number_table()
    assert len(table) >= 10
    assert ("1e-6", "1e-06") in table and ("1.4426950408889634", "1.4426950408889634") in table
    for literal, text in table:
        assert repr(float(literal)) == text, literal
        assert float(text) == float(literal)


def test_log2e_and_eps_survive_the_protocol(tmp_path: Path) -> None:
    """The graph constant eps = 1e-6 reaches the engine exactly, and LOG2E leaves it exactly."""
    from pyrunner.rules.registry import LOG2E

    text = lean_graph_text("RMSNorm")
    assert ", 1e-06]" in text
    assert float(json.loads(text)["nodes"][2]["args"][1]) == 1e-6
    graph_file = tmp_path / "graph.json"
    graph_file.write_text(lean_graph_text("Attention") + "\n")
    out = run(lean_command(graph_file, []))
    assert out.returncode == 0, out.stderr
    assert repr(LOG2E) in out.stdout
