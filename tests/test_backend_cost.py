"""The cost model is per backend: each device is priced with the terms of the backend rendering for it.

The planner holds no default terms (a ``Machine`` needs both a device and terms; ``cost.machine_for``
takes them from the compile target serving the device's architecture), the Ampere terms switch the
Hopper-only ones off, an A100 plan says its times are modelled, and measurements stay with the backend
and device they were taken on: an A100 plan never reads an H200 time, and a run of the Ampere backend on
an H200 never files its time as the Hopper backend's. These tests plan with the model alone.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from pyrunner import cli
from pyrunner.backend.tilelang.ampere import AMPERE_TERMS
from pyrunner.backend.tilelang.backend import backend_for
from pyrunner.backend.tilelang.hopper import HOPPER_TERMS
from pyrunner.ir import catalog
from pyrunner.planner import search
from pyrunner.planner.calibration import same_target
from pyrunner.planner.cost import DEFAULT_MACHINE, UNFITTED, Machine, machine_for
from pyrunner.planner.explain import time_words
from pyrunner.run.runner import RunOptions, _record_tuning, _Run, default_config
from pyrunner.target.device import A100, H200
from pyrunner.target.tuning import TuningDB

MATMUL = {"m": 256, "d": 512, "n": 512}


def test_a_machine_needs_the_terms_of_a_backend() -> None:
    with pytest.raises(TypeError):
        Machine()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Machine(A100)  # type: ignore[call-arg]


def test_each_device_is_priced_with_its_backends_terms() -> None:
    assert machine_for(H200).terms is HOPPER_TERMS and DEFAULT_MACHINE.terms is HOPPER_TERMS
    assert machine_for(A100).terms is AMPERE_TERMS
    assert machine_for(replace(A100, name="A30", sms=56)).terms is AMPERE_TERMS  # by architecture, not by name
    assert backend_for("a100").target.terms is AMPERE_TERMS and backend_for("h200").target.terms is HOPPER_TERMS
    assert AMPERE_TERMS.backend == backend_for("a100").name and HOPPER_TERMS.backend == backend_for("h200").name
    with pytest.raises(ValueError, match="sm_75"):
        machine_for(replace(A100, arch="sm_75"))


def test_the_ampere_terms_switch_the_hopper_only_ones_off() -> None:
    t = AMPERE_TERMS
    assert not t.specialised_one_block and t.no_ws_scale == 1.0  # nothing is warp specialised on sm_80
    assert t.cc_overlap < HOPPER_TERMS.cc_overlap  # mma.sync is synchronous per warp (no async wgmma)
    assert 0 < t.compute_efficiency < 1 and 0 < t.memory_efficiency < 1  # of vendor peaks, not measured ceilings
    assert not t.fitted_on and HOPPER_TERMS.fitted_on == ("H200",)


def test_an_a100_plan_is_priced_with_ampere_terms_and_says_it_is_modelled() -> None:
    graph = catalog.get("Matmul", MATMUL)
    a100 = search(graph, "bf16", tuning=False, device=A100)[0]
    h200 = search(graph, "bf16", tuning=False, device=H200)[0]
    assert a100.cost.model["compute_efficiency"] == AMPERE_TERMS.compute_efficiency
    assert a100.cost.model["launch_us"] == AMPERE_TERMS.launch_us
    assert a100.cost.model[UNFITTED] == 1.0 and UNFITTED not in h200.cost.model
    assert "modelled from the device description" in time_words(a100)
    assert "modelled" not in time_words(h200)


def test_explain_for_the_a100_says_its_times_are_modelled(tmp_path: Path, capsys) -> None:
    args = ["superopt", "Matmul", "--shape", "m=128", "--shape", "n=256", "--shape", "d=256", "--dtype", "bf16",
            "--no-tuning", "--no-lower-check", "--explain", "--out", str(tmp_path / "plan.json")]
    assert cli.main([*args, "--device", "a100"]) == 0
    assert "modelled from the device description" in capsys.readouterr().err
    assert cli.main([*args, "--device", "h200"]) == 0
    assert "modelled" not in capsys.readouterr().err


def test_an_a100_plan_never_reads_an_h200_measurement(tmp_path: Path) -> None:
    graph = catalog.get("Matmul", MATMUL)
    plan = search(graph, "bf16", tuning=False, device=A100)[0]
    cfg = default_config(plan)
    db = TuningDB(tmp_path / "db.json")
    db.record(plan, cfg, 1.0, "NVIDIA H200")  # this plan's structure, timed on an H200 (Hopper backend)
    db.record(plan, cfg, 1.0, "A100")  # on an A100, but filed as the Hopper backend's
    db.record(plan, cfg, 1.0, "NVIDIA H200", backend=AMPERE_TERMS.backend)  # Ampere code, on an H200
    assert search(graph, "bf16", tuning=db, device=A100)[0].cost.model.get("measured") is None
    db.record(plan, cfg, 1.0, "A100", backend=AMPERE_TERMS.backend)
    measured = search(graph, "bf16", tuning=db, device=A100)[0]
    assert measured.cost.model.get("measured") == 1.0 and measured.cost.total_us == 1.0


def test_a_run_of_the_ampere_backend_files_its_time_under_that_backend(tmp_path: Path) -> None:
    """An sm_80 build timed on an H200 is the Ampere backend's measurement there, never an entry the
    Hopper backend's H200 plans (or its calibration) would read."""
    graph = catalog.get("Matmul", MATMUL)
    plan = search(graph, "bf16", tuning=False, device=A100)[0]
    out = tmp_path / "tuning.json"
    run = _Run(plan, graph, RunOptions(tuning_out=out, backend="a100"), Console())
    cfg = default_config(plan)
    run.fields.update(device="NVIDIA H200", config=cfg, plan_us=7.25, status="ok")
    _record_tuning(run)
    assert run.fields["extra"]["backend"] == "tilelang-ampere"
    assert run.fields["extra"]["tuning"]["key"].endswith("|tilelang-ampere")
    db = TuningDB.load(out)
    assert db.lookup(plan, "NVIDIA H200") is None
    assert db.lookup(plan, "NVIDIA H200", backend="tilelang-ampere") is not None
    assert not same_target(dict(run.fields), DEFAULT_MACHINE)  # not an H200 Hopper calibration sample


def test_calibration_matches_records_by_backend_and_device() -> None:
    hopper = {"device": "NVIDIA H200", "extra": {"backend": "tilelang-hopper (sm_90a)"}}  # the GPU sweep's form
    assert same_target(hopper, DEFAULT_MACHINE) and same_target({"device": "NVIDIA H200"}, DEFAULT_MACHINE)
    assert not same_target({"device": "NVIDIA H200", "extra": {"backend": "tilelang-ampere (sm_80)"}},
                           DEFAULT_MACHINE)
    assert not same_target(hopper, machine_for(A100))
    assert not same_target({"device": "A100", "extra": {"backend": "tilelang-ampere"}}, DEFAULT_MACHINE)
    assert same_target({"device": "A100", "extra": {"backend": "tilelang-ampere (sm_80)"}}, machine_for(A100))
    # ``describe``'s form, which the runner's records start with and gpu_run's own records keep: the backend is
    # the hyphenated word, not the device name in front of it
    described = {"device": "NVIDIA H200", "extra": {"backend": "h200 (tilelang-hopper, sm_90a)"}}
    assert same_target(described, DEFAULT_MACHINE) and not same_target(described, machine_for(A100))
    assert same_target({"device": "A100", "extra": {"backend": "a100 (tilelang-ampere, sm_80)"}}, machine_for(A100))


def _a100_plan_and_h200_only_config():
    """An A100 Matmul plan and a config of its kernel outside its space that fits the H200's 227 KiB of shared
    memory per block but not the A100's 163 KiB: 128 x 256 output tiles, 64 deep, 4 stages of bf16 (192 KiB)."""
    graph = catalog.get("Matmul", {"m": 2048, "d": 2048, "n": 2048})
    plan = search(graph, "bf16", tuning=False, device=A100)[0]
    (k,) = plan.kernels
    cfg = {k.name: {**k.defaults, "block_m": 128, "block_n": 256, "block_d": 64, "stages": 4}}
    assert 256 not in k.params["block_n"]  # widened: not in the space
    return graph, plan, cfg


def test_a_tuned_config_is_fitted_against_the_device_the_plan_is_made_for(tmp_path: Path) -> None:
    """``apply_tuned`` and the database lookup fit a tuned config against the plan's device: an A100 plan never
    takes a config that only the H200's shared memory holds (the planner's measured-time path included)."""
    from pyrunner.errors import UserError
    from pyrunner.target.tuning import Entry, apply_tuned, tuning_key

    graph, plan, cfg = _a100_plan_and_h200_only_config()
    entry = Entry(workload=plan.workload, config=cfg, time_us=1.0)
    (k,) = plan.kernels
    assert apply_tuned(plan, entry, H200).kernels[0].defaults == cfg[k.name]  # the H200 holds it
    with pytest.raises(UserError, match="does not fit the A100"):
        apply_tuned(plan, entry, A100)
    db = TuningDB(tmp_path / "db.json", {tuning_key(plan, "A100", backend=AMPERE_TERMS.backend): entry})
    assert db.lookup(plan, "A100", backend=AMPERE_TERMS.backend, fit=H200) is entry  # found; only the fit refuses
    assert db.lookup(plan, "A100", backend=AMPERE_TERMS.backend) is None
    assert search(graph, "bf16", tuning=db, device=A100)[0].cost.model.get("measured") is None


def test_a_time_taken_on_any_a100_is_the_a100_planners(tmp_path: Path) -> None:
    """The driver's names of A100 parts (``NVIDIA A100-SXM4-80GB``) file their times as the A100's: the A100
    plan reads them, and its calibration counts their records."""
    graph = catalog.get("Matmul", MATMUL)
    plan = search(graph, "bf16", tuning=False, device=A100)[0]
    db = TuningDB(tmp_path / "db.json")
    db.record(plan, default_config(plan), 1.0, "NVIDIA A100-SXM4-80GB", backend=AMPERE_TERMS.backend)
    measured = search(graph, "bf16", tuning=db, device=A100)[0]
    assert measured.cost.model.get("measured") == 1.0
    rec = {"device": "NVIDIA A100 80GB PCIe", "extra": {"backend": "tilelang-ampere (sm_80)"}}
    assert same_target(rec, machine_for(A100)) and not same_target(rec, DEFAULT_MACHINE)


def test_a_run_starts_from_its_own_backends_tuned_config(tmp_path: Path) -> None:
    """The runner reads the entry of its backend on this GPU, fitted against the backend's device: an Ampere
    build on an H200 starts from the Ampere entry timed there, never from the Hopper backend's."""
    from pyrunner.run.runner import _tuned_entry

    graph = catalog.get("Matmul", MATMUL)
    plan = search(graph, "bf16", tuning=False, device=A100)[0]
    (k,) = plan.kernels
    hopper, ampere = default_config(plan), {k.name: {**k.defaults, "stages": 1}}
    assert hopper != ampere
    path = tmp_path / "db.json"
    db = TuningDB(path)
    db.record(plan, hopper, 1.0, "NVIDIA H200")
    db.record(plan, ampere, 2.0, "NVIDIA H200", backend=AMPERE_TERMS.backend)
    db.save()
    assert _tuned_entry(plan, "NVIDIA H200", RunOptions(tuning_db=path, backend="a100")).config == ampere
    assert _tuned_entry(plan, "NVIDIA H200", RunOptions(tuning_db=path)).config == hopper
