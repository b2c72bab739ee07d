"""The runner end to end on the CPU: the no-GPU path, and the GPU path's logic with fakes."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from pyrunner.errors import DeviceFitError, PlanError
from pyrunner.ir.reference import evaluate
from pyrunner.log.results import read_log
from pyrunner.plan.validate import plan_graph
from pyrunner.run import runner
from pyrunner.run.runner import RunOptions, run_plan, run_plan_file, sample_configs


@pytest.fixture
def fake_executor(monkeypatch):
    """Stand-in for pyrunner.run.executor and run.shrink: exact float64 evaluation, scale_down halves every axis."""
    from pyrunner.ir.graph_json import graph_to_json
    from pyrunner.plan.schema import with_hash

    def scale_down(plan):
        g = plan_graph(plan)
        small = g.with_sizes({a: max(16, n // 2) for a, n in g.sizes.items()})
        tensors = [t.model_copy(update={"shape": [small.sizes[a] for a in t.axes]}) for t in plan.tensors]
        return with_hash(plan.model_copy(update={"graph": graph_to_json(small), "tensors": tensors}))

    mod = types.ModuleType("pyrunner.run.executor")
    mod.execute = lambda plan, inputs, audit=False: evaluate(plan_graph(plan), inputs)
    shrink = types.ModuleType("pyrunner.run.shrink")
    shrink.scale_down = scale_down
    shrink.cpu_check_plan = scale_down
    monkeypatch.setitem(sys.modules, "pyrunner.run.executor", mod)
    monkeypatch.setitem(sys.modules, "pyrunner.run.shrink", shrink)
    return mod


def _opts(tmp_path: Path, **kw) -> RunOptions:
    base = dict(results=tmp_path / "results.jsonl", out_dir=tmp_path / "out", quiet=True)
    return RunOptions(**{**base, **kw})


def test_cpu_path_renders_lowers_executes_and_says_what_it_skipped(tmp_path, monkeypatch, matmul_plan,
                                                                     fake_executor) -> None:
    monkeypatch.setattr(runner, "gpu_available", lambda: False)
    monkeypatch.setattr(runner.shutil, "which", lambda name: None)  # no nvcc: skip the cubin build
    plan = matmul_plan(128, 128, 128)
    rec = run_plan(plan, _opts(tmp_path))
    assert rec.status == "skipped", rec.message
    assert "no GPU" in rec.message and "timing" in rec.message and "nvcc not found" in rec.message
    assert rec.plan_us is None and rec.error is not None and rec.error < 1e-12
    assert rec.extra["executor_shapes"] == {"m": 64, "d": 64, "n": 64}
    src = tmp_path / "out" / rec.plan_hash / "Matmul.py"
    assert src.exists() and rec.plan_hash in src.read_text()
    assert list((tmp_path / "out" / rec.plan_hash).glob("*.cu"))
    assert [r.plan_hash for r in read_log(tmp_path / "results.jsonl", strict=True)] == [rec.plan_hash]


def test_cpu_path_executor_mismatch_fails_with_exit_1(tmp_path, monkeypatch, matmul_plan, fake_executor,
                                                      capsys) -> None:
    monkeypatch.setattr(runner, "gpu_available", lambda: False)
    monkeypatch.setattr(runner.shutil, "which", lambda name: None)
    monkeypatch.setattr(fake_executor, "execute", lambda plan, x: {"Y": evaluate(plan_graph(plan), x)["Y"] * 2})
    plan = matmul_plan(128, 128, 128)
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    opts = RunOptions(results=tmp_path / "r.jsonl", out_dir=tmp_path / "o", quiet=True)
    assert run_plan_file(path, opts) == 1
    err = capsys.readouterr().err
    assert plan.provenance.plan_hash in err and "failed-verification" in err
    (rec,) = read_log(tmp_path / "r.jsonl", strict=True)
    assert rec.status == "failed-verification"


def test_invalid_plan_file_is_a_user_error(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema_version": 1, "workload": "x"}))
    with pytest.raises(PlanError):
        run_plan_file(bad, RunOptions(results=tmp_path / "r.jsonl", quiet=True))
    assert not (tmp_path / "r.jsonl").exists()


# --- the GPU path's control flow, with fakes standing in for TileLang and CUDA ----------

@pytest.fixture
def fake_gpu(monkeypatch, fake_launch):
    monkeypatch.setattr(runner, "gpu_available", lambda: True)
    monkeypatch.setattr(runner, "device_name", lambda: "fake-gpu")
    compiled: list[dict] = []

    def compile_(plan, cfg, opts=None):
        compiled.append(cfg)
        return fake_launch(plan_graph(plan))

    monkeypatch.setattr(runner, "_compile", compile_)
    return compiled


def test_gpu_path_verifies_times_and_logs_baselines(tmp_path, fake_gpu, matmul_plan) -> None:
    plan = matmul_plan(128, 128, 128)
    opts = _opts(tmp_path, device="cpu", baselines=("eager", "vendor"), warmup_ms=0.1, rep_ms=0.5, seed=99)
    rec = run_plan(plan, opts)
    assert rec.status == "ok", rec.message
    assert rec.device == "fake-gpu" and rec.seed == 99
    assert rec.plan_us is not None and rec.plan_us > 0
    assert set(rec.baselines_us) == {"eager", "cublas"}
    assert set(rec.speedups) == {"eager", "cublas"} and rec.best_baseline in rec.speedups
    assert rec.error is not None and rec.error <= rec.error_bound
    assert set(rec.extra["baseline_errors"]) == {"eager", "cublas"}
    assert read_log(opts.results, strict=True)[0].plan_hash == plan.provenance.plan_hash


def test_gpu_path_mismatch_is_not_timed(tmp_path, monkeypatch, fake_gpu, fake_launch, matmul_plan) -> None:
    monkeypatch.setattr(runner, "_compile",
                        lambda plan, cfg, opts=None: fake_launch(plan_graph(plan), corrupt=lambda y: -y))
    rec = run_plan(matmul_plan(128, 128, 128), _opts(tmp_path, device="cpu", baselines=("eager",)))
    assert rec.status == "failed-verification"
    assert rec.plan_us is None and rec.baselines_us == {}
    assert runner.exit_code(rec) == 1


def test_gpu_path_compile_and_launch_failures(tmp_path, monkeypatch, fake_gpu, matmul_plan) -> None:
    def broken(plan, cfg, opts=None):
        raise RuntimeError("ptxas fatal: too many resources")

    monkeypatch.setattr(runner, "_compile", broken)
    rec = run_plan(matmul_plan(128, 128, 128), _opts(tmp_path, device="cpu"))
    assert rec.status == "failed-compile" and "ptxas" in rec.message

    def crashing_launch(plan, cfg, opts=None):
        def launch(t):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return launch

    monkeypatch.setattr(runner, "_compile", crashing_launch)
    rec2 = run_plan(matmul_plan(128, 128, 128), _opts(tmp_path, device="cpu"))
    assert rec2.status == "failed-launch" and "illegal memory access" in rec2.message
    assert [r.status for r in read_log(tmp_path / "results.jsonl", strict=True)] == ["failed-compile", "failed-launch"]


def test_device_fit_error_is_logged_and_raised(tmp_path, monkeypatch, fake_gpu, matmul_plan) -> None:
    def no_fit(plan, cfg, target=None):
        raise DeviceFitError("kernel 'matmul': needs 300 KiB of shared memory")

    monkeypatch.setattr(runner, "check_fits", no_fit)
    with pytest.raises(DeviceFitError):
        run_plan(matmul_plan(128, 128, 128), _opts(tmp_path, device="cpu"))
    (rec,) = read_log(tmp_path / "results.jsonl", strict=True)
    assert rec.status == "failed-compile" and "shared memory" in rec.message


def test_sample_configs_is_bounded_distinct_deterministic_and_starts_at_the_default(matmul_plan) -> None:
    plan = matmul_plan(256, 256, 256)
    a = sample_configs(plan, 6)
    assert a == sample_configs(plan, 6)
    assert a[0] == {k.name: dict(k.defaults) for k in plan.kernels}
    assert 1 < len(a) <= 6
    assert len({json.dumps(c, sort_keys=True) for c in a}) == len(a)
    assert sample_configs(plan, 1) == a[:1]


def test_autotune_keeps_the_fastest_verified_config(tmp_path, monkeypatch, fake_gpu, fake_launch,
                                                    matmul_plan) -> None:
    plan = matmul_plan(256, 256, 256)
    cands = sample_configs(plan, 4)
    assert len(cands) == 4
    fast, wrong = cands[2], cands[1]
    last: list[dict] = []

    def compile_(p, cfg, opts=None):
        inner = fake_launch(plan_graph(p), corrupt=(lambda y: y + 1.0) if cfg == wrong else None)

        def launch(t):
            last.append(cfg)
            inner(t)
        return launch

    def fake_time(fn, *a, **k):  # stands in for the GPU clock: config `fast` is quickest
        fn()
        return 1.0 if last[-1] == fast else 5.0

    def fake_side_by_side(fns, *a, **k):  # the final timing, same clock
        times = {name: fake_time(f) for name, f in fns.items()}
        return times, {n: "fake" for n in fns}, {n: [t] for n, t in times.items()}

    monkeypatch.setattr(runner, "_compile", compile_)
    monkeypatch.setattr(runner, "median_us", fake_time)
    monkeypatch.setattr(runner, "side_by_side_us", fake_side_by_side)
    rec = run_plan(plan, _opts(tmp_path, device="cpu", autotune=4, baselines=()))
    assert rec.status == "ok", rec.message
    assert rec.config == fast and rec.plan_us == 1.0
    tried = rec.extra["autotune"]
    assert len(tried) == 4
    assert "failed-verification" in next(t["status"] for t in tried if t["config"] == wrong)


@pytest.mark.parametrize(("baselines", "tried"), [(("eager", "torch_compile"), 4),
                                                  (("eager", "torch_compile", "max_autotune"), 1)])
def test_autotune_keeps_time_for_the_baselines_it_will_time(tmp_path, monkeypatch, fake_gpu, matmul_plan,
                                                           baselines, tried) -> None:
    """With 20 s left, autotuning goes on when only eager and torch.compile follow (they take about
    10 s, warm) and stops after the first config when max-autotune follows too (its compile may
    miss the cache); the run still ends ok with its baselines' turn reached."""
    import time

    monkeypatch.setattr(runner, "_prepare_baselines", lambda run, verifier: {})
    monkeypatch.setattr(runner, "median_us", lambda fn, *a, **k: (fn(), 1.0)[1])
    monkeypatch.setattr(runner, "side_by_side_us", lambda fns, *a, **k: (
        {n: 1.0 for n in fns}, {n: "fake" for n in fns}, {n: [1.0] for n in fns}))
    plan = matmul_plan(256, 256, 256)
    opts = _opts(tmp_path, device="cpu", autotune=4, baselines=baselines)
    opts.deadline = time.monotonic() + 20.0
    rec = run_plan(plan, opts)
    assert rec.status == "ok", rec.message
    assert len(rec.extra["autotune"]) == tried
    assert ("autotune stopped after 1 config(s): time budget" in rec.message) == (tried == 1)


def test_a_killed_run_is_logged_from_its_checkpoint(tmp_path, fake_gpu, matmul_plan) -> None:
    ck = tmp_path / "ck.json"
    plan = matmul_plan(128, 128, 128)
    rec = run_plan(plan, _opts(tmp_path, device="cpu", baselines=("eager",), checkpoint=ck, warmup_ms=0.1, rep_ms=0.5))
    assert rec.status == "ok"
    # the last checkpoint holds the plan time: a kill during a later baseline keeps the measurement
    back = runner.record_from_checkpoint(ck, "killed by the time guard after 60 s")
    assert back is not None and back.status == "ok" and back.plan_us == rec.plan_us
    assert "time guard" in back.message and "stage" not in back.extra
    # a kill while compiling is a compile failure
    data = json.loads(ck.read_text())
    data.update(plan_us=None, extra={"stage": "compiling with TileLang"})
    ck.write_text(json.dumps(data))
    assert runner.record_from_checkpoint(ck, "killed").status == "failed-compile"
    assert runner.record_from_checkpoint(tmp_path / "none.json", "killed") is None


def test_gpu_run_writes_the_tuned_config_and_times_side_by_side(tmp_path, fake_gpu, matmul_plan) -> None:
    from pyrunner.target.tuning import TuningDB

    plan = matmul_plan(128, 128, 128)
    out = tmp_path / "tuning.json"
    opts = _opts(tmp_path, device="cpu", baselines=("eager",), warmup_ms=0.1, rep_ms=0.5, tuning_out=out,
                 tuning_db=tmp_path / "none.json", rounds=2)
    rec = run_plan(plan, opts)
    assert rec.status == "ok", rec.message
    timing = rec.extra["timing"]
    assert set(timing["method"]) == {"plan", "eager"} and len(timing["rounds_us"]["plan"]) == 2
    assert rec.baselines_us["eager"] is not None and rec.extra["renderer"] >= 2
    entry = TuningDB.load(out).lookup(plan, "fake-gpu")
    assert entry is not None and entry.config == rec.config and entry.time_us == round(rec.plan_us, 3)
    # the next run starts from that config and says so
    rec2 = run_plan(plan, opts)
    assert "tuning database" in rec2.message


def test_a_config_that_fails_to_compile_falls_back_to_the_next_candidate(tmp_path, monkeypatch, fake_gpu,
                                                                        fake_launch, matmul_plan) -> None:
    plan = matmul_plan(256, 256, 256)
    default = {k.name: dict(k.defaults) for k in plan.kernels}

    def compile_(p, cfg, opts=None):
        if cfg == default:
            raise RuntimeError("TileLang: shared memory exceeds the limit")
        return fake_launch(plan_graph(p))

    monkeypatch.setattr(runner, "_compile", compile_)
    rec = run_plan(plan, _opts(tmp_path, device="cpu", autotune=3, baselines=(), warmup_ms=0.1, rep_ms=0.5))
    assert rec.status == "ok" and rec.config != default and "failed to compile" in rec.message
    # a pinned config is never replaced
    rec2 = run_plan(plan, _opts(tmp_path, device="cpu", autotune=3, baselines=(), config=default))
    assert rec2.status == "failed-compile"
