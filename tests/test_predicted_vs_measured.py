"""A tuning-database measurement is never printed or logged as a prediction (issue 46: ``--explain``
said "predicted" for a measured time, and 166 of 532 logged ``predicted_us`` were copied measurements)."""

from __future__ import annotations

from pathlib import Path

from pyrunner.ir import catalog
from pyrunner.planner import explain, search
from pyrunner.planner.search import prefer_measured
from pyrunner.run.runner import model_prediction
from pyrunner.target.tuning import DEFAULT_DEVICE, TuningDB


def test_a_measured_plan_says_measured_and_keeps_the_model_prediction_apart(tmp_path: Path) -> None:
    plan = search(catalog.get("Matmul", {"m": 512, "d": 512, "n": 512}), "fp16", tuning=False)[0]
    db = TuningDB(tmp_path / "db.json")
    k = plan.kernels[0]
    assert db.record(plan, {k.name: dict(k.defaults)}, 1234.5, DEFAULT_DEVICE)
    measured = prefer_measured(plan, db)
    assert measured.cost.model.get("measured") and measured.cost.total_us == 1234.5
    assert measured.cost.model["model_total_us"] == plan.cost.total_us
    text = explain(measured)
    assert "predicted 1234.5" not in text
    assert "measured 1234.5 us (tuning database" in text
    assert f"the cost model predicted {plan.cost.total_us:.1f} us" in text
    assert model_prediction(measured) == plan.cost.total_us  # what the log's predicted_us carries
    assert model_prediction(plan) == plan.cost.total_us
    assert f"predicted {plan.cost.total_us:.1f} us by the cost model" in explain(plan)
