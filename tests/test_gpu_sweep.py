"""The GPU sweep's dry mode (plan, render, lower; no GPU) on two small graphs, and its summary table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SWEEP = ROOT / "benchmarks" / "gpu_sweep.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_sweep  # noqa: E402


@pytest.mark.slow
def test_dry_sweep_on_two_small_graphs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SWEEP), "--dry", "--only", "Matmul,matmul_bias_residual",
                           "--shapes", "small", "--random", "0", "--jobs", "2", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["cases"] == 2 and summary["planned"] == 2 and summary["compiled"] == 2
    assert summary["failed"] == 0 and summary["by_source"] == {"catalog": 1, "corpus": 1}
    records = [json.loads(ln) for ln in (tmp_path / "cases.jsonl").read_text().splitlines()]
    assert {r["status"] for r in records} == {"lowered"}
    assert {r["sizes"]["m"] for r in records} == {128}
    assert proc.stdout.rstrip().splitlines()[-1].startswith("   planned 2 / compiled 2 / GPU-verified 0 / failed 0")
    assert "worker log of Matmul@small/bf16" in (tmp_path / "sweep.log").read_text()


@pytest.mark.slow
def test_dry_sweep_for_the_ampere_backend(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SWEEP), "--dry", "--device", "a100", "--only", "ScaledAttention",
                           "--shapes", "small", "--random", "0", "--jobs", "1", "--out", str(tmp_path),
                           "--seed", "124662122"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (record,) = [json.loads(ln) for ln in (tmp_path / "cases.jsonl").read_text().splitlines()]
    assert record["status"] == "lowered" and record["extra"]["backend"] == "tilelang-ampere (sm_80)"
    assert record["extra"]["seed"] == 124662122  # handed to the worker: its check would draw from it
    assert json.loads((tmp_path / "summary.json").read_text())["device"] == "a100"
    rendered = "".join(p.read_text() for p in (tmp_path / "work" / "sources").rglob("*.py"))
    assert "'arch': 'sm_80'" in rendered and "T.gemm(" in rendered and "T.wgmma_gemm(" not in rendered


def test_an_unknown_sweep_device_is_one_error_line(tmp_path: Path, capsys) -> None:
    assert gpu_sweep.main(["--dry", "--device", "v100", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().out == "error: --device 'v100': no backend for that device; known: a100, h100, h200\n"


def test_cases_cover_catalog_corpus_random_at_two_shapes() -> None:
    args = gpu_sweep.argparse.Namespace(random=3, random_seed0=0, graph=None, only=None, shapes="small,real",
                                        dtypes="bf16")
    cases = gpu_sweep.collect(args)
    by = {(c.source, c.shape) for c in cases}
    assert by == {(s, sh) for s in ("catalog", "corpus", "bench", "random") for sh in ("small", "real")}
    # a --graph naming a benchmarks/graphs file is that graph once, not twice
    again = gpu_sweep.collect(gpu_sweep.argparse.Namespace(**{**vars(args), "graph": [
        str(gpu_sweep.BENCH_GRAPHS / "lm_head.json")]}))
    assert sorted(c.id for c in again) == sorted(c.id for c in cases)
    att = {c.shape: c.graph["axes"] for c in cases if c.id.startswith("Attention@")}
    assert att["real"] == {"h": 16, "t_q": 4096, "t_kv": 4096, "d": 128}
    assert att["small"] == {"h": 2, "t_q": 128, "t_kv": 128, "d": 128}
    # benchmarks/graphs holds odd sizes on purpose (50257, 997 x 127 x 1009); the rest tile evenly
    assert all(n % 64 == 0 or n <= 16 for c in cases if c.source != "bench" for n in c.graph["axes"].values())
    # wild graphs only when asked for, at their own sizes and 4x that (capped) as the real shape
    wild = gpu_sweep.collect(gpu_sweep.parser().parse_args(["--random", "0", "--wild", "2", "--only", "Wild0,Wild1"]))
    assert sorted(c.id for c in wild) == ["Wild0@real/bf16", "Wild0@small/bf16", "Wild1@real/bf16", "Wild1@small/bf16"]
    assert {c.source for c in wild} == {"wild"}


def test_cases_option_keeps_exactly_the_listed_ids(tmp_path: Path) -> None:
    """``--cases @FILE`` (what benchmarks/changed_cases.py writes) sweeps those ids and no others;
    an id the sweep would not collect is an error, not a silently smaller sweep."""
    listed = tmp_path / "changed.txt"
    listed.write_text("Matmul@real/bf16\nsoftmax_rows@small/bf16\n")
    args = gpu_sweep.parser().parse_args(["--random", "0", "--cases", f"@{listed}"])
    assert sorted(c.id for c in gpu_sweep.collect(args)) == ["Matmul@real/bf16", "softmax_rows@small/bf16"]
    args = gpu_sweep.parser().parse_args(["--random", "0", "--cases", "Matmul@odd/bf16"])
    with pytest.raises(SystemExit, match="Matmul@odd/bf16"):
        gpu_sweep.collect(args)


def test_summary_counts_and_failure_lines() -> None:
    def rec(i, status, stage, msg=""):
        return {"id": f"g{i}@small/bf16", "source": "corpus", "status": status, "stage": stage, "message": msg}

    recs = [rec(0, "ok", "verified"), rec(1, "failed-verification", "compiled", "output 'Y': error 4.3e-01 > 3e-02"),
            rec(2, "failed-compile", "planned", "Layout infer conflict between S and P"), rec(3, "timeout", "planned"),
            rec(4, "failed-plan", "start", "GraphError: no feasible plan")]
    s = gpu_sweep.summarize(recs, dry=False, seconds=12.0)
    assert (s["planned"], s["compiled"], s["gpu_verified"], s["failed"]) == (4, 2, 1, 4)
    text = gpu_sweep.table(s)
    assert "planned 4 / compiled 2 / GPU-verified 1 / failed 4" in text
    assert "Layout infer conflict between S and P" in text and "error 4.3e-01" in text
    recs.append(rec(5, "not-checkable", "compiled", "not checkable: the float64 reference of output 'd_X' ..."))
    s = gpu_sweep.summarize(recs, dry=False, seconds=12.0)
    assert s["failed"] == 4 and [c["id"] for c in s["not_checkable"]] == ["g5@small/bf16"]
    assert "not checkable 1" in gpu_sweep.table(s) and "NOT CHECKABLE g5@small/bf16" in gpu_sweep.table(s)


def test_summary_says_which_draws_ran_and_which_were_skipped() -> None:
    """Each record keeps the check's draws (``VerifyResult.draws_record``); the summary counts them per draw."""
    def rec(i, checked, skipped=()):
        return {"id": f"g{i}@real/bf16", "source": "corpus", "status": "ok", "stage": "verified", "message": "",
                "extra": {"draws": {"checked": checked, "not_checked": list(skipped)}}}

    recs = [rec(0, ["normal", "outlier", "planted"]), rec(1, ["normal", "outlier"]),  # g1: no reduction
            rec(2, ["normal", "outlier"], ["planted"]), rec(3, ["normal"], ["outlier", "planted"]),
            {"id": "g4@real/bf16", "source": "corpus", "status": "failed-compile", "stage": "planned", "message": "x"}]
    s = gpu_sweep.summarize(recs, dry=False, seconds=1.0)
    assert s["draws"] == {"normal": {"checked": 4, "not_checked": 0}, "outlier": {"checked": 3, "not_checked": 1},
                          "planted": {"checked": 1, "not_checked": 2}}
    assert "draws checked: normal 4, outlier 3 (1 not checked), planted 1 (2 not checked)" in gpu_sweep.table(s)


def test_changed_cases_finds_nothing_against_the_tree_itself(tmp_path: Path) -> None:
    """benchmarks/changed_cases.py against HEAD, on a clean tree's own code: every case renders the
    same, so no id is listed (a listed id would send an unchanged case back to the GPU)."""
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "pyrunner"],
                            capture_output=True, text=True, cwd=ROOT)
    if status.returncode != 0 or status.stdout.strip():
        pytest.skip("needs a git checkout whose pyrunner/ has no uncommitted changes")
    out = tmp_path / "changed.txt"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "changed_cases.py"), "--base", "HEAD",
                           "--out", str(out), "--", "--only", "Matmul,softmax_rows", "--shapes", "small",
                           "--random", "0"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.read_text() == ""
    assert "0 of 2 case(s) render differently from HEAD" in proc.stderr


def test_changed_cases_plans_and_renders_for_the_swept_backend() -> None:
    """``changed_cases.py -- --device a100`` hashes what the Ampere sweep builds (the A100 plan, rendered for
    sm_80), not the Hopper rendering."""
    import changed_cases

    from pyrunner.backend.tilelang.backend import backend_for

    args = gpu_sweep.parser().parse_args(["--only", "Matmul", "--shapes", "small", "--random", "0"])
    (case,) = gpu_sweep.collect(args)
    plan, source = changed_cases._plan_and_source(case, "a100")
    assert "'arch': 'sm_80'" in source and plan.cost.model["tc_flops"] == backend_for("a100").device.tc_flops


def test_gpu_diagnose_takes_the_plan_the_sweep_ran_for_the_backend(capsys) -> None:
    """``gpu_diagnose --device a100`` diagnoses the A100 plan the Ampere sweep ran (it planned for the default
    backend, and imported a name compile.py no longer has); an unknown device is one error line."""
    import gpu_diagnose

    from pyrunner.backend.tilelang.backend import backend_for

    graph, plan, backend = gpu_diagnose.sweep_plan("Matmul@small/bf16", "a100")
    assert backend is backend_for("a100") and plan.cost.model["tc_flops"] == backend.device.tc_flops
    assert gpu_diagnose.main(["--cases", "Matmul@small/bf16", "--device", "v100"]) == 2
    assert capsys.readouterr().err.startswith("error: --device 'v100': no backend")


def test_backward_cases_are_the_same_graphs_marked_for_their_derived_backward() -> None:
    args = gpu_sweep.parser().parse_args(["--only", "Attention,SwiGLU", "--shapes", "small", "--random", "0",
                                          "--backward", "--cases", "Attention@small/bf16/bwd"])
    (case,) = gpu_sweep.collect(args)
    assert case.id == "Attention@small/bf16/bwd" and case.backward and case.source == "catalog"
    plain = gpu_sweep.collect(gpu_sweep.parser().parse_args(["--only", "Attention", "--shapes", "small",
                                                             "--random", "0"]))
    assert [c.backward for c in plain] == [False] and plain[0].graph == case.graph


@pytest.mark.slow
def test_dry_backward_sweep_plans_and_lowers_the_derived_backward(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SWEEP), "--dry", "--backward", "--only", "Attention",
                           "--shapes", "small", "--random", "0", "--jobs", "1", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (record,) = [json.loads(ln) for ln in (tmp_path / "cases.jsonl").read_text().splitlines()]
    assert record["id"] == "Attention@small/bf16/bwd" and record["status"] == "lowered"
    assert "LSE_P" in record["extra"]["saved"]  # the backward reads the forward's log-sum-exp
    rendered = "".join(p.read_text() for p in (tmp_path / "work" / "sources").rglob("*.py"))
    assert "d_Q" in rendered and "d_K" in rendered and "d_V" in rendered


def test_saving_cases_plan_the_forward_training_runs() -> None:
    """``--with-saves`` sweeps the forward that also writes what the backward reads (run 157: such a plan failed
    on the GPU in a kernel form no plain forward has), planned and hashed as training plans it."""
    import changed_cases

    from pyrunner.backend.tilelang.backend import backend_for

    args = gpu_sweep.parser().parse_args(["--only", "SwiGLU", "--shapes", "small", "--random", "0", "--with-saves"])
    (case,) = gpu_sweep.collect(args)
    assert case.id == "SwiGLU@small/bf16/saves" and case.saving and not case.backward
    extra: dict = {}
    plan, graph = gpu_sweep.plan_case(case, backend_for("h200"), extra)
    outputs = {n for n, _ in graph.outputs}
    assert "Y" in outputs and set(extra["saved"]) <= outputs and extra["saved"], (outputs, extra)
    assert {t.name for t in plan.tensors if t.role == "output"} == outputs
    hashed, _ = changed_cases._plan_and_source(case, "h200")
    assert hashed.provenance.plan_hash == plan.provenance.plan_hash


def test_changed_cases_hashes_a_backward_case_by_its_backward_plan() -> None:
    """``changed_cases -- --backward`` planned each case's forward graph, so no planner change to a backward
    ever showed as a changed case: the hash of a backward case is its derived backward's rendered source."""
    import changed_cases

    args = gpu_sweep.parser().parse_args(["--only", "SwiGLU", "--shapes", "small", "--random", "0", "--backward"])
    (case,) = gpu_sweep.collect(args)
    plan, src = changed_cases._plan_and_source(case, "h200")
    assert plan.provenance.backward_of is not None and plan.workload == "SwiGLUBackward"
    assert "d_W_gate" in src


def test_a_case_out_of_gpu_memory_narrows_the_sweep_and_runs_again() -> None:
    """Run 168: 13 real-shape backward checks ran out of GPU memory beside 14 other workers; run 169 passed them
    with 4 at once. Each memory failure halves how many cases run at once and the case runs again under it."""
    oom = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    throttle, lines, seen = gpu_sweep.Throttle(8), [], []

    def fits_under(k: int):
        def run() -> dict:
            seen.append(throttle.limit)
            if throttle.limit > k:
                return {"id": "g@real/bf16/bwd", "status": "failed-launch", "stage": "compiled", "message": oom}
            return {"id": "g@real/bf16/bwd", "status": "ok", "stage": "verified", "message": ""}
        return run

    rec = gpu_sweep.run_narrowing(fits_under(2), throttle, lines.append)
    assert rec["status"] == "ok" and rec["extra"]["out_of_memory_under"] == [8, 4]
    assert seen == [8, 4, 2] and throttle.limit == 2 and "g@real/bf16/bwd" in lines[0]
    # alone and still out of memory: that record stands, nothing loops
    seen.clear()
    rec = gpu_sweep.run_narrowing(fits_under(0), throttle, lines.append)
    assert rec["status"] == "failed-launch" and seen == [2, 1] and throttle.limit == 1
    # a launch error or a wrong result is a verdict, run once
    calls = []

    def wrong() -> dict:
        calls.append(1)
        return {"id": "h@real/bf16", "status": "failed-launch", "stage": "compiled", "message": "illegal address"}

    assert gpu_sweep.run_narrowing(wrong, gpu_sweep.Throttle(4), lines.append)["status"] == "failed-launch"
    assert calls == [1]


def test_the_throttle_holds_its_limit_across_threads() -> None:
    """Cases that fail together narrow the limit once, and no more than the limit ever run at once."""
    import threading
    import time

    throttle, lock, state = gpu_sweep.Throttle(4), threading.Lock(), {"now": 0, "peak": 0}

    def case() -> None:
        throttle.acquire()
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        time.sleep(0.01)
        with lock:
            state["now"] -= 1
        throttle.release()

    assert throttle.narrow(4) == 2 and throttle.narrow(4) == 2  # the second failure under 4 changes nothing
    threads = [threading.Thread(target=case) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert state["peak"] <= 2 and throttle.running == 0


