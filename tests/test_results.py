"""Results log: validated records, speedups, and appends that survive a SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from pyrunner.log.results import LogError, RunRecord, append_record, make_record, read_log, speedups

ROOT = Path(__file__).resolve().parent.parent


def _rec(**kw) -> RunRecord:
    base = dict(plan_hash="abc123", workload="W", graph_hash="g1", shapes={"m": 8}, dtype="float16",
                device="cpu", status="ok")
    return make_record(**{**base, **kw})


def test_speedups_against_each_and_the_best_baseline() -> None:
    per, best, vs_best = speedups(50.0, {"eager": 200.0, "torch_compile": 100.0, "sdpa": 75.0, "max_autotune": None})
    assert per == {"eager": 4.0, "torch_compile": 2.0, "sdpa": 1.5}
    assert best == "sdpa" and vs_best == 1.5
    assert speedups(None, {"eager": 1.0}) == ({}, "eager", None)


def test_make_record_fills_speedups() -> None:
    r = _rec(plan_us=10.0, baselines_us={"eager": 30.0, "torch_compile": 20.0})
    assert r.speedups == {"eager": 3.0, "torch_compile": 2.0}
    assert r.best_baseline == "torch_compile" and r.speedup_vs_best == 2.0


def test_round_trip_and_validation(tmp_path: Path) -> None:
    log = tmp_path / "r.jsonl"
    a = _rec(plan_us=1.0, baselines_us={"eager": 2.0})
    b = _rec(status="failed-verification", message="output 'Y' differs")
    append_record(log, a)
    append_record(log, b)
    got = read_log(log)
    assert [r.status for r in got] == ["ok", "failed-verification"]
    assert got[0] == a
    with pytest.raises(ValidationError):
        RunRecord(**{**a.model_dump(), "status": "great"})


def test_trailing_partial_line_is_skipped_and_the_next_append_stays_separate(tmp_path: Path) -> None:
    log = tmp_path / "r.jsonl"
    append_record(log, _rec())
    with open(log, "ab") as fh:
        fh.write(b'{"record_version":1,"plan_ha')  # a torn append
    assert len(read_log(log)) == 1
    append_record(log, _rec(workload="second"))
    got = read_log(log)
    assert [r.workload for r in got] == ["W", "second"]
    with pytest.raises(LogError, match=r"r\.jsonl:2"):
        read_log(log, strict=True)


def test_missing_log_reads_empty(tmp_path: Path) -> None:
    assert read_log(tmp_path / "none.jsonl") == []


def test_sigkill_mid_run_leaves_only_complete_parseable_lines(tmp_path: Path) -> None:
    log = tmp_path / "killed.jsonl"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from pyrunner.log.results import append_record, make_record
        i = 0
        while True:
            append_record({str(log)!r}, make_record(plan_hash=f"p{{i}}", workload="W" * 2000, graph_hash="g",
                          shapes={{"m": i}}, dtype="float16", device="cpu", status="ok", message="x" * 5000,
                          extra={{"i": i, "pad": list(range(500))}}))
            i += 1
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if log.exists() and log.stat().st_size > 200_000:
                break
            time.sleep(0.02)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    data = log.read_bytes()
    lines = data.split(b"\n")
    complete = lines[:-1]
    assert len(complete) >= 5
    for raw in complete:
        json.loads(raw)  # every complete line is whole JSON
    recs = read_log(log, strict=True)
    assert len(recs) == len(complete)
    assert [r.shapes["m"] for r in recs] == list(range(len(recs)))
