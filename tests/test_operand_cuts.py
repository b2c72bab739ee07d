"""Computed GEMM operands as cut candidates, stored in the compute dtype (issue 11).

relu(X W1)^2 @ W2 and LayerNorm-fed GEMMs measured 66.5 and 122 us on the H200 because the second
GEMM's loop computed its operand from the loaded tile with thread code (no warp specialisation).
Materialising the operand in bf16 (the GEMM rounds it to bf16 anyway) leaves that loop only loads;
H200 run 12 measured 29.9 and 56.4 us.
"""

from __future__ import annotations

from pathlib import Path

from plan_cache import search

from pyrunner.ir import catalog
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.plan.analysis import thread_reads_staged
from pyrunner.planner.cost import estimate
from pyrunner.planner.search import Planner, derive
from pyrunner.run.executor import execute
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import cpu_check_plan
from pyrunner.run.verify import verify_executor

DATA = Path(__file__).resolve().parent / "data"


def _intermediates(plan) -> dict[str, str]:
    return {t.name: t.dtype for t in plan.tensors if t.role == "intermediate"}


def test_squared_relu_mlp_materialises_the_activation_for_a_plain_gemm() -> None:
    (plan,) = search(load_graph_file(DATA / "mlp_relu_squared.json"), "bf16", tuning=False)
    assert _intermediates(plan) == {"A2": "bfloat16"}
    consumer = next(k for k in plan.kernels if "A2" in k.reads)
    assert not thread_reads_staged(consumer.body)  # a loop of loads and one GEMM: warp specialised
    producer = next(k for k in plan.kernels if "A2" in k.writes)
    assert any(op.op == "gemm" for op in producer.body)  # relu^2 in the first GEMM's epilogue
    small = cpu_check_plan(plan)
    res = verify_executor(small, graph_of(small), execute)
    assert res.ok, res.message


def test_layernorm_gemm_runs_a_plain_gemm_on_a_bf16_operand() -> None:
    (plan,) = search(catalog.get("LayerNormMatmul"), "bf16", tuning=False)
    dtypes = _intermediates(plan)
    operand = next(n for n, d in dtypes.items() if d == "bfloat16")  # the normalised operand
    assert all(d == "float32" for n, d in dtypes.items() if n != operand)  # a mean or rstd cut stays float32
    gemm = next(k for k in plan.kernels if operand in k.reads)
    assert not thread_reads_staged(gemm.body)


def test_an_intermediate_with_a_non_gemm_user_stays_float32() -> None:
    (plan,) = search(catalog.get("RMSNorm"), "bf16", tuning=False)
    assert set(_intermediates(plan).values()) == {"float32"}  # the row statistics scale the GEMM result


def test_without_operand_cuts_the_first_pass_plan_computes_the_operand_in_the_loop() -> None:
    """The second pass is what finds the materialised operand: the first pass alone keeps H."""
    g = load_graph_file(DATA / "mlp_relu_squared.json")
    p = Planner(g, "bfloat16")
    v = derive(g)[0]
    first = min(p._explore(v, __import__("pyrunner.planner.search", fromlist=["Budget"]).Budget()),
                key=lambda c: c.rank())
    assert {t.name for t in first.tensors if t.role == "intermediate"} == {"H"}
    assert any(thread_reads_staged(kc.kernel.body) for kc in first.kernels)


def test_a_value_is_costed_once_per_block_of_each_grid_axis_it_lacks() -> None:
    """Splitting d in attention's second kernel recomputes the scores' softmax once per d block."""
    g = load_graph_file(DATA / "attention_gqa_decode.json")
    p = Planner(g, "bfloat16")
    # the flash kernel: it streams t_kv through its GEMMs and computes the softmax itself (a plan that
    # materialises the scores has a P @ V kernel that only loads P)
    kc = next(k for c in p.candidates() for k in c.kernels
              if k.low.stream == "t_kv" and k.low.gemms and "block_d" in k.est.config
              and any(e for axes, e, _ in k.low.ew_by_axes if "d" not in axes))
    cfg = dict(kc.est.config)
    whole = estimate(kc.low, {**cfg, "block_d": 128}, p.sizes, {n: 1 << 20 for n in kc.low.reads + kc.low.writes},
                     kc.est.smem, p.machine)
    split = estimate(kc.low, {**cfg, "block_d": 16}, p.sizes, {n: 1 << 20 for n in kc.low.reads + kc.low.writes},
                     kc.est.smem, p.machine)
    softmax_ops = sum(e for axes, e, _ in kc.low.ew_by_axes if "d" not in axes)
    assert softmax_ops > 0
    assert split.flops - whole.flops == softmax_ops * 7  # 8 blocks of d instead of 1


def test_operand_of_inputs_alone_is_a_cut_candidate() -> None:
    """SwiGLU's backward with G and U saved: the gradients dY * U * silu'(G) and dY * silu(G) are GEMM operands
    computed from inputs alone (no contraction upstream). Fused, both GEMMs that read them (the weight
    gradients over m, d_X over n) recompute them on every tile; cut, one elementwise kernel writes them
    once in bf16. Before such operands were cut candidates the search never offered that plan."""
    from pyrunner.ir.grad import derive as derive_grad

    g = catalog.get("SwiGLU")
    both = derive_grad(g, save=derive_grad(g).recomputed)
    (plan,) = search(both.graph, "bf16", tuning=False)
    inter = _intermediates(plan)
    assert inter and set(inter.values()) == {"bfloat16"}
    producer = next(k for k in plan.kernels if set(k.writes) & set(inter))
    assert not any(op.op == "gemm" for op in [*producer.prologue, *producer.body, *producer.epilogue])
    gemms = [k for k in plan.kernels if set(k.reads) & set(inter)]
    assert gemms and all(not thread_reads_staged(k.body) for k in gemms)  # loops of loads and GEMMs
    small = cpu_check_plan(plan)
    res = verify_executor(small, graph_of(small), execute)
    assert res.ok, res.message


def test_the_operand_pass_also_cuts_the_graph_as_written(monkeypatch) -> None:
    """A residual, RMSNorm and SwiGLU (a Llama layer's MLP region) trained with its projections saved: the
    gate and up weight gradients share one GEMM operand, the normalised input times its weight. Each
    derivation variant pulls the weight out of one of the two GEMMs, which leaves two operands, none worth
    cutting alone; the first pass ranks the graph as written low, where both GEMMs recompute the operand.
    With the written graph in the operand pass (``OPERAND_PASS_WRITTEN``) both read it once cut."""
    import importlib

    from pyrunner.planner.saves import choose_saves
    from pyrunner.planner.search import to_plan
    from pyrunner.run.grad_check import backward_inputs

    search_module = importlib.import_module("pyrunner.planner.search")  # the package exports a function of this name
    bwd = choose_saves(load_graph_file(DATA / "multi_oproj_residual_rmsnorm_swiglu.json"), "bfloat16")

    def best(on: bool):
        monkeypatch.setattr(search_module, "OPERAND_PASS_WRITTEN", on)
        p = Planner(bwd.graph, "bfloat16")
        return p, min(p.candidates(), key=lambda c: c.rank())

    _, off = best(False)
    planner, on = best(True)
    assert on.total_us < 0.97 * off.total_us
    assert sum(thread_reads_staged(kc.kernel.body) for kc in on.kernels) < sum(
        thread_reads_staged(kc.kernel.body) for kc in off.kernels)
    small = cpu_check_plan(to_plan(planner, on, False))
    graph = graph_of(small)
    res = verify_executor(small, graph, execute, seed=4, inputs=backward_inputs(bwd, graph, 4))
    assert res.ok, res.message
