"""Issue 46's re-probe of hostile inputs: writes through planted links, quadratic pre-scans,
lax coercion of plan fields, unchecked provenance, ``export`` without the fit check, ``report``
without caps, and the CLI tracebacks it listed.

Each test failed on the tree before the fix it names (issue 46).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_helpers import one_error, run

from pyrunner.errors import UserError
from pyrunner.ir import catalog as workloads
from pyrunner.log.results import append_record, make_record


def _record(**kw):
    base = dict(plan_hash="0123456789abcdef", workload="W", graph_hash="g", shapes={"m": 8}, dtype="float16",
                device="H200", status="ok", plan_us=10.0, baselines_us={"torch_compile": 20.0})
    return make_record(**{**base, **kw})


# --- writes: one atomic writer that refuses links ------------------------------------------------

def _report_folder(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A one-record log, an empty output folder, and a file outside it that a planted link points at."""
    log = tmp_path / "r.jsonl"
    append_record(log, _record())
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    return log, out, victim


def test_report_plot_never_writes_through_a_planted_temp_name(tmp_path: Path, capsys) -> None:
    """Before: the plot went through the fixed temp name ``.speedups.png.tmp.png``, following a link."""
    pytest.importorskip("matplotlib")
    log, out, victim = _report_folder(tmp_path)
    (out / ".speedups.png.tmp.png").symlink_to(victim)
    code, _, err = run(["report", "--log", str(log), "--out", str(out)], capsys)
    assert code == 0, err
    assert victim.read_text() == "precious"
    assert (out / "speedups.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_report_refuses_a_planted_link_at_its_outputs(kind: str, tmp_path: Path, capsys) -> None:
    log, out, victim = _report_folder(tmp_path)
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


# --- plans: strict fields, checked provenance, the fit check at export ----------------------------

_PLANS: dict[str, object] = {}


def _matmul_doc(size: int = 64) -> dict:
    """A real planner plan's JSON document (cached: the planner is the slow part)."""
    import copy

    from pyrunner.plan.schema import plan_document
    from pyrunner.planner import search

    key = f"mm{size}"
    if key not in _PLANS:
        _PLANS[key] = plan_document(search(workloads.get("Matmul", {"m": size, "d": size, "n": size}), "fp16",
                                           tuning=False)[0])
    return copy.deepcopy(_PLANS[key])


def _unhashed(d: dict) -> dict:
    d["provenance"]["plan_hash"] = ""  # the plan is known by its recomputed hash: only the checks stand
    return d


def _set(path: str, value: object):
    def edit(d: dict) -> dict:
        node = d
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[int(k)] if k.isdigit() else node[k]
        node[keys[-1]] = value
        return d
    return edit


@pytest.mark.parametrize(("path", "value"), [
    ("cost.total_us", "1_0"), ("cost.total_us", True), ("cost.total_us", " 2.5 "), ("cost.total_us", "nan"),
    ("cost.total_us", -3.0), ("cost.kernels.0.time_us", -1.0), ("cost.kernels.0.bytes", "1e3"),
    ("tensors.0.shape", ["64", "64"]), ("tensors.0.shape", "64"), ("kernels.0.defaults.threads", 128.0),
    ("cost.launches", "1"),
])
def test_plan_fields_are_never_coerced(path: str, value: object) -> None:
    """Before: pydantic's lax mode read "1_0" as 10.0, true as 1.0, " 2.5 " as 2.5, string shapes as
    lists; negative costs passed."""
    from pyrunner.errors import PlanError
    from pyrunner.plan.validate import validate_plan

    d = _unhashed(_set(path, value)(_matmul_doc()))
    with pytest.raises(PlanError):
        validate_plan(d)


def test_an_overflowing_number_in_the_plan_text_is_refused(tmp_path: Path, capsys) -> None:
    """``1e400`` parses as inf; the schema forbids non-finite numbers."""
    import re

    text = json.dumps(_unhashed(_matmul_doc()))
    text, n = re.subn(r'"total_us": [0-9.e+-]+', '"total_us": 1e400', text, count=1)
    assert n == 1
    f = tmp_path / "p.json"
    f.write_text(text)
    code, _, err = run(["validate", str(f)], capsys)
    assert code == 2 and "total_us" in one_error(err)


@pytest.mark.parametrize(("path", "value", "words"), [
    ("workload", "Attention", "workload"),
    ("provenance.graph_hash", "/etc/passwd", "graph_hash"),
    ("provenance.graph_hash", "0123456789abcdef", "graph_hash"),
    ("derivation", [{"rule": "free_lunch", "at": "Y"}], "not a rule"),
    ("kernels.0.fused_rules", ["free_lunch"], "not a rule"),
    ("derivation", [{"rule": "matmul_assoc", "at": "x\x00y"}], "character"),
    ("derivation", [{"rule": "matmul_assoc", "at": "x\ud800y"}], "character"),
    ("derivation", [{"rule": "matmul_assoc", "at": "x" * 10_000}], "limit"),
])
def test_provenance_and_free_text_are_checked(path: str, value: object, words: str) -> None:
    """Before: a relabelled workload, a graph_hash set to a path, unknown rule names were logged as given,
    and a NUL or lone surrogate in a step's ``at`` passed ``validate`` and crashed ``export``."""
    from pyrunner.errors import PlanError
    from pyrunner.plan.validate import validate_plan

    d = _unhashed(_set(path, value)(_matmul_doc()))
    with pytest.raises(PlanError, match=words):
        validate_plan(d)


@pytest.mark.parametrize("at", ["x\x00y", "x\ud800y"])
def test_export_of_a_plan_with_a_control_character_in_at_is_one_error(at: str, tmp_path: Path, capsys) -> None:
    d = _unhashed(_matmul_doc())
    d["derivation"] = [{"rule": "matmul_assoc", "at": at}]
    f = tmp_path / "p.json"
    f.write_text(json.dumps(d))  # ensure_ascii: the surrogate travels as \\ud800
    code, _, err = run(["export", str(f), "--out", str(tmp_path / "m.py")], capsys)
    assert code == 2
    one_error(err)
    assert not (tmp_path / "m.py").exists()


def test_a_deep_expression_is_refused_before_export(tmp_path: Path, capsys) -> None:
    """Before: a 240-deep expression validated, then exported as a module Python cannot parse."""
    d = _unhashed(_matmul_doc())
    k = d["kernels"][0]
    acc = next(op["c"] for sec in ("prologue", "body", "epilogue") for op in k[sec] if op["op"] == "gemm")
    e: dict = {"kind": "ref", "buf": acc}
    for _ in range(240):
        e = {"kind": "call", "fn": "neg", "args": [e]}
    k["epilogue"].insert(0, {"op": "map", "dst": acc, "expr": e})
    f = tmp_path / "p.json"
    f.write_text(json.dumps(d))
    for argv in (["validate", str(f)], ["export", str(f), "--out", str(tmp_path / "m.py")]):
        code, _, err = run(argv, capsys)
        assert code == 2 and "deep" in one_error(err)


def test_export_runs_the_fit_check(tmp_path: Path, capsys) -> None:
    """Before: a plan whose default tiles need far more shared memory than the device has exported."""
    d = _unhashed(_matmul_doc(1024))
    k = d["kernels"][0]
    k["params"]["stages"] = [*k["params"]["stages"], 100000]
    k["defaults"]["stages"] = 100000
    f = tmp_path / "p.json"
    f.write_text(json.dumps(d))
    assert run(["validate", str(f)], capsys)[0] == 0
    code, _, err = run(["export", str(f), "--out", str(tmp_path / "m.py")], capsys)
    assert code == 2 and "shared memory" in one_error(err)
    assert not (tmp_path / "m.py").exists()


def test_a_rank_70_graph_is_one_error(tmp_path: Path, capsys) -> None:
    """Before: planned, then the CPU check's numpy refused 70 dimensions with a traceback."""
    axes = {f"a{i}": 1 for i in range(68)} | {"m": 4, "n": 8}
    g = {"name": "Rank70", "axes": axes, "inputs": {"X": list(axes)},
         "nodes": [{"name": "P", "op": "softmax", "args": ["X"], "axis": "n"}], "outputs": ["P"]}
    f = tmp_path / "g.json"
    f.write_text(json.dumps(g))
    code, _, err = run(["superopt", "--graph", str(f), "--no-lower-check"], capsys)
    assert code == 2 and "axes" in one_error(err)


def test_a_plan_tensor_of_too_many_axes_is_refused() -> None:
    from pyrunner.errors import PlanError
    from pyrunner.plan.validate import validate_plan

    d = _unhashed(_matmul_doc())
    d["tensors"][0]["axes"] = [f"x{i}" for i in range(70)]
    d["tensors"][0]["shape"] = [1] * 70
    with pytest.raises(PlanError, match="70 axes"):
        validate_plan(d)


@pytest.mark.parametrize("config", [[1, 2], "block_m=64", {"k": {"block_m": 10 ** 5000}}, "deep"])
def test_a_malformed_config_is_one_plan_error(config: object) -> None:
    """Before: ``load(plan, config=[1, 2])`` or a 5,000-digit value raised AttributeError / ValueError."""
    from pyrunner.errors import PlanError
    from pyrunner.plan.analysis import resolve_config
    from pyrunner.plan.validate import check_config, validate_plan

    plan = validate_plan(_matmul_doc())
    name = plan.kernels[0].name
    if config == "deep":
        nest: list = []
        inner = nest
        for _ in range(100_000):
            inner.append([])
            inner = inner[0]
        config = {name: {"block_m": nest}}
    elif isinstance(config, dict):
        config = {name: config["k"]}
    with pytest.raises(PlanError) as e:
        resolve_config(plan, config)
    assert len(str(e.value)) < 400
    if isinstance(config, dict):
        with pytest.raises(PlanError):
            check_config(plan, config[name])


# --- limits on work: linear pre-scan, capped report ----------------------------------------------

def test_json_depth_prescan_is_linear_on_an_unterminated_run_of_escaped_quotes() -> None:
    """Before: the string regex retried from every quote: 100 KB took minutes. Run in a child with a
    generous timeout so a quadratic scan fails rather than hangs the suite."""
    import subprocess
    import sys

    code = ("from pyrunner.ir.graph_json import json_depth; "
            "assert json_depth('[' + '\"' + '\\\\\"' * 200_000) == 1")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   cwd=Path(__file__).resolve().parent.parent)


def test_report_caps_records_and_text(tmp_path: Path, capsys) -> None:
    """Before: 20,000 records drew a 20,000-bar plot (minutes, gigabytes) and a 5 MB workload name
    ended in a FreeType traceback; markdown link syntax passed through."""
    pytest.importorskip("matplotlib")
    from pyrunner.log.report import MAX_CELL, MAX_TABLE_ROWS

    log = tmp_path / "r.jsonl"
    line = json.dumps(json.loads(_record(workload="W0").model_dump_json()))
    lines = [line.replace('"W0"', f'"W{i}"') for i in range(20_000)]
    lines.append(_record(workload="![x](http://e/x.png)" + "N" * 5_000_000).model_dump_json())
    log.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    code, _, err = run(["report", "--log", str(log), "--out", str(out)], capsys)
    assert code == 0, err[-2000:]
    text = (out / "report.md").read_text()
    assert f"{20_001 - MAX_TABLE_ROWS} more record(s) not listed" in text
    assert "![x](" not in text and "N" * (MAX_CELL + 1) not in text
    assert len(text) < 2_000_000


def test_report_refuses_negative_times_and_shapes(tmp_path: Path, capsys) -> None:
    log = tmp_path / "r.jsonl"
    good = json.loads(_record().model_dump_json())
    bad = [dict(good, plan_us=-5.0), dict(good, baselines_us={"torch_compile": -1.0}), dict(good, shapes={"m": -8})]
    log.write_text("\n".join(json.dumps(x) for x in [good, *bad]) + "\n")
    code, out, err = run(["report", "--log", str(log), "--out", str(tmp_path / "out"), "--all"], capsys)
    assert code == 0, err
    assert "skipped 3 line(s)" in out
    assert "-5.0" not in (tmp_path / "out" / "report.md").read_text()
