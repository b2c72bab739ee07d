"""The progress display (one rich bar per stage: capture, plan, check, compile, measure) and the report as a
rich or Markdown table; quiet when stderr is not a terminal or ``progress=False``."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console

import pyrunner
from pyrunner.frontend.progress import STAGES, NullTracker, RichTracker, tracker


def f(x):
    return torch.softmax(x, -1) * 2


def test_bars_per_stage_and_the_report_table_on_a_terminal() -> None:
    buf = io.StringIO()
    trk = RichTracker(Console(file=buf, force_terminal=True, width=140))
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    opt = pyrunner.optimize(f, x, executor="plan", progress=trk)
    out = buf.getvalue()
    assert all(stage in out for stage in STAGES)
    bars = {trk.bars.tasks[t].fields["stage"]: trk.bars.tasks[t] for t in trk.tasks.values()}
    n = len(opt.report.regions)
    assert n >= 1 and bars["capture"].completed == bars["capture"].total == 1
    assert bars["plan"].completed == bars["plan"].total >= n and bars["check"].completed == n
    assert bars["compile"].total == 0  # no GPU: nothing compiled
    assert "Superopt regions" in out and opt.report.regions[0].region.label in out  # the rich table


def test_quiet_without_a_terminal_or_when_off(capsys: pytest.CaptureFixture) -> None:
    x = torch.randn(8, 16, dtype=torch.float64)
    assert isinstance(tracker(True), NullTracker)  # pytest's stderr is not a terminal
    for progress in (True, False):
        pyrunner.optimize(f, x, executor="reference", progress=progress)
        assert capsys.readouterr().err == ""


def test_report_as_markdown() -> None:
    opt = pyrunner.optimize(f, torch.randn(8, 16, dtype=torch.float64), executor="reference", progress=False)
    md = opt.report.markdown().splitlines()
    assert md[0].startswith("| region | ops | kernels |") and md[1].startswith("|---|")
    assert md[2].startswith(f"| {opt.report.regions[0].region.label} | ") and md[2].count(" | ") == 5
