"""Renderer and compiler stage: deterministic source, imports, lowering, cubins, fit checks, GPU numerics."""

from __future__ import annotations

import ast
import shutil

import numpy as np
import pytest
from plan_fixtures import FIXTURES, REFERENCES, attention_plan, elementwise4d_plan, gemm_plan, rmsnorm_gemm_plan

from pyrunner.backend.tilelang.compile import (
    check_fits,
    compile_cubin,
    estimate_kernel,
    load_module,
    lower_to_cuda,
    render_kernel_func,
    rendered_module,
)
from pyrunner.backend.tilelang.render import render
from pyrunner.errors import DeviceFitError, PlanError
from pyrunner.plan.analysis import kernel_axes, resolve_config
from pyrunner.plan.schema import Plan, axis_sizes
from pyrunner.target.device import H200
from pyrunner.target.fit import FitModel
from pyrunner.target.layout import launch_axes, layout_bridges


def _edit_kernel(plan: Plan, **changes) -> Plan:
    k = plan.kernels[0].model_copy(update=changes)
    return plan.model_copy(update={"kernels": [k, *plan.kernels[1:]]})


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_render_is_deterministic_and_parses(name):
    plan = FIXTURES[name]()
    source = render(plan)
    again = render(Plan.model_validate_json(plan.model_dump_json()))
    assert source == again
    tree = ast.parse(source)
    defs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {f"build_{k.name}" for k in plan.kernels} <= defs
    assert {"launch", "compile_kernels", "build_kernels"} <= defs
    assert plan.provenance.plan_hash in source


def test_render_depends_on_the_plan():
    assert render(gemm_plan(m=256)) != render(gemm_plan(m=512))


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_rendered_module_imports_and_builds(name, tmp_path):
    plan = FIXTURES[name]()
    module = rendered_module(plan, tmp_path)
    assert module.CONFIG_SPACE == {k.name: k.params for k in plan.kernels}
    assert module.DEFAULT_CONFIG == {k.name: k.defaults for k in plan.kernels}
    assert {n: (list(s), d) for n, (s, d, _) in module.TENSORS.items()} == {
        t.name: (t.shape, t.dtype) for t in plan.tensors}
    funcs = module.build_kernels()
    assert list(funcs) == [k.name for k in plan.kernels]
    for f in funcs.values():
        assert type(f).__name__ == "PrimFunc"


def test_render_kernel_func_builds_one_kernel(tmp_path):
    plan = FIXTURES["two_kernel"]()
    func = render_kernel_func(plan, "scaled_matmul", {"scaled_matmul": {"block_n": 64}}, tmp_path)
    assert type(func).__name__ == "PrimFunc"
    with pytest.raises(PlanError, match="no kernel 'nope'"):
        render_kernel_func(plan, "nope", None, tmp_path)


def test_load_module_reads_source_from_disk(tmp_path):
    module = load_module("VALUE = 41 + 1\n", tmp_path / "m.py")
    assert module.VALUE == 42 and (tmp_path / "m.py").read_text() == "VALUE = 41 + 1\n"


def test_accumulating_reduce_uses_clear_false_and_overwrite_clear_true():
    source = render(attention_plan())
    assert "T.reduce_max(S, m, dim=1, clear=False)" in source
    assert "T.reduce_sum(S, rs, dim=1, clear=True)" in source
    assert "T.gemm(Q_s, K_s, S, transpose_B=True" in source


def test_layout_bridge_only_where_layouts_disagree():
    assert layout_bridges(attention_plan().kernels[0]) == {}
    assert layout_bridges(rmsnorm_gemm_plan().kernels[0]) == {("epilogue", 1): ["rs"]}


def test_more_than_three_grid_axes_fold_into_blockidx_z():
    plan = elementwise4d_plan()
    k = plan.kernels[0]
    assert launch_axes(k, kernel_axes(k, axis_sizes(plan))) == [["e"], ["c"], ["a", "b"]]
    source = render(plan)
    assert "a_idx = a_b_fold // SIZE_B" in source and "b_idx = a_b_fold % SIZE_B" in source


def test_a_launch_past_cudas_y_z_limit_folds_into_blockidx_x(monkeypatch: pytest.MonkeyPatch) -> None:
    """32 heads x 2048 rows of single-row blocks (65536) cannot launch along gridDim.z (65535 at most): those
    axes fold into .x, outermost, and the rendered source computes what the unfolded launch does (emulated,
    with the limit lowered so the fold happens at a size the emulator runs)."""
    from pyrunner.backend.tilelang.emulate import execute_rendered
    from pyrunner.target import layout

    big = elementwise4d_plan(a=32, b=2048, c=16, e=32)
    k = big.kernels[0]
    assert launch_axes(k, kernel_axes(k, axis_sizes(big))) == [["a", "b", "e"], ["c"]]
    assert "share blockIdx.x" in render(big)
    # and the device fits it at its smallest blocks (refused before: 65536 blocks along gridDim.z)
    assert FitModel(k, axis_sizes(big), H200).why_not({"block_c": 16, "block_e": 32}) is None
    plan = elementwise4d_plan(a=4, b=16, c=32, e=64)
    k = plan.kernels[0]
    assert launch_axes(k, kernel_axes(k, axis_sizes(plan)), max_yz=63) == [["a", "b", "e"], ["c"]]
    assert launch_axes(k, kernel_axes(k, axis_sizes(plan)), max_yz=1) == [["a", "b", "c", "e"]]
    x = np.random.default_rng(0).standard_normal((4, 16, 32, 64)) * 0.7
    config = {"pointwise": {"block_c": 16, "block_e": 32}}
    unfolded = execute_rendered(plan, {"X": x}, config)["Y"]
    monkeypatch.setattr(layout, "CUDA_MAX_GRID_YZ", 40)  # c: 2 blocks at most (block 16), a x b: 64, past it
    assert "# grid axes ['a', 'b', 'e'] share blockIdx.x" in render(plan)
    folded = execute_rendered(plan, {"X": x}, config)["Y"]
    # the same blocks launched in another order: every element as the unfolded launch computes it, and a
    # block coordinate decoded wrongly would leave its tile unwritten or written twice
    np.testing.assert_array_equal(folded, unfolded)


# --- the renderer trusts validation -----------------------------------------------

def test_render_rejects_what_validation_does_not_see():
    plan = gemm_plan()
    k = plan.kernels[0]
    twice = plan.model_copy(update={"kernels": [k, k]})
    with pytest.raises(PlanError, match="repeats a kernel name"):
        render(twice)
    bad = _edit_kernel(plan, params={**k.params, "T": [1]}, defaults={**k.defaults, "T": 1})
    with pytest.raises(PlanError, match="parameter name 'T' cannot be a Python keyword argument|"
                                        "params: name 'T' is reserved for generated code"):
        render(bad)


# --- device fit ------------------------------------------------------------------

def _big_gemm() -> Plan:
    plan = gemm_plan(m=1024, d=1024, n=1024)
    params = {"block_m": [128, 256], "block_n": [128, 256], "block_d": [32, 256], "stages": [2, 4],
              "threads": [128, 256]}
    return _edit_kernel(plan, params=params, defaults={p: v[0] for p, v in params.items()})


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_defaults_fit_an_h200(name):
    assert len(check_fits(FIXTURES[name](), None, H200)) == len(FIXTURES[name]().kernels)


def test_fit_check_rejects_too_much_shared_memory():
    cfg = {"matmul": {"block_m": 256, "block_n": 256, "block_d": 256, "stages": 4}}
    fit = estimate_kernel(_big_gemm(), "matmul", resolve_config(_big_gemm(), cfg)["matmul"])
    assert fit.smem_bytes == (256 * 256 + 256 * 256) * 2 * 4
    with pytest.raises(DeviceFitError, match=r"kernel 'matmul'.*1024\.0 KiB of shared memory.*227 KiB"):
        check_fits(_big_gemm(), cfg)


def test_fit_check_rejects_too_many_registers():
    cfg = {"matmul": {"block_m": 256, "block_n": 256}}
    with pytest.raises(DeviceFitError, match=r"kernel 'matmul'.*registers per thread.*allows 255"):
        check_fits(_big_gemm(), cfg)
    check_fits(_big_gemm(), {"matmul": {"block_m": 128, "block_n": 256, "threads": 256}})


def test_fit_check_rejects_threads_that_cannot_split_the_gemm():
    plan = _edit_kernel(gemm_plan(), params={**gemm_plan().kernels[0].params, "threads": [128, 384]})
    with pytest.raises(DeviceFitError, match=r"128x128 tile GEMM into 'acc' cannot be split among 12 warps"):
        check_fits(plan, {"matmul": {"threads": 384}})


def test_fit_check_rejects_register_a_operand_split_over_columns():
    plan = attention_plan()
    with pytest.raises(DeviceFitError, match=r"A operand 'P16' from registers.*8 warps.*64 rows"):
        check_fits(plan, {"attention": {"block_t_q": 64, "threads": 256}})
    check_fits(plan, {"attention": {"block_t_q": 128, "threads": 256}})


# --- lowering and cubins (a few seconds per kernel on 2 cores) ------------------------

@pytest.mark.slow
def test_a_launch_folded_into_blockidx_x_lowers(tmp_path):
    plan = elementwise4d_plan(a=32, b=2048, c=16, e=32, dtype="bfloat16")
    (src,) = lower_to_cuda(plan, work_dir=tmp_path).values()
    assert "__global__" in src and "blockIdx.x" in src and "blockIdx.z" not in src


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_lowers_to_cuda_and_compiles_cubin(name, tmp_path):
    plan = FIXTURES[name]()
    sources = lower_to_cuda(plan, work_dir=tmp_path)
    assert list(sources) == [k.name for k in plan.kernels]
    for src in sources.values():
        assert "__global__" in src and "extern \"C\"" in src
    if shutil.which("nvcc") is None:
        result = compile_cubin(sources, tmp_path / "cubin")
        assert result.skipped and "nvcc not found" in result.message
        pytest.skip("nvcc is not on PATH: lowered to CUDA source, cubin compilation skipped")
    result = compile_cubin(sources, tmp_path / "cubin")
    assert not result.skipped and len(result) == len(plan.kernels)
    for path in result:
        assert path.suffix == ".cubin" and path.stat().st_size > 0


def test_compile_cubin_without_nvcc_says_what_it_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    result = compile_cubin({"k": "int main() {}"}, tmp_path / "out")
    assert result.skipped and list(result) == [] and "skipped cubin compilation of 1 kernel(s) (k)" in result.message


# --- numerics on a GPU (skipped elsewhere) ------------------------------------------

GPU_CASES = [(name, {}, None) for name in sorted(FIXTURES)] + [
    ("attention", {"dtype": "bfloat16"}, {"attention": {"block_t_q": 128, "block_t_kv": 128, "threads": 256,
                                                        "stages": 1}}),
    ("rmsnorm_gemm", {"m": 128, "n": 384}, {"rmsnorm_matmul": {"block_m": 64, "block_d": 64, "stages": 3,
                                                               "threads": 256}}),
    ("two_kernel", {"dtype": "bfloat16"}, {"row_scale": {"block_d": 256}, "scaled_matmul": {"block_n": 64}}),
    # 32 x 2048 single-row blocks (past gridDim.z's 65535) folded into blockIdx.x
    ("elementwise4d", {"a": 32, "b": 2048, "c": 16, "e": 32, "dtype": "bfloat16"},
     {"pointwise": {"block_c": 16, "block_e": 32}}),
]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize(("name", "shape", "config"), GPU_CASES)
def test_gpu_results_match_float64_reference(name, shape, config, tmp_path):
    import torch

    from pyrunner.backend.tilelang.compile import compile_for_gpu

    plan = FIXTURES[name](**shape)
    launch = compile_for_gpu(plan, config, work_dir=tmp_path)
    gen = torch.Generator(device="cpu").manual_seed(0)
    tensors, inputs = {}, {}
    for t in plan.tensors:
        dtype = getattr(torch, t.dtype)
        if t.role == "input":
            x = (torch.randn(t.shape, generator=gen) * 0.5).to(dtype)
            inputs[t.name] = x.double().numpy()
            tensors[t.name] = x.cuda()
        else:
            tensors[t.name] = torch.full(t.shape, float("nan"), dtype=dtype, device="cuda")
    launch(tensors)
    torch.cuda.synchronize()
    for out, want in REFERENCES[name](inputs).items():
        got = tensors[out].double().cpu().numpy()
        assert np.isfinite(got).all(), f"{out}: non-finite values"
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2, err_msg=f"{name}: {out}")
