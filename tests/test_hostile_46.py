"""Issue 46's re-probe of hostile inputs: writes through planted links, quadratic pre-scans,
lax coercion of plan fields, unchecked provenance, ``export`` without the fit check, ``report``
without caps, and the CLI tracebacks it listed.

Each test failed on the tree before the fix it names (issue 46).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pyrunner import cli
from pyrunner.errors import UserError
from pyrunner.ir import catalog as workloads
from pyrunner.log.results import append_record, make_record


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def one_error(err: str) -> str:
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def _record(**kw):
    base = dict(plan_hash="0123456789abcdef", workload="W", graph_hash="g", shapes={"m": 8}, dtype="float16",
                device="H200", status="ok", plan_us=10.0, baselines_us={"torch_compile": 20.0})
    return make_record(**{**base, **kw})


# --- writes: one atomic writer that refuses links ------------------------------------------------

def test_report_plot_never_writes_through_a_planted_temp_name(tmp_path: Path, capsys) -> None:
    """Before: the plot went through the fixed temp name ``.speedups.png.tmp.png``, following a link."""
    pytest.importorskip("matplotlib")
    log = tmp_path / "r.jsonl"
    append_record(log, _record())
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (out / ".speedups.png.tmp.png").symlink_to(victim)
    code, _, err = run(["report", "--log", str(log), "--out", str(out)], capsys)
    assert code == 0, err
    assert victim.read_text() == "precious"
    assert (out / "speedups.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_report_refuses_a_planted_link_at_its_outputs(kind: str, tmp_path: Path, capsys) -> None:
    log = tmp_path / "r.jsonl"
    append_record(log, _record())
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (out / "report.md").symlink_to(victim) if kind == "symlink" else os.link(victim, out / "report.md")
    code, _, err = run(["report", "--log", str(log), "--out", str(out)], capsys)
    assert code == 2
    assert "link" in one_error(err)
    assert victim.read_text() == "precious"


def test_run_out_refuses_a_hard_link_planted_at_the_rendered_module(tmp_path: Path) -> None:
    """Before: ``write_source`` used ``write_text``, which writes through a hard link."""
    from pyrunner.plan.schema import plan_hash
    from pyrunner.planner import search
    from pyrunner.run.runner import write_source

    plan = search(workloads.get("Matmul", {"m": 64, "d": 64, "n": 64}), "fp16", tuning=False)[0]
    folder = tmp_path / "out" / plan_hash(plan)
    folder.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.link(victim, folder / f"{plan.workload}.py")
    with pytest.raises(UserError, match="hard link"):
        write_source(plan, tmp_path / "out")
    assert victim.read_text() == "precious"


def test_results_log_refuses_links(tmp_path: Path) -> None:
    from pyrunner.log.results import LogError

    victim = tmp_path / "victim.jsonl"
    victim.write_text("")
    (tmp_path / "sym.jsonl").symlink_to(victim)
    os.link(victim, tmp_path / "hard.jsonl")
    for name in ("sym.jsonl", "hard.jsonl"):
        with pytest.raises(LogError, match="link"):
            append_record(tmp_path / name, _record())
    assert victim.read_text() == ""


def test_superopt_out_refuses_a_symlink(tmp_path: Path, capsys) -> None:
    victim = tmp_path / "victim.json"
    victim.write_text("precious")
    (tmp_path / "plan.json").symlink_to(victim)
    code, _, err = run(["schema", "--out", str(tmp_path / "plan.json")], capsys)
    assert code == 2 and "symbolic link" in one_error(err)
    assert victim.read_text() == "precious" and (tmp_path / "plan.json").is_symlink()
