"""The Ampere backend (sm_80) through the same door as Hopper: ``--device a100`` / ``backend_for("a100")``.

Fast tier: the A100's device entry, the target's architecture and nvcc flags, rendering without the
Hopper-only forms (TMA rings, mbarriers, wgmma, async-proxy fences, dependent launch), the fit check
over the A100's limits, the CLI, and the rendered source run on the CPU emulator. Slow tier: every
catalog and corpus graph plans for the A100, passes the CPU executor and the emulator, lowers to sm_80
CUDA without a Hopper instruction, and builds an sm_80 cubin with nvcc.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path

import pytest
from plan_cache import search
from test_corpus import case_graph, planned_cases

from pyrunner import cli
from pyrunner.backend.tilelang.ampere import AMPERE, Ampere
from pyrunner.backend.tilelang.backend import BACKENDS, backend_for
from pyrunner.backend.tilelang.compile import check_fits, compile_cubin, lower_to_cuda
from pyrunner.backend.tilelang.emulate import emulate, rendered_executor
from pyrunner.backend.tilelang.hopper import HOPPER, Hopper
from pyrunner.backend.tilelang.render import render
from pyrunner.backend.tilelang.structure import structure_problems
from pyrunner.errors import DeviceFitError
from pyrunner.ir import catalog
from pyrunner.ir.reference import random_inputs
from pyrunner.pipeline import best_plan
from pyrunner.plan.schema import axis_sizes, plan_document
from pyrunner.run.executor import execute
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import scale_down
from pyrunner.run.verify import verify_executor
from pyrunner.target.device import A100, DEVICES, H200, device_named
from pyrunner.target.fit import FitModel

HOPPER_ONLY = ("T.wgmma_gemm", "T.wait_wgmma", "T.tma_copy", "T.alloc_barrier", "T.barrier_wait",
               "T.barrier_arrive", "T.fence_proxy_async", "T.pdl_trigger", "T.pdl_sync", "T.set_max_nreg")
"""TileLang calls of the Hopper forms; none may appear in a rendering for sm_80."""
HOPPER_CUDA = ("wgmma", "tma_load", "tma_store", "griddepcontrol", "fence.proxy.async", "setmaxnreg")
"""Hopper instructions in lowered CUDA; none may appear in sm_80 source."""
ATTENTION = {"h": 2, "t_q": 256, "t_kv": 512, "d": 64}


def _hopper_calls(source: str) -> list[str]:
    return [c for c in HOPPER_ONLY if c + "(" in source]


def test_a100_is_a_device_and_a_backend() -> None:
    assert DEVICES["a100"] is A100 and DEVICES["h200"] is H200 and device_named(" A100") is A100
    assert (A100.arch, A100.sms, A100.tc_flops, A100.hbm_bw) == ("sm_80", 108, 312e12, 1.56e12)
    assert (A100.smem_per_sm, A100.smem_per_block) == (164 * 1024, 163 * 1024)
    assert (A100.regs_per_sm, A100.regs_per_thread, A100.l2_bytes) == (64 * 1024, 255, 40 * 1024 * 1024)
    assert not A100.tma_wgmma and H200.tma_wgmma
    b = backend_for("A100")
    assert b is BACKENDS["a100"] and b.name == "tilelang-ampere" and b.target is AMPERE and b.device is A100
    assert backend_for("h200").name == "tilelang-hopper"


def test_only_the_device_table_and_the_hopper_backend_name_the_h200() -> None:
    """Hopper specifics live in the Hopper backend and the H200's numbers in the device table; every other
    module asks the backend or the device it is given (``grep -rn H200 pyrunner``)."""
    root = Path(__file__).resolve().parents[1] / "pyrunner"
    allowed = {root / "target" / "device.py", root / "backend" / "tilelang" / "hopper.py"}
    named = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if p not in allowed and "H200" in p.read_text())
    assert named == []


def _device_names_in(path: Path) -> list[str]:
    """``path:line`` of each string naming a device by its key (``"h200"``) or its tuning file (``h200.json``),
    docstrings and the keys of dict literals (a per-device table) aside."""
    import ast

    tree = ast.parse(path.read_text())
    skip = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    skip |= {id(k) for n in ast.walk(tree) if isinstance(n, ast.Dict) for k in n.keys if k is not None}
    files = re.compile(r"\b(?:" + "|".join(DEVICES) + r")\.json\b")
    return [f"{path.name}:{n.lineno}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
            and (n.value.strip().lower() in DEVICES or files.search(n.value))]


def test_the_default_device_is_named_in_the_device_table_only() -> None:
    """One default device (``target.device.DEFAULT_DEVICE``): the CLI, the tuning database, the compile targets,
    the runner, the model-error report and the GPU scripts import it, and the model-error report derives its
    tuning file from its device, so changing the default is one line."""
    from pyrunner.planner import model_error
    from pyrunner.target import device, tuning

    root = Path(__file__).resolve().parents[1]
    files = [*(root / "pyrunner").rglob("*.py"), *(root / "benchmarks").glob("*.py")]
    named = sorted(n for p in files if p != root / "pyrunner" / "target" / "device.py" for n in _device_names_in(p))
    assert named == []
    assert cli.DEFAULT_DEVICE == tuning.DEFAULT_DEVICE == device.DEFAULT_DEVICE in DEVICES
    assert device.DEFAULT_TARGET is DEVICES[device.DEFAULT_DEVICE]
    assert model_error.tuning_file(A100) == tuning.tuning_path("a100", tuning.TUNING_DIR)
    assert model_error.tuning_file().name == f"{device.DEFAULT_DEVICE}.json"


def test_targets_check_their_instruction_set_and_build_flags() -> None:
    assert AMPERE.target == {"kind": "cuda", "arch": "sm_80"} and AMPERE.sm_count == 108
    assert HOPPER.target == {"kind": "cuda", "arch": "sm_90a"}
    assert AMPERE.gencode() == ["-gencode", "arch=compute_80,code=sm_80"]
    assert HOPPER.gencode() == ["-gencode", "arch=compute_90a,code=sm_90a"]
    assert (AMPERE.async_forms, AMPERE.dependent_launch, HOPPER.async_forms, HOPPER.dependent_launch) == \
        (False, False, True, True)
    with pytest.raises(ValueError, match="sm_90a"):
        Hopper(A100)
    with pytest.raises(ValueError, match="sm_80"):
        Ampere(H200)


def test_an_sm80_build_runs_on_a_newer_gpu_from_its_own_instruction_set() -> None:
    on_hopper = AMPERE.running_on("sm_90")
    assert on_hopper.arch == "sm_80" and on_hopper.code == ("sm_90",) and on_hopper.device is A100
    assert on_hopper.target == {"kind": "cuda", "arch": "sm_80", "code": ["sm_90"]}
    assert on_hopper.gencode() == ["-gencode", "arch=compute_80,code=sm_90"]
    assert AMPERE.running_on("sm_80") is AMPERE and AMPERE.running_on("sm_86").code == ("sm_86",)
    two = Ampere(A100, code=("sm_80", "sm_90"))
    assert two.gencode() == ["-gencode", "arch=compute_80,code=[sm_80,sm_90]"]
    assert HOPPER.running_on("sm_90") is HOPPER and HOPPER.running_on("sm_80") is HOPPER  # nothing older
    assert HOPPER.running_on("sm_100") is HOPPER  # sm_90a's wgmma and setmaxnreg exist on sm_90a only


def _attention_plans():
    graph = catalog.get("ScaledAttention", ATTENTION)
    return (search(graph, "bf16", top=1, device=H200)[0], search(graph, "bf16", top=1, device=A100)[0])


def test_ampere_rendering_leaves_the_hopper_forms_out() -> None:
    hopper_plan, ampere_plan = _attention_plans()
    hopper_src = render(hopper_plan, HOPPER)
    assert {"T.wgmma_gemm", "T.tma_copy", "T.alloc_barrier", "T.barrier_wait"} <= set(_hopper_calls(hopper_src))
    src = render(ampere_plan, AMPERE)
    assert _hopper_calls(src) == []
    assert "TARGET = {'kind': 'cuda', 'arch': 'sm_80'}" in src and "SM_COUNT = 108" in src
    assert "T.gemm(" in src and "T.Pipelined(" in src
    assert render(hopper_plan) == hopper_src  # Hopper stays the default target


def test_multi_kernel_plans_have_no_dependent_launch_on_ampere() -> None:
    graph = catalog.get("RMSNorm", {"m": 128, "d": 256, "n": 256})
    plan = search(graph, "bf16", naive=True, device=A100)[0]
    assert len(plan.kernels) > 1
    assert "T.pdl_trigger(" in render(plan, HOPPER) and "T.pdl_sync(" in render(plan, HOPPER)
    assert _hopper_calls(render(plan, AMPERE)) == []


def test_the_fit_check_uses_the_a100_limits() -> None:
    (plan,) = search(catalog.get("ScaledAttention"), "bf16", top=1, device=H200)
    (k,) = plan.kernels
    h200, a100 = FitModel(k, axis_sizes(plan), H200), FitModel(k, axis_sizes(plan), A100)
    configs = [dict(zip(k.params, vals)) for vals in itertools.product(*k.params.values())]
    assert any(h200.renders_async(c) for c in configs) and not any(a100.renders_async(c) for c in configs)
    # the H200 plan's largest config: fits the H200's 227 KiB, not the A100's 163 KiB
    big = max(configs, key=lambda c: h200.footprint(c).smem_bytes)
    assert h200.footprint(big).smem_bytes > A100.smem_per_block and h200.why_not(big) is None
    assert "A100 allows 163 KiB" in a100.why_not(big)
    check_fits(plan, {k.name: big})
    with pytest.raises(DeviceFitError, match="A100 allows 163 KiB"):
        check_fits(plan, {k.name: big}, device=A100)


def test_every_config_of_an_a100_plan_fits_the_a100() -> None:
    for name in ("ScaledAttention", "Matmul", "RMSNorm"):
        graph = catalog.get(name, ATTENTION if name == "ScaledAttention" else None)
        (plan,) = search(graph, "bf16", top=1, device=A100)
        for k in plan.kernels:
            model = FitModel(k, axis_sizes(plan), A100)
            for vals in itertools.product(*k.params.values()):
                assert model.why_not(dict(zip(k.params, vals))) is None, (name, k.name, vals)


def test_superopt_plans_for_the_a100(tmp_path: Path, capsys) -> None:
    out = tmp_path / "plan.json"
    assert cli.main(["superopt", "Matmul", "--shape", "m=256", "--shape", "n=256", "--shape", "d=256",
                     "--device", "a100", "--dtype", "bf16", "--no-lower-check", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["workload"] == "Matmul" and doc["kernels"]
    assert cli.main(["superopt", "Matmul", "--device", "b200"]) == 2
    known = "known: a100, h100, h200\n"
    assert capsys.readouterr().err.endswith(f"error: --device 'b200': no backend for that device; {known}")


def test_cli_and_best_plan_give_byte_identical_a100_plans(tmp_path: Path) -> None:
    sizes = {"m": 128, "d": 256, "n": 256}
    out = tmp_path / "plans.json"
    assert cli.main(["superopt", "Matmul", *(f"--shape={a}={n}" for a, n in sizes.items()), "--dtype", "bf16",
                     "--top", "2", "--device", "a100", "--no-tuning", "--no-lower-check", "--out", str(out)]) == 0
    graph = catalog.get("Matmul", sizes)
    plans = best_plan(graph, "bfloat16", top=2, backend=backend_for("a100"), lower_check=False)
    assert out.read_text() == json.dumps([plan_document(p) for p in plans], indent=2) + "\n"
    hopper = best_plan(graph, "bfloat16", top=2, backend=backend_for("h200"), lower_check=False)
    assert [p.cost for p in plans] != [p.cost for p in hopper]  # the A100's numbers price the plans


@pytest.mark.parametrize("name", ["ScaledAttention", "RMSNorm", "SwiGLU"])
def test_ampere_rendering_runs_on_the_emulator(name: str) -> None:
    graph = catalog.get(name, ATTENTION if name == "ScaledAttention" else None)
    (plan,) = search(graph, "bf16", top=1, device=A100)
    small = scale_down(plan)
    res = verify_executor(small, graph_of(small), rendered_executor(AMPERE))
    assert res.ok, f"{name}: rendered source {res.message} (seed {res.seed})"
    em = emulate(small, random_inputs(graph_of(small), 0), target=AMPERE)
    assert structure_problems(small, em) == []


# --- slow tier: the catalog and the corpus ----------------------------------------------------------

CASES = planned_cases()


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_every_graph_plans_runs_and_compiles_for_sm80(case, tmp_path: Path) -> None:
    (plan,) = search(case_graph(case), "bf16", top=1, device=A100)
    small = scale_down(plan)
    for run, what in ((execute, "CPU executor"), (rendered_executor(AMPERE), "rendered source")):
        res = verify_executor(small, graph_of(small), run)
        assert res.ok, f"{what}: {res.message} (seed {res.seed})"
    check_fits(plan, device=A100)
    assert _hopper_calls(render(plan, AMPERE)) == []
    sources = lower_to_cuda(plan, target=AMPERE, work_dir=tmp_path)
    assert set(sources) == {k.name for k in plan.kernels}
    found = {k: [h for h in HOPPER_CUDA if re.search(re.escape(h), src)] for k, src in sources.items()}
    assert {k: v for k, v in found.items() if v} == {}
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH: sm_80 CUDA source checked, cubin not built")
    cubins = compile_cubin(sources, tmp_path / "cubin", AMPERE)
    assert len(cubins) == len(plan.kernels) and all(p.suffix == ".cubin" and p.stat().st_size for p in cubins)


def _matmul_plan_file(tmp_path: Path) -> Path:
    (plan,) = search(catalog.get("Matmul", {"m": 128, "d": 256, "n": 256}), "bf16", top=1, device=A100)
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    return path


def test_run_with_an_unknown_device_is_one_error_line(tmp_path: Path, capsys) -> None:
    assert cli.main(["run", str(_matmul_plan_file(tmp_path)), "--small", "--device", "v100"]) == 2
    assert capsys.readouterr().err == "error: --device 'v100': no backend for that device; known: a100, h100, h200\n"


@pytest.mark.slow
def test_run_renders_lowers_and_builds_for_sm80(tmp_path: Path) -> None:
    log = tmp_path / "results.jsonl"
    assert cli.main(["run", str(_matmul_plan_file(tmp_path)), "--small", "--device", "a100", "--quiet",
                     "--out", str(tmp_path / "out"), "--log", str(log)]) == 0
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["status"] == "skipped" and "for sm_80" in record["message"], record["message"]
    cuda = "".join(p.read_text() for p in (tmp_path / "out").rglob("*.cu"))
    assert "__global__" in cuda and not [h for h in HOPPER_CUDA if h in cuda]
    assert "'arch': 'sm_80'" in "".join(p.read_text() for p in (tmp_path / "out").rglob("*.py"))
