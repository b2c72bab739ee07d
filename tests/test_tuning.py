"""Tuning database (round trip, keys, lookup by planner and runner), ranked autotune configs, calibration."""

from __future__ import annotations

import json

import pytest
from plan_cache import search

from pyrunner.errors import UserError
from pyrunner.ir import catalog
from pyrunner.plan.schedule import FORM_VERSIONS, plan_forms
from pyrunner.planner.search import model_bias, prefer_measured, ranked_plan_configs
from pyrunner.run.runner import RunOptions, _tuned_entry, autotune_candidates, default_config
from pyrunner.target.tuning import TuningDB, device_key, structure_hash, tuning_key


def _plan(name="Matmul", sizes=None, dtype="bf16"):
    return search(catalog.get(name, sizes or {}), dtype, top=1, tuning=False)[0]


def _other_config(plan):
    (k,) = plan.kernels
    cfg = {k.name: dict(k.defaults)}
    cfg[k.name]["stages"] = next(s for s in k.params["stages"] if s != k.defaults["stages"])
    return cfg


def test_device_key_normalises_names():
    """A known device's every GPU name is its key (the planner of that device reads the times taken on it);
    an unknown GPU's times are kept under its own name."""
    assert device_key("NVIDIA H200") == device_key("NVIDIA H200 NVL") == device_key("H200") == "h200"
    for name in ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe"):
        assert device_key(name) == "a100", name
    assert device_key("NVIDIA H100 80GB HBM3") == device_key("H100") == "h100"
    assert device_key("NVIDIA GH200 480GB") == "gh200_480gb" and device_key("NVIDIA H100 PCIe") == "h100_pcie"
    assert TuningDB.for_device("NVIDIA H100 80GB HBM3").path.name == "h100.json"
    assert TuningDB.for_device("NVIDIA A100 80GB PCIe").path.name == "a100.json"


def test_structure_hash_ignores_tile_values_but_not_structure():
    a = _plan("Matmul")
    b = a.model_copy(update={"kernels": [a.kernels[0].model_copy(update={"defaults": {
        **a.kernels[0].defaults, "stages": 1}})]})
    assert structure_hash(a) == structure_hash(b)
    assert structure_hash(a) != structure_hash(_plan("SwiGLU"))
    # shapes and dtype are part of the key, not of the structure
    big = _plan("Matmul", {"m": 2048})
    assert structure_hash(big) == structure_hash(a)
    assert tuning_key(big, "h200") != tuning_key(a, "h200")
    assert tuning_key(_plan("Matmul", dtype="fp16"), "h200") != tuning_key(a, "h200")


def test_round_trip_and_lookup(tmp_path):
    plan = _plan()
    cfg = _other_config(plan)
    db = TuningDB(tmp_path / "h200.json")
    assert db.lookup(plan, "NVIDIA H200") is None
    assert db.record(plan, cfg, 51.25, "NVIDIA H200", tried=4, default_us=55.0)
    path = db.save()
    again = TuningDB.load(path)
    entry = again.lookup(plan, "h200")
    assert entry is not None and entry.config == cfg and entry.time_us == 51.25 and entry.tried == 4
    assert again.lookup(plan, "h100") is None  # another device
    assert again.lookup(plan, "h200", tl_version="0.0.1") is None  # another TileLang
    assert path.read_text() == again.to_json()  # deterministic


def test_record_keeps_the_faster_config(tmp_path):
    plan = _plan()
    db = TuningDB(tmp_path / "x.json")
    fast, slow = _other_config(plan), default_config(plan)
    db.record(plan, fast, 50.0, "h200")
    assert not db.record(plan, slow, 60.0, "h200")
    assert db.lookup(plan, "h200").config == fast
    assert db.record(plan, slow, 40.0, "h200")
    assert db.lookup(plan, "h200").config == slow


def test_an_entry_measured_under_another_loop_form_is_stale(tmp_path):
    plan = _plan()  # Matmul: one kernel, the asynchronous mainloop
    (k,) = plan.kernels
    db = TuningDB(tmp_path / "x.json")
    db.record(plan, default_config(plan), 50.0, "h200")
    entry = db.lookup(plan, "h200")
    assert entry is not None and entry.extra["forms"] == f"{k.name}:mainloop.{FORM_VERSIONS['mainloop']}"
    entry.extra["forms"] = f"{k.name}:pipelined.1"  # timed before the kernel rendered as the mainloop
    assert db.lookup(plan, "h200") is None
    assert prefer_measured(plan, db).cost.model.get("measured") is None  # the planner falls back to the model
    assert db.record(plan, _other_config(plan), 55.0, "h200")  # slower, but the old time was other code
    assert db.lookup(plan, "h200").time_us == 55.0
    del db.lookup(plan, "h200").extra["forms"]  # files from before forms were recorded: taken as they are
    assert db.lookup(plan, "h200") is not None


def test_plan_forms_name_every_kernels_loop_form():
    assert plan_forms(_plan("Attention").kernels).endswith(":chain.1")
    rms = search(catalog.get("RMSNorm"), "bf16", top=5, tuning=False)
    forms = {plan_forms(p.kernels) for p in rms}
    assert any("pipelined" in f and "mainloop" in f for f in forms)  # statistics kernel + mainloop GEMM
    # the GEMM scales its rows by the statistics only after its loop, and waits for them there
    assert any(f.endswith(":mainloop.1+late") for f in forms)
    assert not any("+late" in f.split(",")[0] for f in forms)  # the first kernel waits for nothing


def test_record_rejects_configs_outside_the_space(tmp_path):
    plan = _plan()
    (k,) = plan.kernels
    with pytest.raises(UserError):
        TuningDB(tmp_path / "x.json").record(plan, {k.name: {"stages": 99}}, 1.0, "h200")


def test_corrupt_database_is_a_user_error(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(UserError, match="not valid"):
        TuningDB.load(p)


def test_planner_prefers_the_measured_time_and_config(tmp_path):
    plan = _plan()
    cfg = _other_config(plan)
    db = TuningDB(tmp_path / "h200.json")
    db.record(plan, cfg, 12.5, "h200")
    tuned = prefer_measured(plan, db)
    assert tuned.cost.total_us == 12.5 and tuned.cost.model["measured"] == 1.0
    assert {k.name: k.defaults for k in tuned.kernels} == cfg
    assert tuned.provenance.plan_hash != plan.provenance.plan_hash
    (top,) = search(catalog.get("Matmul"), "bf16", tuning=db)
    assert top.cost.total_us == 12.5
    assert prefer_measured(plan, TuningDB(tmp_path / "empty.json")) is plan


def test_runner_starts_from_the_tuned_config(tmp_path):
    plan = _plan()
    cfg = _other_config(plan)
    path = tmp_path / "h200.json"
    db = TuningDB(path)
    db.record(plan, cfg, 10.0, "h200")
    db.save()
    entry = _tuned_entry(plan, "cpu", RunOptions(tuning_db=path))
    assert entry is not None and entry.config == cfg
    # the output file, once it exists, is what later runs read
    out = tmp_path / "out.json"
    assert _tuned_entry(plan, "NVIDIA H200", RunOptions(tuning_db=path, tuning_out=out)).config == cfg
    TuningDB(out).save()
    assert _tuned_entry(plan, "NVIDIA H200", RunOptions(tuning_db=path, tuning_out=out)) is None


def test_committed_database_is_valid():
    from pyrunner.target.tuning import TUNING_DIR

    db = TuningDB.load(TUNING_DIR / "h200.json")
    assert json.loads((TUNING_DIR / "h200.json").read_text())["format"] == 1
    for key, e in db.entries.items():
        assert key.split("|")[3] == "h200" and e.time_us > 0


@pytest.mark.parametrize(("name", "device"), [("Matmul", None), ("SwiGLU", None), ("RMSNormMLP", None),
                                            ("Attention", None), ("LayerNormMatmul", "a100")])
def test_ranked_configs_fit_and_start_with_the_planners_choice(name, device):
    """For the device the plan is made for: an A100 plan's configs are ranked and fitted by the A100's model
    (LayerNormMatmul's A100 plan is one whose first config by the H200's model is another)."""
    from pyrunner.backend.tilelang.compile import check_fits
    from pyrunner.errors import DeviceFitError
    from pyrunner.target.device import DEVICES

    g = catalog.get(name)
    target = DEVICES[device] if device else None
    plan = search(g, "bf16", tuning=False, device=target)[0]
    cfgs = ranked_plan_configs(g, plan, 6, device=target)
    assert cfgs and cfgs[0] == default_config(plan)
    assert len({json.dumps(c, sort_keys=True) for c in cfgs}) == len(cfgs)
    fitting = 0
    for c in cfgs:
        try:
            check_fits(plan, c, target)
            fitting += 1
        except DeviceFitError:
            pass
    assert fitting >= min(3, len(cfgs))


def test_autotune_candidates_order_and_count():
    plan = _plan()
    ranked = ranked_plan_configs(catalog.get("Matmul"), plan, 4)
    cfg = default_config(plan)
    cands = autotune_candidates(plan, cfg, RunOptions(autotune=4, candidates=ranked))
    assert cands[0] == cfg and len(cands) == 4
    assert cands[1:] == [c for c in ranked if c != cfg][:3]


def test_calibration_report_on_the_recorded_runs():
    from pyrunner.planner.calibration import prediction_report
    from pyrunner.planner.search import Planner

    rep = prediction_report(["benchmarks/results/h200-run1.jsonl", "benchmarks/results/h200-run2.jsonl"], Planner)
    assert rep["samples"] >= 10
    assert rep["after_mape_pct"] < rep["before_mape_pct"]  # leave-one-out, so this can fail
    assert all(v > 0 for v in rep["scales"].values())


def test_calibration_uses_only_current_renderer_records(tmp_path):
    from pyrunner.planner.calibration import calibrate
    from pyrunner.target.layout import GENERATION

    base = search(catalog.get("Matmul"), "fp16", tuning=False)[0]
    rec = {"status": "ok", "workload": "Matmul", "shapes": dict(catalog.get("Matmul").sizes), "dtype": "float16",
           "device": "NVIDIA H200", "config": default_config(base), "plan_us": base.cost.total_us * 2}
    log = tmp_path / "r.jsonl"
    log.write_text(json.dumps(rec) + "\n")
    from pyrunner.planner.search import Planner

    assert calibrate(log, Planner).structure_scale == ()  # an old-generation record does not calibrate
    log.write_text(json.dumps({**rec, "extra": {"renderer": GENERATION}}) + "\n")
    m = calibrate(log, Planner)
    assert m.structure_scale and 1.5 < dict(m.structure_scale)["gemm1-loop-r0"] < 2.5
    slower = search(catalog.get("Matmul"), "fp16", calibration=log, tuning=False)[0]
    assert slower.cost.total_us > base.cost.total_us * 1.3


def test_gpu_run_second_shape_set_plans_distinct_files():
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_run", "benchmarks/gpu_run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    args = argparse.Namespace(workloads="Matmul", graph=None, shapes2=True, shapes2_only=False)
    tags = [t for t, _ in mod._graphs(args)]
    assert tags[0] == "Matmul" and len(set(tags)) == len(tags) == 5
    sizes = {t: g.sizes for t, g in mod._graphs(args)}
    assert sizes["Attention_t_kv8192_t_q8192"]["t_q"] == 8192
    assert sizes["Matmul_d4096_m4096_n4096"]["m"] == 4096
    assert sizes["RMSNormMLP_m8192"]["m"] == 8192
    only = mod._graphs(argparse.Namespace(workloads="Matmul", graph=None, shapes2=False, shapes2_only=True))
    assert len(only) == 4


def test_gpu_run_alternatives_plan_the_next_distinct_plans(tmp_path):
    import argparse
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("gpu_run", "benchmarks/gpu_run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    args = argparse.Namespace(workloads="RMSNorm", graph=None, shapes2=False, shapes2_only=False,
                              dtypes="bfloat16", alternatives=2, autotune=2, calibration=None)
    said: list[str] = []
    jobs = mod._plan_all(args, tmp_path, tmp_path / "results.jsonl", lambda *p: said.append(" ".join(map(str, p))))
    assert [n for n, *_ in jobs] == ["RMSNorm", f"RMSNorm{mod.ALT}2", f"RMSNorm{mod.ALT}3"]
    hashes = {json.loads(p.read_text())["provenance"]["plan_hash"] for _, _, p, _ in jobs}
    assert len(hashes) == 3  # three distinct plans, each with its own ranked configs
    assert all(p.with_suffix(".configs.json").exists() for _, _, p, _ in jobs)
    assert {d for *_, d in jobs} == {"h200"}  # no GPU here: the default backend


def test_gpu_run_times_the_listed_graphs_first_when_not_all_fit():
    """With time for 3 of 6 runs (MIN_RUN_S / 2 each), the plans asked for run in their order and the
    alternatives are skipped first; run 81 skipped its first four graphs and timed every later one."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_run", "benchmarks/gpu_run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    alt = mod.ALT
    jobs = ["A", f"A{alt}2", "B", f"B{alt}2", "C", "D"]
    step = mod.MIN_RUN_S / 2
    left = 3 * step + 1
    ran = []
    for i, name in enumerate(jobs):
        if mod.runs_now(jobs[i:], left):
            ran.append(name)
            left -= step
    assert ran == ["A", "B", "C"]
    assert all(mod.runs_now(jobs[i:], 100 * step) for i in range(len(jobs)))  # time for all: all run
    assert not mod.runs_now(["A"], step / 2)


def test_gpu_run_worker_exits_past_a_teardown_that_would_hang():
    """A worker leaves once its record is out, not after interpreter teardown: a thread that outlives
    the run (as torch.compile's pools did) must not keep it past gpu_run's hard limit."""
    import subprocess
    import sys
    import time

    code = ("import importlib.util, threading, time\n"
            "spec = importlib.util.spec_from_file_location('gpu_run', 'benchmarks/gpu_run.py')\n"
            "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
            "threading.Thread(target=time.sleep, args=(60,)).start()\n"
            "print('record written', end='')\n"
            "mod._leave(3)\n")
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert time.monotonic() - t0 < 40
    assert done.returncode == 3 and done.stdout == "record written", done.stderr


def _narrowed(plan, param, value):
    """The plan as if the planner's space had dropped ``value`` of ``param`` (its fit pruning does)."""
    (k,) = plan.kernels
    params = {**k.params, param: [v for v in k.params[param] if v != value]}
    return plan.model_copy(update={"kernels": [k.model_copy(update={"params": params})]})


def test_a_tuned_value_outside_the_planned_space_is_still_reached(tmp_path):
    import itertools

    from pyrunner.plan.schema import axis_sizes
    from pyrunner.target.fit import FitModel

    plan = _plan()
    (k,) = plan.kernels
    tuned = _other_config(plan)
    value = tuned[k.name]["stages"]
    db = TuningDB(tmp_path / "x.json")
    db.record(plan, tuned, 40.0, "h200")
    narrow = _narrowed(plan, "stages", value)
    entry = db.lookup(narrow, "h200")
    assert entry is not None and entry.config == tuned
    chosen = prefer_measured(narrow, db)
    (ck,) = chosen.kernels
    assert ck.defaults == tuned[k.name] and value in ck.params["stages"]
    assert chosen.cost.total_us == 40.0 and chosen.cost.model["measured"] == 1.0
    model = FitModel(ck, axis_sizes(chosen))
    names = sorted(ck.params)
    for values in itertools.product(*(ck.params[n] for n in names)):  # the re-pruned space still all fits
        assert model.why_not(dict(zip(names, values, strict=True))) is None


@pytest.mark.parametrize("bad", [{"block_d": 4096}, {"stages": "3"}, {"stages": True}, {"nonsense": 2}])
def test_a_tuned_config_that_does_not_fit_or_is_malformed_is_ignored(tmp_path, bad):
    plan = _plan()
    (k,) = plan.kernels
    db = TuningDB(tmp_path / "x.json")
    db.record(plan, default_config(plan), 40.0, "h200")
    db.lookup(plan, "h200").config[k.name].update(bad)  # as a hand-edited or foreign file could say
    assert db.lookup(plan, "h200") is None
    assert prefer_measured(plan, db).cost.model.get("measured") is None


def test_model_bias_is_the_smallest_undershoot_and_never_below_one():
    assert model_bias([(92.2, 55.5), (60.0, 20.0)]) == pytest.approx(92.2 / 55.5)
    assert model_bias([(40.0, 50.0)]) == 1.0  # a model that overshot leaves alternatives as priced
    assert model_bias([]) == 1.0


def test_a_measured_plan_keeps_its_rank_over_alternatives_the_model_prices_as_optimistically(tmp_path):
    """Measured at three times its model, the best plan would lose to the runner-up's bare estimate;
    ranked at its estimate times the same undershoot, the runner-up stays behind."""
    first, second = search(catalog.get("RMSNorm"), "bf16", top=2, tuning=False)
    assert first.cost.total_us <= second.cost.total_us < 3 * first.cost.total_us
    db = TuningDB(tmp_path / "h200.json")
    db.record(first, default_config(first), 3 * first.cost.total_us, "h200")
    (top,) = search(catalog.get("RMSNorm"), "bf16", tuning=db)
    assert top.cost.model.get("measured") == 1.0 and structure_hash(top) == structure_hash(first)


def test_gpu_run_names_a_missing_graph_file_and_exits_2(tmp_path, capsys):
    """Run 103's command named a graph file that does not exist: one error line, not a traceback."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_run", "benchmarks/gpu_run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rc = mod.main(["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--workloads", "",
                   "--graph", str(tmp_path / "missing.json"), "--budget-s", "30"])
    assert rc == 2
    log = (tmp_path / "out" / "gpu_run.log").read_text()
    assert "error: graph file" in log and "missing.json" in log and "does not exist" in log
    assert not (tmp_path / "out" / "results.jsonl").exists()


def test_lookup_checks_an_entry_against_the_plans_space_once(tmp_path, monkeypatch):
    """An entry outside the planned space is checked against the plan once, then against the widened plan."""
    from pyrunner.target import tuning

    plan = _plan()
    (k,) = plan.kernels
    tuned = _other_config(plan)
    db = TuningDB(tmp_path / "x.json")
    db.record(plan, tuned, 40.0, "h200")
    narrow = _narrowed(plan, "stages", tuned[k.name]["stages"])
    seen: list[object] = []
    real = tuning._valid
    monkeypatch.setattr(tuning, "_valid", lambda p, cfg: seen.append(p) or real(p, cfg))
    assert db.lookup(narrow, "h200").config == tuned
    assert [p is narrow for p in seen] == [True, False]  # the plan once, the widened plan once
    seen.clear()
    assert db.lookup(plan, "h200").config == tuned and seen == [plan]  # inside the space: one check
