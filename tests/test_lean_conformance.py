"""The Lean package builds, proves its rules, and its `superopt` prints the Python planner's plans.

Runs only where `lake` is on PATH: no Lean toolchain can be installed on the development
machines or in CI (DESIGN section 3), so elsewhere every test here is skipped, saying so.
`tests/test_lean_sources.py` and `tests/test_lean_protocol.py` cover what can be checked without
a compiler.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pyrunner.ir.catalog import CATALOG
from pyrunner.ir.graph_json import graph_to_json
from pyrunner.rules.registry import RULE_NAMES

ROOT = Path(__file__).resolve().parents[1]
LAKE = shutil.which("lake")

pytestmark = [pytest.mark.lean, pytest.mark.skipif(
    LAKE is None,
    reason="lake (the Lean 4 build tool) is not on PATH; no Lean toolchain here (DESIGN section 3)")]
"""Every test here carries the ``lean`` marker (``-m lean`` selects them, ``-m 'not lean'`` leaves them
out) and, without ``lake``, is reported as skipped with the reason above: never as passed."""


def lake(*args: str, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    assert LAKE is not None
    return subprocess.run([LAKE, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def built() -> None:
    """`lake build`: compiles the package and has the kernel check every proof."""
    r = lake("build", timeout=3600)
    assert r.returncode == 0, f"lake build failed:\n{r.stdout}\n{r.stderr}"


def superopt(*args: str, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    return lake("exe", "superopt", *args, env={"SUPEROPT_PYTHON": python})


def python_planner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyrunner", "superopt", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_lake_test_passes(built: None) -> None:
    r = lake("test", timeout=1800)
    assert r.returncode == 0, f"lake test failed:\n{r.stdout}\n{r.stderr}"


def test_rules_listed(built: None) -> None:
    r = superopt("--rules")
    assert r.returncode == 0, r.stderr
    names = [rule["name"] for rule in json.loads(r.stdout)["rules"]]
    assert set(RULE_NAMES) <= set(names)


def test_list(built: None) -> None:
    r = superopt("--list")
    assert r.returncode == 0 and r.stdout.split() == list(CATALOG)


@pytest.mark.parametrize("name", list(CATALOG))
def test_graph_json_is_pythons(built: None, name: str) -> None:
    r = superopt("--graph-json", name)
    assert r.returncode == 0, r.stderr
    assert r.stdout == json.dumps(graph_to_json(CATALOG[name]())) + "\n"


@pytest.mark.parametrize("name", list(CATALOG))
def test_plan_is_the_python_plan_byte_for_byte(built: None, name: str) -> None:
    lean, py = superopt(name), python_planner(name)
    assert lean.returncode == 0, lean.stderr
    assert lean.stdout == py.stdout


def test_options_pass_through(built: None) -> None:
    args = ("--shape", "t_kv=64", "--shape", "d=32", "--top", "2", "--dtype", "bf16")
    lean, py = superopt("Attention", *args), python_planner("Attention", *args)
    assert lean.returncode == 0, lean.stderr
    assert lean.stdout == py.stdout


@pytest.mark.parametrize("args", [
    ("NoSuchWorkload",), ("Matmul", "--shape", "zz=4"), ("Matmul", "--shape", "m=0"), ("Matmul", "--bogus"),
    ("Matmul", "--dtype", "fp8"), ("Matmul", "--top", "0"), ()])
def test_bad_input_exits_2_with_one_line(built: None, args: tuple[str, ...]) -> None:
    r = superopt(*args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_missing_python_is_one_line(built: None) -> None:
    r = superopt("Matmul", python="/nonexistent/python3")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""
