"""The H100 (SXM, 80 GB HBM3) as one ``Device`` entry on the Hopper backend: ``--device h100``.

Its numbers are its own where the hardware differs from the H200's (memory), its times are filed under its own
tuning key, its plans say they are modelled (the Hopper terms are fitted to H200 runs only), and its plans for
the seeds and a few corpus graphs pass the CPU executor.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from plan_cache import search

from pyrunner import cli
from pyrunner.backend.tilelang.backend import BACKENDS, backend_for, device_name
from pyrunner.backend.tilelang.hopper import HOPPER, HOPPER_TERMS
from pyrunner.backend.tilelang.targets import target_for
from pyrunner.ir import catalog
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.planner.cost import UNFITTED, machine_for
from pyrunner.planner.explain import time_words
from pyrunner.run.executor import execute
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import scale_down
from pyrunner.run.verify import verify_executor
from pyrunner.target.device import H100, H200, device_named
from pyrunner.target.tuning import TuningDB, committed_tuning, tuning_key

ROOT = Path(__file__).resolve().parents[1]
SMALL = 256
CORPUS = ("tests/data/gated_reglu.json", "tests/data/elementwise_where_softplus.json",
          "tests/data/attention_alibi.json")


def test_the_h100_is_its_own_device_on_the_hopper_backend() -> None:
    assert device_named("h100") is device_named("NVIDIA H100 80GB HBM3") is H100
    assert (H100.arch, H100.sms, H100.smem_per_sm, H100.smem_per_block) == ("sm_90a", 132, 228 * 1024, 227 * 1024)
    assert H100.l2_bytes == 50 * 1024 * 1024 and H100.tma_wgmma
    # other memory than the H200's: its measured copy rate is not borrowed
    assert H100.hbm_bw < 3.35e12 and H100.hbm_bw != H200.hbm_bw
    b = backend_for("NVIDIA H100 80GB HBM3")
    assert b is BACKENDS["h100"] and b.device is H100 and b.name == "tilelang-hopper"
    assert type(b.target) is type(HOPPER) and b.target.arch == "sm_90a" and b.target.sm_count == 132
    assert target_for(H100).device is H100 and device_name("NVIDIA H100 80GB HBM3") == "h100"


def test_the_hopper_terms_are_fitted_on_the_h200_only() -> None:
    assert machine_for(H200).fitted and not machine_for(H100).fitted
    assert machine_for(H100).terms is HOPPER_TERMS


def test_h100_times_are_filed_under_their_own_key(tmp_path: Path) -> None:
    (plan,) = search(catalog.get("Matmul", {"m": 128, "d": 256, "n": 256}), "bf16", top=1, device=H100)
    assert "|h100|" in tuning_key(plan, "NVIDIA H100 80GB HBM3") and "|h200|" in tuning_key(plan, "h200")
    db = TuningDB.for_device("NVIDIA H100 80GB HBM3", tmp_path)
    assert db.path.name == "h100.json"
    cfg = {k.name: dict(k.defaults) for k in plan.kernels}
    assert db.record(plan, cfg, 9.0, "NVIDIA H100 80GB HBM3")
    assert db.lookup(plan, "h100") is not None and db.lookup(plan, "h200") is None
    assert committed_tuning("h100").path.name == "h100.json"


def _small(name: str) -> object:
    sizes = {a: min(n, SMALL) for a, n in catalog.get(name).sizes.items()}
    return catalog.get(name, sizes)


@pytest.mark.parametrize("graph", [*catalog.SEED_WORKLOADS, *CORPUS])
def test_h100_plans_pass_the_cpu_executor(graph: str) -> None:
    g = load_graph_file(ROOT / graph) if graph.endswith(".json") else _small(graph)
    (plan,) = search(g, "bf16", top=1, device=H100)
    assert plan.cost.model["hbm_bw"] == H100.hbm_bw and plan.cost.model[UNFITTED] == 1.0
    assert "modelled from the device description" in time_words(plan)
    small = scale_down(plan)
    res = verify_executor(small, graph_of(small), execute)
    assert res.ok, f"{graph}: {res.message} (seed {res.seed})"


def test_superopt_device_h100(tmp_path: Path, capsys) -> None:
    out = tmp_path / "plan.json"
    assert cli.main(["superopt", "RMSNorm", "--shape=m=256", "--shape=d=256", "--shape=n=256", "--device", "h100",
                     "--dtype", "bf16", "--no-lower-check", "--explain", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["cost"]["model"]["hbm_bw"] == H100.hbm_bw
    assert "modelled from the device description" in capsys.readouterr().err
    assert cli.main(["superopt", "RMSNorm", "--device", "NVIDIA H100 PCIe"]) == 2  # 114 SMs: not this entry
