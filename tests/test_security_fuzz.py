"""Property-based security suite (issue 8): generated hostile names, paths and values through every
entry point (``superopt``, ``run``, ``validate``, ``report``, ``--calibrate``), called in-process
through ``pyrunner.cli.main``. Each example must end in exit 0 or exit 2 with exactly one
``error:`` line, print no traceback, create no file outside its output folder, and execute no
payload (a payload would create a canary file).

CI runs a bounded number of examples, derandomized by the ``ci`` profile (tests/conftest.py).
On demand, ``SUPEROPT_SECURITY_FUZZ=N`` runs N examples per entry point (use N >= 2000 for the
10,000-input run: five entry points) and ``SUPEROPT_SECURITY_FUZZ_REPORT=FILE`` writes the counts
(inputs, payloads executed, files outside, tracebacks, exit codes) as JSON.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import re
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyrunner import cli
from pyrunner.ir import catalog as workloads
from pyrunner.ir.graph_json import graph_to_json
from pyrunner.plan.schema import Plan, plan_hash

ON_DEMAND = int(os.environ.get("SUPEROPT_SECURITY_FUZZ", "0") or 0)
EXAMPLES = ON_DEMAND or 40
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])
CANARY = Path(tempfile.mkdtemp(prefix="superopt-canary-"))
MARK = CANARY / "pwned"
COUNTS: Counter = Counter()

# --- hostile strings ------------------------------------------------------------------------------

PAYLOADS = [
    f'x"""; __import__("os").system("touch {MARK}"); """',
    f"x'''; open({str(MARK)!r}, 'w'); '''",
    f'x = 1\nopen({str(MARK)!r}, "w")\n#',
    f"{{__import__('os').system('touch {MARK}')}}",
    f"x\\\"); open({str(MARK)!r}, 'w'); (\"",
    f"__import__('os').system('touch {MARK}')",
    f"X = open({str(MARK)!r}, 'w')",
]
PATHS = ["../../x", "/tmp/x", "..", ".", "a/b", "sitecustomize", "/dev/null", "..\\..\\x", "x\x00y", "~/x"]
LOOKALIKES = ["𝐗", "x²", "Ｘ", "ﬁ", "K", "ᵃ", "x̅", "é", "ℌ", "Ⅸ", "١", "\u200bX", "X\u00a0"]
KEYWORDS = ["class", "None", "lambda", "import", "def", "__init__", "__class__", "T", "tilelang", "__builtins__"]


def hostile_names() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(PAYLOADS + PATHS + LOOKALIKES + KEYWORDS),
        st.text(min_size=1, max_size=12),
        st.text(alphabet="abcXYZ_019\"'\\\n\r\t {}()[];:.,/$|<>#`", min_size=1, max_size=16),
        st.integers(65, 400).map(lambda n: "a" * n),
        st.tuples(st.sampled_from(["", "x", "X_"]), st.sampled_from(PAYLOADS + LOOKALIKES)).map("".join),
    )


def hostile_numbers() -> st.SearchStrategy[object]:
    return st.one_of(
        st.sampled_from([0, -1, 1e300, -1e300, 2**31, 2**63, 2**64 + 1, 0.5, True, False, None, "nan", "inf",
                         "-inf", "1e309", "NaN", "Infinity", "64", [], {}, 10**400]),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
    )


# --- one in-process call, checked ---------------------------------------------------------------

def _snapshot(root: Path) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, n), root))
    return out


def call(argv: list[str], work: Path, allowed: tuple[str, ...] = ()) -> tuple[int, str]:
    """Run the CLI in ``work``; assert the invariants; return (exit code, stderr)."""
    before = _snapshot(work)
    canary_before = _snapshot(CANARY)
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(work)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(argv)
    finally:
        os.chdir(cwd)
    text = err.getvalue()
    COUNTS["inputs"] += 1
    COUNTS[f"exit {code}"] += 1
    new = {p for p in _snapshot(work) - before if not any(p == a or p.startswith(a + os.sep) for a in allowed)}
    payload = MARK.exists() or _snapshot(CANARY) != canary_before or any("pwned" in p for p in new)
    traceback = "Traceback" in text or "internal error" in text
    COUNTS["payloads executed"] += int(payload)
    COUNTS["files outside"] += int(bool(new))
    COUNTS["tracebacks"] += int(traceback)
    assert not payload, (argv, text)
    assert not new, (argv, sorted(new))
    assert not traceback, (argv, text)
    assert code in (0, 1, 2), (argv, code, text)
    if code == 2:
        lines = [x for x in text.splitlines() if x.startswith("error:")]
        assert len(lines) == 1, (argv, text)
    return code, text


@contextlib.contextmanager
def workdir():
    with tempfile.TemporaryDirectory(prefix="superopt-fuzz-") as d:
        yield Path(d)


# --- bases ----------------------------------------------------------------------------------------

_BASE: dict[str, object] = {}


def base_graph() -> dict:
    return graph_to_json(workloads.get("RMSNorm", {"m": 64, "d": 128, "n": 64}))


def base_plan() -> dict:
    if "plan" not in _BASE:
        from pyrunner.planner import search

        _BASE["plan"] = search(workloads.get("RMSNorm", {"m": 64, "d": 128, "n": 64}), "fp16")[0].model_dump(
            mode="json")
    return json.loads(json.dumps(_BASE["plan"]))


def rehash(data: dict) -> dict:
    """Give an edited plan its true hash (so names, not the hash check, must stop it); best effort."""
    try:
        data["provenance"]["plan_hash"] = ""
        data["provenance"]["plan_hash"] = plan_hash(Plan.model_validate(data))
    except Exception:  # noqa: BLE001, S110 - the schema rejects it anyway
        pass
    return data


GRAPH_SLOTS = ["name", "input", "axis", "node", "output", "alias", "size", "const", "eps"]
PLAN_SLOTS = ["workload", "kernel", "tensor", "buffer", "axis", "param", "rule", "plan_hash", "fill", "const",
              "shape", "block", "graph_name", "cost_kernel"]


def put_graph(g: dict, slot: str, name: str, value: object) -> dict:
    if slot == "name":
        g["name"] = name
    elif slot == "input":
        g["inputs"][name] = g["inputs"].pop("X")
        for n in g["nodes"]:
            n["args"] = [name if a == "X" else a for a in n.get("args", [])]
    elif slot == "axis":
        g["axes"][name] = g["axes"].pop("n")
        g["inputs"]["W"] = ["d", name]
    elif slot == "node":
        old = g["nodes"][0]["name"]
        g["nodes"][0]["name"] = name
        for n in g["nodes"][1:]:
            n["args"] = [name if a == old else a for a in n.get("args", [])]
    elif slot == "output":
        g["outputs"] = [{"name": name, "node": g["nodes"][-1]["name"]}]
    elif slot == "alias":
        g["outputs"] = [{"name": "Y2", "node": "X"}]
    elif slot == "size":
        g["axes"]["m"] = value
    elif slot == "const":
        g["nodes"].append({"name": "c9", "op": "const", "value": value})
    else:
        g["nodes"].append({"name": "r9", "op": "rmsnorm", "args": ["X"], "axis": "d", "eps": value})
    return g


def put_plan(d: dict, slot: str, name: str, value: object) -> dict:
    k = d["kernels"][0]
    if slot == "workload":
        d["workload"] = name
    elif slot == "kernel":
        k["name"] = name
    elif slot == "tensor":
        d["tensors"][0]["name"] = name
    elif slot == "buffer":
        k["buffers"][0]["name"] = name
    elif slot == "axis":
        d["tensors"][0]["axes"][0] = name
    elif slot == "param" and k["params"]:
        p = next(iter(k["params"]))
        k["params"][name] = k["params"].pop(p)
        k["defaults"][name] = k["defaults"].pop(p)
    elif slot == "rule":
        k["fused_rules"] = [name]
    elif slot == "plan_hash":
        d["provenance"]["plan_hash"] = name
        return d
    elif slot == "fill":
        k["prologue"].insert(0, {"op": "fill", "dst": k["buffers"][0]["name"], "value": value})
    elif slot == "const":
        for op in k["body"] + k["epilogue"] + k["prologue"]:
            if op["op"] == "map":
                op["expr"] = {"kind": "call", "fn": "mul", "args": [op["expr"], {"kind": "const", "value": value}]}
                break
    elif slot == "shape":
        d["tensors"][0]["shape"][0] = value
    elif slot == "block":
        k["grid"][0]["block"] = value
    elif slot == "graph_name":
        d["graph"]["name"] = name
    else:
        d["cost"]["kernels"][0]["kernel"] = name
    return rehash(d)


# --- the entry points -----------------------------------------------------------------------------

@FUZZ
@given(slot=st.sampled_from(GRAPH_SLOTS), name=hostile_names(), value=hostile_numbers())
def test_superopt_graph_files(slot: str, name: str, value: object) -> None:
    g = put_graph(base_graph(), slot, name, value)
    with workdir() as w:
        (w / "g.json").write_text(json.dumps(g, default=str))
        (w / "out").mkdir()
        code, _ = call(["superopt", "--graph", "g.json", "--out", "out/p.json"], w, ("out",))
        if code == 0:  # a harmless value: the plan it wrote must validate
            assert call(["validate", "out/p.json"], w)[0] == 0


@FUZZ
@given(slot=st.sampled_from(PLAN_SLOTS), name=hostile_names(), value=hostile_numbers())
def test_validate_plans(slot: str, name: str, value: object) -> None:
    d = put_plan(base_plan(), slot, name, value)
    with workdir() as w:
        (w / "p.json").write_text(json.dumps(d, default=str))
        call(["validate", "p.json"], w)


@FUZZ
@given(slot=st.sampled_from(PLAN_SLOTS), name=hostile_names(), value=hostile_numbers(),
       seed=st.one_of(st.none(), st.sampled_from(["-1", "0", "x", "1e3", str(2**64), "007"])))
def test_run_plans(slot: str, name: str, value: object, seed: str | None) -> None:
    d = put_plan(base_plan(), slot, name, value)
    with workdir() as w:
        (w / "p.json").write_text(json.dumps(d, default=str))
        code, _ = call(["validate", "p.json"], w)
        if code == 0:
            return  # a harmless edit (a name that is a plain identifier): running it is the CPU tests' job
        argv = ["run", "p.json", "--small", "--quiet", "--no-baselines", "--log", "out/r.jsonl", "--out", "out"]
        call(argv + (["--seed", seed] if seed is not None else []), w, ("out",))


RECORD_FIELDS = ["workload", "plan_hash", "dtype", "device", "status", "message", "plan_us", "predicted_us",
                 "baselines_us", "speedups", "error", "shapes", "bound"]


def _record(name: str, value: object, field: str) -> str:
    rec = {"record_version": 1, "timestamp": "t", "tool_version": "0", "plan_hash": "0123456789abcdef",
           "workload": "W", "graph_hash": "g", "shapes": {"m": 8}, "dtype": "float16", "device": "H200",
           "status": "ok", "plan_us": 10.0, "predicted_us": 12.0, "bound": "compute",
           "baselines_us": {"torch_compile": 20.0}}
    if field in ("workload", "plan_hash", "dtype", "device", "message"):
        rec[field] = name
    elif field == "shapes":
        rec["shapes"] = {name: value}
    elif field == "baselines_us":
        rec["baselines_us"] = {name: value}
    elif field == "speedups":
        rec["speedups"] = {"torch_compile": value}
    else:
        rec[field] = value
    return json.dumps(rec, default=str)


@FUZZ
@given(field=st.sampled_from(RECORD_FIELDS), name=hostile_names(), value=hostile_numbers(),
       garbage=st.lists(st.text(max_size=30), max_size=3),
       out=st.sampled_from(["rep", "rep/sub", "LOGFILE", "/dev/null", "/proc/version", None]))
def test_report(field: str, name: str, value: object, garbage: list[str], out: str | None) -> None:
    with workdir() as w:
        lines = [_record(name, value, field)] + [g.replace("\n", " ") for g in garbage]
        (w / "r.jsonl").write_text("\n".join(lines) + "\n")
        argv = ["report", "--log", "r.jsonl"]
        if out is not None:
            argv += ["--out", "r.jsonl" if out == "LOGFILE" else out]
        code, _ = call(argv, w, ("rep",))
        if code == 0:
            md = (w / (out or "rep") / "report.md").read_text()
            rows = md.splitlines()
            start = next(i for i, x in enumerate(rows) if x.startswith("| "))
            table = list(itertools.takewhile(lambda x: x.startswith("|"), rows[start:]))  # the records table
            cells = [len(re.findall(r"(?<!\\)\|", x)) for x in table]
            assert all(c == cells[0] for c in cells), md


@FUZZ
@given(field=st.sampled_from(RECORD_FIELDS), name=hostile_names(), value=hostile_numbers(),
       garbage=st.lists(st.text(max_size=30), max_size=2))
def test_calibrate(field: str, name: str, value: object, garbage: list[str]) -> None:
    with workdir() as w:
        lines = [_record(name, value, field)] + [g.replace("\n", " ") for g in garbage]
        (w / "r.jsonl").write_text("\n".join(lines) + "\n")
        (w / "out").mkdir()
        call(["superopt", "Matmul", "--shape", "m=256", "--shape", "d=256", "--shape", "n=256",
              "--calibrate", "r.jsonl", "--out", "out/p.json"], w, ("out",))


@pytest.mark.skipif(not os.environ.get("SUPEROPT_SECURITY_FUZZ_REPORT"), reason="on-demand report only")
def test_zz_write_counts() -> None:
    Path(os.environ["SUPEROPT_SECURITY_FUZZ_REPORT"]).write_text(json.dumps(dict(COUNTS), indent=1) + "\n")
    assert COUNTS["payloads executed"] == COUNTS["files outside"] == COUNTS["tracebacks"] == 0
