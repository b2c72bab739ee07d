"""The A/B harness's features (benchmarks/gpu_ab.py): each takes out exactly the code it names,
so the 'without' side of a timing is the renderer without that feature and nothing else."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_ab  # noqa: E402
from plan_cache import search  # noqa: E402

from pyrunner.backend.tilelang.render import render  # noqa: E402
from pyrunner.ir import catalog  # noqa: E402


def _plan(name: str, sizes: dict | None = None):
    (plan,) = search(catalog.get(name, sizes), "bf16", top=1, tuning=False)
    return plan


def test_without_dependent_launch_drops_every_pdl_call() -> None:
    plan = _plan("RMSNorm")
    src = render(plan)
    assert "T.pdl_trigger()" in src and "T.pdl_sync()" in src
    out = gpu_ab.FEATURES["pdl"](plan, src)
    assert "T.pdl_" not in out and out.count("pass  # dependent launch") == src.count("T.pdl_")


def test_without_persistence_never_takes_the_persistent_branch() -> None:
    plan = _plan("Attention")  # 512 tiles of 128 queries on 132 SMs
    src = render(plan)
    out = gpu_ab.FEATURES["persistent"](plan, src)
    assert "if tiles > SM_COUNT:  # past one wave" in src
    assert "if tiles > SM_COUNT:  # past one wave" not in out and "if False:  # (A/B) was tiles > SM_COUNT" in out
    assert out.replace("if False:  # (A/B) was tiles > SM_COUNT", "") != src  # only that line changed
    assert len(out.splitlines()) == len(src.splitlines())


def test_without_producer_prologue_copies_q_in_the_consumers() -> None:
    plan = _plan("Attention")
    src = render(plan)
    out = gpu_ab.FEATURES["prologue_tma"](plan, src)
    assert "T.tma_copy(Q[" in src and "Q_s_full" in src
    assert "T.tma_copy(Q[" not in out and "Q_s_full" not in out
    assert render(plan) == src  # the renderer is restored


def test_without_sunk_inputs_waits_for_the_statistics_before_the_loop() -> None:
    plan = _plan("RMSNorm")
    src = render(plan)
    out = gpu_ab.FEATURES["sink"](plan, src)
    late = "T.pdl_sync()  # dependent launch: the kernels ahead finished; the loop ran alongside them"
    assert late in src and late not in out
    assert render(plan) == src


def test_without_staged_loads_loads_each_step_itself() -> None:
    from plan_cache import search

    from pyrunner.ir.graph_json import load_graph_file

    plan = search(load_graph_file(ROOT / "benchmarks" / "graphs" / "lm_head.json"), "bf16", top=1)[0]
    src = render(plan)
    out = gpu_ab.FEATURES["staged"](plan, src)
    staged = "synchronous loads, staged in registers one step ahead"
    assert staged in src and staged not in out
    assert "synchronous loads: rows not 16-byte aligned" in out
    assert render(plan) == src


@pytest.mark.parametrize("feature", sorted(gpu_ab.FEATURES))
def test_every_feature_is_documented(feature: str) -> None:
    assert f"``{feature}``" in gpu_ab.__doc__


def test_config_variants_widen_the_space_and_switch_the_late_wait_off() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks" / "probes"))
    import config_variants

    assert config_variants.parse_variant("k0.block_m=256;-sink;base") == ({"k0": {"block_m": 256}}, {"sink"})
    with pytest.raises(SystemExit, match="not KERNEL.PARAM=N"):
        config_variants.parse_variant("k0.block_m=big")
    plan = _plan("RMSNorm")
    stats = plan.kernels[0].name
    late = "T.pdl_sync()  # dependent launch: the kernels ahead finished; the loop ran alongside them"
    src, cfg = config_variants.variant_source(plan, f"{stats}.block_m=512")
    assert cfg[stats]["block_m"] == 512 and late in src
    src, cfg = config_variants.variant_source(plan, "-sink")
    assert late not in src and cfg == {k.name: k.defaults for k in plan.kernels}
    with pytest.raises(SystemExit, match="has no parameter"):
        config_variants.variant_source(plan, f"{stats}.block_z=8")


@pytest.mark.parametrize("edit", ["+split_epilogue=2", "+direct_epilogue"])
def test_config_variants_source_edits_keep_the_kernel_right(edit: str) -> None:
    """The probe's epilogue edits (run 107: a staged TMA store in column chunks, or stores straight
    from registers) change only how the result leaves the block: the edited module still computes
    the graph on the CPU emulator, and ``+unguard`` lifts only the shared-memory bound."""
    import numpy as np
    from plan_cache import search

    from pyrunner.backend.tilelang.emulate import emulate
    from pyrunner.ir import catalog
    from pyrunner.ir.reference import evaluate, random_inputs
    from pyrunner.run.executor import round_to
    from pyrunner.run.runner import graph_of
    from pyrunner.run.verify import compare, executor_bound

    sys.path.insert(0, str(ROOT / "benchmarks" / "probes"))
    import config_variants

    with pytest.raises(SystemExit, match="edits are"):
        config_variants.parse_variant("+nope")
    (plan,) = search(catalog.get("Matmul", {"m": 256, "d": 512, "n": 512}), "bf16", top=1, tuning=False)
    base, _ = config_variants.variant_source(plan, "base")
    src, cfg = config_variants.variant_source(plan, edit)
    assert src != base and "_out = T.alloc_shared(" in base
    if edit == "+direct_epilogue":
        assert "_out = T.alloc_shared(" not in src
    else:
        assert src.count("for ep_c in T.serial(2):") == base.count("_out)\n")
    unguarded, _ = config_variants.variant_source(plan, f"{edit};+unguard")
    assert "<= 1 << 30:  # asynchronous" in unguarded
    graph = graph_of(plan)
    inputs = {k: round_to(v, "bfloat16").astype(np.float64) for k, v in random_inputs(graph, 3).items()}
    em = emulate(plan, inputs, config=cfg, source=src)
    res = compare(em.outputs, evaluate(graph, inputs), executor_bound(plan), 0,
                  {t.name: t.axes for t in plan.tensors if t.role == "output"}, graph)
    assert res.ok, res.message
