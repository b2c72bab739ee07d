"""Hostile graphs, plans, paths and values (issue 8): each case runs no code, writes nowhere
unexpected, never passes as verified, and ends in one ``error:`` line (exit 2), not a traceback.

Every test here failed before the fix it names (checked against the tree before issue 8's work).
"""

from __future__ import annotations

import json
import math
import os
import stat
import threading
import time
from pathlib import Path

import pytest
from cli_helpers import one_error, run

from pyrunner.errors import GraphError, PlanError, UserError
from pyrunner.ir import catalog as workloads
from pyrunner.ir.graph import show
from pyrunner.ir.graph_json import graph_from_json, graph_to_json
from pyrunner.ir.names import MAX_GRAPH_NAME, check_name, name_problem
from pyrunner.log.results import append_record, make_record, read_log
from pyrunner.plan.schema import Plan, plan_hash
from pyrunner.plan.validate import validate_plan

PAYLOAD = 'x"""; __import__("os").system("touch pwned"); """'


def small_matmul_graph() -> dict:
    return graph_to_json(workloads.get("Matmul", {"m": 64, "d": 128, "n": 64}))


_PLANS: dict[str, Plan] = {}


def planned(name: str = "RMSNorm", sizes: dict | None = None, dtype: str = "fp16") -> Plan:
    """A real planner plan at small shapes (cached: the planner is the slow part)."""
    from pyrunner.planner import search

    sizes = sizes or {"m": 64, "d": 128, "n": 64}
    key = f"{name}{sorted(sizes.items())}{dtype}"
    if key not in _PLANS:
        _PLANS[key] = search(workloads.get(name, sizes), dtype)[0]
    return _PLANS[key]


def edited(plan: Plan, edit, rehash: bool = True) -> dict:
    """The plan's JSON after ``edit(data)``, re-hashed (so only the edit itself can be caught)."""
    data = plan.model_dump(mode="json")
    edit(data)
    if rehash:
        data["provenance"]["plan_hash"] = ""
        data["provenance"]["plan_hash"] = plan_hash(Plan.model_validate(data))
    return data


# --- 1. names: one validator, applied at load ------------------------------------------------

@pytest.mark.parametrize("name, fragment", [
    (PAYLOAD, "not an ASCII identifier"),
    ("x²", "not an ASCII identifier"),
    ("𝐗", "NFKC normalises it to 'X'"),
    ("a" * 251, "too long"),
    ("class", "Python keyword"),
    ("__init__", "dunder"),
    ("1x", "not an ASCII identifier"),
    ("../../etc/passwd", "not an ASCII identifier"),
    ("", "must not be empty"),
])
def test_name_validator_rejects(name: str, fragment: str) -> None:
    assert fragment in name_problem(name)
    with pytest.raises(UserError, match="field: "):
        check_name(name, "field")


def test_name_validator_accepts_identifiers() -> None:
    for ok in ("X", "W_gate", "t_kv", "_tmp", "a" * MAX_GRAPH_NAME, "match", "RMSNormMLP", "T"):
        assert check_name(ok, "f") == ok


@pytest.mark.parametrize("where", ["name", "input", "axis", "node", "output", "output_alias"])
@pytest.mark.parametrize("bad", [PAYLOAD, "x²", "𝐗", "q" * 300])
def test_graph_names_are_checked_at_load(where: str, bad: str) -> None:
    g = small_matmul_graph()
    if where == "name":
        g["name"] = bad
    elif where == "input":
        g["inputs"][bad] = g["inputs"].pop("X")
        g["nodes"][0]["args"][0] = bad
    elif where == "axis":
        g["axes"][bad] = g["axes"].pop("n")
        g["inputs"]["W"] = ["d", bad]
    elif where == "node":
        g["nodes"].insert(0, {"name": bad, "op": "exp", "args": ["X"]})
    elif where == "output":
        g["nodes"][0]["name"] = bad
        g["outputs"] = [bad]
    else:
        g["outputs"] = [{"name": bad, "node": g["nodes"][0]["name"]}]
    with pytest.raises(GraphError, match="ASCII identifier|too long"):
        graph_from_json(g)


@pytest.mark.parametrize("field", ["workload", "kernel", "tensor", "buffer", "axis", "param", "fused_rule",
                                   "plan_hash"])
def test_plan_names_are_checked_at_load(field: str) -> None:
    plan = planned()

    def edit(d: dict) -> None:
        k = d["kernels"][0]
        if field == "workload":
            d["workload"] = PAYLOAD
        elif field == "kernel":
            k["name"] = PAYLOAD
        elif field == "tensor":
            d["tensors"][0]["name"] = PAYLOAD
        elif field == "buffer":
            k["buffers"][0]["name"] = PAYLOAD
        elif field == "axis":
            d["tensors"][0]["axes"][0] = PAYLOAD
        elif field == "param":
            p = next(iter(k["params"]))
            k["params"][PAYLOAD] = k["params"].pop(p)
            k["defaults"][PAYLOAD] = k["defaults"].pop(p)
        elif field == "fused_rule":
            k["fused_rules"] = [PAYLOAD]
        else:
            d["provenance"]["plan_hash"] = "../../" + "0" * 10

    data = edited(plan, edit, rehash=field != "plan_hash")
    with pytest.raises(PlanError, match="ASCII identifier|not a hash"):
        validate_plan(data)


def test_renderer_refuses_unchecked_names_even_without_validation() -> None:
    from pyrunner.backend.tilelang.render import render

    plan = planned()
    bad = plan.model_copy(update={"workload": PAYLOAD})
    with pytest.raises(PlanError, match="workload"):
        render(bad)
    src = render(plan)
    assert f"PLAN_HASH = {plan_hash(plan)!r}" in src


def test_payload_graph_through_superopt_and_run_executes_nothing(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    g = small_matmul_graph()
    g["name"] = PAYLOAD
    f = tmp_path / "g.json"
    f.write_text(json.dumps(g))
    code, out, err = run(["superopt", "--graph", str(f), "--out", str(tmp_path / "p.json")], capsys)
    assert code == 2 and "ASCII identifier" in one_error(err)
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "p.json").exists()


# --- 2. paths ----------------------------------------------------------------------------------

def test_plan_hash_is_recomputed_and_a_mismatch_names_both() -> None:
    plan = planned()
    data = plan.model_dump(mode="json")
    data["kernels"][0]["defaults"] = dict(data["kernels"][0]["defaults"])  # unchanged content: passes
    validate_plan(data)
    data["cost"]["total_us"] = data["cost"]["total_us"] * 0.5  # an edit keeping the genuine plan's hash
    with pytest.raises(PlanError, match=rf"says '{plan.provenance.plan_hash}'.*hashes to '[0-9a-f]{{16}}'"):
        validate_plan(data)


def test_artifacts_stay_inside_the_output_folder(tmp_path: Path) -> None:
    from pyrunner.files import inside

    assert inside(tmp_path, "abc", "x.py") == tmp_path / "abc" / "x.py"
    for bad in ("..", "../x", "/etc/passwd", "a/b", ""):
        with pytest.raises(UserError):
            inside(tmp_path, bad)
    (tmp_path / "link").symlink_to("/")
    with pytest.raises(UserError, match="leaves its output folder"):
        inside(tmp_path, "link", "etc")


@pytest.mark.parametrize("target", ["/dev/null", "/proc/version", "DIR"])
@pytest.mark.parametrize("command", [["schema"], ["superopt", "Matmul", "--naive", "--shape", "m=64",
                                                  "--shape", "d=64", "--shape", "n=64"]])
def test_out_refuses_non_regular_targets(command: list[str], target: str, tmp_path: Path, capsys) -> None:
    if target == "DIR":
        target = str(tmp_path)
    if not os.path.exists(target):
        pytest.skip(f"{target} does not exist here")
    before = os.stat(target)
    code, _, err = run([*command, "--out", target], capsys)
    assert code == 2, err
    one_error(err)
    after = os.stat(target)
    assert stat.S_IFMT(before.st_mode) == stat.S_IFMT(after.st_mode) and before.st_ino == after.st_ino


def test_render_scratch_folder_is_private(matmul_plan) -> None:
    from pyrunner.backend.tilelang import compile as comp

    d = comp._scratch_dir()
    assert d.is_dir() and stat.S_IMODE(d.stat().st_mode) == 0o700
    assert d.name != "superopt-render" and d.name.startswith("superopt-render-")
    assert comp._scratch_dir() == d  # one per process


# --- 3. verification that cannot be fooled -------------------------------------------------------

def test_swapped_axis_in_a_size_expression_fails_the_cpu_check(tmp_path: Path) -> None:
    """mean over d computed as sum / |m|: invisible when every axis is 32, caught at distinct sizes."""
    from pyrunner.run.executor import execute
    from pyrunner.run.shrink import cpu_check_plan, scale_down
    from pyrunner.run.verify import verify_executor

    plan = planned("RMSNorm", {"m": 1024, "d": 4096, "n": 4096})

    def swap(d: dict) -> None:
        hits = 0
        stack = [d["kernels"]]
        while stack:
            x = stack.pop()
            if isinstance(x, dict):
                if x.get("kind") == "size" and x.get("axis") == "d":
                    x["axis"] = "m"
                    hits += 1
                stack.extend(x.values())
            elif isinstance(x, list):
                stack.extend(x)
        assert hits

    with pytest.raises(PlanError, match=r"kernels\[\d+\] .*size"):  # the certificate: its terms divide by |d|
        validate_plan(edited(plan, swap))
    bad = Plan.model_validate(edited(plan, swap))  # the CPU check, on its own, catches it too
    small = cpu_check_plan(bad)
    sizes = [t.shape for t in small.tensors]
    assert small is not bad and len(set(dict(zip(t.axes, t.shape)).values() for t in small.tensors)) >= 1
    axes = {a: n for t in small.tensors for a, n in zip(t.axes, t.shape, strict=True)}
    assert len(set(axes.values())) == len(axes), sizes  # every axis a distinct size
    from pyrunner.plan.validate import plan_graph

    res = verify_executor(small, plan_graph(small), execute, seed=1)
    assert not res.ok and res.error > 0.05, res.message
    good = scale_down(plan)
    assert verify_executor(good, plan_graph(good), execute, seed=1).ok


def test_cpu_check_runs_at_real_shapes_within_budget() -> None:
    from pyrunner.run.shrink import cpu_check_plan

    plan = planned("Matmul", {"m": 64, "d": 32, "n": 48})
    assert cpu_check_plan(plan) is plan
    big = planned("Matmul", {"m": 1024, "d": 4096, "n": 4096})
    assert cpu_check_plan(big) is not big


def test_two_kernels_writing_one_output_are_rejected() -> None:
    data = planned().model_dump(mode="json")
    dup = json.loads(json.dumps(data["kernels"][-1]))
    dup["name"] = dup["name"] + "_again"
    data["kernels"].append(dup)
    data["provenance"]["plan_hash"] = ""
    with pytest.raises(PlanError, match="exactly one writer"):
        validate_plan(data)


def test_duplicate_kernel_names_are_rejected_by_validate() -> None:
    from pyrunner.planner import search

    data = search(workloads.get("RMSNorm", {"m": 256, "d": 256, "n": 256}), "fp16", naive=True)[0].model_dump(
        mode="json")
    assert len(data["kernels"]) >= 2
    data["kernels"][1]["name"] = data["kernels"][0]["name"]
    data["cost"]["kernels"][1]["kernel"] = data["kernels"][0]["name"]
    data["provenance"]["plan_hash"] = ""
    with pytest.raises(PlanError, match="kernel name .* is already used"):
        validate_plan(data)


def test_fill_nan_is_one_error_line(tmp_path: Path, capsys) -> None:
    from test_validate import attention_plan

    plan = attention_plan()

    def edit(d: dict) -> None:
        for k in d["kernels"]:
            for op in k["prologue"] + k["body"] + k["epilogue"]:
                if op["op"] == "fill":
                    op["value"] = "nan"
                    return
        raise AssertionError("no fill in the plan")

    f = tmp_path / "p.json"
    f.write_text(json.dumps(edited(plan, edit, rehash=False)))
    code, _, err = run(["validate", str(f)], capsys)
    assert code == 2 and "nan" in one_error(err).lower()  # strict: the string "nan" is not a number


def test_output_aliased_to_an_input_is_rejected_at_load() -> None:
    g = small_matmul_graph()
    g["outputs"] = [{"name": "Y2", "node": "X"}]
    with pytest.raises(GraphError, match="is the input 'X' itself"):
        graph_from_json(g)
    g["outputs"] = [{"name": "X", "node": g["nodes"][0]["name"]}]
    with pytest.raises(GraphError, match="already the name of an input"):
        graph_from_json(g)


# --- 4. records -----------------------------------------------------------------------------------

def test_nan_output_leaves_a_failed_verification_record(tmp_path: Path, monkeypatch, capsys) -> None:
    from pyrunner.run import executor, runner

    monkeypatch.setattr(runner.shutil, "which", lambda name: None)
    monkeypatch.setattr("pyrunner.backend.tilelang.compile.lower_to_cuda", lambda plan, cfg, **kw: {})
    real = executor.execute
    monkeypatch.setattr(executor, "execute",
                        lambda p, x, **kw: {k: v * math.nan for k, v in real(p, x, **kw).items()})
    plan = planned()
    f = tmp_path / "p.json"
    f.write_text(plan.model_dump_json())
    log = tmp_path / "r.jsonl"
    code, _, err = run(["run", str(f), "--small", "--log", str(log), "--out", str(tmp_path / "o"), "--quiet"],
                       capsys)
    assert code == 1 and "internal error" not in err
    (rec,) = read_log(log, strict=True)
    assert rec.status == "failed-verification" and rec.error is None and rec.extra["nonfinite"]["error"] == "inf"


def test_non_finite_numbers_anywhere_in_a_record_are_kept_as_strings(tmp_path: Path) -> None:
    rec = make_record(plan_hash="0" * 16, workload="W", graph_hash="g", shapes={"m": 8}, dtype="float16",
                      device="cpu", status="failed-verification", error=math.inf, error_bound=1e-3,
                      baselines_us={"eager": math.nan}, extra={"baseline_errors": {"eager": math.inf}})
    append_record(tmp_path / "r.jsonl", rec)
    (back,) = read_log(tmp_path / "r.jsonl", strict=True)
    assert back.error is None and back.baselines_us == {"eager": None}
    assert back.extra["baseline_errors"] == {"eager": "inf"}


def test_worker_killed_after_its_record_is_not_a_success() -> None:
    from pyrunner.run.runner import record_after_exit

    rec = make_record(plan_hash="0" * 16, workload="W", graph_hash="g", shapes={"m": 8}, dtype="float16",
                      device="H200", status="ok", plan_us=10.0, baselines_us={"eager": 20.0})
    assert record_after_exit(rec, 0) is rec
    for rc in (137, None):
        out = record_after_exit(rec, rc)
        assert out.status == "failed-launch" and out.extra["exit_code"] == rc and out.plan_us == 10.0
    failed = rec.model_copy(update={"status": "failed-verification"})
    assert record_after_exit(failed, 1).status == "failed-verification"


@pytest.mark.parametrize("log", ["DIR", "/dev/full", "/dev/null", "MISSING/deeper/r.jsonl"])
def test_bad_results_log_is_one_error_line_before_running(log: str, tmp_path: Path, capsys) -> None:
    if log == "DIR":
        log = str(tmp_path)
    elif log.startswith("MISSING"):
        (tmp_path / "MISSING").write_text("a file where a folder should be")
        log = str(tmp_path / log)
    elif not os.path.exists(log):
        pytest.skip(f"{log} does not exist here")
    f = tmp_path / "p.json"
    f.write_text(planned().model_dump_json())
    code, _, err = run(["run", str(f), "--small", "--log", log, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "results log" in one_error(err)


@pytest.mark.parametrize("argv, fragment", [
    (["--seed", "-1"], "--seed"),
    (["--budget", "nan"], "--budget"),
    (["--budget", "-3"], "--budget"),
    (["--autotune", "-2"], "--autotune"),
])
def test_bad_run_values_are_one_line(argv: list[str], fragment: str, tmp_path: Path, capsys) -> None:
    f = tmp_path / "p.json"
    f.write_text(planned().model_dump_json())
    code, _, err = run(["run", str(f), "--small", "--log", str(tmp_path / "r.jsonl"), *argv], capsys)
    assert code == 2 and fragment in one_error(err)


def _rec(**kw):
    base = dict(plan_hash="0123456789abcdef", workload="W", graph_hash="g", shapes={"m": 8}, dtype="float16",
                device="H200", status="ok", plan_us=10.0, baselines_us={"torch_compile": 20.0})
    return make_record(**{**base, **kw})


def test_report_needs_out_recomputes_speedups_escapes_and_counts(tmp_path: Path, capsys) -> None:
    log = tmp_path / "r.jsonl"
    append_record(log, _rec(workload="A|B\nC"))
    data = json.loads(log.read_text())
    data["speedups"] = {"torch_compile": -5.0}
    data["speedup_vs_best"] = -5.0
    data["workload"] = "Fake"
    with log.open("a") as f:
        f.write(json.dumps(data) + "\n")
        f.write("not json\n")
        f.write('{"record_version": 1}\n')
    code, _, err = run(["report", "--log", str(log)], capsys)
    assert code == 2 and "--out" in one_error(err)
    code, out, err = run(["report", "--log", str(log), "--out", str(tmp_path / "rep")], capsys)
    assert code == 0, err
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "-5.00x" not in md and "2.00x" in md
    assert "A\\|B C" in md
    assert "2 line(s)" in md and "skipped 2 line(s)" in out


def test_report_refuses_bad_paths(tmp_path: Path, capsys) -> None:
    log = tmp_path / "r.jsonl"
    append_record(log, _rec())
    (tmp_path / "file").write_text("x")
    for argv in (["--out", str(tmp_path / "file")], ["--log", str(tmp_path), "--out", str(tmp_path / "o")],
                 ["--log", "/dev/zero", "--out", str(tmp_path / "o")]):
        code, _, err = run(["report", *argv] + ([] if "--log" in argv else ["--log", str(log)]), capsys)
        assert code == 2, argv
        one_error(err)


def test_calibrate_rejects_malformed_records_with_one_line(tmp_path: Path, capsys) -> None:
    log = tmp_path / "r.jsonl"
    log.write_text('{"status": "ok", "predicted_us": 60.1, "plan_us": 1.0, "bound": "compute"}\n')
    code, _, err = run(["superopt", "Matmul", "--calibrate", str(log)], capsys)
    assert code == 2 and "invalid record" in one_error(err)


# --- 5. limits ------------------------------------------------------------------------------------

def _shared(n: int) -> dict:
    nodes = [{"name": "d0", "op": "exp", "args": ["X"]}]
    nodes += [{"name": f"d{i}", "op": "add", "args": [f"d{i - 1}", f"d{i - 1}"]} for i in range(1, n)]
    return {"name": "Shared", "axes": {"m": 64, "n": 64}, "inputs": {"X": ["m", "n"]}, "nodes": nodes,
            "outputs": [f"d{n - 1}"]}


def _chain(n: int) -> dict:
    nodes = [{"name": "d0", "op": "exp", "args": ["X"]}]
    nodes += [{"name": f"d{i}", "op": "neg" if i % 2 else "silu", "args": [f"d{i - 1}"]} for i in range(1, n)]
    return {"name": "Chain", "axes": {"m": 64, "n": 64}, "inputs": {"X": ["m", "n"]}, "nodes": nodes,
            "outputs": [f"d{n - 1}"]}


@pytest.mark.parametrize("family", [_shared, _chain])
def test_large_graphs_load_and_print_in_linear_time(family) -> None:
    t = time.perf_counter()
    g = graph_from_json(family(1000))
    text = show(g.outputs[0][1])
    assert g.axes_of(g.outputs[0][1]) == ("m", "n") and len(text) <= 400
    again = graph_from_json(family(1000))  # structurally equal, distinct objects: iterative equality
    assert again.outputs[0][1] == g.outputs[0][1]
    assert time.perf_counter() - t < 5.0


def test_input_files_are_bounded_and_regular(tmp_path: Path, capsys) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(17 * 1024 * 1024)
    for path, fragment in (("/dev/zero", "not a regular file"), (str(fifo), "not a regular file"),
                           (str(big), "limit"), (str(tmp_path), "directory")):
        result: list = []
        th = threading.Thread(target=lambda p=path: result.append(run(["superopt", "--graph", p], capsys)))
        th.start()
        th.join(10)
        assert not th.is_alive(), f"blocked on {path}"
        code, _, err = result[0]
        assert code == 2 and fragment in one_error(err), (path, err)


def test_node_count_depth_and_axis_sizes_are_bounded(tmp_path: Path, capsys) -> None:
    for g, fragment in ((_chain(6000), "the limit is 5000"),
                        ({**small_matmul_graph(), "axes": {"m": 1e300, "d": 32, "n": 32}}, "too large"),
                        ({**small_matmul_graph(), "axes": {"m": 2**31, "d": 32, "n": 32}}, "too large")):
        f = tmp_path / "g.json"
        f.write_text(json.dumps(g))
        code, _, err = run(["superopt", "--graph", str(f)], capsys)
        assert code == 2 and fragment in one_error(err)
    f.write_text("[" * 5000 + "]" * 5000)
    code, _, err = run(["superopt", "--graph", str(f)], capsys)
    assert code == 2 and "nested too deeply" in one_error(err)
    code, _, err = run(["superopt", "Matmul", "--shape", "m=99999999999999999999"], capsys)
    assert code == 2 and "limit" in one_error(err)
    code, _, err = run(["superopt", "Matmul", "--shape", "m=2097152", "--shape", "n=2097152", "--shape",
                        "d=64"], capsys)
    assert code == 2 and "2**40" in one_error(err)


def test_deep_plan_expression_is_one_line(tmp_path: Path, capsys) -> None:
    plan = planned()
    inner: list = []

    def mark(d: dict) -> None:
        for k in d["kernels"]:
            for op in k["body"] + k["epilogue"] + k["prologue"]:
                if op["op"] == "map":
                    inner.append(op["expr"])
                    op["expr"] = "DEEP"
                    return

    text = json.dumps(edited(plan, mark, rehash=False))
    for depth in (200, 2000):
        deep = '{"kind": "call", "fn": "neg", "args": [' * depth + json.dumps(inner[0]) + "]}" * depth
        f = tmp_path / "p.json"
        f.write_text(text.replace('"DEEP"', deep))
        code, _, err = run(["validate", str(f)], capsys)
        assert code == 2, err
        one_error(err)


def test_found_by_the_fuzz_suite(tmp_path: Path, capsys) -> None:
    """A constant of 10**400 overflowed math.isfinite; a record with plan_us "inf" crashed --calibrate."""
    g = small_matmul_graph()
    g["nodes"].append({"name": "c9", "op": "const", "value": 10**400})
    with pytest.raises(GraphError, match="finite number"):
        graph_from_json(g)
    rec = json.loads(_rec().model_dump_json())
    rec.update(plan_us="inf", predicted_us=12.0, bound="compute")
    log = tmp_path / "r.jsonl"
    log.write_text(json.dumps(rec) + "\n")
    code, _, err = run(["superopt", "Matmul", "--calibrate", str(log)], capsys)
    assert code == 2 and "invalid record" in one_error(err)
