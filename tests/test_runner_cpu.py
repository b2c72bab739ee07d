"""The runner end to end on the CPU: the no-GPU path with the real executor, and the GPU path's logic
through its one seam (``RunOptions.runtime``, a ``run.runtime.GpuRuntime``) with a fake runtime."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pyrunner.errors import DeviceFitError, PlanError
from pyrunner.log.results import read_log
from pyrunner.plan.validate import plan_graph
from pyrunner.run import runner
from pyrunner.run.runner import RunOptions, run_plan, run_plan_file, sample_configs
from pyrunner.run.runtime import TileLangRuntime


def _opts(tmp_path: Path, **kw) -> RunOptions:
    base = dict(results=tmp_path / "results.jsonl", out_dir=tmp_path / "out", quiet=True)
    return RunOptions(**{**base, **kw})


def _doubled(plan):
    """The plan with its output doubled before the store: a wrong plan, well formed, hash recomputed."""
    from pyrunner.plan.schema import Plan, plan_document, with_hash

    doc = plan_document(plan)
    epilogue = doc["kernels"][0]["epilogue"]
    at = next(i for i, op in enumerate(epilogue) if op["op"] == "store")
    src = epilogue[at]["src"]
    epilogue.insert(at, {"op": "map", "dst": src, "expr": {"kind": "call", "fn": "mul", "args": [
        {"kind": "ref", "buf": src}, {"kind": "const", "value": 2.0}]}})
    return with_hash(Plan.model_validate(doc))


def test_cpu_path_renders_lowers_executes_and_says_what_it_skipped(tmp_path, monkeypatch, matmul_plan) -> None:
    monkeypatch.setattr(runner.shutil, "which", lambda name: None)  # no nvcc: skip the cubin build
    plan = matmul_plan(128, 128, 128)
    rec = run_plan(plan, _opts(tmp_path, force_cpu=True))
    assert rec.status == "skipped", rec.message
    assert "no GPU" in rec.message and "timing" in rec.message and "nvcc not found" in rec.message
    assert "on outlier inputs" in rec.message  # both draws of the check ran
    assert rec.extra["draws"] == {"checked": ["normal", "outlier"], "not_checked": []}  # no reduction: no planting
    assert rec.plan_us is None and rec.error is not None and 0 < rec.error <= rec.error_bound
    assert rec.extra["executor_shapes"] == {"m": 128, "d": 128, "n": 128}  # within the CPU budget: real shapes
    src = tmp_path / "out" / rec.plan_hash / "Matmul.py"
    assert src.exists() and rec.plan_hash in src.read_text()
    assert list((tmp_path / "out" / rec.plan_hash).glob("*.cu"))
    assert [r.plan_hash for r in read_log(tmp_path / "results.jsonl", strict=True)] == [rec.plan_hash]


def test_cpu_path_executor_mismatch_fails_with_exit_1(tmp_path, monkeypatch, matmul_plan, capsys) -> None:
    monkeypatch.setattr(runner.shutil, "which", lambda name: None)
    plan = _doubled(matmul_plan(128, 128, 128))
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    opts = RunOptions(results=tmp_path / "r.jsonl", out_dir=tmp_path / "o", quiet=True, force_cpu=True)
    assert run_plan_file(path, opts) == 1
    err = capsys.readouterr().err
    assert plan.provenance.plan_hash in err and "failed-verification" in err
    (rec,) = read_log(tmp_path / "r.jsonl", strict=True)
    assert rec.status == "failed-verification" and rec.error > 0.4


def test_invalid_plan_file_is_a_user_error(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema_version": 1, "workload": "x"}))
    with pytest.raises(PlanError):
        run_plan_file(bad, RunOptions(results=tmp_path / "r.jsonl", quiet=True))
    assert not (tmp_path / "r.jsonl").exists()


# --- the GPU path's control flow, through the runtime seam (run.runtime.GpuRuntime) ----------

@dataclass
class FakeGpu:
    """A ``GpuRuntime`` without a GPU: a compiled plan computes its graph in float64 with torch on the
    CPU (``fake_launch``), ``corrupt(config)`` makes a config's launch wrong, ``compile_error(config)``
    fails its compile, and the clock reads ``clock(config)`` microseconds for the config launched last
    (baselines: ``baseline_us``). Baselines are the real torch ones (eager, the vendor kernel)."""

    make_launch: Callable
    corrupt: Callable[[dict], Callable | None] = lambda cfg: None
    compile_error: Callable[[dict], Exception | None] = lambda cfg: None
    launch_error: Exception | None = None
    clock: Callable[[dict], float] = lambda cfg: 1.0
    baseline_us: float = 2.0
    baselines: bool = True
    compiled: list[dict] = field(default_factory=list)
    launched: list[dict] = field(default_factory=list)
    released: int = 0

    def available(self) -> bool:
        return True

    def name(self) -> str:
        return "fake-gpu"

    def compile(self, plan, config, target):
        self.compiled.append(config)
        err = self.compile_error(config)
        if err is not None:
            raise err
        inner = self.make_launch(plan_graph(plan), corrupt=self.corrupt(config))

        def launch(t):
            self.launched.append(config)
            if self.launch_error is not None:
                raise self.launch_error
            inner(t)
        return launch

    def _time(self, name: str, fn) -> float:
        fn()
        return self.clock(self.launched[-1]) if name == "plan" else self.baseline_us

    def time_us(self, fn, warmup_ms, rep_ms) -> float:
        return self._time("plan", fn)

    def side_by_side_us(self, fns, rounds, warmup_ms, rep_ms):
        times = {name: self._time(name, fn) for name, fn in fns.items()}
        return times, dict.fromkeys(fns, "fake clock"), {n: [t] * rounds for n, t in times.items()}

    def kernel_times_us(self, fn, names):
        fn()
        return dict.fromkeys(names, self.clock(self.launched[-1]))

    def baseline(self, graph, name):
        return TileLangRuntime().baseline(graph, name) if self.baselines and name in ("eager", "vendor") else None

    def warm(self, graph, dtype, names) -> None:
        pass

    def release(self) -> None:
        self.released += 1


@pytest.fixture
def fake_gpu(fake_launch) -> FakeGpu:
    return FakeGpu(fake_launch)


def _gpu_opts(tmp_path: Path, gpu: FakeGpu, **kw) -> RunOptions:
    return _opts(tmp_path, runtime=gpu, device="cpu", **kw)


def test_gpu_path_verifies_times_and_logs_baselines(tmp_path, fake_gpu, matmul_plan) -> None:
    plan = matmul_plan(128, 128, 128)
    opts = _gpu_opts(tmp_path, fake_gpu, baselines=("eager", "vendor"), warmup_ms=0.1, rep_ms=0.5, seed=99)
    rec = run_plan(plan, opts)
    assert rec.status == "ok", rec.message
    assert rec.device == "fake-gpu" and rec.seed == 99
    assert rec.plan_us == 1.0 and rec.baselines_us == {"eager": 2.0, "cublas": 2.0}
    assert set(rec.speedups) == {"eager", "cublas"} and rec.best_baseline in rec.speedups
    assert rec.error is not None and rec.error <= rec.error_bound
    assert "on outlier inputs" in rec.message  # the device check ran both draws
    assert set(rec.extra["baseline_errors"]) == {"eager", "cublas"}
    assert rec.kernel_times_us == {k.name: 1.0 for k in plan.kernels}
    assert fake_gpu.compiled == [rec.config] and fake_gpu.released == 1
    assert read_log(opts.results, strict=True)[0].plan_hash == plan.provenance.plan_hash


def test_the_runtimes_implement_the_seam_and_force_cpu_never_asks_one(tmp_path, monkeypatch, matmul_plan,
                                                                     fake_gpu) -> None:
    from pyrunner.run.runtime import GpuRuntime

    wanted = {n for n in vars(GpuRuntime) if not n.startswith("_")}
    assert wanted and wanted <= set(vars(TileLangRuntime)) and wanted <= set(vars(FakeGpu))
    assert RunOptions().runtime is None  # run_plan then takes TileLangRuntime()
    monkeypatch.setattr(runner.shutil, "which", lambda name: None)
    rec = run_plan(matmul_plan(64, 64, 64), _gpu_opts(tmp_path, fake_gpu, force_cpu=True))
    assert rec.device == "cpu" and rec.status == "skipped" and fake_gpu.compiled == []


def test_gpu_path_mismatch_is_not_timed(tmp_path, fake_gpu, matmul_plan) -> None:
    fake_gpu.corrupt = lambda cfg: (lambda y: -y)
    rec = run_plan(matmul_plan(128, 128, 128), _gpu_opts(tmp_path, fake_gpu, baselines=("eager",)))
    assert rec.status == "failed-verification"
    assert rec.plan_us is None and rec.baselines_us == {}
    assert fake_gpu.launched == [rec.config]  # launched once, for the check, never for timing
    assert runner.exit_code(rec) == 1


def test_gpu_path_an_output_clamped_to_60_fails_on_the_outlier_draw(tmp_path, fake_gpu, matmul_plan) -> None:
    fake_gpu.corrupt = lambda cfg: (lambda y: y.clamp(-60.0, 60.0))
    rec = run_plan(matmul_plan(64, 64, 64), _gpu_opts(tmp_path, fake_gpu, baselines=("eager",)))
    assert rec.status == "failed-verification" and "on outlier inputs" in rec.message, rec.message
    assert fake_gpu.launched == [rec.config] * 2  # the normal draw passed, the outlier one failed


def test_gpu_path_compile_and_launch_failures(tmp_path, fake_gpu, matmul_plan) -> None:
    fake_gpu.compile_error = lambda cfg: RuntimeError("ptxas fatal: too many resources")
    rec = run_plan(matmul_plan(128, 128, 128), _gpu_opts(tmp_path, fake_gpu))
    assert rec.status == "failed-compile" and "ptxas" in rec.message

    fake_gpu.compile_error = lambda cfg: None
    fake_gpu.launch_error = RuntimeError("CUDA error: an illegal memory access was encountered")
    rec2 = run_plan(matmul_plan(128, 128, 128), _gpu_opts(tmp_path, fake_gpu))
    assert rec2.status == "failed-launch" and "illegal memory access" in rec2.message
    assert [r.status for r in read_log(tmp_path / "results.jsonl", strict=True)] == ["failed-compile", "failed-launch"]


def test_device_fit_error_is_logged_and_raised(tmp_path, monkeypatch, fake_gpu, matmul_plan) -> None:
    def no_fit(plan, cfg, target=None):
        raise DeviceFitError("kernel 'matmul': needs 300 KiB of shared memory")

    monkeypatch.setattr(runner, "check_fits", no_fit)  # the device model, public: no fixture plan exceeds it
    with pytest.raises(DeviceFitError):
        run_plan(matmul_plan(128, 128, 128), _gpu_opts(tmp_path, fake_gpu))
    (rec,) = read_log(tmp_path / "results.jsonl", strict=True)
    assert rec.status == "failed-compile" and "shared memory" in rec.message
    assert fake_gpu.compiled == []


def test_sample_configs_is_bounded_distinct_deterministic_and_starts_at_the_default(matmul_plan) -> None:
    plan = matmul_plan(256, 256, 256)
    a = sample_configs(plan, 6)
    assert a == sample_configs(plan, 6)
    assert a[0] == {k.name: dict(k.defaults) for k in plan.kernels}
    assert 1 < len(a) <= 6
    assert len({json.dumps(c, sort_keys=True) for c in a}) == len(a)
    assert sample_configs(plan, 1) == a[:1]


def test_autotune_keeps_the_fastest_verified_config(tmp_path, fake_gpu, matmul_plan) -> None:
    plan = matmul_plan(256, 256, 256)
    cands = sample_configs(plan, 4)
    assert len(cands) == 4
    fast, wrong = cands[2], cands[1]
    fake_gpu.corrupt = lambda cfg: (lambda y: y + 1.0) if cfg == wrong else None
    fake_gpu.clock = lambda cfg: 1.0 if cfg == fast else 5.0  # config `fast` is quickest
    rec = run_plan(plan, _gpu_opts(tmp_path, fake_gpu, autotune=4, baselines=()))
    assert rec.status == "ok", rec.message
    assert rec.config == fast and rec.plan_us == 1.0
    tried = rec.extra["autotune"]
    assert len(tried) == 4
    assert "failed-verification" in next(t["status"] for t in tried if t["config"] == wrong)
    assert [t.get("time_us") for t in tried if t["config"] != wrong] == [5.0, 1.0, 5.0]


@pytest.mark.parametrize(("baselines", "tried"), [(("eager", "torch_compile"), 4),
                                                  (("eager", "torch_compile", "max_autotune"), 1)])
def test_autotune_keeps_time_for_the_baselines_it_will_time(tmp_path, fake_gpu, matmul_plan,
                                                           baselines, tried) -> None:
    """With 23 s left, autotuning goes on when only eager and torch.compile follow (12 s kept for them,
    warm) and stops after the first config when max-autotune follows too (24 s kept: its compile may
    miss the cache); the run still ends ok with its baselines' turn reached. (23 s, not 20: each
    config's check runs two draws, about 2 s on two loaded cores, and 3 of them must fit in the 11 s.)"""
    import time

    fake_gpu.baselines = False  # none is built: only the reserve kept for them is under test
    plan = matmul_plan(256, 256, 256)
    opts = _gpu_opts(tmp_path, fake_gpu, autotune=4, baselines=baselines)
    opts.deadline = time.monotonic() + 23.0
    rec = run_plan(plan, opts)
    assert rec.status == "ok", rec.message
    assert len(rec.extra["autotune"]) == tried
    assert ("autotune stopped after 1 config(s): time budget" in rec.message) == (tried == 1)


def test_a_killed_run_is_logged_from_its_checkpoint(tmp_path, fake_gpu, matmul_plan) -> None:
    ck = tmp_path / "ck.json"
    plan = matmul_plan(128, 128, 128)
    rec = run_plan(plan, _gpu_opts(tmp_path, fake_gpu, baselines=("eager",), checkpoint=ck, warmup_ms=0.1,
                                   rep_ms=0.5))
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
    opts = _gpu_opts(tmp_path, fake_gpu, baselines=("eager",), warmup_ms=0.1, rep_ms=0.5, tuning_out=out,
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


def test_warm_only_compiles_the_candidates_and_logs_nothing(tmp_path, fake_gpu, matmul_plan) -> None:
    plan = matmul_plan(256, 256, 256)
    rec = run_plan(plan, _gpu_opts(tmp_path, fake_gpu, autotune=3, baselines=(), warm_only=True))
    assert rec.status == "skipped" and rec.message == "warm-up only"
    assert len(fake_gpu.compiled) == 3 and fake_gpu.launched == []
    assert not (tmp_path / "results.jsonl").exists()


def test_a_config_that_fails_to_compile_falls_back_to_the_next_candidate(tmp_path, fake_gpu, matmul_plan) -> None:
    plan = matmul_plan(256, 256, 256)
    default = {k.name: dict(k.defaults) for k in plan.kernels}
    fake_gpu.compile_error = lambda cfg: RuntimeError("TileLang: shared memory exceeds the limit") \
        if cfg == default else None
    rec = run_plan(plan, _gpu_opts(tmp_path, fake_gpu, autotune=3, baselines=(), warmup_ms=0.1, rep_ms=0.5))
    assert rec.status == "ok" and rec.config != default and "failed to compile" in rec.message
    # a pinned config is never replaced
    rec2 = run_plan(plan, _gpu_opts(tmp_path, fake_gpu, autotune=3, baselines=(), config=default))
    assert rec2.status == "failed-compile"


def test_gpu_path_a_kernel_dropping_a_reduced_row_fails_on_the_planted_draw(tmp_path, executor_launch) -> None:
    """The device's kernels drop the last row of ``X @ W`` before its maximum is taken (the plan is right, the
    compiled code is not: the runtime runs an edited plan's tiled algorithm). Normal and outlier inputs put the
    maximum elsewhere; the runner's check plants it there, fails the run and records which draws it ran."""
    from test_mutation_holes import _tail_edited

    plan, edited = _tail_edited("benchmarks/graphs/gemm_max_scalar.json", "Y")
    wrong = FakeGpu(lambda graph, corrupt=None: executor_launch(edited), baselines=False)
    rec = run_plan(plan, _gpu_opts(tmp_path, wrong, baselines=(), seed=11))
    assert rec.status == "failed-verification" and "on planted inputs" in rec.message, rec.message
    assert rec.extra["draws"] == {"checked": ["normal", "outlier", "planted"], "not_checked": []}
    right = FakeGpu(lambda graph, corrupt=None: executor_launch(plan), baselines=False)
    rec = run_plan(plan, _gpu_opts(tmp_path, right, baselines=(), seed=11))
    assert rec.status == "ok" and "on planted inputs" in rec.message, rec.message
    assert rec.extra["draws"] == {"checked": ["normal", "outlier", "planted"], "not_checked": []}
