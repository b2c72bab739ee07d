"""One door for the device: ``superopt --device``, ``optimize(device=)``, ``export --device``, ``gpu_sweep`` and
``gpu_run --device`` all hand out ``pipeline.best_plan``'s plan for the backend named.

For each backend (``a100``, ``h200``) the CLI, the frontend's call site, the GPU sweep and the seed-timing
runner give byte-identical plans for the same graph, dtype and tuning database; plans for a100 and
h200 differ where the device numbers must move them (the modelled times); ``gpu_run --device h200,a100``
plans every workload once per backend, names the backend in each job and writes each device's records
apart; the default backend is the GPU found at run time (h200 without one).
"""

from __future__ import annotations

import argparse
import importlib.util
import json

import pytest

from pyrunner import cli
from pyrunner.backend.tilelang import backend as backend_mod
from pyrunner.backend.tilelang.backend import backend_for, backend_name_for_arch, device_name, local_backend_name
from pyrunner.ir import catalog
from pyrunner.ir.graph_json import graph_to_json
from pyrunner.pipeline import best_plan
from pyrunner.plan.schema import canonical_json, plan_document
from pyrunner.plan.validate import load_plan

SIZES = {"m": 128, "d": 256, "n": 256}


def _module(name: str):
    """A benchmark script as a module (registered first: its dataclasses look their module up)."""
    import sys

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, f"benchmarks/{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _canon(plan) -> str:
    return canonical_json(plan_document(plan))


def test_the_backend_of_a_gpu_is_its_own_else_the_newest_it_runs() -> None:
    assert backend_name_for_arch("sm_90") == "h200"
    assert backend_name_for_arch("sm_80") == backend_name_for_arch("sm_86") == "a100"
    assert backend_name_for_arch("sm_89") == "a100"  # Ada runs the Ampere instruction set
    assert backend_name_for_arch("sm_100") == "a100"  # sm_90a code runs on sm_90 only; compute_80 PTX runs on
    assert backend_name_for_arch("sm_75") == backend_name_for_arch("bogus") == "h200"  # none runs: the default
    assert local_backend_name() == "h200"  # no GPU here
    assert device_name(None) == "h200" and device_name(" A100 ") == "a100"


def test_a_device_or_gpu_name_is_read_one_way() -> None:
    """``backend_for`` and ``device_name`` read a name through one helper: a known device's key for its name or
    any GPU name the driver gives it, else the name as typed, lower case (which ``backend_for`` then refuses)."""
    from pyrunner.backend.tilelang.backend import device_key_or_name

    assert device_key_or_name("NVIDIA A100-SXM4-80GB") == device_key_or_name(" A100 ") == "a100"
    assert device_key_or_name("NVIDIA H200 NVL") == "h200" and device_key_or_name(" B200 ") == "b200"


def test_a_gpu_name_picks_its_backend_and_an_unknown_gpu_is_said_so(monkeypatch) -> None:
    """Any A100 part plans for the a100 backend, the H100 SXM for its own entry; a GH200 or an H100 PCIe (no
    device entry) runs the backend its architecture runs, and gpu_run says that its plans use that backend's
    device numbers and where its times are filed."""
    from pyrunner.backend.tilelang.backend import unknown_gpu_note

    assert backend_for("NVIDIA A100-SXM4-80GB") is backend_for("a100") and device_name("NVIDIA H200 NVL") == "h200"
    assert unknown_gpu_note("NVIDIA A100 80GB PCIe", "a100") is None
    assert unknown_gpu_note("NVIDIA H100 80GB HBM3", "h100") is None
    note = unknown_gpu_note("NVIDIA GH200 480GB", backend_name_for_arch("sm_90"))
    assert "not a known device" in note and "H200's numbers" in note and "'gh200_480gb'" in note
    note = unknown_gpu_note("NVIDIA H100 PCIe", backend_name_for_arch("sm_90"))  # 114 SMs: not the H100 entry
    assert "not a known device" in note and "'h100_pcie'" in note
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100-SXM4-40GB")
    assert local_backend_name() == "a100"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    assert local_backend_name() == "h100"  # its own entry, on the Hopper backend
    assert backend_for("h100").target.family == backend_for("h200").target.family == "hopper"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA GH200 480GB")
    assert local_backend_name() == "h200"  # by architecture: sm_90 runs the Hopper backend


@pytest.mark.parametrize("device", ["a100", "h200"])
def test_plans_are_byte_identical_from_the_cli_the_frontend_the_sweep_and_gpu_run(device, tmp_path, monkeypatch):
    """Each door plans with the backend's committed tuning database: here one (``SUPEROPT_TUNING_DIR``) in
    which the plan was measured at another config, so every door must hand out that tuned plan."""
    from pyrunner.frontend.region_plans import plan_region
    from pyrunner.target.tuning import TuningDB, committed_tuning

    graph = catalog.get("Matmul", SIZES)
    backend = backend_for(device)
    (model,) = best_plan(graph, "bfloat16", backend=backend, lower_check=False)
    (k,) = model.kernels
    param = next(p for p, values in sorted(k.params.items()) if len(values) > 1)
    tuned = {k.name: {**k.defaults, param: next(v for v in k.params[param] if v != k.defaults[param])}}
    db = TuningDB.for_device(backend.device.name, tmp_path / "tuning")
    assert db.record(model, tuned, 1.0, backend.device.name, backend=backend.name)
    db.save()
    monkeypatch.setenv("SUPEROPT_TUNING_DIR", str(tmp_path / "tuning"))
    (direct,) = best_plan(graph, "bfloat16", backend=backend, tuning=committed_tuning(backend.device.name),
                          lower_check=False)
    assert direct.cost.model.get("measured") == 1.0 and dict(direct.kernels[0].defaults) == tuned[k.name]
    out = tmp_path / "plan.json"
    shapes = [f"--shape={a}={n}" for a, n in SIZES.items()]
    assert cli.main(["superopt", "Matmul", *shapes, "--dtype", "bf16", "--device", device, "--out", str(out)]) == 0
    assert out.read_text() == json.dumps(plan_document(direct), indent=2) + "\n"
    # the frontend's call site (optimize and the backend plan every region through it)
    assert _canon(plan_region(graph, "bfloat16", device)) == _canon(direct)
    # the GPU sweep's case (dry: planned and lowered to CUDA, no GPU)
    sweep = _module("gpu_sweep")
    case = sweep.Case("Matmul@small", "catalog", graph_to_json(graph), "small", "bfloat16")
    rec = sweep.run_case(case, tmp_path / "sweep.jsonl", True, tmp_path / "work", device)
    assert rec.status == "lowered", rec.message
    assert rec.plan_hash == direct.provenance.plan_hash
    assert f"{backend.name} ({backend.target.arch})" in rec.extra["backend"]
    # the seed-timing runner's plan file, both backends in one run
    run = _module("gpu_run")
    args = argparse.Namespace(devices=["h200", "a100"], dtypes="bfloat16", alternatives=0, autotune=1,
                              calibration=None)
    jobs = run._plan_all(args, tmp_path / "w", tmp_path / "results.jsonl", lambda *p: None, [("Matmul", graph)])
    assert [(n, d) for n, _, _, d in jobs] == [("Matmul", "h200"), (f"Matmul{run.AT}a100", "a100")]
    (job,) = [j for j in jobs if j[3] == device]
    assert _canon(load_plan(job[2])) == _canon(direct)


def test_a100_and_h200_plans_differ_where_the_device_numbers_move_them() -> None:
    """The same kernels (a GEMM's structure does not depend on the device here) with the A100's modelled
    time: 312 TFLOP/s bf16 against the H200's ~990, so the A100's compute-bound GEMM is slower."""
    graph = catalog.get("Matmul", {"m": 2048, "d": 2048, "n": 2048})
    (a100,) = best_plan(graph, "bfloat16", backend=backend_for("a100"), lower_check=False)
    (h200,) = best_plan(graph, "bfloat16", backend=backend_for("h200"), lower_check=False)
    assert _canon(a100) != _canon(h200)
    assert a100.cost.total_us > 2 * h200.cost.total_us


def test_gpu_run_writes_each_device_apart_and_tables_them_side_by_side(tmp_path) -> None:
    run = _module("gpu_run")
    assert run.devices_of(None) == ["h200"] and run.devices_of("h200,A100,h200") == ["h200", "a100"]
    with pytest.raises(Exception, match="no backend for that device"):
        run.devices_of("v100")
    assert run.results_file(tmp_path, ["h200", "a100"], "h200").name == "results.jsonl"
    assert run.results_file(tmp_path, ["h200", "a100"], "a100").name == "results_a100.jsonl"
    assert run.backend_label("a100") == "a100 (tilelang-ampere, sm_80)"
    from pyrunner.log.results import make_record

    def rec(us: float | None):
        return make_record(plan_hash="x", workload="Matmul", graph_hash="", shapes={"m": 1}, dtype="bfloat16",
                           device="gpu", status="ok", plan_us=us)

    table = run.side_by_side({"h200": [rec(10.0)], "a100": [rec(25.0)]}, ["h200", "a100"])
    assert "h200 us" in table and "a100/h200" in table and "25.0" in table and "2.50" in table


def test_an_unknown_device_is_one_error_line(tmp_path, capsys) -> None:
    run = _module("gpu_run")
    assert run.main(["--out", str(tmp_path / "o"), "--work", str(tmp_path / "w"), "--device", "v100"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --device 'v100': no backend") and "Traceback" not in err
    plan = tmp_path / "p.json"
    assert cli.main(["superopt", "Matmul", "--shape=m=128", "--shape=d=256", "--shape=n=256", "--out", str(plan)]) == 0
    capsys.readouterr()
    assert cli.main(["export", str(plan), "--out", str(tmp_path / "k.py"), "--device", "v100"]) == 2
    assert "no backend for that device" in capsys.readouterr().err


def test_export_renders_for_the_device_named(tmp_path, capsys) -> None:
    plan = tmp_path / "p.json"
    assert cli.main(["superopt", "Matmul", "--shape=m=128", "--shape=d=256", "--shape=n=256", "--out", str(plan)]) == 0
    for device, arch in (("a100", "sm_80"), ("h200", "sm_90a")):
        out = tmp_path / f"k_{device}.py"
        assert cli.main(["export", str(plan), "--out", str(out), "--device", device]) == 0
        assert f"TARGET = {{'kind': 'cuda', 'arch': '{arch}'}}" in out.read_text()
    default = tmp_path / "k.py"
    assert cli.main(["export", str(plan), "--out", str(default)]) == 0  # no GPU here: h200
    assert default.read_text() == (tmp_path / "k_h200.py").read_text()


def test_optimize_plans_for_the_device_named(monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    from pyrunner.frontend import region_plans as fcompile
    from pyrunner.frontend.optimize import optimize

    asked: list = []
    real = fcompile.plan_region

    def spy(graph, dtype, device=None):
        asked.append(device)
        return real(graph, dtype, device)

    monkeypatch.setattr(fcompile, "plan_region", spy)
    monkeypatch.setattr(fcompile, "_PLANS", {})

    def f(x, w):
        return torch.relu(x @ w)

    x, w = torch.randn(64, 128, dtype=torch.bfloat16), torch.randn(128, 128, dtype=torch.bfloat16)
    opt = optimize(f, x, w, device="A100", executor="plan", progress=False, verify=False)
    assert asked and set(asked) == {"a100"}
    (choice,) = opt.report.regions
    (direct,) = best_plan(choice.planned or choice.region.graph, "bfloat16", backend=backend_for("a100"),
                          lower_check=False)
    assert _canon(choice.plan) == _canon(direct)
    with pytest.raises(Exception, match="no backend for that device"):
        optimize(f, x, w, device="v100", executor="plan", progress=False)
    monkeypatch.setattr(backend_mod, "local_backend_name", lambda: "a100")
    assert device_name(None) == "a100"
