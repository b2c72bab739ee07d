"""Backward graphs (``ir.grad``) are planned by the same search and pass the CPU executor against the
float64 reference of the backward graph, fed saved tensors computed by the forward (``run.grad_check``).

The backward graph itself is checked against PyTorch float64 autograd in tests/test_grad.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from plan_cache import search

from pyrunner.cli import main
from pyrunner.ir import catalog
from pyrunner.ir.grad import derive
from pyrunner.ir.graph import Graph
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.plan.backward_of import with_backward_of
from pyrunner.plan.schema import Plan
from pyrunner.planner.saves import choose_saves, predicted_us
from pyrunner.run.executor import execute
from pyrunner.run.grad_check import backward_inputs, composed_error, gradient_bound
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import cpu_check_plan, scale_down
from pyrunner.run.verify import verify_executor

DATA = Path(__file__).resolve().parent / "data"
SMALL = {"h": 2, "t_q": 128, "t_kv": 128, "d": 64, "m": 128, "n": 128, "kv_h": 2, "group": 2}
"""Tile-friendly small shapes for the catalog (the planner's tiles are multiples of 16)."""
QUICK = ("Matmul", "SwiGLU", "RMSNorm", "Attention", "CausalAttention")
"""Catalog workloads planned in the default suite; every one is planned under ``slow``."""


def _small(name: str) -> Graph:
    g = catalog.get(name)
    return g.with_sizes({a: SMALL[a] for a in g.sizes if a in SMALL})


def _elements(plan: Plan) -> int:
    return sum(math.prod(t.shape) for t in plan.tensors)


def _check_backward_plan(forward: Graph, shrink: bool, seed: int = 5) -> None:
    bwd = derive(forward)
    plans = search(bwd.graph, "bf16", top=1)
    assert plans and plans[0].workload == bwd.graph.name
    small = cpu_check_plan(plans[0])
    if shrink:  # scale_down gives every tiled axis 32..256: a 5-axis gradient may grow, not shrink
        scaled = scale_down(plans[0])
        small = scaled if _elements(scaled) <= _elements(plans[0]) else plans[0]
    graph = graph_of(small)
    for draw in range(seed, seed + 3):
        # a draw on which the graph itself is ill-conditioned says nothing of the plan (a query temperature drawn
        # near zero); the next seed is drawn then, and the first checkable draw must pass
        res = verify_executor(small, graph, execute, seed=draw, inputs=backward_inputs(bwd, graph, draw))
        if not res.uncheckable:
            break
    assert res.ok, f"{forward.name} backward plan {plans[0].provenance.plan_hash}: {res.message}"


@pytest.mark.parametrize("name", QUICK)
def test_catalog_backward_plans_pass_cpu_executor(name: str) -> None:
    _check_backward_plan(_small(name), shrink=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in catalog.CATALOG if n not in QUICK])
def test_more_catalog_backward_plans_pass_cpu_executor(name: str) -> None:
    _check_backward_plan(_small(name), shrink=False)


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(DATA.glob("*.json")), ids=lambda p: p.stem)
def test_corpus_backward_plans_pass_cpu_executor(path: Path) -> None:
    _check_backward_plan(load_graph_file(path), shrink=True)


BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "graphs"


def test_a_gradient_infinite_in_float64_is_not_checkable_rather_than_failed() -> None:
    """Z = sqrt(X - min_n X): at each row's argmin sqrt' is infinite, so the float64 reference of d_X is not
    finite on any draw (row_min_range, run 127). The CPU check, the GPU verifier (run here on the CPU) and
    training's backward check say the plan cannot be checked there, instead of failing it."""
    import torch

    from pyrunner.frontend.training import cpu_check_backward
    from pyrunner.run.verify import GpuVerifier

    forward = load_graph_file(BENCH / "row_min_range.json").with_sizes({"m": 64, "n": 64})
    bwd = derive(forward)
    (plan,) = search(bwd.graph, "bf16", top=1)
    inputs = backward_inputs(bwd, bwd.graph, 5)
    res = verify_executor(plan, bwd.graph, execute, seed=5, inputs=inputs)
    assert res.uncheckable and not res.ok and "not checkable" in res.message and "'d_X'" in res.message
    v = GpuVerifier(plan, bwd.graph, seed=5, device="cpu", inputs=inputs)

    def launch(t: dict) -> None:
        outs = execute(plan, {k: x.to(torch.float64).numpy() for k, x in v.inputs.items()})
        t["d_X"].copy_(torch.from_numpy(outs["d_X"]))

    gpu = v.check(launch)
    assert gpu.uncheckable and not gpu.ok and "not checkable" in gpu.message
    assert "not CPU-checked" in cpu_check_backward(forward, bwd, plan)


def test_a_decay_the_forward_masks_away_leaves_the_plans_gradient_finite() -> None:
    """Retention's decay exp2((j - i) softplus(g)) overflows float32 at j > i, where the causal mask discards
    it; its gradient d_g was 0 * inf = NaN in the plan (the GPU's run 127 draw, seed 320637324: g[1] = 0.686,
    2^139 at i = j = 128). The mask now stays outermost in the chain rule (``ir.vjp._masked``)."""
    forward = load_graph_file(BENCH / "retention_parallel.json").with_sizes(
        {"h": 2, "i": 128, "j": 128, "d": 32, "e": 32})
    bwd = derive(forward)
    (plan,) = search(bwd.graph, "bf16", top=1)
    inputs = backward_inputs(bwd, bwd.graph, 320637324)
    assert max(inputs["g"]) > 0.6  # a decay that overflows float32 at the longest distance
    res = verify_executor(plan, bwd.graph, execute, seed=1, inputs=inputs)
    assert res.ok, res.message


def test_forward_with_saves_plans_and_writes_lse() -> None:
    """The forward a backward needs writes O and the row log-sum-exp (a multi-output kernel)."""
    bwd = derive(catalog.get("Attention", {"h": 1, "t_q": 64, "t_kv": 64, "d": 32}))
    (plan,) = search(bwd.forward, "bf16", top=1)
    outs = {t.name for t in plan.tensors if t.role == "output"}
    assert outs == {"O", "LSE_P"} == set(bwd.saved)
    small = cpu_check_plan(plan)
    res = verify_executor(small, graph_of(small), execute, seed=2)
    assert res.ok, res.message


def _superopt(argv: list[str], capsys) -> tuple[int, dict, str]:
    code = main(["superopt", *argv, "--no-lower-check"])
    out = capsys.readouterr()
    return code, json.loads(out.out) if code == 0 else {}, out.err


def test_cli_backward(capsys) -> None:
    shape = ["--shape", "m=64", "--shape", "d=32", "--shape", "n=48"]
    code, plan, err = _superopt(["Matmul", *shape, "--backward"], capsys)
    assert code == 0 and plan["workload"] == "MatmulBackward"
    assert {t["name"] for t in plan["tensors"] if t["role"] == "output"} == {"d_X", "d_W"}
    assert {t["name"] for t in plan["tensors"] if t["role"] == "input"} == {"X", "W", "d_Y"}
    assert "cotangents d_Y" in err
    assert main(["superopt", "Matmul", "--backward", "--with-saves"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.slow
def test_saved_contractions_are_chosen_by_the_cost_model() -> None:
    """SwiGLU's backward recomputes X W_gate and X W_up unless saving one is predicted cheaper: the
    choice is never dearer than recomputing everything, and saves only recomputed contractions."""
    g = _small("SwiGLU")
    base = derive(g)
    assert len(base.recomputed) == 2
    chosen = choose_saves(g, "bfloat16")
    assert predicted_us(chosen, "bfloat16") <= predicted_us(base, "bfloat16")
    labels = {n: t for n, t in chosen.forward.outputs}
    extra = [labels[n] for n in chosen.saved if n not in dict(g.outputs)]
    assert all(t in base.recomputed for t in extra)
    assert all(t not in chosen.recomputed for t in extra)  # a saved contraction is read, not recomputed


@pytest.mark.slow
def test_saves_are_chosen_as_a_set_not_one_at_a_time() -> None:
    """RMSNormMLP at its catalog shape: saving either projection alone spares the backward nothing (it still
    recomputes the normalised input for the other), saving both spares the norm and both GEMMs. A greedy
    walk in graph order stopped at the first; the chosen set is predicted no dearer than any subset."""
    import itertools

    g = catalog.get("RMSNormMLP")
    base = derive(g)
    chosen = choose_saves(g, "bfloat16")
    best = predicted_us(chosen, "bfloat16")
    for r in range(len(base.recomputed) + 1):
        for kept in itertools.combinations(base.recomputed, r):
            assert best <= predicted_us(derive(g, save=kept), "bfloat16") + 1e-9
    assert not chosen.recomputed  # at this shape the model prefers both saved


def test_cli_backward_reads_what_with_saves_writes(capsys) -> None:
    shape = ["--shape", "m=32", "--shape", "d=32", "--shape", "n=32"]
    code, back, _ = _superopt(["SwiGLU", *shape, "--backward"], capsys)
    assert code == 0
    code, fwd, _ = _superopt(["SwiGLU", *shape, "--with-saves"], capsys)
    assert code == 0
    fwd_out = {t["name"] for t in fwd["tensors"] if t["role"] == "output"}
    back_in = {t["name"] for t in back["tensors"] if t["role"] == "input"}
    assert "Y" in fwd_out and back_in - {"X", "W_gate", "W_up", "d_Y"} == fwd_out - {"Y"}


@pytest.mark.slow
def test_attention_scores_are_recomputed_at_scale() -> None:
    """At h16 t4096 d128 storing the scores (t_q x t_kv per head) is predicted dearer than recomputing
    them (at toy sizes, where every kernel is latency-bound, the model may save them)."""
    g = catalog.get("Attention")
    chosen = choose_saves(g, "bfloat16")
    assert set(chosen.saved) == {"O", "LSE_P"} and len(chosen.recomputed) == 1


GRADIENT_BOUND_CAP = 0.05
"""No stated gradient bound may exceed this: a bound raised without limit would pass any gradient."""


@pytest.mark.parametrize("name", QUICK)
def test_composed_training_plans_meet_the_gradient_bound(name: str) -> None:
    """The forward-with-saves plan and the backward plan chained on the CPU executor (what a training step
    runs, bf16 stores included) give every input gradient within ``gradient_bound`` of float64 autograd.
    The bound is derived as the forward's (stores of both halves, the longest reduction) and conditioned
    on what rounding the saved tensors alone does to the float64 backward (attention's log-sum-exp is
    saved in float32, so little: ``test_saved_statistics``)."""
    g = _small(name)
    bwd = derive(g)
    fwd_plan = search(bwd.forward, "bf16", top=1)[0]
    back_plan = search(bwd.graph, "bf16", top=1)[0]
    errors, bound = composed_error(g, bwd, fwd_plan, back_plan, seed=3)
    assert errors and set(errors) <= set(bwd.wrt)
    assert gradient_bound(fwd_plan, back_plan, bwd) <= bound <= GRADIENT_BOUND_CAP
    assert max(errors.values()) <= bound, (errors, bound)


class _Loaded:
    """A ``load.LoadedPlan`` stand-in for ``gpu_check_backward``: its kernels are the plan's tiled algorithm on
    the CPU executor (``GpuVerifier`` runs on device ``cpu``)."""

    def __init__(self, plan: Plan, launch) -> None:
        from pyrunner.plan.validate import plan_graph

        self.plan, self.graph, self.hash, self._launch = plan, plan_graph(plan), plan.provenance.plan_hash, launch

    def compile(self, device: str):
        return self._launch


def test_the_training_checks_run_a_backward_plan_on_every_draw(executor_launch) -> None:
    """The training path's checks (``cpu_check_backward``, ``gpu_check_backward``) run a backward plan on every
    draw, each with saves computed from its forward inputs, as ``run`` does, not on one normal set. The gradient
    of max |X @ W| flows to its argmax alone: a backward plan whose last column of d_W is zeroed passed on one normal
    set (the argmax sat elsewhere) and fails on the planted draw, which puts it in that row."""
    from test_plan_mutations import _at, _edit, _sites

    from pyrunner.errors import UserError
    from pyrunner.frontend.training import cpu_check_backward, gpu_check_backward
    from pyrunner.plan.schema import plan_document, with_hash

    # n the longest axis of d_W, so the mutation zeroes its last column, where the planted draw puts the argmax
    forward = load_graph_file(BENCH / "gemm_max_scalar.json").with_sizes({"m": 64, "d": 64, "n": 128})
    bwd = derive(forward)
    (plan,) = search(bwd.graph, "bf16", top=1)
    doc = plan_document(plan)
    site = next(p for p in _sites(doc)["tail"] if _at(doc, p)["dst"] == "d_W")
    edited = with_hash(Plan.model_validate(_edit(doc, "tail", site)))
    assert verify_executor(edited, bwd.graph, execute, seed=0, inputs=backward_inputs(bwd, bwd.graph, 0)).ok
    with pytest.raises(UserError, match="on planted inputs"):
        cpu_check_backward(forward, bwd, edited)
    msg = cpu_check_backward(forward, bwd, plan)
    assert "backward CPU-checked" in msg and "on outlier inputs" in msg and "on planted inputs" in msg, msg
    with pytest.raises(UserError, match="on planted inputs"):
        gpu_check_backward(_Loaded(edited, executor_launch(edited)), bwd, device="cpu")
    res = gpu_check_backward(_Loaded(plan, executor_launch(plan)), bwd, device="cpu")
    assert res.ok and res.draws == ["normal", "outlier", "planted"], res.message


def test_a_later_draw_ill_conditioned_on_computed_saves_is_taken_smaller() -> None:
    """A decode softmax's backward on planted inputs at std 0.5: the corner makes its softmax one-hot, and float32
    roundings of the graph's own values move the float64 gradient by 1e11 of its scale (``run.conditioning``).
    That draw was the verdict, so a plan that passed normal and outlier inputs was "not checkable"; it is now
    taken at the next scale, as an overflowing draw is."""
    forward = load_graph_file(BENCH / "gemv_softmax_decode.json").with_sizes({"d": 64, "v": 64})
    bwd = derive(forward)
    (plan,) = search(bwd.graph, "bf16", top=1)
    res = verify_executor(with_backward_of(plan, bwd), bwd.graph, execute, seed=0)
    assert res.ok and "on planted inputs (std 0.25)" in res.message, res.message
