"""The command line: exit codes, one-line errors, pure-JSON stdout, atomic output files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from cli_helpers import one_error as error_line
from cli_helpers import run
from test_validate import attention_plan, rmsnorm_plan

from pyrunner import cli
from pyrunner.errors import GraphError, UserError
from pyrunner.ir import catalog as workloads
from pyrunner.ir.graph_json import graph_to_json

ROOT = Path(__file__).resolve().parent.parent
MIXTURE = Path(__file__).parent / "data" / "gated_mixture.json"


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(attention_plan().model_dump(mode="json")))
    return p


# --- planner (faked: the CLI's contract is the call it makes) ---------------------------

@pytest.fixture
def fake_planner(monkeypatch):
    calls: list[dict] = []
    mod = types.ModuleType("pyrunner.planner")

    def search(graph, dtype, *, top=1, naive=False, calibration=None, budget=None, tuning=None, device=None):
        calls.append({"graph": graph, "dtype": dtype, "top": top, "naive": naive, "calibration": calibration,
                      "tuning": tuning, "device": device})
        plan = rmsnorm_plan()
        return [plan.model_copy(update={"workload": f"{graph.name}#{i}"}) for i in range(top)]

    mod.search = search
    mod.explain = lambda plan: f"EXPLAIN {plan.workload}\n"
    monkeypatch.setitem(sys.modules, "pyrunner.planner", mod)
    return calls


def test_superopt_prints_one_plan(fake_planner, capsys) -> None:
    code, out, err = run(["superopt", "RMSNorm", "--shape", "m=32", "--shape", "d=64"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert isinstance(data, dict) and data["workload"] == "RMSNorm#0"
    (call,) = fake_planner
    assert call["dtype"] == "float16" and call["top"] == 1 and not call["naive"] and call["calibration"] is None
    assert call["tuning"].path.name == "h200.json" and call["device"].name == "H200"  # the committed database
    assert call["graph"] == workloads.get("RMSNorm", {"m": 32, "d": 64})


def test_superopt_top_explain_dtype(fake_planner, capsys, tmp_path: Path) -> None:
    log = tmp_path / "results.jsonl"
    log.write_text("")
    code, out, err = run(["superopt", "matmul", "--top", "2", "--dtype", "bf16", "--naive", "--explain",
                          "--calibrate", str(log)], capsys)
    assert code == 0, err
    data = json.loads(out)  # stdout stays pure JSON
    assert [p["workload"] for p in data] == ["Matmul#0", "Matmul#1"]
    assert "EXPLAIN Matmul#0" in err and "EXPLAIN Matmul#1" in err
    (call,) = fake_planner
    assert call["dtype"] == "bfloat16" and call["naive"] and call["top"] == 2 and call["calibration"] == log


def test_superopt_graph_file(fake_planner, capsys, tmp_path: Path) -> None:
    code, out, err = run(["superopt", "Attention", "--graph", str(MIXTURE), "--shape", "n=10"], capsys)
    assert code == 0, err
    assert "ignoring workload name 'Attention'" in err
    assert fake_planner[0]["graph"].name == "GatedMixture" and fake_planner[0]["graph"].sizes["n"] == 10
    out_file = tmp_path / "plan.json"
    code, out, err = run(["superopt", "--graph", str(MIXTURE), "--out", str(out_file)], capsys)
    assert code == 0 and out == ""
    assert json.loads(out_file.read_text())["workload"] == "GatedMixture#0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]  # no temp file left


SUPEROPT_ERRORS = [
    (["superopt", "Nope"], "unknown workload 'Nope'; the catalog has: Attention"),
    (["superopt"], "superopt needs a WORKLOAD name"),
    (["superopt", "Matmul", "--shape", "m"], "--shape 'm': expected AXIS=N"),
    (["superopt", "Matmul", "--shape", "m=big"], "--shape 'm=big': 'big' is not an integer"),
    (["superopt", "Matmul", "--shape", "m=-4"], "must be a positive integer"),
    (["superopt", "Matmul", "--shape", "m=4", "--shape", "m=8"], "--shape: 'm' is given twice"),
    (["superopt", "Matmul", "--shape", "q=4"], "--shape names axis 'q'"),
    (["superopt", "Matmul", "--top", "0"], "--top must be at least 1"),
    (["superopt", "Matmul", "--calibrate", "/nonexistent/log.jsonl"], "--calibrate: results log"),
    (["superopt", "--graph", "/nonexistent/g.json"], "graph file '/nonexistent/g.json' does not exist"),
]


@pytest.mark.parametrize("argv,fragment", SUPEROPT_ERRORS, ids=[" ".join(a) for a, _ in SUPEROPT_ERRORS])
def test_superopt_errors(argv: list[str], fragment: str, fake_planner, capsys) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert fragment in error_line(err)
    assert not fake_planner


def test_superopt_bad_graph_file(fake_planner, capsys, tmp_path: Path) -> None:
    bad = tmp_path / "g.json"
    data = json.loads(MIXTURE.read_text())
    data["nodes"][4]["op"] = "hadamard"
    bad.write_text(json.dumps(data))
    code, _, err = run(["superopt", "--graph", str(bad)], capsys)
    assert code == 2
    assert "node 'AB' (nodes[4]): unknown op 'hadamard'" in error_line(err)


def test_planner_user_error_is_exit_2(monkeypatch, capsys) -> None:
    mod = types.ModuleType("pyrunner.planner")

    def search(graph, dtype, **kw):
        raise GraphError("no derivation covers op 'conv'")

    mod.search, mod.explain = search, str
    monkeypatch.setitem(sys.modules, "pyrunner.planner", mod)
    code, _, err = run(["superopt", "Matmul"], capsys)
    assert code == 2 and error_line(err) == "error: no derivation covers op 'conv'"


# --- run / validate ----------------------------------------------------------------

def test_run_passes_typed_options_to_the_runner(monkeypatch, capsys, plan_file: Path) -> None:
    from pyrunner.run import runner

    seen = {}

    def run_plan_file(path, opts):
        seen.update(path=path, opts=opts)
        return 1

    monkeypatch.setattr(runner, "run_plan_file", run_plan_file)
    code, _, _ = run([str(plan_file), "--config", "block_t_kv=32", "--config", "attention.stages=1",
                      "--log", "r.jsonl", "--small", "--seed", "7", "--autotune", "99", "--baselines", "eager"],
                     capsys)
    assert code == 1 and seen["path"] == str(plan_file)
    opts = seen["opts"]
    assert isinstance(opts, runner.RunOptions)
    assert opts.config == {"block_t_kv": 32, "attention.stages": 1}
    assert (opts.results, opts.force_cpu, opts.seed, opts.baselines) == (Path("r.jsonl"), True, 7, ("eager",))
    assert opts.autotune == runner.MAX_AUTOTUNE_CONFIGS and opts.out_dir == runner.RunOptions().out_dir
    assert opts.deadline is None and not opts.quiet


def test_run_rejects_unknown_baselines(capsys, plan_file: Path) -> None:
    code, _, err = run([str(plan_file), "--baselines", "eager,cudnn"], capsys)
    assert code == 2 and "unknown baseline(s) ['cudnn']" in error_line(err)


def test_validate_ok(capsys, plan_file: Path) -> None:
    code, out, _ = run(["validate", str(plan_file)], capsys)
    assert code == 0
    assert "workload Attention, float16, 1 kernel(s): attention(block_t_q=16, block_t_kv=16" in out


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bad.json"
    p.write_text(text)
    return p


def _plan_text(edit) -> str:
    data = attention_plan().model_dump(mode="json")
    edit(data)
    return json.dumps(data)


MALFORMED = [
    ("missing file", None, "plan file", "does not exist"),
    ("bad json", "{\"schema_version\": 1", "not valid JSON", "line 1 column"),
    ("not an object", "[]", "a plan must be a JSON object, got list", ""),
    ("schema version", _plan_text(lambda d: d.update(schema_version=7)), "schema_version: 7 is not supported", ""),
    ("missing field", _plan_text(lambda d: d["kernels"][0].pop("buffers")), "kernels[0].buffers: required field", ""),
    ("extra field", _plan_text(lambda d: d.update(colour=1)), "colour: unknown field", ""),
    ("wrong type", _plan_text(lambda d: d["kernels"][0]["body"][2].update(clear="maybe")),
     "kernels[0].body[2].clear: Input should be a valid boolean", "maybe"),
    ("semantic", _plan_text(lambda d: d["kernels"][0]["body"][2].update(b="Q_s")),
     "kernels[0] 'attention' body[2] (gemm)", ""),
    ("bad graph", _plan_text(lambda d: d["graph"].update(axes={})), "graph: graph field 'axes'", ""),
]


@pytest.mark.parametrize("case,text,frag1,frag2", MALFORMED, ids=[m[0] for m in MALFORMED])
@pytest.mark.parametrize("command", ["validate", "run"])
def test_malformed_plans_exit_2(command: str, case: str, text, frag1: str, frag2: str, tmp_path: Path,
                                capsys, monkeypatch) -> None:
    path = tmp_path / "missing.json" if text is None else _write(tmp_path, text)
    code, out, err = run([command, str(path)], capsys)
    assert code == 2 and out == ""
    line = error_line(err)
    assert frag1 in line and frag2 in line


CONFIG_ERRORS = [
    (["--config", "block_t_kv"], "--config 'block_t_kv': expected K=N"),
    (["--config", "block_t_kv=x"], "'x' is not an integer"),
    (["--config", "bk=16"], "no kernel has a parameter 'bk'"),
    (["--config", "block_t_kv=12"], "allowed values are [8, 16, 32]"),
    (["--config", "attention.nope=1"], "kernel 'attention' has no parameter 'nope'"),
]


@pytest.mark.parametrize("extra,fragment", CONFIG_ERRORS, ids=[c[0][1] for c in CONFIG_ERRORS])
def test_config_errors(extra: list[str], fragment: str, plan_file: Path, capsys) -> None:
    code, _, err = run(["validate", str(plan_file), *extra], capsys)
    assert code == 2 and fragment in error_line(err)


USAGE_ERRORS = [
    ["superopt", "Matmul", "--top", "many"],
    ["superopt", "Matmul", "--dtype", "fp8"],
    ["validate"],
    ["schema", "--bogus"],
    [],
]


@pytest.mark.parametrize("argv", USAGE_ERRORS, ids=[" ".join(a) or "(none)" for a in USAGE_ERRORS])
def test_usage_errors_exit_2(argv: list[str], capsys) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert "usage:" in err and error_line(err)


def test_help_exits_0(capsys) -> None:
    code, out, _ = run(["--help"], capsys)
    assert code == 0 and "superopt" in out and "workloads" in out


# --- schema / workloads / report ------------------------------------------------------

def test_committed_schema_is_fresh(capsys) -> None:
    committed = (ROOT / "pyrunner" / "schema" / "plan.schema.json").read_text()
    regen = "regenerate: python -m pyrunner schema --out pyrunner/schema/plan.schema.json"
    assert committed == cli.schema_text(), regen
    code, out, _ = run(["schema"], capsys)
    assert code == 0 and out == committed
    assert json.loads(out)["title"] == "Plan"


def test_schema_out_is_atomic(tmp_path: Path, capsys) -> None:
    target = tmp_path / "s.json"
    target.write_text("old")
    code, _, _ = run(["schema", "--out", str(target)], capsys)
    assert code == 0 and target.read_text() == cli.schema_text()
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]
    code, _, err = run(["schema", "--out", str(tmp_path / "no" / "s.json")], capsys)
    assert code == 2 and "folder" in error_line(err) and "does not exist" in error_line(err)
    code, _, err = run(["schema", "--out", str(tmp_path)], capsys)
    assert code == 2 and "is a directory" in error_line(err)


def test_atomic_write_failure_leaves_old_file(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "f.json"
    target.write_text("old")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(UserError, match="disk full"):
        cli.write_text_atomic(target, "new")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_workloads_table(capsys) -> None:
    code, out, _ = run(["workloads"], capsys)
    assert code == 0
    lines = out.splitlines()
    for name in workloads.CATALOG:
        assert any(line.startswith(name + " ") for line in lines), name
    assert "Y = (X @d W)" in out and "h=16 t_q=4096 d=128 t_kv=4096" in out


def test_report_passes_flags(monkeypatch, capsys) -> None:
    seen = []
    mod = types.ModuleType("pyrunner.log.report")
    mod.main = lambda argv: seen.append(argv) or 0
    monkeypatch.setitem(sys.modules, "pyrunner.log.report", mod)
    code, _, _ = run(["report", "--log", "r.jsonl", "--out", "rep"], capsys)
    assert code == 0 and seen == [["--log", "r.jsonl", "--out", "rep"]]
    code, _, _ = run(["report", "--all"], capsys)
    assert code == 0 and seen[-1] == ["--all"]


# --- as a real process: no tracebacks ----------------------------------------------------

def test_subprocess_errors_have_no_traceback(tmp_path: Path) -> None:
    bad_plan = _write(tmp_path, _plan_text(lambda d: d["kernels"][0]["grid"][1].update(block=1.5)))
    graph = tmp_path / "g.json"
    graph.write_text(json.dumps({**graph_to_json(workloads.get("Matmul")), "outputs": ["Z"]}))
    for argv, fragment in (
        (["validate", str(bad_plan)], "kernels[0].grid[1].block: matches no allowed form"),
        (["superopt", "--graph", str(graph)], "outputs[0]: names undefined node 'Z'"),
        (["superopt", "Matmul", "--top", "x"], "argument --top: invalid int value"),
    ):
        proc = subprocess.run([sys.executable, "-m", "pyrunner", *argv], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout == ""
        assert "Traceback" not in proc.stderr
        assert fragment in error_line(proc.stderr)
