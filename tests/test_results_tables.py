"""The measured tables are generated from the committed records, and README quotes them verbatim."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyrunner.errors import UserError
from pyrunner.log.results import RunRecord
from pyrunner.log.tables import newest_rows, render, seed_table, side_by_side
from pyrunner.target.device import DEFAULT_GPU_NAME

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MAX_RESULT_FILES = 60


def _rec(workload: str = "G", plan: float = 10.0, tc: float | None = 20.0, rounds: tuple = ("plan", "torch_compile"),
         status: str = "ok", ts: str = "2026-12-01T00:00:00", **baselines: float) -> dict:
    base = {"torch_compile": tc, **baselines}
    return RunRecord(plan_hash="p", workload=workload, graph_hash="g", shapes={"m": 64}, dtype="bfloat16",
                     device="NVIDIA H200", status=status, plan_us=plan, baselines_us=base, timestamp=ts,
                     speedups={"torch_compile": 99.0}, extra={"timing": {"rounds_us": {k: [1.0] for k in rounds}}}
                     ).model_dump(mode="json")


def _write(folder: Path, name: str, *records: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in records))


def test_committed_results_md_is_what_the_records_generate() -> None:
    committed = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    assert committed == render(newest_rows(RESULTS, DEFAULT_GPU_NAME)), \
        "benchmarks/RESULTS.md is stale: run `python -m pyrunner report --tables` and commit it"


def test_readme_table_is_the_seed_slice_of_results_md() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- results:seeds -->", 1)[1].split("<!-- /results:seeds -->", 1)[0].strip()
    assert block == seed_table(newest_rows(RESULTS, DEFAULT_GPU_NAME))
    assert block in (ROOT / "benchmarks" / "RESULTS.md").read_text()


def test_results_folder_is_small_and_indexed() -> None:
    files = sorted(p.name for p in RESULTS.iterdir())
    assert len(files) <= MAX_RESULT_FILES, f"benchmarks/results holds {len(files)} files (at most {MAX_RESULT_FILES})"
    index = (RESULTS / "INDEX.md").read_text()
    named = set(re.findall(r"`([^`\s]+)`", index))
    missing = [f for f in files if f != "INDEX.md" and f not in named]
    assert not missing, f"INDEX.md does not say what these are for: {missing}"
    for row in newest_rows(RESULTS, DEFAULT_GPU_NAME):  # every table row's log is kept
        assert (RESULTS / row.file).is_file()


def test_only_side_by_side_records_make_rows(tmp_path: Path) -> None:
    ok = RunRecord.model_validate(_rec())
    assert side_by_side(ok)
    assert not side_by_side(RunRecord.model_validate(_rec(tc=None)))  # an alternative: no baselines
    assert not side_by_side(RunRecord.model_validate(_rec(rounds=("plan",))))  # baseline timed apart
    assert not side_by_side(RunRecord.model_validate(_rec(rounds=("plan", "torch_compile"), eager=5.0)))
    assert not side_by_side(RunRecord.model_validate(_rec(status="failed-launch")))
    assert not side_by_side(RunRecord.model_validate(_rec(plan=None)))


def test_newest_record_per_case_wins_and_speedups_come_from_times(tmp_path: Path) -> None:
    _write(tmp_path, "h200-run5-a.jsonl", _rec(plan=10.0, ts="2026-12-01T00:00:00"),
           _rec(workload="H", plan=4.0, tc=2.0))
    _write(tmp_path, "h200-run7-b.jsonl", _rec(plan=8.0, ts="2026-12-02T00:00:00"),
           _rec(workload="H", plan=1.0, rounds=("plan",)))  # newer, but timed apart: not a row
    (tmp_path / "sweep-cases.jsonl").write_text('{"id": "x", "status": "verified"}\n')
    rows = {r.record.workload: r for r in newest_rows(tmp_path, DEFAULT_GPU_NAME)}
    assert rows["G"].record.plan_us == 8.0 and rows["G"].run == "7"
    assert rows["G"].record.speedups["torch_compile"] == pytest.approx(2.5)  # 20 / 8, not the stored 99
    assert rows["H"].run == "5" and rows["H"].record.speedup_vs_best == pytest.approx(0.5)
    text = render(list(rows.values()))
    assert "| H | bf16 | m=64 | 4.0 | 2.0 | 2.0 (torch.compile) | 0.50x | 0.50x | 5 (`h200-run5-a.jsonl`) |" in text


def test_report_tables_command(tmp_path: Path) -> None:
    logs, out = tmp_path / "logs", tmp_path / "out"
    _write(logs, "h200-run3-x.jsonl", _rec())
    cmd = [sys.executable, "-m", "pyrunner", "report", "--tables", "--log", str(logs), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (out / "RESULTS.md").read_text() == render(newest_rows(logs, DEFAULT_GPU_NAME))
    bad = subprocess.run(cmd[:6] + [str(tmp_path / "nope")], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not a folder" in bad.stderr
    with pytest.raises(UserError):
        newest_rows(tmp_path / "nope", DEFAULT_GPU_NAME)


def test_a_second_backends_row_stands_beside_the_hopper_row(tmp_path: Path) -> None:
    """The Ampere path timed on the same GPU (``gpu_run --device a100``) is another row of the case, never the
    newer record that replaces the Hopper one; a record without a backend is Hopper's."""
    hopper = _rec(plan=10.0, ts="2026-12-01T00:00:00")  # no backend field: an old Hopper record
    named = _rec(plan=9.0, ts="2026-12-02T00:00:00")
    named["extra"]["backend"] = "tilelang-hopper"  # the runner's form: the same backend as no field
    ampere = _rec(plan=12.0, ts="2026-12-03T00:00:00")  # newest, but another backend's
    ampere["extra"]["backend"] = "a100 (tilelang-ampere, sm_80)"  # the form gpu_run's own records take
    _write(tmp_path, "h200-run5-a.jsonl", hopper, named)
    _write(tmp_path, "h200-run6-ampere.jsonl", ampere)
    rows = newest_rows(tmp_path, DEFAULT_GPU_NAME)
    assert sorted(r.record.plan_us for r in rows) == [9.0, 12.0]  # the Ampere record replaced nothing
    assert sorted((r.backend, r.record.plan_us) for r in rows) == [("tilelang-ampere", 12.0), ("tilelang-hopper", 9.0)]
    text = render(rows)
    hop = text.index("| G | bf16 | m=64 | 9.0 |")
    amp = text.index("| G (tilelang-ampere) | bf16 | m=64 | 12.0 |")
    assert hop < amp and text.count("| G") == 2  # the Hopper row first, the Ampere path's beside it
    assert "| all, tilelang-ampere (1) |" in text and "| all (1) |" in text  # summaries kept apart


def test_readme_seed_table_is_the_default_backends_and_the_others_follow_it(tmp_path: Path) -> None:
    """README's seed slice is the Hopper backend's table; another backend's seeds are a table of their own
    after it in RESULTS.md, so the README block stays one contiguous piece of RESULTS.md."""
    from pyrunner.ir import catalog

    sizes = dict(catalog.get("Matmul").sizes)
    hopper, ampere = _rec("Matmul", plan=50.0), _rec("Matmul", plan=93.0)
    ampere["extra"]["backend"] = "tilelang-ampere"
    for r in (hopper, ampere):
        r["shapes"] = sizes
    _write(tmp_path, "h200-run7-seeds.jsonl", hopper, ampere)
    rows = newest_rows(tmp_path, DEFAULT_GPU_NAME)
    readme = seed_table(rows)
    assert "| Matmul | bf16 |" in readme and "tilelang-ampere" not in readme
    amp = seed_table(rows, ("tilelang-ampere", "NVIDIA H200"))
    assert "| Matmul (tilelang-ampere) | bf16 |" in amp and "| Matmul | bf16 |" not in amp
    text = render(rows)
    assert readme in text and text.index(readme) < text.index("On tilelang-ampere:") < text.index(amp)


def test_a_record_from_another_card_stands_beside_the_h200_row_and_never_replaces_it(tmp_path: Path) -> None:
    """The lent GPU is sometimes an H100: a newer H100 record of a seed is its own row, marked with the card,
    and averages only with other H100 rows; the H200 row (README's table) keeps the H200 time."""
    from pyrunner.ir import catalog

    sizes = dict(catalog.get("Matmul").sizes)
    h200 = _rec("Matmul", plan=50.0, ts="2026-12-01T00:00:00")
    h100 = _rec("Matmul", plan=60.0, tc=30.0, ts="2026-12-05T00:00:00")
    h100["device"] = "NVIDIA H100 80GB HBM3"
    for r in (h200, h100):
        r["shapes"] = sizes
    _write(tmp_path, "h200-run7-seeds.jsonl", h200)
    _write(tmp_path, "h100-run8-seeds.jsonl", h100)
    rows = newest_rows(tmp_path, DEFAULT_GPU_NAME)
    assert len(rows) == 2
    readme = seed_table(rows)
    assert "| Matmul | bf16 |" in readme and "| 50.0 |" in readme and "H100" not in readme
    other = seed_table(rows, ("tilelang-hopper", "NVIDIA H100 80GB HBM3"))
    assert "| Matmul (H100 80GB HBM3) | bf16 |" in other and "| 60.0 |" in other
    text = render(rows)
    assert "| seeds (1) | 0.40x |" in text and "| seeds, H100 80GB HBM3 (1) | 0.50x |" in text


def test_record_backend_reads_every_form_writers_use() -> None:
    from pyrunner.log.results import record_backend

    assert record_backend({}) == record_backend({"backend": None}) == "tilelang-hopper"
    assert record_backend({"backend": "tilelang-ampere"}) == "tilelang-ampere"  # runner.py
    assert record_backend({"backend": "tilelang-ampere (sm_80)"}) == "tilelang-ampere"  # gpu_sweep.py
    assert record_backend({"backend": "a100 (tilelang-ampere, sm_80)"}) == "tilelang-ampere"  # describe()
    assert record_backend({"backend": "h200 (tilelang-hopper, sm_90a)"}) == "tilelang-hopper"


def test_a_record_tagged_with_its_run_names_that_run_whatever_its_file(tmp_path: Path) -> None:
    tagged = _rec(ts="2026-12-02T00:00:00")
    tagged["extra"]["run"] = 139
    _write(tmp_path, "h100-seeds-runs128-139.jsonl", tagged, _rec(workload="H"))
    _write(tmp_path, "h200-run5-a.jsonl", {**_rec(workload="K"), "extra": {**_rec()["extra"], "run": "../x"}})
    rows = {r.record.workload: r for r in newest_rows(tmp_path, DEFAULT_GPU_NAME)}
    assert rows["G"].run == "139"
    assert rows["H"].run == "-"  # untagged, and the file name names no single run
    assert rows["K"].run == "5"  # a tag that is not a run number is ignored
