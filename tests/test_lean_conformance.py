"""The Lean package builds, proves its rules, and prints the same graphs as the Python catalog.

Runs only where `lake` is on PATH: no Lean toolchain can be installed on the development
machines or in CI (DESIGN section 3), so elsewhere every test here is skipped, saying so.
`tests/test_lean_sources.py` covers what can be checked without a compiler.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pyrunner.ir import graph as G
from pyrunner.ir.catalog import CATALOG

ROOT = Path(__file__).resolve().parents[1]
LAKE = shutil.which("lake")
RULES = (
    "softmax_max_shift", "matmul_div_commute", "matmul_row_scale_commute", "exp_to_exp2",
    "mean_to_sum_div", "reduction_tiling", "online_softmax_rescale", "shared_operand_fusion",
    "reduction_in_contraction_loop",
)

pytestmark = pytest.mark.skipif(
    LAKE is None,
    reason="lake (the Lean 4 build tool) is not on PATH; no Lean toolchain here (DESIGN section 3)")


def lake(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    assert LAKE is not None
    return subprocess.run([LAKE, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def built() -> None:
    """`lake build`: compiles the package and has the kernel check every proof."""
    r = lake("build", timeout=3600)
    assert r.returncode == 0, f"lake build failed:\n{r.stdout}\n{r.stderr}"


def superopt(*args: str) -> subprocess.CompletedProcess[str]:
    return lake("exe", "superopt", *args)


def term_json(t: G.Term) -> dict[str, Any]:
    """A Python term in the JSON format `Superopt/Plan.lean` prints."""
    if t.op == "input":
        return {"op": "input", "name": t.name, "axes": list(t.axes)}
    if t.op == "const":
        return {"op": "const", "value": t.value}
    if t.op == "axis_size":
        return {"op": "axis_size", "axis": t.axis}
    out: dict[str, Any] = {"op": t.op, "args": [term_json(a) for a in t.args]}
    if t.op in ("unary", "binary", "reduce"):
        out["fn"] = t.fn
    if t.op in ("reduce", "matmul"):
        out["axis"] = t.axis
    return out


def graph_json(g: G.Graph) -> dict[str, Any]:
    return {
        "name": g.name,
        "sizes": dict(g.sizes),
        "inputs": [{"name": t.name, "axes": list(t.axes)} for t in g.inputs()],
        "outputs": [{"name": n, "axes": list(G.result_axes(t)), "term": term_json(t)} for n, t in g.outputs],
    }


def same(a: Any, b: Any) -> bool:
    """JSON equality, with floats compared to a relative 1e-12 (Lean prints its own decimals)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return a == b


def test_same_sees_a_difference() -> None:
    g = graph_json(CATALOG["RMSNorm"]())
    other = graph_json(CATALOG["RMSNorm"]().with_sizes({"m": 8}))
    assert same(g, g) and not same(g, other)


def test_lake_test_passes(built: None) -> None:
    r = lake("test", timeout=1800)
    assert r.returncode == 0, f"lake test failed:\n{r.stdout}\n{r.stderr}"


def test_rules_listed(built: None) -> None:
    r = superopt("--rules")
    assert r.returncode == 0, r.stderr
    assert tuple(rule["name"] for rule in json.loads(r.stdout)["rules"]) == RULES


@pytest.mark.parametrize("name", list(CATALOG))
def test_workload_graph_matches_python(built: None, name: str) -> None:
    r = superopt(name)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["workload"] == name and tuple(doc["rules"]) == RULES
    assert same(doc["graph"], graph_json(CATALOG[name]())), f"Lean and Python graphs of {name} differ"


def test_shape_override_matches_python(built: None) -> None:
    r = superopt("Attention", "--shape", "t_kv=64", "--shape", "d=32")
    assert r.returncode == 0, r.stderr
    expected = graph_json(CATALOG["Attention"]().with_sizes({"t_kv": 64, "d": 32}))
    assert same(json.loads(r.stdout)["graph"], expected)


@pytest.mark.parametrize("args", [
    ("NoSuchWorkload",), ("Matmul", "--shape", "zz=4"), ("Matmul", "--shape", "m=0"), ("Matmul", "--bogus"), ()])
def test_bad_input_exits_2(built: None, args: tuple[str, ...]) -> None:
    r = superopt(*args)
    assert r.returncode == 2 and r.stderr.strip()
