"""``benchmarks/merge_tuning.py``: GPU runs merge into the committed tuning database, from a run's
tuning file or, where that did not come back, from its results log alone."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from pyrunner.ir import catalog
from pyrunner.planner import search
from pyrunner.run.runner import RunOptions, _record_tuning, _Run, default_config
from pyrunner.target.tuning import Entry, TuningDB, measured_forms, tuning_key

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import merge_tuning  # noqa: E402

DEVICE = "NVIDIA H200"


def _plan():
    return search(catalog.get("Matmul", {"m": 256, "d": 512, "n": 512}), "bf16", top=1, tuning=False)[0]


def _entry(config: dict, time_us: float, forms: str = "k0:mainloop.1") -> Entry:
    return Entry(workload="Matmul", config=config, time_us=time_us, extra={"forms": forms})


def test_merging_keeps_the_faster_config_the_newer_code_and_a_re_measurement(tmp_path: Path) -> None:
    a, b = {"k0": {"block_m": 64}}, {"k0": {"block_m": 128}}
    db = TuningDB(tmp_path / "db.json", {"x": _entry(a, 10.0), "y": _entry(a, 10.0), "z": _entry(a, 10.0),
                                          "w": _entry(a, 10.0)})
    run = TuningDB(tmp_path / "run.json", {"x": _entry(b, 12.0), "y": _entry(b, 9.0), "z": _entry(a, 11.0),
                                           "w": _entry(b, 12.0, forms="k0:mainloop.2"), "v": _entry(b, 5.0)})
    lines = merge_tuning.merge_entries(db, run)
    assert db.entries["x"].config == a  # slower: kept
    assert db.entries["y"].config == b and db.entries["y"].time_us == 9.0  # faster
    assert db.entries["z"].time_us == 11.0  # the same config measured again
    assert db.entries["w"].config == b  # measured under other code: replaced
    assert "v" in db.entries and len(lines) == 4
    assert merge_tuning.merge_entries(db, run) == []  # merging the same run again changes nothing


def test_a_results_record_carries_its_tuning_entry_through_the_runner(tmp_path: Path) -> None:
    """The runner names the database key in each timed record (``extra.tuning``), so the entry the
    run wrote to its tuning file is rebuilt from the results log alone, without re-planning."""
    plan = _plan()
    out = tmp_path / "tuning_h200.json"
    run = _Run(plan, catalog.get("Matmul", {"m": 256, "d": 512, "n": 512}), RunOptions(tuning_out=out), Console())
    cfg = default_config(plan)
    run.fields.update(device=DEVICE, config=cfg, plan_us=7.25, status="ok")
    run.fields["extra"]["autotune"] = [{"config": cfg, "time_us": 7.3}]
    _record_tuning(run)
    record = dict(run.fields)
    assert record["extra"]["tuning"]["key"] == tuning_key(plan, DEVICE)
    assert record["extra"]["tuning"]["forms"] == measured_forms(plan)
    written = TuningDB.load(out)

    rebuilt = TuningDB(tmp_path / "db.json")
    lines = merge_tuning.rebuild_from_results(rebuilt, [json.loads(json.dumps(record))], {}, "0.1.15")
    assert len(lines) == 1 and "new" in lines[0]
    (key,) = rebuilt.entries
    assert key in written.entries
    got, want = rebuilt.entries[key], written.entries[key]
    assert (got.config, got.time_us, got.default_us, got.extra) == (want.config, want.time_us, want.default_us,
                                                                    want.extra)
    assert rebuilt.lookup(plan, DEVICE) is not None


def test_an_older_record_is_matched_by_re_planning_its_graph(tmp_path: Path) -> None:
    plan = _plan()
    record = {"status": "ok", "workload": "Matmul", "plan_hash": plan.provenance.plan_hash, "dtype": "bfloat16",
              "device": DEVICE, "config": default_config(plan), "plan_us": 6.5, "extra": {}}
    graphs = {"Matmul": catalog.get("Matmul", {"m": 256, "d": 512, "n": 512})}
    db = TuningDB(tmp_path / "db.json")
    assert merge_tuning.rebuild_from_results(db, [record], graphs, "0.1.15") == ["Matmul: 6.50 us recorded"]
    entry = db.lookup(plan, DEVICE, "0.1.15")
    assert entry is not None and entry.config == default_config(plan) and entry.time_us == 6.5
    lost = replace(graphs["Matmul"], name="Other")
    assert "no graph" in merge_tuning.rebuild_from_results(db, [{**record, "workload": "Lost"}], {"Other": lost},
                                                           "0.1.15")[0]


def test_the_command_merges_a_run_file_and_reports_a_bad_one(tmp_path: Path, capsys) -> None:
    db_path, run_path = tmp_path / "db.json", tmp_path / "run.json"
    TuningDB(db_path, {"x": _entry({"k0": {"block_m": 64}}, 10.0)}).save()
    TuningDB(run_path, {"x": _entry({"k0": {"block_m": 128}}, 8.0)}).save()
    assert merge_tuning.main([str(db_path), "--tuning", str(run_path)]) == 0
    assert TuningDB.load(db_path).entries["x"].time_us == 8.0
    run_path.write_text("{not json")
    before = db_path.read_text()
    assert merge_tuning.main([str(db_path), "--tuning", str(run_path)]) == 2
    assert "not valid" in capsys.readouterr().err and db_path.read_text() == before
