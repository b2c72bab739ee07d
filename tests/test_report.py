"""Report: markdown table with geomeans, PNG plot, latest record per workload."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyrunner.log.report import geomean, latest, main, markdown
from pyrunner.log.results import append_record, make_record


def _rec(workload: str, dtype: str, plan: float | None, tc: float | None, status: str = "ok", **kw):
    return make_record(plan_hash=f"h{workload}{dtype}", workload=workload, graph_hash="g", shapes={"m": 64},
                       dtype=dtype, device="FakeGPU", status=status, plan_us=plan,
                       baselines_us={"eager": 400.0, "torch_compile": tc, **kw.pop("extra_b", {})}, **kw)


def test_geomean() -> None:
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([]) is None
    assert geomean([None, 4.0]) == pytest.approx(4.0)


def test_latest_keeps_the_last_record_per_workload_dtype_shape() -> None:
    a1, a2, b = _rec("A", "float16", 10, 20), _rec("A", "float16", 5, 20), _rec("A", "bfloat16", 10, 20)
    assert latest([a1, b, a2]) == [a2, b]


def test_markdown_has_rows_geomean_and_failures() -> None:
    recs = [
        _rec("A", "float16", 10.0, 40.0, extra_b={"sdpa": 12.0}),
        _rec("B", "float16", 10.0, 10.0),
        _rec("C", "float16", None, None, status="failed-verification", message="output 'Y' differs"),
    ]
    md = markdown(recs)
    assert "| A | float16 | m=64 | 10.0 | 400.0 | 40.0 | - | 12.0 (sdpa) | 4.00x | 1.20x (sdpa) |" in md
    assert "| all | 2.00x |" in md  # geomean of 4x and 1x over torch.compile; the failed run is excluded
    assert "**failed-verification**" in md and "hCfloat16" in md and "output 'Y' differs" in md


def test_main_writes_report_and_plot(tmp_path: Path, capsys) -> None:
    log = tmp_path / "r.jsonl"
    for r in (_rec("A", "float16", 10.0, 40.0), _rec("B", "bfloat16", 20.0, 30.0)):
        append_record(log, r)
    out = tmp_path / "rep"
    assert main(["--log", str(log), "--out", str(out)]) == 0
    assert "| B | bfloat16 |" in (out / "report.md").read_text()
    png = (out / "speedups.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "geomean vs torch.compile" in capsys.readouterr().out
