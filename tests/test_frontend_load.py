"""pyrunner.load on a machine without a GPU: the call checks its arguments like a Python function
(names, dtypes, shapes, devices), then says in one line that it needs a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import pyrunner
from pyrunner.errors import PlanError
from pyrunner.frontend.cache import entry_dir
from pyrunner.frontend.errors import FrontendError
from pyrunner.ir import catalog
from pyrunner.planner import search

GPU = torch.cuda.is_available()


@pytest.fixture(scope="module")
def plan():
    return search(catalog.get("RMSNormMLP", {"m": 64, "d": 128, "n": 128}), "fp16")[0]


def _args():
    return (torch.randn(64, 128).half(), torch.randn(128, 128).half(), torch.randn(128, 128).half())


def test_load_from_object_file_and_dict(plan, tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(plan.model_dump_json())
    for src in (plan, path, str(path), json.loads(path.read_text())):
        f = pyrunner.load(src)
        assert f.sig.input_names == ("X", "W_up", "W_gate")
        assert f.sig.output_names == ("Y",)
        assert f.hash == plan.provenance.plan_hash
    assert "X[m=64, d=128] float16" in repr(f)


def test_load_rejects_bad_plans(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="does not exist"):
        pyrunner.load(tmp_path / "none.json")
    with pytest.raises(PlanError):
        pyrunner.load({"schema_version": 1, "workload": "x"})


def test_call_checks_arguments(plan) -> None:
    f = pyrunner.load(plan)
    x, wu, wg = _args()
    cases = [
        ((x, wu), {}, r"missing input\(s\) W_gate"),
        ((x, wu, wg, wg), {}, r"takes 3 input\(s\)"),
        ((x, wu), {"W_gate": wg, "Z": wg}, "unexpected input 'Z'"),
        ((x, wu, wg), {"X": x}, "input 'X' given twice"),
        ((x.float(), wu, wg), {}, "input 'X' has dtype torch.float32, the plan needs torch.float16"),
        ((x[:32], wu, wg), {}, r"input 'X' has shape \(32, 128\), the plan needs \(64, 128\)"),
        ((x, wu.T.contiguous()[:, :64], wg), {}, "input 'W_up' has shape"),
        ((x.numpy(), wu, wg), {}, "must be a torch.Tensor, got ndarray"),
    ]
    for args, kwargs, msg in cases:
        with pytest.raises(FrontendError, match=msg) as e:
            f(*args, **kwargs)
        assert "\n" not in str(e.value)


@pytest.mark.skipif(GPU, reason="checks the message a machine without a GPU gives")
def test_call_without_gpu_is_one_clear_line(plan) -> None:
    f = pyrunner.load(plan, verify=True)
    x, wu, wg = _args()
    for call in (lambda: f(x, wu, wg), lambda: f(X=x, W_gate=wg, W_up=wu), f.compile):
        with pytest.raises(FrontendError, match="no CUDA GPU is available") as e:
            call()
        assert "\n" not in str(e.value)


def test_cache_key_separates_plan_config_device_and_version(plan, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path))
    cfg = {k.name: dict(k.defaults) for k in plan.kernels}
    base = entry_dir(plan, cfg, "H200-sm90", "0.1.15")
    assert base.is_relative_to(tmp_path) and plan.provenance.plan_hash in base.name
    other_plan = search(catalog.get("RMSNormMLP", {"m": 128, "d": 128, "n": 128}), "fp16")[0]
    other_cfg = {k: {**v, "threads": 2 * v["threads"]} for k, v in cfg.items()}
    variants = {entry_dir(other_plan, cfg, "H200-sm90", "0.1.15"), entry_dir(plan, other_cfg, "H200-sm90", "0.1.15"),
                entry_dir(plan, cfg, "A100-sm80", "0.1.15"), entry_dir(plan, cfg, "H200-sm90", "0.1.16")}
    assert base not in variants and len(variants) == 4
    assert entry_dir(plan, dict(cfg), "H200-sm90", "0.1.15") == base
    assert entry_dir(plan, cfg, "../../etc", "0.1.15").is_relative_to(tmp_path)


def test_config_override_is_checked(plan) -> None:
    from pyrunner.errors import UserError

    with pytest.raises(UserError):
        pyrunner.load(plan, config={"no_such_param": 3})
    # a value every kernel's tuning space allows (the space holds only configs that fit the device)
    want = max(set.intersection(*(set(k.params["threads"]) for k in plan.kernels)))
    f = pyrunner.load(plan, config={"threads": want})
    assert all(v["threads"] == want for v in f.config.values())
    with pytest.raises(UserError):
        pyrunner.load(plan, config={"threads": 96})
