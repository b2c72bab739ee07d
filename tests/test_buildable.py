"""`superopt` hands out only plans TileLang can lower: the next-ranked plan, then the naive plan."""

from __future__ import annotations

import json
import sys
import types

import pytest
from test_validate import rmsnorm_plan

from pyrunner import cli, pipeline
from pyrunner.backend.tilelang import buildable


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def checked(monkeypatch):
    """The lowering check on; a fake planner whose plans are told apart by their workload field."""
    monkeypatch.delenv("SUPEROPT_NO_LOWER_CHECK", raising=False)
    mod = types.ModuleType("pyrunner.planner")

    def search(graph, dtype, *, top=1, naive=False, calibration=None, budget=None, tuning=None, device=None):
        base = rmsnorm_plan()
        tag = "naive" if naive else "ranked"
        return [base.model_copy(update={"workload": f"{tag}{i}"}) for i in range(top)]

    mod.search = search
    mod.explain = lambda plan: ""
    monkeypatch.setitem(sys.modules, "pyrunner.planner", mod)
    bad: set[str] = set()
    monkeypatch.setattr(buildable, "lowering_problem",
                        lambda plan, target=None: "InternalError: no available layout found" if plan.workload in bad
                        else None)
    return bad


def test_the_best_plan_that_builds_is_handed_out(checked, capsys) -> None:
    checked.add("ranked0")
    code, out, err = _run(["superopt", "RMSNorm"], capsys)
    assert code == 0, err
    assert json.loads(out)["workload"] == "ranked1"
    assert "plan 1" in err and "does not build with TileLang" in err and "no available layout found" in err


def test_the_naive_plan_when_no_ranked_plan_builds(checked, capsys) -> None:
    checked.update({f"ranked{i}" for i in range(pipeline.LOWER_CHECK_SPARES + 1)})
    code, out, err = _run(["superopt", "RMSNorm"], capsys)
    assert code == 0, err
    assert json.loads(out)["workload"] == "naive0"
    assert "this is the naive plan" in err


def test_nothing_builds_is_one_error_line(checked, capsys) -> None:
    checked.update({f"ranked{i}" for i in range(pipeline.LOWER_CHECK_SPARES + 1)} | {"naive0"})
    code, out, err = _run(["superopt", "RMSNorm"], capsys)
    assert code == 2 and out == ""
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert "cannot build any plan" in line and "no available layout found" in line


def test_no_lower_check_hands_out_the_best_plan(checked, capsys) -> None:
    checked.add("ranked0")
    code, out, err = _run(["superopt", "RMSNorm", "--no-lower-check"], capsys)
    assert code == 0 and json.loads(out)["workload"] == "ranked0"


def test_a_real_plan_lowers() -> None:
    pytest.importorskip("tilelang")
    from pyrunner.ir import catalog
    from pyrunner.planner import search

    (plan,) = search(catalog.get("Matmul", {"m": 128, "d": 128, "n": 128}), "bf16")
    assert buildable.lowering_problem(plan) is None
